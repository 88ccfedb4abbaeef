"""The Node.js worker (clients/node) against Python: same math, real fleets.

* The JS ``mlp-categorical`` policy computes tests/mlp_reference.py's logits,
  log-probabilities and, from the same per-episode seeds, actions, bit for
  bit (the Python worker's kernel is held to the same reference), on its own
  and over whole episodes in a fleet.
* The JS CartPole port steps like gymnasium's CartPole-v1 from the same
  states (bit for bit wherever Math.sin and Math.cos round as numpy does),
  and resets to the same states from the same seeds.
* The Node worker reads a Task's units as columns (rlfleet.unit-columns) or
  as EpisodeUnit messages with the same episodes, and refuses a Task whose
  columns are malformed by its id without ending the stream.
* A Node worker joins a real coordinator and serves every sampling mode;
  a mixed fleet (one Python worker, one Node worker) trains through pushed
  parameters, and the Node worker's episodes carry the pushed version.

Everything runs on loopback with real processes. Skipped when ``node`` or
``clients/node/node_modules`` (``npm ci``) is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

import rlfleet.envs.cartpole_js
from rlfleet.client import RemoteSampler
from rlfleet.conformance import run_conformance
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, EnvNotFoundError, PolicyError, RlfleetError
from rlfleet.learners.vpg import VPG
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.transport.rpc import UNIT_COLUMNS_CAPABILITY
from rlfleet.v1 import updates_pb2, worker_pb2
from rlfleet.wire import encode_task
from tests import mlp_reference as ref
from tests._coordinator_fakes import status as fleet_status
from tests.node_support import (
    NODE,
    NODE_DIR,
    NODE_WORKER,
    node_present,  # noqa: F401 (autouse: skips without Node, fails under CI=true)
)
from tests.test_fleet_equivalence import assert_same_batch
from tests.test_remote_worker import Connection, ScriptedCoordinator, env_update, welcome
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

JS_ENV = rlfleet.envs.cartpole_js.ENV_ID
JS_SPEC = EnvConfig(JS_ENV).env_spec()


def run_node_script(script: str, payload: object) -> dict[str, Any]:
    """Runs clients/node/scripts/SCRIPT with JSON on stdin; returns its JSON output."""
    done = subprocess.run(
        [str(NODE), str(NODE_DIR / "scripts" / script)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# --- same math --------------------------------------------------------------------------


def reference_layers(
    params: dict[str, np.ndarray], hidden_layers: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (params[f"layers.{i}.weight"], params[f"layers.{i}.bias"]) for i in range(hidden_layers + 1)
    ]


def bits(values: Any) -> np.ndarray:
    """float32 values as their bit patterns, for exact comparisons (-0.0 too)."""
    return np.asarray(values, np.float32).view(np.uint32)


@pytest.mark.parametrize(
    ("hidden_sizes", "activation"),
    [((16, 7), "tanh"), ((12,), "relu"), ((), "identity"), ((32, 32), "tanh")],
)
def test_mlp_categorical_is_the_reference_bit_for_bit(
    hidden_sizes: tuple[int, ...], activation: str
) -> None:
    rng = np.random.default_rng(5)
    spec = EnvSpec(gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(3), None)
    policy = MLPCategoricalPolicy(spec, hidden_sizes=hidden_sizes, activation=activation, seed=1)
    params = {
        name: rng.normal(0.0, 0.7, value.shape).astype(np.float32)
        for name, value in policy.get_param_values().items()
    }
    observations = rng.normal(0.0, 2.0, (40, 6)).astype(np.float32)
    seeds = rng.integers(0, 2**32, 40).tolist()
    logits = ref.forward32(observations, reference_layers(params, len(hidden_sizes)), activation)
    rows = [
        ref.categorical_row(row, np.random.default_rng(seed).random())
        for row, seed in zip(logits, seeds, strict=True)
    ]

    node = run_node_script(
        "policy-logits.js",
        {
            "policy": {
                "name": "mlp-categorical",
                "kwargs": {"hidden_sizes": list(hidden_sizes), "activation": activation},
            },
            "params": {
                k: {"shape": list(v.shape), "data": v.ravel().tolist()} for k, v in params.items()
            },
            "observations": observations.tolist(),
            "seeds": seeds,
            "n_actions": 3,
        },
    )

    np.testing.assert_array_equal(np.array(node["logits"], np.uint32), bits(logits))
    np.testing.assert_array_equal(node["actions"], [index for index, _ in rows])
    np.testing.assert_array_equal(
        np.array(node["log_prob"], np.uint32), bits([log_prob for _, log_prob in rows])
    )


def test_cartpole_port_steps_and_resets_like_gymnasium() -> None:
    rng = np.random.default_rng(11)
    # States inside and around the termination box, so both flags occur.
    scale = np.array([2.6, 3.0, 0.25, 3.0])
    states = rng.uniform(-1.0, 1.0, (300, 4)) * scale
    actions = rng.integers(0, 2, 300)
    seeds = [0, 1, 123, 2**32 - 1, *rng.integers(0, 2**32, 6).tolist()]

    env = CartPoleEnv()  # gymnasium's CartPole-v1 without its TimeLimit wrapper
    expected_states, expected_obs, expected_terminated = [], [], []
    for state, action in zip(states, actions, strict=True):
        env.reset(seed=0)
        env.state = state.copy()
        obs, reward, terminated, _, _ = env.step(int(action))
        assert reward == 1.0
        expected_states.append(np.asarray(env.state, np.float64))
        expected_obs.append(obs)
        expected_terminated.append(terminated)
    expected_resets = []
    for seed in seeds:
        env.reset(seed=int(seed))
        expected_resets.append(np.asarray(env.state, np.float64))

    node = run_node_script(
        "cartpole-steps.js",
        {"transitions": np.column_stack([states, actions]).tolist(), "seeds": seeds},
    )

    steps = node["steps"]
    # The port does gymnasium's float64 operations in gymnasium's order: the
    # next state is the same bits whenever Math.sin and Math.cos give numpy's
    # (one or both differ by an ulp for about 2% of these angles on the test machine).
    states_js = np.array([s["state"] for s in steps])
    sin_cos = np.array([s["sinCos"] for s in steps])
    libm_agrees = (sin_cos[:, 0] == np.sin(states[:, 2])) & (sin_cos[:, 1] == np.cos(states[:, 2]))
    assert libm_agrees.sum() > 250
    np.testing.assert_array_equal(states_js[libm_agrees], np.array(expected_states)[libm_agrees])
    np.testing.assert_allclose(states_js, expected_states, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        np.array([s["observation"] for s in steps], np.float32), expected_obs, rtol=1e-6
    )
    assert [s["terminated"] for s in steps] == expected_terminated
    assert 50 < sum(expected_terminated) < 250  # both outcomes were exercised
    # Same seed, same generator (numpy's PCG64 in JS): the same initial state, bit for bit.
    np.testing.assert_array_equal(node["resets"], expected_resets)


# --- real fleets ------------------------------------------------------------------------


def start_node_worker(address: str, *, envs: int, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(NODE),
            str(NODE_WORKER),
            "--coordinator",
            address,
            "--envs",
            str(envs),
            "--name",
            name,
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def start_python_worker(
    address: str, *, envs: int, name: str, imports: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet",
            "worker",
            "--coordinator",
            address,
            "--envs",
            str(envs),
            "--name",
            name,
            "--import",
            "rlfleet.envs.cartpole_js",
            *(flag for module in imports for flag in ("--import", module)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )


def stop(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    """SIGTERMs a worker; returns its exit code and stderr."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    stderr = process.stderr.read().decode() if process.stderr else ""
    return process.returncode, stderr


def wait_for_workers(sampler: RemoteSampler, count: int, timeout: float = 60.0) -> dict[str, int]:
    """Waits until ``count`` workers are idle; returns their ids by name."""

    def idle() -> dict[str, int] | None:
        workers = sampler.status().workers
        if len(workers) == count and all(w.state == "idle" for w in workers):
            return {w.name: w.worker_id for w in workers}
        return None

    return wait_until(idle, f"{count} idle workers", timeout=timeout)


@pytest.fixture
def coordinator() -> Iterator[CoordinatorServer]:
    config = CoordinatorConfig(
        listen="127.0.0.1:0", env=EnvConfig(JS_ENV), wait_for_workers_seconds=30.0
    )
    with serve(config) as server:
        yield server


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        stop(process)


def check_batch(batch: EpisodeBatch, *, version: int, worker_ids: set[int]) -> None:
    """Checks the invariants every answer has, whoever produced it."""
    n, total = batch.n_episodes, batch.total_steps
    assert batch.observations.shape == (total, 4) and batch.observations.dtype == np.float32
    assert batch.last_observations.shape == (n, 4)
    assert batch.actions.dtype == np.int64 and set(np.unique(batch.actions)) <= {0, 1}
    assert batch.rewards.dtype == np.float64
    infos = batch.episode_infos
    assert set(infos) >= {"agent_version", "env_seed", "policy_seed", "episode_index", "worker"}
    assert (infos["agent_version"] == version).all()
    assert set(infos["worker"].tolist()) <= worker_ids
    assert batch.lengths.min() >= 1 and batch.lengths.max() <= 500


def test_node_worker_serves_every_mode(
    coordinator: CoordinatorServer, processes: list[subprocess.Popen[bytes]]
) -> None:
    processes.append(start_node_worker(coordinator.address, envs=3, name="node-a"))
    with RemoteSampler(coordinator.address, seed=3, timeout=60) as sampler:
        ids = wait_for_workers(sampler, 1)
        assert sampler.status().workers[0].implementation.startswith("rlfleet-node/")
        # Its tasks' units come as columns.
        assert UNIT_COLUMNS_CAPABILITY in fleet_status(coordinator.address).workers[0].capabilities
        assert sampler.env_spec == JS_SPEC  # the Node worker's EnvReady, decoded by Python

        episodes = sampler.obtain_episodes(7)
        check_batch(episodes, version=0, worker_ids=set(ids.values()))
        assert episodes.episode_infos["episode_index"].tolist() == list(range(7))
        first = np.concatenate([[0], np.cumsum(episodes.lengths)[:-1]])
        assert (episodes.step_types[first] == StepType.FIRST).all()
        assert set(episodes.step_types[np.cumsum(episodes.lengths) - 1]) <= {
            StepType.TERMINAL,
            StepType.TIMEOUT,
        }

        steps = sampler.obtain_samples(1, 300)
        check_batch(steps, version=0, worker_ids=set(ids.values()))
        assert steps.total_steps >= 300 > steps.total_steps - steps.lengths[-1]

        fragments = sampler.obtain_fragments(60, 10)
        check_batch(fragments, version=0, worker_ids=set(ids.values()))
        assert fragments.total_steps >= 60 and (fragments.lengths <= 10).all()
        streams = fragments.episode_infos["stream"]
        for stream in np.unique(streams):
            assert fragments.lengths[streams == stream].sum() % 10 == 0  # whole windows

        # A pushed MLP reaches the Node worker; a bad parameter is refused by name.
        policy = MLPCategoricalPolicy(JS_SPEC, hidden_sizes=(8,), seed=0)
        version = sampler.update_agent(policy)
        check_batch(sampler.obtain_episodes(4), version=version, worker_ids=set(ids.values()))
        bad = {"layers.0.weight": np.zeros((3, 8), np.float32)}
        with pytest.raises(PolicyError, match=r"layers\.0\.weight.*\(4, 8\)"):
            sampler.update_agent(bad)
        with pytest.raises(EnvNotFoundError, match="rlfleet/CartPoleJS-v0"):
            sampler.update_env("CartPole-v1")
        for vectorization in ("vector_entry_point", "subprocess"):
            config = EnvConfig(JS_ENV, vectorization=vectorization)
            with pytest.raises(ConfigError, match="not implemented by the Node worker"):
                sampler.update_env(config)


def test_same_seeds_give_the_same_episodes_in_both_languages(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """Not a promise of the protocol (libm may round sin/cos differently),
    but with the same PCG64 draws and float64 dynamics the episodes agree."""
    batches = []
    for start in (start_node_worker, start_python_worker):
        config = CoordinatorConfig(listen="127.0.0.1:0", env=EnvConfig(JS_ENV))
        with serve(config) as server:
            worker = start(server.address, envs=2, name=start.__name__)
            processes.append(worker)
            with RemoteSampler(server.address, seed=21, timeout=60) as sampler:
                wait_for_workers(sampler, 1)
                # Both read their units as columns.
                assert (
                    UNIT_COLUMNS_CAPABILITY in fleet_status(server.address).workers[0].capabilities
                )
                batches.append(sampler.obtain_episodes(6))
            stop(worker)
    node, python = batches
    np.testing.assert_array_equal(node.lengths, python.lengths)
    np.testing.assert_array_equal(node.actions, python.actions)
    np.testing.assert_array_equal(node.step_types, python.step_types)
    np.testing.assert_allclose(node.observations, python.observations, rtol=1e-6, atol=1e-7)
    for key in ("env_seed", "policy_seed", "episode_index", "agent_version"):
        np.testing.assert_array_equal(node.episode_infos[key], python.episode_infos[key])


def balancing_params(gain: float) -> dict[str, np.ndarray]:
    """An 8-unit tanh MLP whose first unit steers the pole: long CartPole episodes."""
    rng = np.random.default_rng(2)
    w0 = rng.normal(0.0, 0.3, (4, 8))
    w0[:, 0] = [0.05, 0.5, 3.0, 1.0]  # positive when the pole falls right: push right
    w1 = rng.normal(0.0, 0.2, (8, 2))
    w1[0] = [-gain, gain]
    values = {
        "layers.0.weight": w0,
        "layers.0.bias": rng.normal(0.0, 0.1, 8),
        "layers.1.weight": w1,
        "layers.1.bias": np.zeros(2),
    }
    return {name: value.astype(np.float32) for name, value in values.items()}


def test_node_worker_episodes_follow_the_reference(
    coordinator: CoordinatorServer, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Whole episodes of a Node worker against tests/mlp_reference.py and gymnasium.

    Every step's logits, log_prob and action are the reference's, bit for bit,
    for the worker's observation and the episode's next draw from
    default_rng(policy_seed). The observations are gymnasium's CartPole-v1
    replayed from env_seed with the same actions, bit for bit until a
    Math.sin or Math.cos rounding (an ulp off libm's) first shows in a float32
    observation, and close there; most episodes never get there.
    """
    processes.append(start_node_worker(coordinator.address, envs=3, name="node"))
    params = balancing_params(gain=2.0)
    policy = MLPCategoricalPolicy(JS_SPEC, hidden_sizes=(8,), seed=0)
    policy.set_param_values(params)
    with RemoteSampler(coordinator.address, seed=4, timeout=60) as sampler:
        wait_for_workers(sampler, 1)
        sampler.update_agent(policy)
        batch = sampler.obtain_episodes(16)
    assert batch.total_steps > 3000
    layers = reference_layers(params, 1)
    env = gym.make(JS_ENV)
    ends = np.cumsum(batch.lengths)
    identical = 0
    for k, (start, end) in enumerate(zip(ends - batch.lengths, ends, strict=True)):
        observations = batch.observations[start:end]
        actions = batch.actions[start:end]
        logits = ref.forward32(observations, layers, "tanh")
        # random(n) gives the values of n random() calls, one per step.
        draws = np.random.default_rng(batch.episode_infos["policy_seed"][k]).random(end - start)
        rows = [ref.categorical_row(row, u) for row, u in zip(logits, draws, strict=True)]
        np.testing.assert_array_equal(bits(batch.agent_infos["logits"][start:end]), bits(logits))
        np.testing.assert_array_equal(actions, [index for index, _ in rows])
        np.testing.assert_array_equal(
            bits(batch.agent_infos["log_prob"][start:end]), bits([lp for _, lp in rows])
        )

        replay, _ = env.reset(seed=int(batch.episode_infos["env_seed"][k]))
        for t, action in enumerate(actions):
            if not np.array_equal(bits(replay), bits(observations[t])):
                np.testing.assert_allclose(replay, observations[t], rtol=1e-5, atol=1e-6)
                break
            replay, _, terminated, truncated, _ = env.step(int(action))
            assert not (terminated or truncated) or t == end - start - 1
        else:
            np.testing.assert_array_equal(bits(replay), bits(batch.last_observations[k]))
            expected = StepType.TERMINAL if terminated else StepType.TIMEOUT
            assert batch.step_types[end - 1] == expected
            identical += 1
    assert identical >= batch.n_episodes // 2, f"{identical} of {batch.n_episodes} identical"


def test_mixed_fleet_trains_with_pushed_parameters(
    coordinator: CoordinatorServer, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A VPG learner trains through one Python and one Node worker."""
    processes.append(start_python_worker(coordinator.address, envs=2, name="py"))
    processes.append(start_node_worker(coordinator.address, envs=2, name="node"))
    vpg = VPG(JS_SPEC, hidden_sizes=(16,), seed=0)
    with RemoteSampler(coordinator.address, seed=1, timeout=60) as sampler:
        ids = wait_for_workers(sampler, 2)
        for itr in range(3):
            params = vpg.get_params()
            update = (vpg.policy_spec, params) if itr == 0 else params
            batch = sampler.obtain_samples(itr, 400, agent_update=update)
            version = int(batch.episode_infos["agent_version"][0])
            assert version == sampler.agent_version == itr + 1
            check_batch(batch, version=version, worker_ids=set(ids.values()))
            # Both languages took part, each with the pushed version.
            assert set(batch.episode_infos["worker"].tolist()) == {ids["py"], ids["node"]}
            stats = vpg.train_step(batch)
            assert np.isfinite(stats["PolicyLoss"]) and stats["NumSteps"] == batch.total_steps
            after = vpg.get_params()
            assert any(not np.array_equal(after[k], params[k]) for k in params)
    code, stderr = stop(processes.pop())
    assert code == 0, stderr  # SIGTERM: leave gracefully, exit 0


def node_episodes(connection: Connection, count: int) -> EpisodeBatch:
    """The next ``count`` episodes the worker sends, in episode index order."""
    episodes: list[EpisodeBatch] = []
    while len(episodes) < count:
        ((_, batch, _),) = connection.results(1)
        episodes += batch.split()
    return EpisodeBatch.concatenate(
        *sorted(episodes, key=lambda e: int(e.episode_infos["episode_index"][0]))
    )


def test_node_worker_reads_units_as_columns_and_refuses_malformed_ones(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """The same units as columns or as EpisodeUnit messages give the same episodes,
    bit for bit; a Task the worker cannot read is refused by its id, and the stream goes on."""
    scripted = ScriptedCoordinator()
    try:
        processes.append(start_node_worker(scripted.address, envs=3, name="node"))
        connection = scripted.accept()
        assert UNIT_COLUMNS_CAPABILITY in connection.next("hello").message.hello.capabilities
        welcome(connection)
        env_update(connection, 1, JS_ENV)
        assert connection.next("env_ready").message.env_ready.generation == 1

        # Indices past 2**32 and up to 2**53 - 1 stay exact.
        indices = [*range(20), 2**40 + 3, 2**53 - 1]
        units = UnitColumns.seeded(8, 2, indices)
        batches = []
        for task_id, as_columns in ((1, True), (2, False)):
            task = TaskAssignment(task_id, 2, Mode.EPISODES.value, -1, 1, units=units)
            message = encode_task(task, unit_columns=as_columns)
            assert message.HasField("unit_columns") == as_columns
            connection.send(task=message)
            batches.append(node_episodes(connection, len(indices)))
        from_columns, from_messages = batches
        assert from_columns.episode_infos["episode_index"].tolist() == indices
        for key, column in (("env_seed", units.env_seeds), ("policy_seed", units.policy_seeds)):
            np.testing.assert_array_equal(from_columns.episode_infos[key], column)
        assert_same_batch(from_messages, from_columns, {5})

        def refused(task_id: int, **fields: object) -> str:
            message = worker_pb2.Task(
                task_id=task_id,
                request_id=3,
                mode=worker_pb2.SAMPLE_MODE_EPISODES,
                agent_version=-1,
                env_generation=1,
                **fields,  # type: ignore[arg-type]
            )
            connection.send(task=message)
            detail = connection.next("error").message.error.detail
            assert (detail.kind, detail.task_id) == (updates_pb2.ERROR_KIND_PROTOCOL, task_id)
            assert detail.message.startswith(f"task {task_id} asks for units it cannot decode")
            return detail.message

        two = worker_pb2.EpisodeUnitColumns(
            episode_indices=bytes(16), env_seeds=bytes(8), policy_seeds=bytes(8)
        )
        short = worker_pb2.EpisodeUnitColumns(
            episode_indices=bytes(16), env_seeds=bytes(8), policy_seeds=bytes(4)
        )
        assert "columns differ in length" in refused(10, unit_columns=short)
        torn = worker_pb2.EpisodeUnitColumns(
            episode_indices=bytes(16), env_seeds=bytes(7), policy_seeds=bytes(8)
        )
        assert "env_seeds holds 7 bytes" in refused(11, unit_columns=torn)
        both = refused(12, unit_columns=two, units=[worker_pb2.EpisodeUnit(episode_index=1)])
        assert "carries both units and unit_columns" in both
        negative = worker_pb2.EpisodeUnitColumns(
            episode_indices=np.array([0, -1], "<i8").tobytes(),
            env_seeds=bytes(8),
            policy_seeds=bytes(8),
        )
        assert "episode_indices[1]: -1 is negative" in refused(13, unit_columns=negative)
        # The stream goes on: the next task is served.
        connection.send(
            task=encode_task(
                TaskAssignment(14, 4, Mode.EPISODES.value, -1, 1, units=units), unit_columns=True
            )
        )
        again = node_episodes(connection, len(indices))
        assert_same_batch(from_columns, again, {5})
    finally:
        scripted.stop()


def test_node_worker_passes_the_conformance_kit() -> None:
    """Every check of rlfleet's conformance kit (docs/protocol.md, section 9)."""
    worker = NODE_WORKER
    command = f"{NODE} {worker} --coordinator {{address}} --envs 2 --quiet"
    results = run_conformance(command, env_id=JS_ENV)
    failed = [f"{r.name}: {r.message}" for r in results if not r.passed]
    assert not failed, failed
    assert len(results) >= 10


def test_multi_agent_work_goes_only_to_workers_with_the_capability(
    coordinator: CoordinatorServer, processes: list[subprocess.Popen[bytes]]
) -> None:
    """The Node worker lacks "rlfleet.multi-agent": alone, a clear error; beside Python, no work."""
    from rlfleet.core import MultiAgentEpisodeBatch
    from rlfleet.rllib.pettingzoo_envs import SIMPLE_SPREAD
    from rlfleet.rllib.worker_group import RolloutWorkerGroup

    module = "rlfleet.rllib.pettingzoo_envs"
    spread = EnvConfig(SIMPLE_SPREAD, {"max_cycles": 10}, imports=(module,))
    processes.append(start_node_worker(coordinator.address, envs=2, name="node"))
    with RemoteSampler(coordinator.address, seed=1, timeout=60) as sampler:
        wait_for_workers(sampler, 1)
        with pytest.raises(RlfleetError, match=r"declares the capability 'rlfleet\.multi-agent'"):
            sampler.update_env(spread)
        processes.append(
            start_python_worker(
                coordinator.address,
                envs=2,
                name="py",
                imports=("rlfleet.rllib", module),
            )
        )
        ids = wait_for_workers(sampler, 2)
        sampler.update_env(spread)
        group = RolloutWorkerGroup(
            sampler, env=spread, policy_spec={"all": "random"}, rollout_fragment_length=5
        )
        for _ in range(2):
            batch = group.sample()
            assert isinstance(batch, MultiAgentEpisodeBatch)
            rows = batch.policy_batches["all"]
            assert set(rows.episode_infos["worker"].tolist()) == {ids["py"]}
            assert set(rows.episode_infos["agent_id"].tolist()) == {"agent_0", "agent_1", "agent_2"}
        status = {w.name: w for w in sampler.status().workers}
        # The Node worker sat the env out: it never got it, nor its agent.
        assert status["node"].env_generation < status["py"].env_generation
        assert status["node"].units_in_flight == 0
        # Back on a single-agent env while the joint policy is still the agent:
        # the Node worker gets the env but never the joint policy (which it
        # would refuse), then the next agent it can build.
        sampler.update_env(EnvConfig(JS_ENV))
        # One joining now gets the env, not the joint policy.
        processes.append(start_node_worker(coordinator.address, envs=1, name="late"))
        wait_until(
            lambda: "late" in {w.name for w in sampler.status().workers}, "the late Node worker"
        )
        vpg = VPG(JS_SPEC, hidden_sizes=(8,), seed=0)
        sampler.update_agent((vpg.policy_spec, vpg.get_params()))
        # Workers answer in order: a refusal of the joint policy would have
        # come before their ack of this version.
        status = {w.name: w for w in sampler.status().workers}
        for name in ("node", "late"):
            assert status[name].last_error is None, status[name].last_error
            assert status[name].agent_version == sampler.agent_version
        # Then it takes work again.
        batch = sampler.obtain_samples(0, 200)
        workers = {w.name: w.worker_id for w in sampler.status().workers}
        assert set(batch.episode_infos["worker"].tolist()) == set(workers.values())
