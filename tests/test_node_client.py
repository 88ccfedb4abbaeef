"""The Node.js client (clients/node/src/client.js) driving Python workers.

A real coordinator and two real Python worker processes on loopback; the
Node client (spawned as ``node scripts/sample-summary.js``) pushes an MLP,
samples in every mode and prints a JSON summary, checked here for shapes,
counts, ordering, agent versions and typed errors. Skipped when ``node``
or ``clients/node/node_modules`` (``npm ci``) is missing, failed instead
under ``CI=true`` (tests/node_support.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rlfleet.client import RemoteSampler
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.envs import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from tests.node_support import (
    NODE,
    NODE_DIR,
    node_present,  # noqa: F401 (autouse: skips without Node, fails under CI=true)
)
from tests.test_node_worker import start_python_worker, stop, wait_for_workers

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fleet() -> Iterator[CoordinatorServer]:
    config = CoordinatorConfig(listen="127.0.0.1:0", env=EnvConfig("CartPole-v1"))
    with serve(config) as server:
        workers = [start_python_worker(server.address, envs=2, name=f"py{i}") for i in range(2)]
        try:
            with RemoteSampler(server.address, timeout=60) as sampler:
                wait_for_workers(sampler, 2)
            yield server
        finally:
            for worker in workers:
                stop(worker)


@pytest.fixture(scope="module")
def summary(fleet: CoordinatorServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    policy = MLPCategoricalPolicy(EnvConfig("CartPole-v1").env_spec(), hidden_sizes=(8,), seed=4)
    params = {
        name: {"dtype": "float32", "shape": list(value.shape), "data": value.ravel().tolist()}
        for name, value in policy.get_param_values().items()
    }
    params_file = tmp_path_factory.mktemp("node-client") / "params.json"
    params_file.write_text(json.dumps({"hidden_sizes": [8], "params": params}))
    done = subprocess.run(
        [
            str(NODE),
            str(NODE_DIR / "scripts" / "sample-summary.js"),
            fleet.address,
            str(params_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def check_episodes(part: dict[str, Any], *, version: int) -> None:
    lengths = np.array(part["lengths"])
    total = int(lengths.sum())
    n = len(lengths)
    assert part["total_steps"] == total and part["num_episodes"] == n
    assert part["observations_shape"] == [total, 4] and part["observations_dtype"] == "float32"
    assert part["last_observations_shape"] == [n, 4]
    assert part["actions_dtype"] == "int64" and part["rewards_dtype"] == "float64"
    assert part["agent_versions"] == [version] * n
    assert part["agent_info_keys"] == ["log_prob", "logits"] and part["logits_shape"] == [total, 2]
    step_types = np.array(part["step_types"])
    ends = np.cumsum(lengths) - 1
    assert set(step_types[ends]) <= {2, 3}  # TERMINAL or TIMEOUT


def test_node_client_samples_from_python_workers(summary: dict[str, Any]) -> None:
    assert summary["status_workers"] == 2
    version = summary["ack"]["agentVersion"]
    assert version >= 1 and summary["ack"]["workersUpdated"] == 2

    episodes = summary["episodes"]
    check_episodes(episodes, version=version)
    assert episodes["episode_index"] == [0, 1, 2, 3, 4]  # exactly the answer, in index order
    assert episodes["agent_version"] == version
    assert episodes["env_spec"]["maxEpisodeLength"] == 500
    assert episodes["env_spec"]["actionSpace"] == {"kind": "discrete", "n": 2, "start": 0}
    # Same seed, same episodes, whichever worker ran them.
    again = summary["episodes_again"]
    assert again["lengths"] == episodes["lengths"]
    assert again["first_observation"] == episodes["first_observation"]

    steps = summary["steps"]
    check_episodes(steps, version=version)
    assert steps["episode_index"] == list(range(len(steps["lengths"])))
    assert steps["total_steps"] >= 200 > steps["total_steps"] - steps["lengths"][-1]

    fragments = summary["fragments"]
    assert fragments["total_steps"] >= 40 and max(fragments["lengths"]) <= 10
    keys = list(
        zip(
            fragments["stream"],
            fragments["episode_index"],
            fragments["fragment_index"],
            strict=True,
        )
    )
    assert keys == sorted(keys)
    assert len(set(fragments["workers"])) == 2 and fragments["agent_versions"] == [version] * len(
        keys
    )


def test_node_client_surfaces_typed_errors(summary: dict[str, Any]) -> None:
    assert summary["bad_params"]["name"] == "PolicyError"
    assert "layers.0.weight" in summary["bad_params"]["message"]
    assert summary["bad_env"]["name"] in {"EnvNotFoundError", "InvalidArgumentError"}
    assert "NoSuchEnv-v9" in summary["bad_env"]["message"]
    assert summary["bad_amount"] == {
        "name": "ConfigError",
        "message": "amount must be an integer >= 1, got 0",
    }
