"""Test helpers for the coordinator: scripted workers and a raw learner client.

Everything here talks to a real coordinator over real gRPC channels.

* :class:`ScriptedWorker` speaks the Join protocol one message at a time, as
  the test says (handshakes, malformed messages, workers that vanish).
* :class:`AutoWorker` is a scripted worker that answers on its own with a
  real :class:`~rlfleet.worker.vec.VecWorker`, for tests that need results.
* :func:`sample` calls Sample without the client library and rebuilds the
  answer from the forwarded chunks, as the contract describes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from rlfleet.coordinator.worker_messages import ResultPiece, parse_worker_message
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.policies import PolicySpec
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, updates_pb2, worker_pb2
from rlfleet.wire import (
    ChunkAssembler,
    decode_batch,
    decode_env_spec,
    decode_tensor_map,
    encode_batch_chunks,
    encode_env_spec,
)
from rlfleet.wire.results import JoinedResult, ResultAssembler
from rlfleet.worker.units import EpisodeUnit, make_units
from rlfleet.worker.vec import VecWorker
from tests.waiting import wait_until

_STOP = object()
ROOT = str(Path(__file__).resolve().parent.parent)
CAPABILITIES = ("rlfleet.episodes", "rlfleet.fragments")


@dataclass(frozen=True)
class Failure:
    """How a call ended: its status, message and the ErrorDetail it carried."""

    code: grpc.StatusCode
    details: str
    detail: updates_pb2.ErrorDetail | None
    error: grpc.RpcError


def failure_of(error: Any) -> Failure:
    """Reads a failed call (a grpc.RpcError that is also a grpc.Call)."""
    detail = None
    for key, value in error.trailing_metadata() or ():
        if key == _rpc.ERROR_DETAIL_KEY:
            detail = updates_pb2.ErrorDetail.FromString(value)
    return Failure(error.code(), error.details() or "", detail, error)


def expect_failure(call: Callable[[], object]) -> Failure:
    """Runs a call that must fail; returns how it failed."""
    try:
        call()
    except grpc.RpcError as exc:
        return failure_of(exc)
    raise AssertionError("the call succeeded")


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=_rpc.channel_options())


class ScriptedWorker:
    """A Join stream driven message by message by the test."""

    def __init__(self, address: str) -> None:
        self.channel = channel(address)
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        join = self.channel.stream_stream(
            _rpc.JOIN,
            request_serializer=self._serialize,
            response_deserializer=_rpc.plain_deserializer(worker_pb2.CoordinatorMessage),
        )
        self.call = join(iter(self._outgoing.get, _STOP))
        self.inbox: queue.SimpleQueue[worker_pb2.CoordinatorMessage | grpc.RpcError | None] = (
            queue.SimpleQueue()
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def _serialize(item: Any) -> bytes:
        if isinstance(item, bytes):
            return item  # raw bytes: how tests send garbage
        return _rpc.serialize(item)

    def _read(self) -> None:
        try:
            for message in self.call:
                self.inbox.put(message)
        except grpc.RpcError as exc:
            self.inbox.put(exc)
            return
        self.inbox.put(None)

    def send(self, item: Any) -> None:
        """Sends a WorkerMessage, a WithChunk, or raw bytes."""
        self._outgoing.put(item)

    def hello(
        self,
        *,
        num_envs: int = 1,
        name: str = "",
        version: int = 1,
        capabilities: Iterable[str] = CAPABILITIES,
    ) -> None:
        self.send(
            worker_pb2.WorkerMessage(
                hello=worker_pb2.Hello(
                    protocol_version=version,
                    capabilities=capabilities,
                    num_envs=num_envs,
                    name=name,
                    host="testhost",
                    pid=1,
                    implementation="rlfleet-tests",
                )
            )
        )

    def receive(self, timeout: float = 10.0) -> worker_pb2.CoordinatorMessage:
        """The next message; fails the test if the stream ended instead."""
        item = self.inbox.get(timeout=timeout)
        if not isinstance(item, worker_pb2.CoordinatorMessage):
            raise AssertionError(f"expected a message, the stream ended: {item!r}")
        return item

    def expect(self, body: str, timeout: float = 10.0) -> Any:
        """The next message, which must be a ``body``; returns that field."""
        message = self.receive(timeout)
        assert message.WhichOneof("body") == body, message
        return getattr(message, body)

    def ended(self, timeout: float = 10.0) -> Failure | None:
        """Skips messages until the stream ends; returns how (None if OK)."""
        while True:
            item = self.inbox.get(timeout=timeout)
            if not isinstance(item, worker_pb2.CoordinatorMessage):
                return None if item is None else failure_of(item)

    def finish(self) -> None:
        """Closes its side of the stream cleanly (what a leaving worker does last)."""
        self._outgoing.put(_STOP)

    def close(self) -> None:
        """Vanishes without a word (as a killed process would)."""
        self._outgoing.put(_STOP)
        self.call.cancel()
        self.channel.close()


def join(
    address: str, *, num_envs: int = 1, name: str = "", capabilities: Iterable[str] = CAPABILITIES
) -> tuple[ScriptedWorker, Any]:
    """A scripted worker after the handshake; returns it and its Welcome."""
    worker = ScriptedWorker(address)
    worker.hello(num_envs=num_envs, name=name, capabilities=capabilities)
    welcome = worker.expect("welcome")
    return worker, welcome


def env_ready(worker: ScriptedWorker, update: Any) -> EnvSpec:
    """Answers an EnvUpdate with the spec of the env it names."""
    spec = env_config(update).env_spec()
    worker.send(
        worker_pb2.WorkerMessage(
            env_ready=worker_pb2.EnvReady(
                generation=update.generation, env_spec=encode_env_spec(spec)
            )
        )
    )
    return spec


def env_config(update: Any) -> EnvConfig:
    length = update.max_episode_length if update.HasField("max_episode_length") else None
    return EnvConfig(update.env_id, json.loads(update.kwargs_json or "{}"), length)


def joined(payloads: list[bytes]) -> JoinedResult:
    """A result's messages as the coordinator reads and joins them."""
    assembler = ResultAssembler()
    result = None
    for payload in payloads:
        piece = parse_worker_message(payload)
        assert isinstance(piece, ResultPiece) and piece.chunk is not None
        result = assembler.join(piece.header, piece.chunk, keep_pieces=True)
    assert result is not None
    return result


def result_messages(
    batch: EpisodeBatch, *, task_id: int, env_generation: int, batch_id: int, max_bytes: int
) -> list[_rpc.WithChunk]:
    """The chunked EpisodeResult messages of a batch, as a worker sends them."""
    chunks = encode_batch_chunks(batch, max_bytes, batch_id=batch_id, include_env_spec=False)
    infos = batch.episode_infos
    meta = worker_pb2.EpisodeResult(
        task_id=task_id,
        episode_indices=infos["episode_index"].tolist(),
        lengths=batch.lengths.tolist(),
        agent_version=int(infos["agent_version"][0]),
        env_generation=env_generation,
    )
    messages = [_rpc.WithChunk(worker_pb2.WorkerMessage(result=meta), chunks[0])]
    for chunk in chunks[1:]:
        empty = worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult())
        messages.append(_rpc.WithChunk(empty, chunk))
    return messages


class AutoWorker:
    """A worker that runs its tasks with a real VecWorker, on its own thread.

    Args:
        address: The coordinator.
        num_envs: Env slots.
        name: Its name in the fleet.
        chunk_bytes: Largest chunk it sends (small values force chunking).
        pause: If set, the worker waits for this event before each task.
        capabilities: Its Hello's capabilities.
        send_result: Takes each result's messages instead of the Join stream
            (default: sends them on the stream).
    """

    def __init__(
        self,
        address: str,
        *,
        num_envs: int = 1,
        name: str = "",
        chunk_bytes: int = 1 << 20,
        pause: threading.Event | None = None,
        capabilities: Iterable[str] = CAPABILITIES,
        send_result: Callable[[list[_rpc.WithChunk]], None] | None = None,
    ) -> None:
        self.worker, self.welcome = join(
            address, num_envs=num_envs, name=name, capabilities=capabilities
        )
        self.send_result = send_result
        self.num_envs = num_envs
        self.chunk_bytes = chunk_bytes
        self.pause = pause
        self.vec: VecWorker | None = None
        self.generation = 0
        self.tasks: list[Any] = []
        self.ending: grpc.RpcError | None = None
        self._batch_ids = itertools.count(1)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self._closed.wait(self.welcome.heartbeat_interval_seconds):
            self._send(heartbeat=worker_pb2.Heartbeat())

    def _send(self, **body: Any) -> None:
        self.worker.send(worker_pb2.WorkerMessage(**body))

    def _run(self) -> None:
        try:
            while True:
                item = self.worker.inbox.get()
                if not isinstance(item, worker_pb2.CoordinatorMessage):
                    self.ending = item
                    return
                self._handle(item)
        finally:
            if self.vec is not None:
                self.vec.shutdown()

    def _handle(self, message: worker_pb2.CoordinatorMessage) -> None:
        body = message.WhichOneof("body")
        if body == "env_update":
            self._env_update(message.env_update)
        elif body == "agent_update":
            self._agent_update(message.agent_update)
        elif body == "task":
            self.tasks.append(message.task)
            if self.pause is not None:
                self.pause.wait()
            self._task(message.task)

    def _env_update(self, update: Any) -> None:
        config = env_config(update)
        try:
            if self.vec is None:
                self.vec = VecWorker(
                    n_envs=self.num_envs, worker_number=self.welcome.worker_id, env=config
                )
            else:
                self.vec.update_env(config)
        except Exception as exc:
            self._error(exc, env_generation=update.generation)
            return
        self.generation = update.generation
        self._send(
            env_ready=worker_pb2.EnvReady(
                generation=update.generation, env_spec=encode_env_spec(self.vec.env_spec)
            )
        )

    def _agent_update(self, update: Any) -> None:
        assert self.vec is not None
        try:
            if update.HasField("policy"):
                spec = PolicySpec(update.policy.name, json.loads(update.policy.kwargs_json or "{}"))
                self.vec.update_agent(spec, version=update.version)
            if update.params.entries:
                params = decode_tensor_map(update.params)
                self.vec.update_agent(params, version=update.version)  # type: ignore[arg-type]
        except Exception as exc:
            self._error(exc, agent_version=update.version)
            return
        self._send(agent_ready=worker_pb2.AgentReady(version=update.version))

    def _error(
        self,
        exc: Exception,
        task_id: int = 0,
        *,
        env_generation: int | None = None,
        agent_version: int | None = None,
    ) -> None:
        detail = _rpc.detail_from_exception(
            exc,
            worker=self.welcome.name,
            task_id=task_id,
            env_generation=env_generation,
            agent_version=agent_version,
        )
        self._send(error=worker_pb2.WorkerError(detail=detail))

    def _task(self, task: Any) -> None:
        vec = self.vec
        assert vec is not None
        try:
            if task.mode == worker_pb2.SAMPLE_MODE_FRAGMENTS:
                batches = [
                    vec.collect_fragments(
                        task.fragment_length,
                        base_seed=task.base_seed,
                        first_stream=self.welcome.first_stream,
                    )
                    for _ in range(task.rounds)
                ]
            else:
                units = [
                    EpisodeUnit(u.episode_index, u.env_seed, u.policy_seed) for u in task.units
                ]
                batches = [vec.run(units)]
        except Exception as exc:
            self._error(exc, task.task_id)
            return
        for batch in batches:
            messages = result_messages(
                batch,
                task_id=task.task_id,
                env_generation=self.generation,
                batch_id=next(self._batch_ids),
                max_bytes=self.chunk_bytes,
            )
            if self.send_result is not None:
                self.send_result(messages)
                continue
            for item in messages:
                self.worker.send(item)

    def close(self) -> None:
        self._closed.set()
        self.worker.close()
        self._thread.join(timeout=10)


@dataclass
class Answer:
    """A Sample call's messages, and the batch they stand for."""

    header: learner_pb2.SampleHeader
    footer: learner_pb2.SampleFooter
    results: list[worker_pb2.EpisodeResult]
    batch: EpisodeBatch


def sample_stream(address: str, request: Any, timeout: float = 60.0) -> Iterator[_rpc.WithChunk]:
    """The raw responses of a Sample call (WithChunk for results)."""
    ch = channel(address)
    call = ch.unary_stream(
        _rpc.SAMPLE,
        request_serializer=_rpc.serialize,
        response_deserializer=_rpc.chunked_deserializer(learner_pb2.SampleResponse),
    )
    try:
        yield from call(request, timeout=timeout)
    finally:
        ch.close()


def sample(address: str, timeout: float = 60.0, **fields: Any) -> Answer:
    """Calls Sample and rebuilds its answer as the contract says."""
    request = learner_pb2.SampleRequest(**fields)
    header = footer = None
    results: list[worker_pb2.EpisodeResult] = []
    assemblers: dict[int, ChunkAssembler] = {}
    pending: dict[int, worker_pb2.EpisodeResult] = {}
    batches = []
    for item in sample_stream(address, request, timeout):
        body = item.message.WhichOneof("body")
        if body == "header":
            header = item.message.header
        elif body == "footer":
            footer = item.message.footer
        else:
            meta, chunk = item.message.result, item.chunk
            assert chunk is not None, "a result without its chunk"
            if chunk.index == 0:
                pending[meta.worker_id] = meta
            payload = assemblers.setdefault(meta.worker_id, ChunkAssembler()).add(chunk)
            if payload is not None:
                assert header is not None
                results.append(pending.pop(meta.worker_id))
                batch = decode_batch(payload, env_spec=decode_env_spec(header.env_spec))
                assert isinstance(batch, EpisodeBatch)
                batches.append(batch)
    assert header is not None and footer is not None
    whole = EpisodeBatch.concatenate(*batches)
    if request.mode == worker_pb2.SAMPLE_MODE_FRAGMENTS:
        keys = [whole.episode_infos[k] for k in ("fragment_index", "episode_index", "stream")]
        order = np.lexsort(keys)
    else:
        index = whole.episode_infos["episode_index"]
        kept = np.flatnonzero(index < footer.num_episodes)
        order = kept[np.argsort(index[kept])]
    return Answer(header, footer, results, select(whole, order))


def select(batch: EpisodeBatch, order: np.ndarray) -> EpisodeBatch:
    """The episodes ``order`` of a batch, in that order."""
    episodes = batch.split()
    return EpisodeBatch.concatenate(*(episodes[i] for i in order))


def unary(address: str, method: str, request: Any, response: Any, timeout: float = 60.0) -> Any:
    """Calls a unary learner method."""
    ch = channel(address)
    try:
        call = ch.unary_unary(
            method,
            request_serializer=_rpc.serialize,
            response_deserializer=_rpc.plain_deserializer(response),
        )
        return call(request, timeout=timeout)
    finally:
        ch.close()


def subscribe_stream(
    address: str,
    request: learner_pb2.SubscribeRequest,
    timeout: float = 60.0,
    options: list[tuple[str, int]] | None = None,
) -> tuple[Any, Iterator[_rpc.WithChunk]]:
    """Opens a subscription; returns (call, its responses). Cancel the call to end it."""
    ch = grpc.insecure_channel(address, options=_rpc.channel_options() + (options or []))
    call = ch.unary_stream(
        _rpc.SUBSCRIBE,
        request_serializer=_rpc.serialize,
        response_deserializer=_rpc.chunked_deserializer(learner_pb2.SampleResponse),
    )(request, timeout=timeout)

    def responses() -> Iterator[_rpc.WithChunk]:
        try:
            yield from call
        finally:
            ch.close()

    return call, responses()


def status(address: str) -> learner_pb2.FleetStatus:
    return unary(address, _rpc.GET_STATUS, learner_pb2.StatusRequest(), learner_pb2.FleetStatus)


#: The array fields of an :class:`EpisodeBatch`, beside its three info groups.
BATCH_FIELDS = ("observations", "last_observations", "actions", "rewards", "step_types", "lengths")

#: The info groups of an :class:`EpisodeBatch`, each a dict of arrays.
INFO_GROUPS = ("episode_infos", "env_infos", "agent_infos")


def batch_arrays(batch: EpisodeBatch) -> dict[str, np.ndarray]:
    """Every array of a batch by name: its fields, then each info as ``group[key]``."""
    arrays = {name: np.asarray(getattr(batch, name)) for name in BATCH_FIELDS}
    for group in INFO_GROUPS:
        for key, value in getattr(batch, group).items():
            arrays[f"{group}[{key}]"] = np.asarray(value)
    return arrays


def assert_same_batch(
    actual: EpisodeBatch, expected: EpisodeBatch, *, skip_infos: tuple[str, ...] = ("worker",)
) -> None:
    """Bit-for-bit equality of two batches (infos named in ``skip_infos`` left out)."""
    skipped = {f"{group}[{key}]" for group in INFO_GROUPS for key in skip_infos}
    a = {k: v for k, v in batch_arrays(actual).items() if k not in skipped}
    e = {k: v for k, v in batch_arrays(expected).items() if k not in skipped}
    assert a.keys() == e.keys(), f"only one batch holds {sorted(a.keys() ^ e.keys())}"
    for name, array in e.items():
        np.testing.assert_array_equal(a[name], array, err_msg=name)


def reference_episodes(
    indices: Iterable[int],
    *,
    seed: int,
    request_index: int,
    env: EnvConfig | None = None,
    policy: Any = None,
) -> EpisodeBatch:
    """Episodes ``indices`` of a request, run locally one by one (the expected answer)."""
    vec = VecWorker(n_envs=1, env=env or EnvConfig("CartPole-v1"), policy=policy)
    try:
        return vec.run(make_units(seed, request_index, indices))
    finally:
        vec.shutdown()


def reference_steps(amount: int, *, seed: int, request_index: int) -> EpisodeBatch:
    """Episodes 0..m with the smallest m whose lengths reach ``amount``."""
    episodes: list[EpisodeBatch] = []
    while sum(int(e.lengths.sum()) for e in episodes) < amount:
        episodes.append(reference_episodes([len(episodes)], seed=seed, request_index=request_index))
    return EpisodeBatch.concatenate(*episodes)


def reference_fragments(
    streams: int, fragment_length: int, rounds: list[int], *, seed: int
) -> list[EpisodeBatch]:
    """Fragments of ``streams`` streams over consecutive requests of ``rounds`` windows."""
    vec = VecWorker(n_envs=streams, env=EnvConfig("CartPole-v1"))
    try:
        answers = []
        for count in rounds:
            windows = [
                vec.collect_fragments(fragment_length, base_seed=seed, first_stream=0)
                for _ in range(count)
            ]
            whole = EpisodeBatch.concatenate(*windows)
            keys = [whole.episode_infos[k] for k in ("fragment_index", "episode_index", "stream")]
            answers.append(select(whole, np.lexsort(keys)))
        return answers
    finally:
        vec.shutdown()


# --- real processes ---------------------------------------------------------------

PROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
}


def rlfleet_process(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """``python -m rlfleet ARGS`` in its own process group, output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rlfleet", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=PROCESS_ENV,
            start_new_session=True,
        )


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Signals a process group and reaps it (SIGKILL after 10 s); returns its exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait(timeout=10)


def wait_for_file(path: Path, process: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    """The text of a file another process writes, once it exists."""

    def written() -> bool:
        assert process.poll() is None, f"process exited with {process.returncode}"
        return path.exists()

    wait_until(written, str(path), timeout=timeout)
    return path.read_text()


def wait_for_workers(address: str, count: int, timeout: float = 60.0) -> learner_pb2.FleetStatus:
    """Waits until ``count`` workers are connected and idle; returns the status."""

    def ready() -> learner_pb2.FleetStatus | None:
        fleet = status(address)
        idle = [w for w in fleet.workers if w.state == "idle"]
        return fleet if len(fleet.workers) == count == len(idle) else None

    return wait_until(
        ready, f"{count} idle workers", timeout=timeout, describe=lambda: str(status(address))
    )
