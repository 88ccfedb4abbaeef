"""Fuzzing the message handlers with random, malformed and hostile input.

Everything goes to a real coordinator over a real channel as raw bytes
(identity serializers), so the coordinator's own parsing is what is tested.
The property every time: no crash and no hang (each call has a deadline the
coordinator must beat), a clear error status (never INTERNAL or UNKNOWN,
always with a message), and afterwards the coordinator still serves a
normal request. The resource tests check that one client cannot exhaust the
coordinator's memory or threads with one huge, endless or slow message.

Examples are derandomized, so a failure reproduces on every run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.conformance.kit_messages import agent_ready_of, error_of
from rlfleet.conformance.scripted_coordinator import (
    BROKEN,
    CLOSED,
    Inbound,
    ScriptedCoordinator,
    ScriptedSession,
)
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import batch_pb2, learner_pb2, spaces_pb2, tensor_pb2, updates_pb2, worker_pb2
from rlfleet.wire._protowire import encode_varint
from rlfleet.worker.remote import RemoteWorker, WorkerConfig
from tests._coordinator_fakes import env_ready, join, status
from tests.waiting import PATIENCE

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Seconds a call may take before the test calls it a hang.
CALL_DEADLINE = 10.0
#: The fuzzed worker's handshake timeout and the driver's waits on it. These
#: tests fuzz message handling, not handshake timing: on a loaded machine a
#: worker that gave up a slow handshake would re-join under the driver's feet.
WORKER_DEADLINE = PATIENCE
HANDSHAKE_TIMEOUT = 1.0
MAX_RESULT_BYTES = 1 << 20
UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT32 = st.integers(0, UINT32_MAX)
UINT64 = st.integers(0, UINT64_MAX)

#: Statuses that are not a clear refusal: a bug in the handler, not the input.
UNCLEAR = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
REFUSED_PICKLE = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT}
EPISODES = batch_pb2.PAYLOAD_KIND_EPISODE_BATCH


def hello(name: str = "fuzz", num_envs: int = 1) -> bytes:
    return worker_pb2.WorkerMessage(
        hello=worker_pb2.Hello(
            protocol_version=1,
            capabilities=["rlfleet.episodes"],
            num_envs=num_envs,
            name=name,
            implementation="fuzz",
        )
    ).SerializeToString()


#: A message that always ends an admitted worker's stream: a second Hello.
SENTINEL = hello("sentinel")


@dataclass(frozen=True)
class Outcome:
    """How a raw call ended."""

    code: grpc.StatusCode
    details: str
    bodies: tuple[str, ...]
    seconds: float

    def assert_clear_refusal(self) -> None:
        """An error status with a message, well before the client's deadline."""
        assert self.seconds < CALL_DEADLINE - 1, f"the coordinator hung: {self}"
        assert self.code is not grpc.StatusCode.OK, f"accepted: {self}"
        assert self.code not in UNCLEAR, f"unclear status: {self}"
        assert self.details, f"no message: {self}"


def raw_join(address: str, messages: Iterable[bytes], *, hold: bool = True) -> Outcome:
    """Runs one Join call sending ``messages``; keeps its side open after them if ``hold``.

    Holding open means the call can only end by the coordinator's decision
    (or the deadline), so its status is the coordinator's verdict.
    """
    release = threading.Event()

    def requests() -> Iterator[bytes]:
        yield from messages
        if hold:
            release.wait(CALL_DEADLINE)

    bodies: list[str] = []
    start = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(_rpc.JOIN, None, None)(requests(), timeout=CALL_DEADLINE)
        try:
            for data in call:
                bodies.append(worker_pb2.CoordinatorMessage.FromString(data).WhichOneof("body"))
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        finally:
            release.set()
    return Outcome(code, details, tuple(bodies), time.monotonic() - start)


def raw_call(address: str, method: str, data: bytes, *, streaming: bool) -> Outcome:
    """Calls a learner method with raw request bytes."""
    start = time.monotonic()
    count = 0
    with grpc.insecure_channel(address) as channel:
        try:
            if streaming:
                for _ in channel.unary_stream(method, None, None)(data, timeout=CALL_DEADLINE):
                    count += 1
            else:
                channel.unary_unary(method, None, None)(data, timeout=CALL_DEADLINE)
                count = 1
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
    return Outcome(code, details, ("response",) * count, time.monotonic() - start)


def start(**overrides: object) -> CoordinatorServer:
    settings_: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "handshake_timeout_seconds": HANDSHAKE_TIMEOUT,
        "wait_for_workers_seconds": 0.2,
        "update_timeout_seconds": 2.0,
        "max_result_bytes": MAX_RESULT_BYTES,
    }
    settings_.update(overrides)
    return serve(CoordinatorConfig(**settings_))  # type: ignore[arg-type]


def assert_still_serves(server: CoordinatorServer) -> None:
    """A learner call and a well-behaved worker's handshake both work."""
    assert status(server.address).protocol_version == 1
    worker, welcome = join(server.address, name="well-behaved")
    try:
        assert welcome.worker_id >= 1
        env_ready(worker, worker.expect("env_update"))
    finally:
        worker.close()


@pytest.fixture(scope="module")
def server() -> Iterator[CoordinatorServer]:
    with start() as running:
        yield running
        assert_still_serves(running)


# --- the worker face ------------------------------------------------------------------


@FUZZ
@given(first=st.binary(max_size=256))
def test_random_first_message(server: CoordinatorServer, first: bytes) -> None:
    # If the bytes happen to be a valid Hello, the sentinel (a second
    # Hello) must end the stream instead.
    raw_join(server.address, [first, SENTINEL]).assert_clear_refusal()


@FUZZ
@given(garbage=st.lists(st.binary(max_size=256), min_size=1, max_size=4))
def test_random_messages_after_hello(server: CoordinatorServer, garbage: list[bytes]) -> None:
    outcome = raw_join(server.address, [hello(), *garbage, SENTINEL])
    outcome.assert_clear_refusal()
    assert outcome.bodies[:1] == ("welcome",)


@FUZZ
@given(
    version=UINT32,
    num_envs=UINT32,
    name=st.text(max_size=64),
    capabilities=st.lists(st.text(max_size=16), max_size=8),
    pid=INT64,
)
def test_hostile_hellos(
    server: CoordinatorServer,
    *,
    version: int,
    num_envs: int,
    name: str,
    capabilities: list[str],
    pid: int,
) -> None:
    message = worker_pb2.WorkerMessage(
        hello=worker_pb2.Hello(
            protocol_version=version,
            num_envs=num_envs,
            name=name,
            capabilities=capabilities,
            pid=pid,
        )
    )
    outcome = raw_join(server.address, [message.SerializeToString(), SENTINEL])
    outcome.assert_clear_refusal()
    if version != 1:
        assert outcome.code is grpc.StatusCode.FAILED_PRECONDITION
    elif num_envs == 0:
        assert outcome.code is grpc.StatusCode.INVALID_ARGUMENT


CHUNKS = st.builds(
    batch_pb2.BatchChunk,
    batch_id=UINT64,
    index=st.one_of(st.integers(0, 3), st.just(UINT32_MAX)),
    count=st.one_of(st.integers(0, 4), st.just(UINT32_MAX)),
    total_bytes=st.one_of(st.integers(0, 64), st.just(UINT64_MAX), st.just(MAX_RESULT_BYTES + 1)),
    kind=st.integers(0, 3),
    data=st.binary(max_size=64),
)


def result(chunk: batch_pb2.BatchChunk, **meta: object) -> bytes:
    return worker_pb2.WorkerMessage(
        result=worker_pb2.EpisodeResult(chunk=chunk, **meta)  # type: ignore[arg-type]
    ).SerializeToString()


@FUZZ
@given(
    chunks=st.lists(CHUNKS, min_size=1, max_size=5),
    task_id=UINT64,
    indices=st.lists(INT64, max_size=20),
    lengths=st.lists(INT64, max_size=20),
)
def test_hostile_chunk_sequences(
    server: CoordinatorServer,
    chunks: list[batch_pb2.BatchChunk],
    task_id: int,
    indices: list[int],
    lengths: list[int],
) -> None:
    messages = [result(chunks[0], task_id=task_id, episode_indices=indices, lengths=lengths)]
    messages += [result(chunk) for chunk in chunks[1:]]
    outcome = raw_join(server.address, [hello(), *messages, SENTINEL])
    outcome.assert_clear_refusal()


def test_chunk_announcing_a_huge_batch_is_refused_before_allocation(
    server: CoordinatorServer,
) -> None:
    chunk = batch_pb2.BatchChunk(
        batch_id=1, index=0, count=UINT32_MAX, total_bytes=UINT64_MAX, kind=EPISODES, data=b"x"
    )
    outcome = raw_join(server.address, [hello(), result(chunk)])
    outcome.assert_clear_refusal()
    assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the limit" in outcome.details


def test_chunks_in_the_wrong_order_are_refused(server: CoordinatorServer) -> None:
    first = batch_pb2.BatchChunk(
        batch_id=1, index=0, count=3, total_bytes=30, kind=EPISODES, data=b"a"
    )
    third = batch_pb2.BatchChunk(
        batch_id=1, index=2, count=3, total_bytes=30, kind=EPISODES, data=b"c"
    )
    outcome = raw_join(server.address, [hello(), result(first), result(third)])
    outcome.assert_clear_refusal()
    assert outcome.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "chunk 1 of batch 1 missing" in outcome.details


def _length_delimited(field: int, body: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(body)) + body


def _deep_space(depth: int) -> bytes:
    """A Space nested ``depth`` TupleSpaces deep, written by hand (protobuf refuses to)."""
    space = _length_delimited(2, b"\x08\x02")  # Discrete(n=2)
    for _ in range(depth):
        space = _length_delimited(6, _length_delimited(1, space))  # Tuple(spaces=[space])
    return space


@pytest.mark.parametrize("depth", [150, 5000])
def test_deeply_nested_env_spec_is_refused(server: CoordinatorServer, depth: int) -> None:
    worker, _ = join(server.address, name="deep")
    try:
        update = worker.expect("env_update")
        spec = _length_delimited(1, _deep_space(depth)) + _length_delimited(2, _deep_space(1))
        ready = encode_varint(1 << 3) + encode_varint(update.generation)
        ready += _length_delimited(2, spec)
        worker.send(_length_delimited(2, ready))  # WorkerMessage.env_ready
        failure = worker.ended(timeout=CALL_DEADLINE)
    finally:
        worker.close()
    assert failure is not None
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT, failure


SHAPES = st.lists(st.one_of(st.integers(-3, 8), st.just(1 << 62), st.just(-(1 << 63))), max_size=4)


@FUZZ
@given(shape=SHAPES, dtype=st.integers(0, 14), data=st.binary(max_size=64))
def test_hostile_env_specs(
    server: CoordinatorServer, shape: list[int], dtype: int, data: bytes
) -> None:
    code = cast(Any, dtype)  # unknown enum numbers on purpose
    tensor = tensor_pb2.Tensor(dtype=code, shape=shape, data=data)
    box = spaces_pb2.Space(
        box=spaces_pb2.BoxSpace(shape=shape, dtype=code, low=tensor, high=tensor)
    )
    binary = spaces_pb2.Space(multi_binary=spaces_pb2.MultiBinarySpace(shape=shape))
    worker, _ = join(server.address, name="hostile-spec")
    try:
        update = worker.expect("env_update")
        spec = spaces_pb2.EnvSpec(observation_space=box, action_space=binary)
        worker.send(
            worker_pb2.WorkerMessage(
                env_ready=worker_pb2.EnvReady(generation=update.generation, env_spec=spec)
            )
        )
        worker.send(SENTINEL)
        failure = worker.ended(timeout=CALL_DEADLINE)
    finally:
        worker.close()
    assert failure is not None and failure.code not in UNCLEAR and failure.details, failure


def test_oversized_strings_are_survived(server: CoordinatorServer) -> None:
    big = "x" * (1 << 20)
    error = worker_pb2.WorkerMessage(
        error=worker_pb2.WorkerError(
            detail=updates_pb2.ErrorDetail(message=big, traceback=big, worker=big)
        )
    ).SerializeToString()
    leaving = worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason=big)).SerializeToString()
    outcome = raw_join(server.address, [hello(name="y" * 4096), error, leaving, SENTINEL])
    outcome.assert_clear_refusal()


# --- the learner face ------------------------------------------------------------------

LEARNER_METHODS = [
    (_rpc.SAMPLE, True),
    (_rpc.SUBSCRIBE, True),
    (_rpc.UPDATE_AGENT, False),
    (_rpc.UPDATE_ENV, False),
    (_rpc.GET_STATUS, False),
]


@pytest.fixture(scope="module")
def learner_face() -> Iterator[CoordinatorServer]:
    """A coordinator with no workers: requests end at the worker wait, never stream forever."""
    with start() as running:
        yield running
        assert status(running.address).protocol_version == 1


@FUZZ
@given(data=st.binary(max_size=256), method=st.sampled_from(LEARNER_METHODS))
def test_random_bytes_to_learner_methods(
    learner_face: CoordinatorServer, data: bytes, method: tuple[str, bool]
) -> None:
    path, streaming = method
    outcome = raw_call(learner_face.address, path, data, streaming=streaming)
    assert outcome.seconds < CALL_DEADLINE - 1, outcome
    assert outcome.code not in UNCLEAR, outcome
    if outcome.code is not grpc.StatusCode.OK:
        assert outcome.details, outcome


SAMPLE_REQUESTS = st.builds(
    learner_pb2.SampleRequest,
    mode=st.integers(0, 5),
    amount=INT64,
    fragment_length=UINT32,
    seed=UINT64,
    request_index=UINT64,
    wait_for_workers_seconds=st.one_of(
        st.floats(0, 0.2), st.just(float("nan")), st.just(-1.0), st.just(-float("inf"))
    ),
    itr=INT64,
)


@FUZZ
@given(request=SAMPLE_REQUESTS)
def test_hostile_sample_requests(
    learner_face: CoordinatorServer, request: learner_pb2.SampleRequest
) -> None:
    outcome = raw_call(
        learner_face.address, _rpc.SAMPLE, request.SerializeToString(), streaming=True
    )
    outcome.assert_clear_refusal()


TENSORS = st.builds(
    tensor_pb2.Tensor, dtype=st.integers(0, 14), shape=SHAPES, data=st.binary(max_size=64)
)
JSON_TEXT = st.one_of(
    st.text(max_size=32),
    st.just("[" * 3000 + "]" * 3000),
    st.just('{"a": ' * 3000 + "1" + "}" * 3000),
    st.just('{"hidden_sizes": [1e308, -1]}'),
)


@FUZZ
@given(
    name=st.one_of(
        st.sampled_from(["random", "mlp-categorical", "os:system"]), st.text(max_size=16)
    ),
    kwargs=JSON_TEXT,
    params=st.lists(st.tuples(st.text(max_size=8), TENSORS), max_size=3),
    pickled=st.binary(max_size=8),
)
def test_hostile_agent_updates(
    learner_face: CoordinatorServer,
    name: str,
    kwargs: str,
    params: list[tuple[str, tensor_pb2.Tensor]],
    pickled: bytes,
) -> None:
    update = updates_pb2.AgentUpdate(
        policy=updates_pb2.PolicySpec(name=name, kwargs_json=kwargs), pickled_policy=pickled
    )
    for key, tensor in params:
        update.params.entries.add(key=key, tensor=tensor)
    outcome = raw_call(
        learner_face.address, _rpc.UPDATE_AGENT, update.SerializeToString(), streaming=False
    )
    assert outcome.code not in UNCLEAR, outcome
    if pickled:  # refused: for the pickle, or for a malformed field checked before it
        assert outcome.code in REFUSED_PICKLE, outcome


@FUZZ
@given(
    env_id=st.one_of(
        st.sampled_from(["CartPole-v1", "os:system", "gymnasium.envs:CartPole-v1", ""]),
        st.text(max_size=16),
    ),
    kwargs=JSON_TEXT,
    length=st.one_of(st.none(), INT64),
    pickled=st.binary(max_size=8),
)
def test_hostile_env_updates(
    learner_face: CoordinatorServer, env_id: str, kwargs: str, length: int | None, pickled: bytes
) -> None:
    update = updates_pb2.EnvUpdate(env_id=env_id, kwargs_json=kwargs, pickled_env_factory=pickled)
    if length is not None:
        update.max_episode_length = length
    outcome = raw_call(
        learner_face.address, _rpc.UPDATE_ENV, update.SerializeToString(), streaming=False
    )
    assert outcome.code not in UNCLEAR, outcome
    if pickled:  # refused: for the pickle, or for a malformed field checked before it
        assert outcome.code in REFUSED_PICKLE, outcome
    if ":" in env_id:
        assert outcome.code is not grpc.StatusCode.OK, outcome


# --- resource limits ----------------------------------------------------------------------


def test_a_handshake_that_never_comes_is_closed_after_the_timeout(
    server: CoordinatorServer,
) -> None:
    outcome = raw_join(server.address, [])
    outcome.assert_clear_refusal()
    assert outcome.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no Hello within 1 seconds" in outcome.details
    assert HANDSHAKE_TIMEOUT - 0.1 < outcome.seconds < HANDSHAKE_TIMEOUT + 3


def test_silent_streams_hold_threads_only_until_the_handshake_timeout() -> None:
    # Far more silent streams than the server has threads: calls beyond its
    # pool are refused, and once the handshake timeout frees the threads it
    # serves again.
    with start(max_workers=2, max_learner_calls=2) as small:
        pool = small.coordinator.config.thread_pool_size
        outcomes: list[Outcome] = []
        threads = [
            threading.Thread(target=lambda: outcomes.append(raw_join(small.address, [])))
            for _ in range(pool + 8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CALL_DEADLINE + 5)
        assert len(outcomes) == len(threads)
        for outcome in outcomes:
            outcome.assert_clear_refusal()
        assert {o.code for o in outcomes} <= {
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        }
        assert_still_serves(small)


def test_a_chunk_stream_that_never_ends_is_cut_off(server: CoordinatorServer) -> None:
    # Announces a batch within the limit, then keeps sending chunks forever.
    sent = 0

    def endless() -> Iterator[bytes]:
        nonlocal sent
        yield hello("endless")
        for index in range(UINT32_MAX):
            chunk = batch_pb2.BatchChunk(
                batch_id=7,
                index=index,
                count=UINT32_MAX,
                total_bytes=MAX_RESULT_BYTES,
                kind=EPISODES,
                data=b"z" * 4096,
            )
            sent += 4096
            yield result(chunk)

    outcome = raw_join(server.address, endless(), hold=False)
    outcome.assert_clear_refusal()
    assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "in flight" in outcome.details
    # gRPC buffers what the client already wrote; the coordinator stopped
    # reading within a few messages of the limit.
    assert sent < 4 * MAX_RESULT_BYTES


def test_tiny_chunks_cannot_grow_memory_without_bound(server: CoordinatorServer) -> None:
    # One byte per chunk: a per-byte budget alone would let the per-chunk
    # bookkeeping grow far beyond it.
    sent = 0

    def tiny() -> Iterator[bytes]:
        nonlocal sent
        yield hello("tiny")
        for index in range(UINT32_MAX):
            chunk = batch_pb2.BatchChunk(
                batch_id=8,
                index=index,
                count=UINT32_MAX,
                total_bytes=MAX_RESULT_BYTES,
                kind=EPISODES,
                data=b"z",
            )
            sent += 1
            yield result(chunk)

    outcome = raw_join(server.address, tiny(), hold=False)
    outcome.assert_clear_refusal()
    assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "in flight" in outcome.details


def test_more_workers_than_max_workers_are_refused() -> None:
    with start(max_workers=2) as small:
        first, _ = join(small.address, name="one")
        second, _ = join(small.address, name="two")
        try:
            outcome = raw_join(small.address, [hello("three")])
            outcome.assert_clear_refusal()
            assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "the fleet is full (2 workers)" in outcome.details
        finally:
            first.close()
            second.close()


def test_a_message_over_the_size_limit_is_refused() -> None:
    with start(max_message_bytes=256 * 1024) as small:
        huge = hello(name="n" * (512 * 1024))
        outcome = raw_join(small.address, [huge])
        outcome.assert_clear_refusal()
        assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_still_serves(small)


# --- the Python worker's message handling ---------------------------------------------


class _Raw:
    """Bytes the scripted coordinator sends as they are (its serializer calls this)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def SerializeToString(self) -> bytes:
        return self._data


class WorkerDriver:
    """A real RemoteWorker (in a thread) joined to a scripted coordinator.

    :meth:`probe` proves the worker still works: it sends a valid agent
    update and waits for its AgentReady, re-joining first if the worker
    dropped the stream (which it may do after garbage).
    """

    def __init__(self, coordinator: ScriptedCoordinator, worker: RemoteWorker) -> None:
        self.coordinator = coordinator
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, name="fuzzed-worker", daemon=True)
        self.session: ScriptedSession | None = None
        self._pending: ScriptedSession | None = None  # a new Join call: the worker re-joined
        # Far from any version the fuzzed updates carry.
        self._version = 1 << 62
        self.thread.start()

    def current(self) -> ScriptedSession:
        """The joined session, after a fresh handshake if the worker re-joined."""
        if self._pending is None and (self.session is None or self.session.ended):
            self._pending = self.coordinator.accept(WORKER_DEADLINE)
            assert self._pending is not None, "the worker did not reconnect"
        if self._pending is not None:
            if self.session is not None:
                self.session.abort_quietly()
            # Taken before the handshake: one that fails leaves no stale
            # session for the next test to wait on.
            pending, self._pending, self.session = self._pending, None, None
            self.session = self._handshake(pending)
        assert self.session is not None
        return self.session

    def _handshake(self, session: ScriptedSession) -> ScriptedSession:
        hello_in = session.receive(WORKER_DEADLINE)
        assert hello_in is not None and hello_in.kind == "hello", hello_in
        session.send(
            worker_pb2.CoordinatorMessage(
                welcome=worker_pb2.Welcome(
                    protocol_version=1,
                    worker_id=1,
                    name="fuzzed",
                    heartbeat_interval_seconds=1.0,
                    heartbeat_timeout_seconds=10.0,
                    max_message_bytes=_rpc.DEFAULT_MAX_MESSAGE_BYTES,
                    capabilities=["rlfleet.episodes"],
                )
            )
        )
        session.send(
            worker_pb2.CoordinatorMessage(
                env_update=updates_pb2.EnvUpdate(generation=1, env_id="CartPole-v1")
            )
        )
        assert self._expect(session, "env_ready") is not None
        return session

    def send(self, message: object) -> None:
        self.current().send(message)  # type: ignore[arg-type]

    def probe(self) -> None:
        """A valid agent update is applied: the worker is alive and serving.

        Also drains the worker's answers to earlier input, so that the next
        message read is an answer to what comes next.
        """
        for _ in range(2):  # once more after a re-join
            session = self.current()
            self._version += 1
            session.send(
                worker_pb2.CoordinatorMessage(
                    agent_update=updates_pb2.AgentUpdate(
                        version=self._version, policy=updates_pb2.PolicySpec(name="random")
                    )
                )
            )
            while (ready := self._expect(session, "agent_ready")) is not None:
                assert ready.message is not None
                if agent_ready_of(ready.message) == self._version:
                    assert self.thread.is_alive()
                    return
        raise AssertionError("the worker did not apply a valid agent update")

    def _expect(self, session: ScriptedSession, kind: str) -> Inbound | None:
        """The next ``kind`` message, skipping answers to earlier input.

        Returns None if the worker left this stream (ended it, or opened a
        new Join call: garbage makes it drop the stream and re-join).
        """
        deadline = time.monotonic() + WORKER_DEADLINE
        while time.monotonic() < deadline:
            item = session.receive(0.05)
            if item is None:
                if self._pending is None:
                    self._pending = self.coordinator.accept(0)
                if self._pending is not None:
                    return None
                continue
            if item.kind == kind:
                return item
            if item.kind in (CLOSED, BROKEN):
                return None
            assert item.kind in ("error", "env_ready", "agent_ready", "result", "leaving"), item
        raise AssertionError(f"the worker hung: no {kind} within {WORKER_DEADLINE:g} s")


@pytest.fixture(scope="module")
def fuzzed_worker() -> Iterator[WorkerDriver]:
    with ScriptedCoordinator() as coordinator:
        worker = RemoteWorker(
            WorkerConfig(
                coordinator=coordinator.address,
                envs=2,
                name="fuzzed",
                reconnect_base_seconds=0.01,
                reconnect_max_seconds=0.05,
                handshake_timeout=WORKER_DEADLINE,
                drain_grace_seconds=1.0,
                close_timeout=1.0,
            )
        )
        driver = WorkerDriver(coordinator, worker)
        driver.probe()
        yield driver
        worker.request_leave("the fuzz tests are over")
        if driver.session is not None:
            driver.session.abort_quietly()
        driver.thread.join(WORKER_DEADLINE)
        assert not driver.thread.is_alive()


WORKER_FUZZ = settings(FUZZ, max_examples=25)


@WORKER_FUZZ
@given(data=st.binary(max_size=128))
def test_worker_survives_random_bytes(fuzzed_worker: WorkerDriver, data: bytes) -> None:
    fuzzed_worker.send(_Raw(data))
    fuzzed_worker.probe()


UNITS = st.builds(worker_pb2.EpisodeUnit, episode_index=INT64, env_seed=UINT32, policy_seed=UINT32)


@WORKER_FUZZ
@given(
    task=st.builds(
        worker_pb2.Task,
        task_id=UINT64,
        request_id=UINT64,
        mode=st.integers(0, 4),
        agent_version=st.one_of(st.just(-1), INT64),
        env_generation=st.one_of(st.just(1), UINT64),
        units=st.lists(UNITS, max_size=5),
        fragment_length=st.one_of(st.integers(0, 3), st.just(UINT32_MAX)),
        rounds=st.one_of(st.integers(0, 2), st.just(UINT32_MAX)),
        base_seed=UINT64,
    ),
    cancel=st.builds(
        worker_pb2.Cancel, task_id=UINT64, episode_indices=st.lists(INT64, max_size=5)
    ),
)
def test_worker_survives_hostile_tasks(
    fuzzed_worker: WorkerDriver, task: worker_pb2.Task, cancel: worker_pb2.Cancel
) -> None:
    fuzzed_worker.send(worker_pb2.CoordinatorMessage(task=task))
    fuzzed_worker.send(worker_pb2.CoordinatorMessage(cancel=cancel))
    # Whatever it started, cancel it, so that the probe is not queued behind it.
    fuzzed_worker.send(
        worker_pb2.CoordinatorMessage(cancel=worker_pb2.Cancel(task_id=task.task_id))
    )
    fuzzed_worker.probe()


@WORKER_FUZZ
@given(
    name=st.one_of(
        st.sampled_from(
            ["random", "mlp-categorical", "mlp-gaussian", "os:system", "subprocess:Popen"]
        ),
        st.text(max_size=16),
    ),
    kwargs=JSON_TEXT,
    params=st.lists(st.tuples(st.text(max_size=8), TENSORS), max_size=3),
    version=INT64,
    pickled=st.binary(max_size=8),
)
def test_worker_survives_hostile_agent_updates(
    fuzzed_worker: WorkerDriver,
    *,
    name: str,
    kwargs: str,
    params: list[tuple[str, tensor_pb2.Tensor]],
    version: int,
    pickled: bytes,
) -> None:
    update = updates_pb2.AgentUpdate(
        version=version,
        policy=updates_pb2.PolicySpec(name=name, kwargs_json=kwargs),
        pickled_policy=pickled,
    )
    for key, tensor in params:
        update.params.entries.add(key=key, tensor=tensor)
    fuzzed_worker.send(worker_pb2.CoordinatorMessage(agent_update=update))
    fuzzed_worker.probe()


@WORKER_FUZZ
@given(
    env_id=st.one_of(
        st.sampled_from(["CartPole-v1", "os:system", "gymnasium.envs:CartPole-v1", ""]),
        st.text(max_size=16),
    ),
    kwargs=JSON_TEXT,
    length=st.one_of(st.none(), INT64),
    pickled=st.binary(max_size=8),
)
def test_worker_survives_hostile_env_updates(
    fuzzed_worker: WorkerDriver, env_id: str, kwargs: str, length: int | None, pickled: bytes
) -> None:
    update = updates_pb2.EnvUpdate(
        generation=1, env_id=env_id, kwargs_json=kwargs, pickled_env_factory=pickled
    )
    if length is not None:
        update.max_episode_length = length
    fuzzed_worker.send(worker_pb2.CoordinatorMessage(env_update=update))
    # Back to a known env, whatever that update did.
    fuzzed_worker.send(
        worker_pb2.CoordinatorMessage(
            env_update=updates_pb2.EnvUpdate(generation=1, env_id="CartPole-v1")
        )
    )
    fuzzed_worker.probe()


def test_worker_refuses_pickles_it_was_not_allowed(
    fuzzed_worker: WorkerDriver, tmp_path: Path
) -> None:
    import pickle as std_pickle

    marker = str(tmp_path / "pwned")
    payload = std_pickle.dumps(_Pwn(marker))
    fuzzed_worker.probe()  # answers to earlier tests' input are drained
    session = fuzzed_worker.current()
    session.send(
        worker_pb2.CoordinatorMessage(
            agent_update=updates_pb2.AgentUpdate(version=10**6, pickled_policy=payload)
        )
    )
    error = fuzzed_worker._expect(session, "error")
    assert error is not None and error.message is not None
    detail = error_of(error.message)
    assert detail.kind == updates_pb2.ERROR_KIND_PERMISSION
    assert "--allow-pickle" in detail.message
    assert not os.path.exists(marker)
    fuzzed_worker.probe()


class _Pwn:
    """Unpickling this creates a file: proof that pickled code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (self.path, "w"))
