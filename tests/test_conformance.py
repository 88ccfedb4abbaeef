"""The conformance kit: it passes real workers and fails broken ones.

* Result rules are rlfleet.wire.result_checks', shared with the coordinator:
  tests/test_episode_results.py.
* The whole kit against the Python worker and, when Node.js and
  ``clients/node/node_modules`` are present (without them it is skipped,
  or failed under ``CI=true``: tests/node_support.py), the Node worker:
  every check passes.
* The kit against tests/fixtures/broken_worker.py, which skips heartbeats,
  never runs tasks, reconnects in a hot loop, says protocol version 2,
  ignores malformed unit columns, or (the real worker with a fault) runs a
  data connection's Task before its agent version or drops a Cancel that
  came before its Task: exactly the checks those faults break fail, with
  reasons naming them.

The kit runs real worker processes over loopback gRPC (no mocks), so the
end-to-end tests take tens of seconds; the rule tests take milliseconds.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.cli.conformance import print_row, print_summary
from rlfleet.conformance import CHECKS, CheckResult, run_conformance
from rlfleet.conformance.agents import balancing_agent, pinned_agent
from rlfleet.conformance.runner import worker_argv
from rlfleet.conformance.suite import select_checks
from rlfleet.core import EnvSpec
from rlfleet.errors import ConfigError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy
from tests.node_support import NODE_WORKER, require_node

ROOT = Path(__file__).resolve().parent.parent
BROKEN_WORKER = ROOT / "tests" / "fixtures" / "broken_worker.py"
SPEC = EnvSpec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), 10)


# --- agents ----------------------------------------------------------------------------------


def test_the_pinned_categorical_agent_always_takes_the_first_action() -> None:
    spec = EnvSpec.from_env(gym.make("CartPole-v1"))
    agent = pinned_agent(spec)
    policy = MLPCategoricalPolicy(spec, hidden_sizes=[16])
    policy.set_param_values(agent.params)
    observations = np.random.default_rng(0).uniform(-2, 2, (500, 4)).astype(np.float32)
    actions, _ = policy.get_actions(observations, [np.random.default_rng(i) for i in range(500)])
    assert agent.off_pin(actions) is None
    assert agent.off_pin(np.array([0, 0, 1])) == 2


def test_the_pinned_gaussian_agent_acts_at_the_middle_of_the_box() -> None:
    spec = EnvSpec.from_env(gym.make("Pendulum-v1"))  # actions in [-2, 2]
    agent = pinned_agent(spec)
    policy = MLPGaussianPolicy(spec, hidden_sizes=[16])
    policy.set_param_values(agent.params)
    observations = np.random.default_rng(0).uniform(-1, 1, (100, 3)).astype(np.float32)
    actions, _ = policy.get_actions(observations, [np.random.default_rng(i) for i in range(100)])
    assert agent.off_pin(actions) is None
    assert agent.off_pin(np.array([[0.0], [0.5]])) == 1


def test_the_balancing_agent_fits_cartpole_shaped_envs_only() -> None:
    assert balancing_agent(EnvSpec.from_env(gym.make("CartPole-v1"))) is not None
    assert balancing_agent(SPEC) is None


# --- commands and options --------------------------------------------------------------------


def test_the_address_goes_where_the_placeholder_is() -> None:
    argv = worker_argv("node w.js --coordinator {address} --name 'a b'", "127.0.0.1:5")
    assert argv == ["node", "w.js", "--coordinator", "127.0.0.1:5", "--name", "a b"]


def test_a_command_without_the_placeholder_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"has no \{address\}"):
        worker_argv("node w.js", "127.0.0.1:5")


def test_checks_run_in_their_own_order_and_unknown_names_are_refused() -> None:
    assert [c.name for c in select_checks(["drain", "handshake"])] == ["handshake", "drain"]
    with pytest.raises(ConfigError, match="unknown checks \\['nope'\\]"):
        select_checks(["nope"])


def test_the_table_shows_a_failure_with_its_whole_reason() -> None:
    out = io.StringIO()
    print_row(CheckResult("cancel", False, "cancel was not honoured:\n  - task 3", 1.5), out)
    print_row(CheckResult("drain", True, "closed", 0.25), out)
    print_summary(
        [CheckResult("cancel", False, "x", 1.5), CheckResult("drain", True, "y", 0.5)], out
    )
    assert out.getvalue() == (
        "FAIL  cancel               1.5s  cancel was not honoured:\n"
        "        - task 3\n"
        "PASS  drain                0.2s  closed\n"
        "1 of 2 checks passed in 2.0s; failed: cancel\n"
    )


# --- real workers ----------------------------------------------------------------------------


def python_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p)}


def run_cli(worker_cmd: str, *extra: str) -> tuple[int, dict]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlfleet",
            "conformance",
            "--worker-cmd",
            worker_cmd,
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=python_env(),
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def failures(report: dict) -> str:
    return "\n".join(f"{c['name']}: {c['message']}" for c in report["checks"] if not c["passed"])


@pytest.mark.timeout(240)
def test_the_python_worker_passes_every_check() -> None:
    command = f"{sys.executable} -m rlfleet worker --coordinator {{address}} --envs 2"
    code, report = run_cli(command)
    assert report["passed"], failures(report)
    assert code == 0
    assert [c["name"] for c in report["checks"]] == list(CHECKS)


@pytest.mark.timeout(240)
def test_the_node_worker_passes_every_check() -> None:
    command = f"{require_node()} {NODE_WORKER} --coordinator {{address}} --envs 2"
    code, report = run_cli(command, "--env-id", "rlfleet/CartPoleJS-v0")
    assert report["passed"], failures(report)
    assert code == 0


def broken(*flags: str) -> str:
    return f"{sys.executable} {BROKEN_WORKER} --coordinator {{address}} {' '.join(flags)}"


@pytest.mark.timeout(120)
def test_a_broken_worker_fails_exactly_the_checks_its_faults_break(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    results = run_conformance(
        broken("--no-heartbeats", "--hot-retry"),
        checks=["handshake", "heartbeats", "sampling", "version-mismatch"],
        timeout=3.0,
    )
    by_name = {r.name: r for r in results}
    assert by_name["handshake"].passed, by_name["handshake"].message
    assert not by_name["heartbeats"].passed
    assert by_name["heartbeats"].message.startswith("no Heartbeat in ")
    assert not by_name["sampling"].passed
    assert "never came back" in by_name["sampling"].message
    mismatch = by_name["version-mismatch"]
    assert not mismatch.passed
    assert "per second): retry with exponential backoff" in mismatch.message
    assert "its stderr does not mention 'version'" in mismatch.message


@pytest.mark.timeout(60)
def test_a_worker_that_does_not_refuse_malformed_unit_columns_fails_their_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    handshake, result = run_conformance(
        broken("--unit-columns"), checks=["handshake", "unit-columns"], timeout=3.0
    )
    assert handshake.passed, handshake.message
    assert not result.passed
    assert result.message.startswith("expected WorkerError ERROR_KIND_PROTOCOL naming task ")
    assert "whose episode_indices lack their last 3 bytes" in result.message


@pytest.mark.timeout(60)
def test_a_worker_speaking_another_protocol_version_fails_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    (result,) = run_conformance(
        broken("--protocol-version", "2"), checks=["handshake"], timeout=3.0
    )
    assert not result.passed
    assert result.message.startswith("Hello has protocol_version=2 and num_envs=1; expected")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        # Its task path refuses the Task it let through (an agent version it
        # does not run): an error where the Task must wait.
        ("run-held", "came on the data connection before its AgentUpdate: hold it until"),
        ("drop-early-cancel", "ran although its Cancel came before it: keep a Cancel"),
    ],
    ids=["run-held", "drop-early-cancel"],
)
def test_a_worker_that_mishandles_tasks_on_its_data_connection_fails_their_check(
    monkeypatch: pytest.MonkeyPatch, fault: str, reason: str
) -> None:
    # The real Python worker with one fault in its held Tasks: the check
    # passes it without the fault (test_the_python_worker_passes_every_check).
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    handshake, result = run_conformance(
        broken("--data-tasks", fault), checks=["handshake", "data-tasks"], timeout=5.0
    )
    assert handshake.passed, handshake.message
    assert not result.passed
    assert reason in result.message, result.message
