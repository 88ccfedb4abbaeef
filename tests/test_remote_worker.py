"""The worker process (``rlfleet worker``) over real gRPC.

Most tests put a real worker process in front of a scripted coordinator (a
gRPC server whose Join handler the test drives message by message), so the
protocol can be checked exactly: handshake, EnvReady, results and their
chunks, refusals, Cancel, Drain, SIGTERM. The last ones use the real
coordinator: reconnecting after it restarts, and leaving mid-request.
"""

from __future__ import annotations

import gc
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar

import grpc
import numpy as np
import pytest

from rlfleet.cli.health import check as check_health
from rlfleet.client import Fleet, RemoteSampler
from rlfleet.client.fleet import WorkerProcess, spawn_worker, stop_processes
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs import EnvConfig
from rlfleet.errors import UnavailableError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.sampling.local import LocalSampler
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import tensor_pb2, updates_pb2, worker_pb2
from rlfleet.wire import ChunkAssembler, decode_batch, decode_env_spec, encode_tensor_map
from rlfleet.worker._flush import TAIL_SECONDS, FlushPolicy
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.remote import RemoteWorker, WorkerConfig
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker
from tests.fleet_processes import ProcessFleet
from tests.test_fleet_equivalence import assert_same_batch
from tests.test_result_message import python_calls
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")

TESTING = "rlfleet.envs.testing"
CARTPOLE = EnvConfig("CartPole-v1")
PATIENCE = 30.0


class Connection:
    """One Join call on the scripted coordinator: what the worker sent, what to send it."""

    def __init__(self) -> None:
        self.env_spec: EnvSpec | None = None  # from the worker's last EnvReady
        self.received: queue.Queue[_rpc.WithChunk | None] = queue.Queue()
        self.to_send: queue.Queue[worker_pb2.CoordinatorMessage | grpc.StatusCode | None] = (
            queue.Queue()
        )

    def send(self, **body: object) -> None:
        self.to_send.put(worker_pb2.CoordinatorMessage(**body))  # type: ignore[arg-type]

    def next(self, kind: str, timeout: float = PATIENCE) -> _rpc.WithChunk:
        """The next message of this kind (heartbeats skipped unless asked for)."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.received.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert item is not None, f"the worker closed its stream while {kind} was awaited"
            body = item.message.WhichOneof("body")
            if body == "env_ready":
                self.env_spec = decode_env_spec(item.message.env_ready.env_spec)
            if body == kind:
                return item
            assert body == "heartbeat", f"expected {kind}, got {body}: {item.message}"

    def results(self, count: int) -> list[tuple[worker_pb2.EpisodeResult, EpisodeBatch, int]]:
        """``count`` complete results: (metadata, batch, number of chunks)."""
        out: list[tuple[worker_pb2.EpisodeResult, EpisodeBatch, int]] = []
        assembler = ChunkAssembler()
        chunks = 0
        meta = None
        while len(out) < count:
            item = self.next("result")
            assert item.chunk is not None
            meta = item.message.result if item.chunk.index == 0 else meta
            chunks += 1
            payload = assembler.add(item.chunk)
            if payload is not None:
                assert meta is not None
                batch = decode_batch(payload, env_spec=self.env_spec)
                assert isinstance(batch, EpisodeBatch)
                out.append((meta, batch, chunks))
                chunks = 0
        return out

    def closed(self, timeout: float = PATIENCE) -> None:
        """Waits for the worker to close its side, skipping what it sends before."""
        deadline = time.monotonic() + timeout
        while (
            item := self.received.get(timeout=max(deadline - time.monotonic(), 0.01))
        ) is not None:
            assert item.message.WhichOneof("body") in ("heartbeat", "result")


class ScriptedCoordinator:
    """A gRPC server with a Join handler the test scripts."""

    def __init__(self) -> None:
        self.connections: queue.Queue[Connection] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        join = grpc.stream_stream_rpc_method_handler(
            self._join,
            request_deserializer=_rpc.chunked_deserializer(worker_pb2.WorkerMessage),
            response_serializer=_rpc.serialize,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_rpc.WORKER_SERVICE, {"Join": join}),)
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accept(self, timeout: float = PATIENCE) -> Connection:
        return self.connections.get(timeout=timeout)

    def stop(self) -> None:
        self._server.stop(None).wait()

    def _join(
        self, requests: Iterator[_rpc.WithChunk], context: grpc.ServicerContext
    ) -> Iterator[worker_pb2.CoordinatorMessage]:
        connection = Connection()

        def read() -> None:
            try:
                for item in requests:
                    connection.received.put(item)
            except grpc.RpcError:
                pass
            connection.received.put(None)
            connection.to_send.put(None)  # the worker closed its side: end the call

        threading.Thread(target=read, daemon=True).start()
        self.connections.put(connection)
        while True:
            item = connection.to_send.get()
            if item is None:
                return
            if isinstance(item, grpc.StatusCode):
                context.abort(item, "the scripted coordinator refuses this worker")
            yield item


@pytest.fixture
def scripted() -> Iterator[ScriptedCoordinator]:
    coordinator = ScriptedCoordinator()
    try:
        yield coordinator
    finally:
        coordinator.stop()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Worker processes a test starts; all stopped (trees killed) at the end."""
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        stop_processes([w.process for w in started], grace=5.0)


def start_worker(
    workers: list[WorkerProcess],
    address: str,
    tmp_path: Path,
    *,
    envs: int = 1,
    name: str = "tester",
) -> WorkerProcess:
    worker = spawn_worker(
        address,
        name=name,
        envs=envs,
        imports=(TESTING,),
        log_path=tmp_path / f"{name}.log",
        log_level="INFO",
        extra_args=("--reconnect-max-seconds", "0.5", "--heartbeat-interval", "0.2"),
    )
    workers.append(worker)
    return worker


def welcome(
    connection: Connection, *, max_message_bytes: int = 1 << 22, first_stream: int = 10
) -> None:
    connection.send(
        welcome=worker_pb2.Welcome(
            protocol_version=1,
            worker_id=5,
            name="tester",
            heartbeat_interval_seconds=0.2,
            heartbeat_timeout_seconds=5,
            max_message_bytes=max_message_bytes,
            first_stream=first_stream,
        )
    )


def env_update(connection: Connection, generation: int, env_id: str, **kwargs: object) -> None:
    connection.send(
        env_update=updates_pb2.EnvUpdate(
            generation=generation, env_id=env_id, kwargs_json=json.dumps(kwargs)
        )
    )


def units(n: int, request: int = 0) -> list[worker_pb2.EpisodeUnit]:
    return [
        worker_pb2.EpisodeUnit(episode_index=k, env_seed=e, policy_seed=p)
        for k in range(n)
        for e, p in [episode_seeds(3, request, k)]
    ]


def episode_task(
    task_id: int, n: int, *, agent_version: int = 0, generation: int = 1
) -> worker_pb2.Task:
    return worker_pb2.Task(
        task_id=task_id,
        request_id=task_id,
        mode=worker_pb2.SAMPLE_MODE_EPISODES,
        agent_version=agent_version,
        env_generation=generation,
        units=units(n),
    )


def joined(
    scripted: ScriptedCoordinator,
    workers: list[WorkerProcess],
    tmp_path: Path,
    *,
    envs: int = 1,
    env_kwargs: dict[str, object] | None = None,
    max_message_bytes: int = 1 << 22,
) -> Connection:
    start_worker(workers, scripted.address, tmp_path, envs=envs)
    connection = scripted.accept()
    connection.next("hello")
    welcome(connection, max_message_bytes=max_message_bytes)
    env_update(connection, 1, "rlfleet/Counter-v0", **(env_kwargs or {"length": 3}))
    assert connection.next("env_ready").message.env_ready.generation == 1
    return connection


def test_hello_env_ready_results_and_heartbeats(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = start_worker(workers, scripted.address, tmp_path, envs=2)
    connection = scripted.accept()
    hello = connection.next("hello").message.hello
    assert (hello.protocol_version, hello.num_envs, hello.name, hello.pid) == (
        1,
        2,
        "tester",
        worker.process.pid,
    )
    assert list(hello.capabilities) == [
        "rlfleet.episodes",
        "rlfleet.fragments",
        "rlfleet.multi-agent",
        "rlfleet.stream-takeover",
        "rlfleet.unit-columns",
        "rlfleet.leases",
        "rlfleet.data-results",
        "rlfleet.results-switch",
        "rlfleet.data-tasks",
        "rlfleet.data-heartbeats",
    ]
    assert hello.implementation.startswith("rlfleet-python/")
    welcome(connection)
    env_update(connection, 1, "rlfleet/Counter-v0", length=3)
    ready = connection.next("env_ready").message.env_ready
    expected = EnvConfig("rlfleet/Counter-v0", {"length": 3}, imports=(TESTING,)).env_spec()
    assert ready.generation == 1 and decode_env_spec(ready.env_spec) == expected

    connection.send(task=episode_task(1, 5))
    got = connection.results(1)
    while sum(len(meta.episode_indices) for meta, _, _ in got) < 5:
        got += connection.results(1)
    indices = [i for meta, _, _ in got for i in meta.episode_indices]
    assert sorted(indices) == [0, 1, 2, 3, 4]
    for meta, batch, _ in got:
        assert (meta.task_id, meta.agent_version, meta.env_generation) == (1, 0, 1)
        assert list(meta.lengths) == batch.lengths.tolist() == [3] * len(meta.lengths)
        infos = batch.episode_infos
        assert infos["episode_index"].tolist() == list(meta.episode_indices)
        assert infos["worker"].tolist() == [5] * batch.n_episodes  # the Welcome's worker id
        for k, env_seed in zip(infos["episode_index"], infos["env_seed"], strict=True):
            assert env_seed == episode_seeds(3, 0, int(k))[0]
        # Counter observations count the steps of each episode.
        assert batch.observations[:, 0].tolist() == [0, 1, 2] * batch.n_episodes
    beats = connection.next("heartbeat").message.heartbeat
    while beats.steps_total < 15:
        beats = connection.next("heartbeat").message.heartbeat
    assert beats.steps_total == 15 and beats.active_envs == 0 and beats.queued_units == 0


def test_finished_episodes_are_grouped_until_the_queue_runs_out(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    connection = joined(scripted, workers, tmp_path, envs=2)
    connection.send(task=episode_task(1, 20))
    got = connection.results(1)
    while sum(len(meta.episode_indices) for meta, _, _ in got) < 20:
        got += connection.results(1)
    assert sorted(i for meta, _, _ in got for i in meta.episode_indices) == list(range(20))
    # Two results: the 18 episodes finished when the last units start, then
    # the last 2. (Only a machine stalled for the 0.1 s timer splits more.)
    assert len(got) <= 4


def _due(
    policy: FlushPolicy,
    now: float,
    finished_steps: int,
    *,
    queued_units: int = 5,
    running: int = 8,
    slots: int = 8,
    step_seconds: float = 0.01,
) -> bool:
    stepped = SimpleNamespace(active_count=running, n_envs=slots)
    return policy.after_step(now, queued_units, finished_steps, stepped, step_seconds)


def test_the_flush_policy_holds_episodes_back_until_a_bound_or_an_empty_queue() -> None:
    policy = FlushPolicy(max_steps=100, max_bytes=10_000, max_seconds=0.5)
    assert not _due(policy, 10.0, 30)
    assert not _due(policy, 10.25, 99)
    assert _due(policy, 10.5, 99)  # timer
    policy.sent()
    assert not _due(policy, 11.0, 1)
    assert not _due(policy, 11.25, 99)
    assert _due(policy, 11.25, 100)  # steps
    policy.sent()
    assert _due(policy, 12.0, 1, queued_units=0, running=0)  # dry, nothing running
    policy.sent()
    assert _due(policy, 13.0, 1, step_seconds=0.5)  # slow step


def test_out_of_work_the_flush_policy_waits_briefly_for_the_running_episodes() -> None:
    """A request's tail: episodes still running share a result for up to TAIL_SECONDS."""
    policy = FlushPolicy(max_steps=100, max_bytes=10_000, max_seconds=0.5)

    def tail(now: float, finished_steps: int, running: int) -> bool:
        return _due(
            policy,
            now,
            finished_steps,
            queued_units=0,
            running=running,
            slots=64,
            step_seconds=0.001,
        )

    assert not tail(20.0, 3, running=60)
    assert not tail(20.0 + TAIL_SECONDS / 2, 9, running=55)
    assert tail(20.0 + TAIL_SECONDS, 12, running=50)
    policy.sent()
    assert not tail(21.0, 3, running=1)
    # The last episode ended: no reason to wait.
    assert tail(21.001, 5, running=0)


def test_the_flush_policy_sends_once_half_the_slots_are_idle_when_out_of_work() -> None:
    policy = FlushPolicy(max_steps=100, max_bytes=10_000, max_seconds=0.5)
    ms = TAIL_SECONDS / 10
    # Out of work, but most slots still run episodes: one result per
    # episode that ends would cost a message each.
    assert not _due(policy, 12.0, 1, queued_units=0, running=7)
    assert not _due(policy, 12.0 + ms, 2, queued_units=0, running=5)
    assert _due(policy, 12.0 + 2 * ms, 3, queued_units=0, running=4)  # half idle
    policy.sent()
    # Then not per slot that goes idle, only after TAIL_SECONDS...
    assert not _due(policy, 13.0, 1, queued_units=0, running=3)
    assert not _due(policy, 13.0 + ms, 2, queued_units=0, running=1)
    assert _due(policy, 13.0 + TAIL_SECONDS + ms, 2, queued_units=0, running=1)
    policy.sent()
    # ...and a refill (units queued again) arms the rule for the next dry spell.
    assert not _due(policy, 14.0, 1, queued_units=3)
    assert _due(policy, 14.0 + ms, 1, queued_units=0, running=4)


def test_the_reads_after_each_vector_step_make_one_python_call_each() -> None:
    """What a session reads after every vector step (the finished episodes' count
    and steps, whether the worker was asked to leave) is one Python call each,
    and right: a native worker takes a vector step of 64 envs in about 80 us, and
    every call nested behind a read costs it about 0.1 us."""
    vec = VecWorker(n_envs=4, env=EnvConfig("CartPole-v1", vectorization="vector_entry_point"))
    worker = RemoteWorker(WorkerConfig("local:0"))
    try:
        vec.submit(make_units(0, 0, range(12)))
        while vec.finished_count < 2:
            vec.step()
        count, steps = vec.finished_count, vec.finished_steps
        for read in (
            lambda: vec.finished_count,
            lambda: vec.finished_steps,
            lambda: worker.leave_requested,
        ):
            assert python_calls(read) == 2  # the lambda and the property, nothing behind
        batch = vec.take_finished()
        assert batch is not None and (batch.n_episodes, batch.total_steps) == (count, steps)
        assert (vec.finished_count, vec.finished_steps) == (0, 0)
        assert not worker.leave_requested
        worker.request_leave("a test")
        assert worker.leave_requested
    finally:
        vec.shutdown()


def test_a_busy_sessions_reads_around_each_vector_step_make_few_python_calls() -> None:
    """Before each vector step a busy native session's TaskBook reads its VecWorker's
    counts in one call and its leased envs' count in a C call, and after it the
    flush decision with units queued is one call: each Python call nested there
    costs a native worker about 0.1 us per vector step. Both answer as before: no
    block handed while every slot is held, and a send exactly at the step bound."""
    env = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
    vec = VecWorker(n_envs=8, env=env, policy="mlp-categorical")
    try:
        book = TaskBook(vec)
        units = UnitColumns.seeded(0, 0, np.arange(100))
        book.add(EpisodeTask(task_id=1, request_id=1, agent_version=-1, env_generation=0), units)
        vec.step()
        counts = vec.unit_counts()
        assert counts == (vec.active_count, vec.queued_count) and sum(counts) >= 8
        assert counts[1] > 0  # units queued in the VecWorker: no block due
        waiting = book.queued_units
        policy = FlushPolicy(max_steps=100, max_bytes=10_000, max_seconds=0.5)
        gc.disable()  # a collection may run the test runner's Python callbacks
        try:
            feed_calls = python_calls(book.feed)
            decide_calls = python_calls(lambda: policy.after_step(1.0, 5, 99, vec, 0.001))
        finally:
            gc.enable()
        assert feed_calls == 2  # feed and unit_counts: the leases' count is a C call
        assert decide_calls == 2  # the lambda and after_step
        assert book.queued_units == waiting and vec.unit_counts() == counts
        assert not policy.after_step(1.0, 5, 99, vec, 0.001)
        assert policy.after_step(1.0, 5, 100, vec, 0.001)
    finally:
        vec.shutdown()


def test_the_flush_policy_sends_large_steps_sooner() -> None:
    policy = FlushPolicy(max_steps=100, max_bytes=10_000, max_seconds=0.5)
    policy.expect_step_bytes(50.0)  # 200 steps would fit: the step bound rules
    assert policy.step_limit == 100
    policy.expect_step_bytes(400.0)  # 25 steps make 10,000 bytes
    assert policy.step_limit == 25
    assert not _due(policy, 1.0, 24)
    assert _due(policy, 1.0, 25)
    policy.expect_step_bytes(1e9)  # one step is too big already: still one per result
    assert policy.step_limit == 1


def test_results_bigger_than_the_message_limit_are_chunked(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    connection = joined(
        scripted, workers, tmp_path, env_kwargs={"length": 3000}, max_message_bytes=16 * 1024
    )
    connection.send(task=episode_task(1, 1))
    ((meta, batch, chunks),) = connection.results(1)
    assert chunks >= 3
    assert list(meta.lengths) == [3000]
    assert batch.observations[:, 0].tolist() == list(range(3000))


def test_refusals_name_what_is_wrong(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    connection = joined(scripted, workers, tmp_path)

    def error() -> updates_pb2.ErrorDetail:
        return connection.next("error").message.error.detail

    connection.send(task=episode_task(7, 1, agent_version=4))
    detail = error()
    assert (detail.kind, detail.task_id) == (updates_pb2.ERROR_KIND_PROTOCOL, 7)
    assert "agent version 4, this worker has 0" in detail.message

    env_update(connection, 2, "gymnasium.envs.classic_control:CartPoleEnv")
    detail = error()
    assert detail.kind == updates_pb2.ERROR_KIND_ENV_CONFIG
    assert "names a module to import" in detail.message and detail.worker == "tester"
    env_update(connection, 3, "NoSuchEnv-v0")
    assert error().kind == updates_pb2.ERROR_KIND_ENV_NOT_FOUND

    bad = updates_pb2.AgentUpdate(version=1, policy=updates_pb2.PolicySpec(name="mlp-categorical"))
    bad.params.CopyFrom(encode_tensor_map({"layers.0.weight": np.zeros((2, 2), np.float32)}))
    connection.send(agent_update=bad)
    detail = error()
    assert detail.kind == updates_pb2.ERROR_KIND_POLICY and "layers.0.weight" in detail.message
    # Malformed parameters (8 bytes for 3 float32) refuse their version, naming them.
    malformed = tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[3], data=bytes(8))
    unreadable = updates_pb2.AgentUpdate(
        version=5,
        params=tensor_pb2.TensorMap(entries=[tensor_pb2.TensorMapEntry(key="w", tensor=malformed)]),
    )
    connection.send(agent_update=unreadable)
    detail = error()
    assert (detail.kind, detail.agent_version) == (updates_pb2.ERROR_KIND_POLICY, 5)
    assert "agent version 5 refused: WireFormatError" in detail.message
    assert "AgentUpdate.params['w']" in detail.message
    # So does a task whose replay does not decode, naming the task.
    replay = worker_pb2.ReliabilityStreamReplay(
        stream=10, episode_index=0, fragment_index=1, actions=malformed, last_observation=malformed
    )
    connection.send(
        task=worker_pb2.Task(
            task_id=9,
            request_id=9,
            mode=worker_pb2.SAMPLE_MODE_FRAGMENTS,
            agent_version=-1,
            env_generation=1,
            fragment_length=2,
            rounds=1,
            streams=[10],
            replays=[replay],
        )
    )
    detail = error()
    assert (detail.kind, detail.task_id) == (updates_pb2.ERROR_KIND_PROTOCOL, 9)
    assert "task 9 asks for a replay it cannot decode" in detail.message
    assert "ReliabilityStreamReplay.actions" in detail.message
    # And one whose unit columns differ in length (rlfleet.unit-columns).
    columns = worker_pb2.EpisodeUnitColumns(
        episode_indices=bytes(16), env_seeds=bytes(8), policy_seeds=bytes(4)
    )
    connection.send(
        task=worker_pb2.Task(
            task_id=10,
            request_id=10,
            mode=worker_pb2.SAMPLE_MODE_EPISODES,
            agent_version=-1,
            env_generation=1,
            unit_columns=columns,
        )
    )
    detail = error()
    assert (detail.kind, detail.task_id) == (updates_pb2.ERROR_KIND_PROTOCOL, 10)
    assert "task 10 asks for units it cannot decode" in detail.message
    assert "columns differ in length" in detail.message

    good = updates_pb2.AgentUpdate(
        version=2,
        policy=updates_pb2.PolicySpec(name="mlp-categorical", kwargs_json='{"hidden_sizes":[4]}'),
    )
    connection.send(agent_update=good)
    assert connection.next("agent_ready").message.agent_ready.version == 2
    connection.send(task=episode_task(8, 1, agent_version=2))  # still on env generation 1
    ((meta, batch, _),) = connection.results(1)
    assert meta.agent_version == 2 and batch.agent_infos.keys() == {"log_prob", "logits"}


def test_fragment_tasks_send_one_result_per_window(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    connection = joined(scripted, workers, tmp_path, envs=2, env_kwargs={"length": 5})
    connection.send(
        task=worker_pb2.Task(
            task_id=3,
            request_id=3,
            mode=worker_pb2.SAMPLE_MODE_FRAGMENTS,
            agent_version=-1,
            env_generation=1,
            fragment_length=4,
            rounds=2,
            base_seed=9,
        )
    )
    (_, first, _), (meta1, second, _) = connection.results(2)
    assert first.total_steps == second.total_steps == 8  # 2 slots x 4 steps
    assert set(first.episode_infos["stream"].tolist()) == {10, 11}  # first_stream 10
    # Counter episodes are 5 long: window 2 finishes them (1 step) and starts new ones.
    assert first.lengths.tolist() == [4, 4] and second.lengths.tolist() == [1, 3, 1, 3]
    assert second.episode_infos["fragment_index"].tolist() == [1, 0, 1, 0]
    assert list(meta1.episode_indices) == second.episode_infos["episode_index"].tolist()


def test_cancel_drops_units_that_did_not_run(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    start_worker(workers, scripted.address, tmp_path)
    connection = scripted.accept()
    connection.next("hello")
    welcome(connection)
    env_update(connection, 1, "rlfleet/Hanging-v0", hang_seconds=0.3, length=2)
    connection.next("env_ready")
    connection.send(task=episode_task(1, 5))
    connection.send(cancel=worker_pb2.Cancel(task_id=1, episode_indices=[2, 3, 4]))
    got = [i for meta, _, _ in connection.results(1) for i in meta.episode_indices]
    while len(got) < 2:
        got += [i for meta, _, _ in connection.results(1) for i in meta.episode_indices]
    assert sorted(got) == [0, 1]
    with pytest.raises(queue.Empty):  # nothing more comes
        connection.next("result", timeout=1.5)


def test_sigterm_finishes_the_episode_in_flight_and_exits_0(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = start_worker(workers, scripted.address, tmp_path)
    connection = scripted.accept()
    connection.next("hello")
    welcome(connection)
    # Each episode's last step takes 0.5 s: SIGTERM lands while one runs.
    env_update(connection, 1, "rlfleet/Hanging-v0", hang_at_step=2, hang_seconds=0.5, length=2)
    connection.next("env_ready")
    connection.send(task=episode_task(1, 4))
    ((meta, _, _),) = connection.results(1)
    assert list(meta.episode_indices) == [0]
    worker.process.send_signal(signal.SIGTERM)  # episode 1 is running now
    after: list[worker_pb2.WorkerMessage] = []
    while (item := connection.received.get(timeout=PATIENCE)) is not None:
        if item.message.WhichOneof("body") != "heartbeat":
            after.append(item.message)
    assert [m.leaving.reason for m in after if m.HasField("leaving")] == ["got SIGTERM"]
    sent = [i for m in after if m.HasField("result") for i in m.result.episode_indices]
    assert sent == [1]  # finished and sent; 2 and 3 never started
    assert worker.process.wait(timeout=PATIENCE) == 0


def test_drain_closes_the_stream_and_the_worker_joins_again(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    connection = joined(scripted, workers, tmp_path)
    connection.send(drain=worker_pb2.Drain(reason="test", grace_seconds=5))
    connection.closed()
    again = scripted.accept()
    assert again.next("hello").message.hello.name == "tester"


def test_a_protocol_version_refusal_makes_the_worker_exit_1(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = start_worker(workers, scripted.address, tmp_path)
    connection = scripted.accept()
    connection.next("hello")
    connection.to_send.put(grpc.StatusCode.FAILED_PRECONDITION)
    assert worker.process.wait(timeout=PATIENCE) == 1
    assert "refused this worker: protocol version mismatch" in worker.log_tail()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_health_port_serves_while_the_worker_is_joined(
    scripted: ScriptedCoordinator, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    health = f"127.0.0.1:{free_port()}"
    worker = spawn_worker(
        scripted.address,
        name="tester",
        log_path=tmp_path / "tester.log",
        extra_args=("--health-listen", health, "--heartbeat-interval", "0.2"),
    )
    workers.append(worker)
    connection = scripted.accept()
    connection.next("hello")
    assert check_health(health) == "NOT_SERVING"  # not joined yet
    welcome(connection)
    connection.next("heartbeat")
    wait_until(lambda: check_health(health) == "SERVING", "health SERVING", timeout=PATIENCE)


def test_the_worker_command_checks_its_flags(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rlfleet", "worker", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=PATIENCE,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parent.parent)},
        )

    missing = run()
    assert missing.returncode == 2 and "pass --coordinator HOST:PORT" in missing.stderr
    bad_import = run("--coordinator", "127.0.0.1:1", "--import", "no_such_module_xyz")
    assert bad_import.returncode == 1
    assert "--import no_such_module_xyz: ModuleNotFoundError" in bad_import.stderr


def until_available(call: Callable[[], T], seconds: float = PATIENCE) -> T:
    """Retries a call while it fails with UnavailableError (the retryable error)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_worker_rejoins_a_restarted_coordinator_and_the_sampler_restores_its_agent(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(4,), seed=3)
    first = serve(CoordinatorConfig(listen="127.0.0.1:0"))
    port = first.port
    start_worker(workers, first.address, tmp_path, name="survivor")
    with RemoteSampler(first.address, seed=2, timeout=10, wait_for_workers=PATIENCE) as sampler:
        before = sampler.obtain_episodes(2, agent_update=policy)
        old_id = sampler.status().coordinator_id
        first.stop()
        with pytest.raises(UnavailableError, match="retry"):
            sampler.status()
        with serve(CoordinatorConfig(listen=f"127.0.0.1:{port}")):
            # The same sampler (its channel reconnects) and a rejoined worker;
            # the sampler pushes its agent again, so the retry is the same batch.
            after = until_available(lambda: sampler.obtain_episodes(2))
            status = sampler.status()
            assert status.coordinator_id != old_id
            assert [w.name for w in status.workers] == ["survivor"]
            ids = {w.worker_id for w in status.workers}
    assert "reconnecting in" in workers[0].log_path.read_text()
    with LocalSampler(CARTPOLE, seed=2) as local:
        assert_same_batch(local.obtain_episodes(2, agent_update=policy), before, {1})
        assert_same_batch(local.obtain_episodes(2), after, ids)


def test_a_worker_leaving_mid_request_loses_nothing() -> None:
    # Episodes sleep 0.3 s at their first step, so SIGTERM lands mid-request.
    slow = EnvConfig("rlfleet/Hanging-v0", {"hang_seconds": 0.3, "length": 4}, imports=(TESTING,))
    twin = EnvConfig("rlfleet/Counter-v0", {"length": 4}, imports=(TESTING,))
    fleet = Fleet.local(2, 1, slow, seed=8)
    with fleet as sampler:
        leaver = next(w for w in fleet.workers if w.name == "local-1")
        timer = threading.Timer(0.6, leaver.process.send_signal, (signal.SIGTERM,))
        timer.start()
        batch = sampler.obtain_episodes(10)
        timer.join()
        assert leaver.process.wait(timeout=PATIENCE) == 0
        assert [w.name for w in sampler.status().workers] == ["local-0"]
    with LocalSampler(twin, seed=8) as local:
        assert_same_batch(local.obtain_episodes(10), batch, {1, 2})


def test_a_worker_with_a_wrong_address_logs_sparingly_and_gives_up_at_its_connect_timeout(
    tmp_path: Path,
) -> None:
    # Nothing listens on the port: dozens of quick retries, the first few
    # logged, then a line per 30 s with a count; at the timeout one error
    # line and exit 1 (the variable sets the timeout).
    nowhere = f"127.0.0.1:{free_port()}"
    with ProcessFleet(tmp_path) as processes:
        worker = processes.start_worker(
            "--reconnect-max-seconds", "0.2",
            coordinator=nowhere, defaults=(), env={"RLFLEET_CONNECT_TIMEOUT": "6"},
        )  # fmt: skip
        worker.stopped = True
        assert worker.popen.wait(timeout=120) == 1, worker.describe()
        lines = worker.log_text().splitlines()
    retries = [line for line in lines if "WARNING" in line and "reconnecting in" in line]
    # The backoff's first attempts each, then one line with a count.
    assert [f"(attempt {n})" in line for n, line in enumerate(retries[:5], 1)] == [True] * 5
    assert len(retries) == 6, lines  # the next would come 30 s after the 6th
    (error,) = [line for line in lines if "ERROR" in line]
    assert f"could not join coordinator {nowhere} within --connect-timeout 6 s" in error
    attempts = int(error.split("(")[1].split(" attempts")[0])
    assert attempts > len(retries) + 2, error  # the others were held back, not made
    assert "Traceback" not in "\n".join(lines)
