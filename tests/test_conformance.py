"""The conformance kit: it passes real workers and fails broken ones.

* Result rules (step types, episode_infos, fragment windows, chunks) on
  hand-built batches, with the problem each breakage must be reported as.
* The whole kit against the Python worker and, when Node.js and
  ``clients/node/node_modules`` are present, the Node worker: every check
  passes.
* The kit against tests/fixtures/broken_worker.py, which skips heartbeats,
  never runs tasks, reconnects in a hot loop or says protocol version 2:
  exactly the checks those faults break fail, with reasons naming them.

The kit runs real worker processes over loopback gRPC (no mocks), so the
end-to-end tests take tens of seconds; the rule tests take milliseconds.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.cli.conformance import print_row, print_summary
from rlfleet.conformance import CHECKS, CheckResult, run_conformance
from rlfleet.conformance._failure import CheckFailed
from rlfleet.conformance.agents import balancing_agent, pinned_agent
from rlfleet.conformance.results import (
    Result,
    ResultAssembler,
    WorkerFacts,
    check_result,
    continuity_problems,
    step_type_problems,
)
from rlfleet.conformance.runner import worker_argv
from rlfleet.conformance.scripted_coordinator import Inbound
from rlfleet.conformance.suite import select_checks
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import ConfigError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.seeding import stream_seeds
from rlfleet.v1 import worker_pb2
from rlfleet.wire import encode_batch_chunks

ROOT = Path(__file__).resolve().parent.parent
BROKEN_WORKER = ROOT / "tests" / "fixtures" / "broken_worker.py"
NODE_DIR = ROOT / "clients" / "node"
NODE = shutil.which("node")

F, M, TERM, TIME = (
    int(t) for t in (StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT)
)
SPEC = EnvSpec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), 10)
WORKER_ID = 7
FACTS = WorkerFacts(worker_id=WORKER_ID, env_spec=SPEC, first_stream=10, num_envs=2)


# --- building results by hand ------------------------------------------------------


def make_batch(
    lengths: Sequence[int], step_types: Sequence[int], infos: Mapping[str, Sequence[int]]
) -> EpisodeBatch:
    total = sum(lengths)
    observations = np.arange(total * 2, dtype=np.float32).reshape(total, 2) / 100
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={key: np.asarray(value, dtype=np.int64) for key, value in infos.items()},
        observations=observations,
        last_observations=np.full((len(lengths), 2), 0.5, dtype=np.float32),
        actions=np.zeros(total, dtype=np.int64),
        rewards=np.ones(total, dtype=np.float32),
        env_infos={},
        agent_infos={},
        step_types=np.asarray(step_types, dtype=np.uint8),
        lengths=np.asarray(lengths, dtype=np.int64),
    )


def make_result(batch: EpisodeBatch, *, task_id: int = 1, agent_version: int = 0) -> Result:
    return Result(
        task_id=task_id,
        episode_indices=tuple(batch.episode_infos["episode_index"].tolist()),
        lengths=tuple(batch.lengths.tolist()),
        agent_version=agent_version,
        env_generation=1,
        batch=batch,
        chunk_sizes=(100,),
        total_bytes=100,
        seq=0,
        at=0.0,
    )


def episode_task() -> worker_pb2.Task:
    units = [
        worker_pb2.EpisodeUnit(episode_index=0, env_seed=11, policy_seed=21),
        worker_pb2.EpisodeUnit(episode_index=1, env_seed=12, policy_seed=22),
    ]
    return worker_pb2.Task(
        task_id=1, mode=worker_pb2.SAMPLE_MODE_EPISODES, env_generation=1, units=units
    )


def good_episode_infos() -> dict[str, list[int]]:
    return {
        "agent_version": [0, 0],
        "env_seed": [11, 12],
        "policy_seed": [21, 22],
        "episode_index": [0, 1],
        "worker": [WORKER_ID, WORKER_ID],
    }


def failure_of(result: Result, task: worker_pb2.Task) -> str:
    with pytest.raises(CheckFailed) as info:
        check_result(result, task, FACTS)
    return str(info.value)


# --- step types ------------------------------------------------------------------------


def test_whole_episodes_with_valid_step_types_have_no_problems() -> None:
    # A 3-step terminal episode, then a one-step episode cut by a time limit.
    problems = step_type_problems(
        np.array([F, M, TERM, TIME]), np.array([3, 1]), np.array([True, True]), must_end=True
    )
    assert problems == []


def test_a_second_first_step_is_reported_with_its_position() -> None:
    problems = step_type_problems(
        np.array([F, F, TERM]), np.array([3]), np.array([True]), must_end=True
    )
    assert problems == ["episode 0 of the batch, step 2 of 3: step type FIRST, expected MID"]


def test_a_whole_episode_must_end_terminal_or_timeout() -> None:
    problems = step_type_problems(np.array([F, M]), np.array([2]), np.array([True]), must_end=True)
    assert problems[0].startswith("episode 0 of the batch ends with step type MID")


def test_fragment_pieces_continue_with_mid_and_may_be_cut() -> None:
    # Piece 0 starts and ends an episode; piece 1 continues one and is cut.
    lengths, starts = np.array([2, 3]), np.array([True, False])
    assert step_type_problems(np.array([F, TERM, M, M, M]), lengths, starts, must_end=False) == []
    problems = step_type_problems(np.array([F, TERM, F, M, M]), lengths, starts, must_end=False)
    assert problems == ["episode 1 of the batch, step 1 of 3: step type FIRST, expected MID"]


# --- episode results ---------------------------------------------------------------------


def test_a_well_formed_episode_result_passes() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    check_result(make_result(batch), episode_task(), FACTS)


def test_episodes_naming_another_worker_fail() -> None:
    infos = good_episode_infos() | {"worker": [0, 0]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode_infos['worker'] holds [0], expected 7 for every episode" in message


def test_episodes_with_seeds_other_than_their_units_fail() -> None:
    infos = good_episode_infos() | {"env_seed": [11, 99]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode 1: episode_infos['env_seed'] is 99, the unit's env_seed is 12" in message


def test_metadata_that_disagrees_with_the_batch_fails() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    result = make_result(batch)
    wrong = Result(**{**result.__dict__, "lengths": (3, 2)})
    assert "metadata lengths [3, 2] disagree with the batch's lengths [3, 1]" in failure_of(
        wrong, episode_task()
    )


def test_episodes_that_are_not_units_of_the_task_fail() -> None:
    infos = good_episode_infos() | {"episode_index": [0, 5]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episodes [5] are not units of task 1" in message


def test_missing_episode_infos_fail() -> None:
    infos = good_episode_infos()
    del infos["policy_seed"]
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode_infos has no 'policy_seed' tensor" in message


def test_episodes_longer_than_the_limit_fail() -> None:
    lengths = [11, 1]
    types = [F, *[M] * 9, TIME, TERM]
    message = failure_of(
        make_result(make_batch(lengths, types, good_episode_infos())), episode_task()
    )
    assert "episode 0 has 11 steps, more than the env's max_episode_length 10" in message


# --- fragment windows --------------------------------------------------------------------------


def fragment_task() -> worker_pb2.Task:
    return worker_pb2.Task(
        task_id=2,
        mode=worker_pb2.SAMPLE_MODE_FRAGMENTS,
        env_generation=1,
        fragment_length=3,
        rounds=2,
        base_seed=4,
    )


def window(pieces: Sequence[tuple[int, int, int, int]], step_types: Sequence[int]) -> Result:
    """Pieces as (stream, episode, fragment, length), seeded as stream_seeds says."""
    seeds = [stream_seeds(4, stream, episode) for stream, episode, _, _ in pieces]
    infos = {
        "agent_version": [0] * len(pieces),
        "env_seed": [s[0] for s in seeds],
        "policy_seed": [s[1] for s in seeds],
        "episode_index": [p[1] for p in pieces],
        "worker": [WORKER_ID] * len(pieces),
        "stream": [p[0] for p in pieces],
        "fragment_index": [p[2] for p in pieces],
    }
    return make_result(make_batch([p[3] for p in pieces], step_types, infos), task_id=2)


# Stream 10 cuts episode 0 after 3 steps; stream 11 ends episode 0 after one
# step and cuts episode 1 after two.
FIRST_WINDOW = ((10, 0, 0, 3), (11, 0, 0, 1), (11, 1, 0, 2))
FIRST_TYPES = (F, M, M, TERM, F, M)


def test_a_well_formed_fragment_window_passes() -> None:
    check_result(window(FIRST_WINDOW, FIRST_TYPES), fragment_task(), FACTS)


def test_a_stream_with_more_steps_than_the_fragment_length_fails() -> None:
    pieces = ((10, 0, 0, 3), (11, 0, 0, 1), (11, 1, 0, 3))
    message = failure_of(window(pieces, (*FIRST_TYPES, M)), fragment_task())
    assert "stream 11 has 4 steps in the window, expected fragment_length 3" in message


def test_a_window_missing_a_stream_fails() -> None:
    message = failure_of(window(((10, 0, 0, 3),), (F, M, M)), fragment_task())
    assert "the window covers streams [10], expected one piece or more of each" in message


def test_fragment_seeds_come_from_stream_seeds() -> None:
    result = window(FIRST_WINDOW, FIRST_TYPES)
    infos = dict(result.batch.episode_infos) | {"env_seed": np.array([1, 2, 3], dtype=np.int64)}
    broken = make_result(
        make_batch(result.lengths, FIRST_TYPES, {k: v.tolist() for k, v in infos.items()}),
        task_id=2,
    )
    assert "stream 10 episode 0: seeds (env, policy) are" in failure_of(broken, fragment_task())


def test_the_next_window_continues_each_stream() -> None:
    first = window(FIRST_WINDOW, FIRST_TYPES)
    _, last = continuity_problems({}, first)
    # Stream 10 goes on with episode 0 (fragment 1), stream 11 with episode 1.
    good = window(((10, 0, 1, 3), (11, 1, 1, 3)), (M, M, TERM, M, M, M))
    good_batch = EpisodeBatch(
        **{
            **good.batch.__dict__,
            "observations": np.concatenate(
                [first.batch.last_observations[[0]], good.batch.observations[1:]]
            ),
        }
    )
    problems, _ = continuity_problems(last, Result(**{**good.__dict__, "batch": good_batch}))
    assert problems == [
        "stream 11: the fragment continuing episode 1 does not start from the previous "
        "fragment's last observation"
    ]
    restarted = window(((10, 1, 0, 3), (11, 1, 1, 3)), (F, M, M, M, M, M))
    problems, _ = continuity_problems(last, restarted)
    assert problems[0] == (
        "stream 10 starts the window with episode 1 fragment 0, expected episode 0 fragment 1 "
        "(the previous window cut episode 0 at fragment 0)"
    )


# --- chunks --------------------------------------------------------------------------------


def chunk_messages(batch: EpisodeBatch, *, repeat_metadata: bool = False) -> list[Inbound]:
    chunks = encode_batch_chunks(batch, 120, batch_id=3, include_env_spec=False)
    messages = []
    for chunk in chunks:
        result = worker_pb2.EpisodeResult(task_id=1)
        if chunk.index == 0 or repeat_metadata:
            result.episode_indices.extend([0, 1])
            result.lengths.extend(batch.lengths.tolist())
        message = worker_pb2.WorkerMessage(result=result)
        messages.append(Inbound("result", chunk.index, 0.0, 110, message, chunk))
    return messages


def test_chunks_in_order_reassemble_into_the_batch() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    messages = chunk_messages(batch)
    assert len(messages) > 2
    assembler = ResultAssembler(SPEC)
    outputs = [assembler.add(m) for m in messages]
    assert outputs[:-1] == [None] * (len(messages) - 1)
    result = outputs[-1]
    assert result is not None
    assert result.episode_indices == (0, 1) and result.lengths == (3, 1)
    assert len(result.chunk_sizes) == len(messages)
    np.testing.assert_array_equal(result.batch.observations, batch.observations)


def test_chunks_out_of_order_fail() -> None:
    messages = chunk_messages(make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos()))
    assembler = ResultAssembler(SPEC)
    assembler.add(messages[0])
    with pytest.raises(CheckFailed, match="bad chunk sequence: chunk 1 of batch 3 missing"):
        assembler.add(messages[2])


def test_metadata_repeated_on_later_chunks_fails() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    assembler = ResultAssembler(SPEC)
    messages = chunk_messages(batch, repeat_metadata=True)
    assembler.add(messages[0])
    with pytest.raises(CheckFailed, match="chunk 1 repeats episode_indices/lengths"):
        assembler.add(messages[1])


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


@pytest.mark.skipif(NODE is None, reason="node is not installed (Node.js >= 20)")
@pytest.mark.skipif(
    not (NODE_DIR / "node_modules").is_dir(),
    reason="clients/node/node_modules is missing: run `cd clients/node && npm ci`",
)
@pytest.mark.timeout(240)
def test_the_node_worker_passes_every_check() -> None:
    command = (
        f"{NODE} {NODE_DIR / 'bin' / 'rlfleet-node-worker.js'} --coordinator {{address}} --envs 2"
    )
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
def test_a_worker_speaking_another_protocol_version_fails_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", python_env()["PYTHONPATH"])
    (result,) = run_conformance(
        broken("--protocol-version", "2"), checks=["handshake"], timeout=3.0
    )
    assert not result.passed
    assert result.message.startswith("Hello has protocol_version=2 and num_envs=1; expected")
