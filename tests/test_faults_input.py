"""Bad input, each with a clear error that harms nothing else.

Guarantee 6 of docs/reliability.md: bad actions from a user's policy,
non-finite observations, malformed tensors, unknown fields and dtypes, a
protocol-version mismatch, unknown env ids, parameters that do not fit, and
batches larger than the message limit. The coordinator and the workers are
real processes; the malformed and unusual messages come from a scripted
worker in this process, the only way to send them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError, EnvNotFoundError, PolicyError
from rlfleet.policies import MLPCategoricalPolicy, Policy, PolicySpec
from rlfleet.sampling import LocalSampler
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import batch_pb2, worker_pb2
from rlfleet.wire import chunk_payload, encode_batch
from rlfleet.wire._protowire import encode_varint
from rlfleet.worker.units import EpisodeUnit
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import (
    CAPABILITIES,
    Answer,
    ScriptedWorker,
    assert_same_batch,
    env_config,
    env_ready,
    sample,
)
from tests.fixtures.fault_envs import ENV_ID as BIG_OBS_ENV
from tests.fixtures.fault_policies import FAULTS
from tests.fleet_processes import (
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)

pytestmark = pytest.mark.timeout(240)

SEED = 89
EPISODES = 2  # SAMPLE_MODE_EPISODES
CARTPOLE = EnvConfig("CartPole-v1")
#: An unknown varint field (number 111) a newer peer might add.
UNKNOWN_FIELD = encode_varint((111 << 3) | 0) + encode_varint(7)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def expected_episodes(
    env: EnvConfig, n: int, policy: Policy | PolicySpec | str | None = None
) -> EpisodeBatch:
    """LocalSampler's answer to a first ``obtain_episodes(n)`` with SEED."""
    return local_episodes(env, n, seed=SEED, policy=policy)[0]


def worker_ids(fleet: ProcessFleet) -> dict[str, int]:
    """Connected workers: name -> worker id (a new id means it reconnected)."""
    return {w.name: w.worker_id for w in fleet.status().workers}


# --- a scripted worker that answers with crafted batches ----------------------------------

Corruption = Callable[[batch_pb2.EpisodeBatch], None]


class CraftedWorker:
    """Joins like a worker, beats, and answers each task with a batch the test shapes.

    The episodes are real (run with a VecWorker from the task's seeds); the
    test's ``corrupt`` edits the serialized batch before it is chunked.

    Args:
        address: The coordinator.
        name: Its name.
        hello: Raw bytes of its first message (default: a plain Hello).
    """

    def __init__(self, address: str, name: str, hello: bytes | None = None) -> None:
        self.stream = ScriptedWorker(address)
        self.stream.send(hello if hello is not None else hello_bytes(name))
        self.welcome = self.stream.expect("welcome")
        update = self.stream.expect("env_update")
        env_ready(self.stream, update)
        self.generation = update.generation
        self.env = env_config(update)
        self._batches = 0
        self._stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(self.welcome.heartbeat_interval_seconds):
            self.stream.send(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))

    def next_task(self) -> worker_pb2.Task:
        """The next Task (other messages are skipped)."""
        while True:
            message = self.stream.receive(timeout=60)
            if message.WhichOneof("body") == "task":
                return message.task

    def answer(self, task: worker_pb2.Task, corrupt: Corruption | None = None) -> None:
        """Runs the task's units and sends them as one result, edited by ``corrupt``."""
        units = [EpisodeUnit(u.episode_index, u.env_seed, u.policy_seed) for u in task.units]
        vec = VecWorker(n_envs=1, env=self.env, worker_number=self.welcome.worker_id)
        try:
            batch = vec.run(units)
        finally:
            vec.shutdown()
        message = batch_pb2.EpisodeBatch.FromString(encode_batch(batch, include_env_spec=False))
        if corrupt is not None:
            corrupt(message)
        self._batches += 1
        chunks = chunk_payload(
            message.SerializeToString(),
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            max_bytes=16 * 1024,
            batch_id=self._batches,
        )
        meta = worker_pb2.EpisodeResult(
            task_id=task.task_id,
            episode_indices=[u.episode_index for u in units],
            lengths=batch.lengths.tolist(),
            agent_version=task.agent_version,
            env_generation=self.generation,
        )
        for i, chunk in enumerate(chunks):
            envelope = meta if i == 0 else worker_pb2.EpisodeResult()
            self.stream.send(_rpc.WithChunk(worker_pb2.WorkerMessage(result=envelope), chunk))

    def close(self) -> None:
        self._stop.set()
        self.stream.close()


def hello_bytes(name: str, *, version: int = 1, extra: bytes = b"") -> bytes:
    """A serialized WorkerMessage with a Hello, ``extra`` appended inside and outside it."""
    hello = worker_pb2.Hello(
        protocol_version=version,
        capabilities=CAPABILITIES,
        num_envs=1,
        name=name,
        host="testhost",
        pid=1,
        implementation="rlfleet-tests",
    ).SerializeToString()
    inner = hello + extra
    return encode_varint((1 << 3) | 2) + encode_varint(len(inner)) + inner + extra


def truncate_observations(message: batch_pb2.EpisodeBatch) -> None:
    """Observation bytes 4 short of what dtype and shape say."""
    message.observations.data = message.observations.data[:-4]


def unknown_dtype(message: batch_pb2.EpisodeBatch) -> None:
    """A dtype number protocol version 1 does not define."""
    message.observations.dtype = 99  # type: ignore[assignment]


def unknown_codec(message: batch_pb2.EpisodeBatch) -> None:
    """A codec (compression) protocol version 1 does not define."""
    message.observations.codec = 5  # type: ignore[assignment]


def unknown_fields(message: batch_pb2.EpisodeBatch) -> None:
    """Fields a newer sender might add: in a Tensor and in the batch itself."""
    message.observations.MergeFromString(UNKNOWN_FIELD)
    message.MergeFromString(UNKNOWN_FIELD)


# --- bad actions from a user policy ---------------------------------------------------------


def test_bad_actions_from_a_user_policy_fail_the_request_and_nothing_else(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator()
    fleet.start_worker(imports=["tests.fixtures.fault_policies"])
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    complaints = {
        "range": "an invalid action for env 0: 2 is outside action space Discrete(2)",
        "shape": "actions of shape (1, 2) for 1 envs (env indices [0])",
        "dtype": "actions of dtype float64 for action space Discrete(2)",
    }
    for fault in FAULTS:
        sampler.update_agent(
            PolicySpec("tests.fixtures.fault_policies:BadActionPolicy", {"fault": fault})
        )
        with pytest.raises(PolicyError) as failure:
            sampler.obtain_episodes(2)
        message = str(failure.value)
        assert f"BadActionPolicy.get_actions returned {complaints[fault]}" in message, message
        assert "worker 'w0'" in message, message
    # A fixed policy samples again, on the same worker (its call never ended).
    ids = worker_ids(fleet)
    sampler.update_agent("random")
    assert_same_batch(
        sampler.obtain_episodes(4), expected_episodes(CARTPOLE, 4, "random"), skip_infos=_VERSION
    )
    assert worker_ids(fleet) == ids


_VERSION = ("worker", "agent_version")


# --- non-finite observations ------------------------------------------------------------------


def test_nonfinite_observations_are_an_error_a_flag_or_ignored_as_configured(
    fleet: ProcessFleet,
) -> None:
    # Counter observations count steps: [0], [1], NaN (step 2), [3]; last [4].
    nan_env = EnvConfig("rlfleet/NaN-v0", {"nan_at_step": 2, "length": 4})
    fleet.start_coordinator(*env_flags(nan_env))
    sampler = fleet.sampler(seed=SEED, timeout=120)
    observed = np.array([0, 1, np.nan, 3] * 2, dtype=np.float32)

    error_worker = fleet.start_worker("--nonfinite", "error", imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(1)
    with pytest.raises(EnvError) as failure:
        sampler.obtain_episodes(2)
    assert (failure.value.worker, failure.value.env_index, failure.value.step) == (
        error_worker.name,
        0,
        2,
    )
    assert "non-finite observation" in str(failure.value)
    fleet.kill(error_worker)

    for mode in ("flag", "ignore"):
        worker = fleet.start_worker("--nonfinite", mode, imports=[TEST_ENVS_MODULE])
        fleet.wait_for_workers(1)
        batch = sampler.obtain_episodes(2)
        np.testing.assert_array_equal(batch.observations.ravel(), observed)
        np.testing.assert_array_equal(batch.last_observations.ravel(), [4, 4])
        if mode == "flag":  # the step that returned it and the step that acted on it
            flags = [False, True, True, False] * 2
            np.testing.assert_array_equal(batch.env_infos["nonfinite_obs"], flags)
        else:
            assert "nonfinite_obs" not in batch.env_infos
        fleet.kill(worker)


# --- malformed messages from a worker --------------------------------------------------------


@pytest.mark.parametrize(
    ("corrupt", "complaint"),
    [(truncate_observations, "bytes"), (unknown_dtype, "dtype"), (unknown_codec, "codec")],
    ids=["bytes-short-of-dtype-and-shape", "unknown-dtype", "unknown-codec"],
)
def test_a_malformed_batch_ends_only_its_senders_call(
    fleet: ProcessFleet, corrupt: Corruption, complaint: str
) -> None:
    fleet.start_coordinator()
    fleet.start_worker()
    fleet.wait_for_workers(1)
    crafted = CraftedWorker(fleet.address, "crafted")
    fleet.wait_for_workers(2)
    honest = {name: id_ for name, id_ in worker_ids(fleet).items() if name != "crafted"}
    try:
        pending = run_in_thread(
            lambda: sample(fleet.address, mode=EPISODES, amount=8, seed=SEED, request_index=0)
        )
        crafted.answer(crafted.next_task(), corrupt)
        ended = crafted.stream.ended(timeout=60)
    finally:
        crafted.close()
    assert ended is not None and ended.code is grpc.StatusCode.INVALID_ARGUMENT, ended
    assert complaint in ended.details and "observations" in ended.details, ended.details

    result: Answer = pending(120)
    assert_same_batch(result.batch, expected_episodes(CARTPOLE, 8))
    assert result.footer.reassigned_units >= 1
    # The honest worker's call never ended; the coordinator serves on.
    assert worker_ids(fleet) == honest


def test_unknown_fields_are_skipped(fleet: ProcessFleet) -> None:
    fleet.start_coordinator()
    # Unknown fields in the Hello, in the WorkerMessage, in a Tensor and in the batch.
    crafted = CraftedWorker(fleet.address, "newer", hello=hello_bytes("newer", extra=UNKNOWN_FIELD))
    try:
        fleet.wait_for_workers(1)
        pending = run_in_thread(
            lambda: sample(fleet.address, mode=EPISODES, amount=3, seed=SEED, request_index=0)
        )
        answered = 0
        while answered < 3:  # one slot: tasks of 1-2 units until all 3 came back
            task = crafted.next_task()
            crafted.answer(task, unknown_fields)
            answered += len(task.units)
        result: Answer = pending(120)
    finally:
        crafted.close()
    assert_same_batch(result.batch, expected_episodes(CARTPOLE, 3))
    assert set(result.batch.episode_infos["worker"].tolist()) == {crafted.welcome.worker_id}


def test_a_protocol_version_mismatch_is_refused_at_the_handshake(fleet: ProcessFleet) -> None:
    fleet.start_coordinator()
    fleet.start_worker()
    fleet.wait_for_workers(1)
    ids = worker_ids(fleet)

    future = ScriptedWorker(fleet.address)
    future.send(hello_bytes("future", version=2))
    refused = future.ended()
    future.close()
    assert refused is not None and refused.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "version 2" in refused.details and "version 1" in refused.details, refused.details

    garbage = ScriptedWorker(fleet.address)
    garbage.send(b"\xff\xff\xff\xff not a protobuf message")
    refused = garbage.ended()
    garbage.close()
    assert refused is not None and refused.code is grpc.StatusCode.INVALID_ARGUMENT

    assert worker_ids(fleet) == ids
    with fleet.sampler(seed=SEED, timeout=120) as sampler:
        assert_same_batch(sampler.obtain_episodes(3), expected_episodes(CARTPOLE, 3))


# --- bad updates from the learner -------------------------------------------------------------


def test_unknown_env_ids_and_unfitting_parameters_leave_the_fleet_as_it_was(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator()
    fleet.start_worker()
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)

    with pytest.raises(EnvNotFoundError) as missing:
        sampler.update_env("rlfleet-tests/NoSuchEnv-v0")
    assert "rlfleet-tests/NoSuchEnv-v0" in str(missing.value)

    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=[4], seed=3)
    sampler.update_agent(policy)
    params = policy.get_param_values()
    name = sorted(params)[0]
    for wrong, named in (
        ({"no_such_layer": np.zeros(3, np.float32)}, "no_such_layer"),
        ({name: np.zeros((2, 2), np.float32)}, name),
    ):
        with pytest.raises(PolicyError) as refused:
            sampler.update_agent(wrong)
        assert named in str(refused.value), str(refused.value)

    # Still CartPole, still the policy that was accepted.
    assert_same_batch(
        sampler.obtain_episodes(4), expected_episodes(CARTPOLE, 4, policy), skip_infos=_VERSION
    )


# --- batches above the message limit ------------------------------------------------------------


def test_a_batch_of_several_mebibytes_is_chunked_never_refused(fleet: ProcessFleet) -> None:
    # 2 episodes x 13 observations of 256 KiB: about 6.5 MiB, with every
    # message (worker -> coordinator -> learner) capped at 1 MiB.
    limit = 1 << 20
    big = EnvConfig(BIG_OBS_ENV, {"obs_shape": [256, 256], "length": 12})
    fleet.start_coordinator(*env_flags(big), "--max-message-bytes", str(limit))
    fleet.start_worker(imports=["tests.fixtures.fault_envs"])
    fleet.wait_for_workers(1)
    with fleet.sampler(seed=SEED, timeout=120, max_message_bytes=limit) as sampler:
        batch = sampler.obtain_episodes(2)
    assert batch.observations.nbytes >= 6 * limit
    twin = EnvConfig(BIG_OBS_ENV, dict(big.kwargs), imports=("tests.fixtures.fault_envs",))
    assert_same_batch(batch, expected_episodes(twin, 2))


class _ShapeChangingEnv(gym.Env[np.ndarray, np.int64]):
    """Observations of 3 values, but 4 at step 3 of every episode."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, object] | None = None
    ) -> tuple[np.ndarray, dict[str, object]]:
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, object]]:
        self.t += 1
        return np.zeros(4 if self.t == 3 else 3, np.float32), 1.0, self.t >= 10, False, {}


def test_an_observation_of_another_shape_names_its_env_step_and_shapes() -> None:
    # The ring stores a vector step's outputs at once; when they do not fit,
    # it stores them one by one to find which env's do.
    sampler = LocalSampler(_ShapeChangingEnv, envs_per_worker=2, seed=1)
    shapes = r"observation of shape \(4,\) \(the space has \(3,\)\)"
    with pytest.raises(EnvError, match=shapes) as e:
        sampler.obtain_episodes(4)
    assert "step 3" in str(e.value)
