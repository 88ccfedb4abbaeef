"""LeaseStream: one ``Lease`` call, the connection layer of RemoteVectorEnv.

It speaks rlfleet's types to its user and protobuf to the coordinator: it
opens a lease of K envs, sends calls on some env ids without waiting
(pipelining), and hands back each env's answer as it lands, decoded into
numpy arrays and info dicts. A reader thread receives the replies; every
wait has a deadline, and an env whose answer is late past ``call_timeout``
is answered with an :class:`~rlfleet.errors.RlfleetTimeoutError` naming the
seconds (its late answer is then dropped).
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import gymnasium as gym
import numpy as np

from rlfleet import _rpc
from rlfleet.client._errors import call_error
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import ProtocolError, RlfleetError, RlfleetTimeoutError, UsageError
from rlfleet.v1 import leases_pb2, updates_pb2
from rlfleet.wire import decode_env_spec, decode_tensor, decode_tensor_map, encode_tensor

#: Ops by the vector-env command names of rlfleet.envs (the RemoteVectorEnv's vocabulary).
OPS = {
    "reset": leases_pb2.LEASE_OP_RESET,
    "step": leases_pb2.LEASE_OP_STEP,
    "render": leases_pb2.LEASE_OP_RENDER,
    "get_attr": leases_pb2.LEASE_OP_GET_ATTR,
    "set_attr": leases_pb2.LEASE_OP_SET_ATTR,
    "call": leases_pb2.LEASE_OP_CALL,
    "class_names": leases_pb2.LEASE_OP_CLASS_NAMES,
}


@dataclass(frozen=True)
class LeaseEnvFailure:
    """An env's answer that is an error (it raised, its lease ended, it timed out)."""

    error: RlfleetError


@dataclass
class _Waiting:
    call_id: int
    deadline: float


class LeaseStream:
    """K envs leased on a fleet, stepped over one stream.

    Args:
        channel: A channel to the coordinator (not closed by this object).
        env: The env to lease.
        num_envs: K.
        open_timeout: Seconds to wait for workers to take and build the envs.
        call_timeout: Deadline of each env's answer, in seconds.
        prefetch_resets: Ask workers to reset an env as soon as its episode
            ends and send that reset with the step (LeaseCall.prefetch_reset):
            the learner's next seedless reset of it then costs no round trip.
        learner: This learner's name for the coordinator's per-learner caps
            (LeaseOpen.learner).

    Raises:
        NoWorkersError, UnavailableError, ResourceExhaustedError, ConfigError,
        WorkerError: If the lease cannot be opened (the message says why).
        RlfleetTimeoutError: If it was not opened within ``open_timeout``.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        env: EnvConfig,
        num_envs: int,
        *,
        open_timeout: float,
        call_timeout: float,
        prefetch_resets: bool = True,
        learner: str = "",
    ) -> None:
        self.num_envs = num_envs
        self.prefetch_resets = prefetch_resets
        # Resets workers made when an episode ended, not yet taken: (obs, info).
        self._prefetched: dict[int, tuple[Any, dict[str, Any]]] = {}
        self.call_timeout = call_timeout
        self.lease_id = 0  # the coordinator's number, once opened
        self._requests: queue.SimpleQueue[leases_pb2.LeaseRequest | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting: dict[int, _Waiting] = {}
        self._answers: dict[int, Any] = {}
        self._failure: RlfleetError | None = None
        self._call_ids = itertools.count(1)
        self._opened = threading.Event()
        self._opened_message: leases_pb2.LeaseOpened | None = None
        update = updates_pb2.EnvUpdate(env_id=env.id, kwargs_json=json.dumps(dict(env.kwargs)))
        if env.max_episode_length is not None:
            update.max_episode_length = env.max_episode_length
        self._requests.put(
            leases_pb2.LeaseRequest(
                open=leases_pb2.LeaseOpen(
                    env=update, num_envs=num_envs, timeout_seconds=open_timeout, learner=learner
                )
            )
        )
        lease = channel.stream_stream(
            _rpc.LEASE,
            request_serializer=_rpc.serialize,
            response_deserializer=_rpc.plain_deserializer(leases_pb2.LeaseResponse),
        )
        self._call = lease(self._outgoing())
        self._reader = threading.Thread(target=self._read, name="rlfleet-lease", daemon=True)
        self._reader.start()
        # A little beyond the coordinator's own wait, so its precise error wins.
        if not self._opened.wait(open_timeout + 5.0):
            self._call.cancel()
            raise RlfleetTimeoutError(
                f"the lease of {num_envs} envs was not opened within {open_timeout:g} seconds"
            )
        if self._opened_message is None:
            raise self._failure or ProtocolError("the Lease stream ended before LeaseOpened")
        opened = self._opened_message
        self.lease_id = int(opened.lease_id)
        self.env_spec: EnvSpec = decode_env_spec(opened.env_spec)
        self.env_workers: list[str] = list(opened.env_workers)

    # --- calls ------------------------------------------------------------------

    def send(self, op: str, ids: Sequence[int], args: Sequence[Any]) -> None:
        """Starts ``op`` on envs ``ids`` (``args[k]`` for ``ids[k]``) without waiting.

        A failure to encode the call is each env's answer (an
        :class:`LeaseEnvFailure`), never raised, so every env of ``ids`` answers
        exactly once through :meth:`receive`.
        """
        call_id = next(self._call_ids)
        deadline = time.monotonic() + self.call_timeout
        try:
            call = _call(call_id, op, ids, args)
            call.prefetch_reset = op == "step" and self.prefetch_resets
            request = leases_pb2.LeaseRequest(call=call)
        except RlfleetError as exc:
            with self._lock:
                for env_id in ids:
                    self._answers[env_id] = LeaseEnvFailure(exc)
                self._changed.notify_all()
            return
        with self._lock:
            for env_id in ids:
                self._waiting[env_id] = _Waiting(call_id, deadline)
                self._answers.pop(env_id, None)
            if self._failure is not None:
                self._fail_waiting(self._failure)
                return
        self._requests.put(request)

    def receive(self, ids: Sequence[int], count: int, timeout: float | None) -> dict[int, Any]:
        """Answers of envs ``ids`` once ``count`` have one, or after ``timeout`` seconds.

        Each env of ``ids`` must have a call in flight (sent by :meth:`send`).
        An env past its ``call_timeout`` is answered with an
        :class:`LeaseEnvFailure` holding an RlfleetTimeoutError, so this wait ends
        even with ``timeout`` None.

        Returns:
            ``{env id: answer}``: ``(obs, info)`` for reset, ``(obs, reward,
            terminated, truncated, info)`` for step, the value for the other
            ops, or an :class:`LeaseEnvFailure`.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                self._expire(ids)
                ready = [i for i in ids if i in self._answers]
                if len(ready) >= count:
                    break
                now = time.monotonic()
                waits = [self._waiting[i].deadline for i in ids if i in self._waiting]
                if end is not None:
                    if now >= end:
                        break
                    waits.append(end)
                if not waits:
                    raise UsageError(f"envs {list(ids)} have no call in flight")
                self._changed.wait(max(min(waits) - now, 0.0) + 1e-3)
            return {i: self._answers.pop(i) for i in ready}

    def take_prefetched(
        self, ids: Sequence[int], args: Sequence[Any]
    ) -> dict[int, tuple[Any, dict[str, Any]]]:
        """The prefetched resets that answer a reset of ``ids`` without a round trip.

        Only a reset without seed and options (``args[k]``, reset's kwargs)
        is answered this way; the prefetched resets of every env of ``ids``
        are used up either way (a seeded reset makes them stale).
        """
        with self._lock:
            found = {i: self._prefetched.pop(i) for i in ids if i in self._prefetched}
        return {
            i: found[i]
            for i, kwargs in zip(ids, args, strict=True)
            if i in found and all(value is None for value in kwargs.values())
        }

    def close(self, timeout: float = 5.0) -> None:
        """Releases the lease: sends close and waits up to ``timeout`` seconds for the end."""
        self._requests.put(leases_pb2.LeaseRequest(close=leases_pb2.LeaseClose()))
        self._requests.put(None)
        self._reader.join(timeout)
        self._call.cancel()

    # --- the stream ----------------------------------------------------------------

    def _outgoing(self) -> Iterator[leases_pb2.LeaseRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self) -> None:
        failure: RlfleetError
        try:
            for response in self._call:
                body = response.WhichOneof("body")
                if body == "opened":
                    self._opened_message = response.opened
                    self._opened.set()
                elif body == "reply":
                    self._on_reply(response.reply)
            failure = UsageError("the lease is closed")
        except grpc.RpcError as exc:
            failure = call_error(exc, what="Lease", timeout=None)
        except RlfleetError as exc:  # a reply that does not decode
            failure = exc
            self._call.cancel()
        with self._lock:
            self._failure = failure
            self._fail_waiting(failure)
        self._requests.put(None)
        self._opened.set()

    def _on_reply(self, reply: leases_pb2.LeaseReply) -> None:
        space = self.env_spec.observation_space
        answers = _answers(reply, space)
        resets = _prefetched_resets(reply, space)
        with self._lock:
            for env_id, answer in zip(reply.env_ids, answers, strict=True):
                waiting = self._waiting.get(env_id)
                if waiting is None or waiting.call_id != reply.call_id:
                    continue  # the answer of a call that already timed out
                del self._waiting[env_id]
                self._answers[env_id] = answer
                if env_id in resets:
                    self._prefetched[env_id] = resets[env_id]
            self._changed.notify_all()

    def _expire(self, ids: Sequence[int]) -> None:
        now = time.monotonic()
        for env_id in ids:
            waiting = self._waiting.get(env_id)
            if waiting is not None and now >= waiting.deadline:
                del self._waiting[env_id]
                self._answers[env_id] = LeaseEnvFailure(
                    RlfleetTimeoutError(
                        f"env {env_id} of lease {self.lease_id} did not answer within "
                        f"{self.call_timeout:g} seconds (call_timeout)"
                    )
                )

    def _fail_waiting(self, failure: RlfleetError) -> None:
        for env_id in list(self._waiting):
            self._answers[env_id] = LeaseEnvFailure(failure)
        self._waiting.clear()
        self._changed.notify_all()


def _call(call_id: int, op: str, ids: Sequence[int], args: Sequence[Any]) -> leases_pb2.LeaseCall:
    """The LeaseCall of one vector-env command (see rlfleet.envs' command arguments)."""
    call = leases_pb2.LeaseCall(call_id=call_id, op=OPS[op], env_ids=ids)
    if op == "reset":
        seeds = [kwargs.get("seed") for kwargs in args]
        if any(seed is not None for seed in seeds):
            call.seeds.extend(-1 if seed is None else int(seed) for seed in seeds)
        options = {json.dumps(kwargs.get("options")) for kwargs in args}
        extra = sorted({key for kwargs in args for key in kwargs} - {"seed", "options"})
        if extra or len(options) > 1:
            raise UsageError(
                f"reset() of leased envs takes seed and options (the same options for every "
                f"env of the call), got {extra or 'different options per env'}"
            )
        text = options.pop()
        if text != "null":
            call.options_json = text
    elif op == "step":
        call.actions.CopyFrom(encode_tensor(np.stack([np.asarray(a) for a in args])))
    elif op in ("get_attr", "set_attr", "call"):
        first = args[0]
        call.name = first if op == "get_attr" else first[0]
        if op == "set_attr":
            call.value_json = _json_text(first[1], f"set_env_attr({call.name!r})")
        elif op == "call":
            call.value_json = _json_text([list(first[1]), first[2]], f"method {call.name!r}")
    return call


def _json_text(value: Any, where: str) -> str:
    try:
        return json.dumps(value, default=_plain)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"{where}: leased envs take plain (JSON) values, got {type(value).__name__}: {exc}"
        ) from exc


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _answers(reply: leases_pb2.LeaseReply, space: gym.Space) -> list[Any]:
    """Each env's answer in a reply, decoded and its observations checked.

    Raises:
        ProtocolError: If the reply is inconsistent or its observations do
            not fit the lease's observation space (shape and dtype).
    """
    count = len(reply.env_ids)
    if reply.HasField("error"):
        error = _rpc.error_from_detail(reply.error)
        return [LeaseEnvFailure(error)] * count
    op = reply.op
    if op in (leases_pb2.LEASE_OP_RESET, leases_pb2.LEASE_OP_STEP):
        obs = _observations(reply.observations, space, reply.worker)
        infos = _infos(reply.infos, reply.infos_json, "LeaseReply.infos")
        if obs.shape[:1] != (count,) or len(infos) != count:
            raise ProtocolError(
                f"a lease reply for {count} envs holds {obs.shape[:1]} observations and "
                f"{len(infos)} infos"
            )
        if op == leases_pb2.LEASE_OP_RESET:
            return [(obs[k], infos[k]) for k in range(count)]
        rewards = decode_tensor(reply.rewards, name="LeaseReply.rewards")
        terminated = decode_tensor(reply.terminated, name="LeaseReply.terminated")
        truncated = decode_tensor(reply.truncated, name="LeaseReply.truncated")
        return [
            (obs[k], float(rewards[k]), bool(terminated[k]), bool(truncated[k]), infos[k])
            for k in range(count)
        ]
    if op == leases_pb2.LEASE_OP_RENDER:
        if not reply.HasField("frames"):
            return [None] * count
        frames = decode_tensor(reply.frames, name="LeaseReply.frames")
        return [frames[k] for k in range(count)]
    if op == leases_pb2.LEASE_OP_SET_ATTR:
        return [None] * count
    return [json.loads(text) for text in reply.values_json]


def _prefetched_resets(
    reply: leases_pb2.LeaseReply, space: gym.Space
) -> dict[int, tuple[Any, dict[str, Any]]]:
    """The resets a STEP reply carries (LeaseCall.prefetch_reset), by env id."""
    if not reply.reset_env_ids:
        return {}
    obs = _observations(reply.reset_observations, space, reply.worker)
    count = len(reply.reset_env_ids)
    if obs.shape[:1] != (count,) or len(reply.reset_infos) != count:
        raise ProtocolError(
            f"a lease reply carries {count} prefetched resets with {obs.shape[:1]} "
            f"observations and {len(reply.reset_infos)} infos"
        )
    infos = _infos(reply.reset_infos, reply.reset_infos_json, "LeaseReply.reset_infos")
    return {int(env_id): (obs[k], infos[k]) for k, env_id in enumerate(reply.reset_env_ids)}


def _observations(tensor: Any, space: gym.Space, worker: str) -> np.ndarray:
    """Decodes a reply's observations and checks them against the lease's space."""
    obs = decode_tensor(tensor, name="LeaseReply.observations")
    if obs.shape[1:] != (space.shape or ()) or obs.dtype != space.dtype:
        raise ProtocolError(
            f"worker {worker!r} sent observations of shape {obs.shape[1:]} and dtype "
            f"{obs.dtype} per env; the lease's observation space is {space}"
        )
    return obs


def _infos(maps: Sequence[Any], texts: Sequence[str], name: str) -> list[dict[str, Any]]:
    """Info dicts from their TensorMaps and JSON texts (LeaseReply.infos/_json)."""
    infos = [_info(decode_tensor_map(m, name=name)) for m in maps]
    for info, text in zip(infos, texts, strict=False):
        if text:
            info.update(json.loads(text))
    return infos


def _info(tree: Mapping[str, Any]) -> dict[str, Any]:
    """An info dict from the wire: 0-d arrays become numpy scalars, as envs give them."""
    return {
        key: _info(value)
        if isinstance(value, Mapping)
        else (value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value)
        for key, value in tree.items()
    }
