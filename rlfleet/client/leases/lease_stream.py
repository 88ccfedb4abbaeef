"""LeaseStream: one ``Lease`` call, the connection layer of RemoteVectorEnv.

It speaks rlfleet's types to its user and, through rlfleet.wire.leases
(the lease face's translation), protobuf to the coordinator: it opens a
lease of K envs, sends calls on some env ids without waiting (pipelining),
and hands back each env's answer as it lands, decoded into numpy arrays and
info dicts. A reader thread receives the replies; every
wait has a deadline, and an env whose answer is late past ``call_timeout``
is answered with an :class:`~rlfleet.errors.RlfleetTimeoutError` naming the
seconds (its late answer is then dropped).

When the coordinator serves the lease data channel (LeaseOpened.data), the
lease's calls and replies move to a framed TCP connection to the same host
(rlfleet.transport.lease_channel): the caller's thread writes each call to the socket and,
in :meth:`LeaseStream.receive`, reads the replies from it itself, with no
gRPC and no thread hand-off on the way (one hop fewer than a reader thread:
~13-27 us of CPU and latency per call, docs/vector_env.md). The
stream stays open for the lease's errors and its end. If the data port
cannot be reached, everything stays on the stream (one WARNING says what to
open). A learner in the coordinator's own process (``Fleet.local``) presents
its ticket in memory instead of dialling (``data_in_process``): the same
frames, with no socket and no relay thread between its calls and the
workers' connections.

Several streams may share one condition (``changed``), so that one thread
waits on all of them at once (a vector env whose envs are leased on several
coordinators, rlfleet.client.leases.sharded_lease): each such stream then
reads its data channel on a thread of its own, which wakes that condition,
since no caller's thread can read every socket itself.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc

from rlfleet.client._errors import call_error
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import (
    ProtocolError,
    RlfleetError,
    RlfleetTimeoutError,
    UnavailableError,
    UsageError,
)
from rlfleet.security import ClientTLS
from rlfleet.security.pickle import cloudpickle_module
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.data_address import warn_unreachable
from rlfleet.transport.in_process_link import InProcessLink
from rlfleet.transport.lease_channel import (
    DATA_DIAL_SECONDS,
    DataLink,
    dial,
)
from rlfleet.wire.lease_values import ReplyCheck
from rlfleet.wire.leases import (
    CLOSE_REQUEST,
    LeaseEnvFailure,
    LeaseOpenedEvent,
    LeaseRepliedEvent,
    call_request,
    data_hello,
    decode_lease_response,
    open_request,
)

__all__ = ["LeaseEnvFailure", "LeaseStream"]

logger = logging.getLogger("rlfleet.client")

#: How long a broken data connection waits for the stream to say why (the
#: lease's own error, e.g. no worker left) before reporting the break itself.
_WHY_SECONDS = 2.0
#: How long a read of replies already arriving waits for the rest of a frame
#: (the coordinator sends each frame whole; what is read is kept on timeout).
_REST_OF_FRAME_SECONDS = 0.01
#: How long a data-channel reader thread's read waits before it checks
#: whether the stream ended (closing the link wakes it at once anyway).
_DATA_READER_WAIT_SECONDS = 60.0


class _Waiting(NamedTuple):
    """The call an env waits on; one per call, shared by its envs."""

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
        data_host: The coordinator's host, to dial the lease data channel on;
            None keeps the lease's traffic on the stream.
        tls: The fleet's TLS settings (the data channel uses them too).
        max_message_bytes: Longest frame accepted on the data channel.
        data_in_process: The coordinator's in-process attach, when it runs
            in this process (``Fleet.local``): it takes the serialized
            LeaseDataHello and returns the data channel's in-memory link.
        pickled_factories: One cloudpickled env factory per env, sent in
            LeaseOpen.env for a fleet that takes pickles (b"": none).
        pickles: The envs come from pickled factories (sent here, or
            registered in an embedded coordinator's memory), so their
            replies may carry pickled values, which this stream then
            unpickles (rlfleet.wire.lease_values); else it unpickles nothing.
        changed: A condition shared with other streams, notified whenever
            an answer lands or the stream fails, so that one thread waits
            on all of them (:meth:`answered`); its lock guards this stream's
            state. None: a condition of its own. With one, the data channel
            is read by a thread of this stream.
        first_env: What the caller calls env 0 of this lease (a lease of a
            block of a larger vector env), for the env ids in messages.

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
        data_host: str | None = None,
        tls: ClientTLS | None = None,
        max_message_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES,
        data_in_process: Callable[[bytes], DataLink] | None = None,
        pickled_factories: bytes = b"",
        pickles: bool = False,
        changed: threading.Condition | None = None,
        first_env: int = 0,
    ) -> None:
        self.num_envs = num_envs
        self.first_env = first_env
        self.prefetch_resets = prefetch_resets
        # Resets workers made when an episode ended, not yet taken: (obs, info).
        self._prefetched: dict[int, tuple[Any, dict[str, Any]]] = {}
        self.call_timeout = call_timeout
        self.lease_id = 0  # the coordinator's number, once opened
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # Its lock guards the state below (with a shared condition, every
        # stream's): ``with self._changed`` holds it.
        self._changed = threading.Condition(threading.Lock()) if changed is None else changed
        self._read_on_thread = changed is not None
        self._waiting: dict[int, _Waiting] = {}
        self._answers: dict[int, Any] = {}
        self._failure: RlfleetError | None = None
        self._call_ids = itertools.count(1)
        self._opened = threading.Event()
        self._opened_event: LeaseOpenedEvent | None = None
        # Only a lease of pickled factories may carry pickles back.
        self._unpickle = cloudpickle_module().loads if pickles or pickled_factories else None
        self._check: ReplyCheck | None = None  # the replies' rules, once opened
        self._link: DataLink | None = None  # the data channel, once accepted
        # Held by the one thread reading the data channel, taken and released
        # under self._changed so that a waiter never misses the reader's end.
        self._read_lock = threading.Lock()
        self._closing = False
        self._requests.put(open_request(env, num_envs, open_timeout, learner, pickled_factories))
        # Bytes both ways: rlfleet.wire.leases serializes and parses.
        lease = channel.stream_stream(
            _rpc.LEASE, request_serializer=None, response_deserializer=None
        )
        # The reader waits for replies (none at all while they take the data
        # channel) without grpcio's polls, which take the GIL from the learner.
        _rpc.install_long_waits()
        self._call = lease(self._outgoing())
        self._reader = threading.Thread(target=self._read, name="rlfleet-lease", daemon=True)
        self._reader.start()
        # A little beyond the coordinator's own wait, so its precise error wins.
        if not self._opened.wait(open_timeout + 5.0):
            self._call.cancel()
            raise RlfleetTimeoutError(
                f"the lease of {num_envs} envs was not opened within {open_timeout:g} seconds"
            )
        if self._opened_event is None:
            raise self._failure or ProtocolError("the Lease stream ended before LeaseOpened")
        opened = self._opened_event
        self.lease_id = opened.lease_id
        self.env_spec: EnvSpec = opened.env_spec
        #: Each env's spec (env_specs[i]); all ``env_spec`` unless the factories differ.
        self.env_specs: list[EnvSpec] = opened.env_specs
        self.env_workers: list[str] = opened.env_workers
        if opened.data is not None and data_in_process is not None:
            self._attach_in_process(data_in_process, opened.data[1])
        if opened.data is not None and self._link is None and data_host is not None:
            timeout = min(open_timeout, DATA_DIAL_SECONDS)
            self._dial(data_host, opened.data, tls, timeout, max_message_bytes)
        self._data_reader: threading.Thread | None = None
        if self._link is not None and self._read_on_thread:
            self._data_reader = threading.Thread(
                target=self._read_data, args=(self._link,), name="rlfleet-lease-data", daemon=True
            )
            self._data_reader.start()

    @property
    def carrier(self) -> str:
        """``"data"`` when calls travel on the lease data channel, ``"in-process"``
        on its in-memory link (``Fleet.local``), else ``"grpc"``."""
        if isinstance(self._link, InProcessLink):
            return "in-process"
        return "data" if self._link is not None else "grpc"

    def _attach_in_process(self, attach: Callable[[bytes], DataLink], ticket: bytes) -> None:
        """Presents the ticket to the coordinator of this process (if it refuses,
        the learner dials its data port as any learner would)."""
        try:
            self._link = attach(data_hello(ticket))
        except UnavailableError as exc:
            logger.info("lease %d: %s; dialling its data port instead", self.lease_id, exc)

    def _dial(
        self,
        host: str,
        data: tuple[int, bytes],
        tls: ClientTLS | None,
        timeout: float,
        max_frame_bytes: int,
    ) -> None:
        """Opens the lease data channel (LeaseOpened.data: port and ticket), or warns."""
        port, ticket = data
        try:
            link = dial(
                host,
                port,
                data_hello(ticket),
                tls=tls,
                timeout=timeout,
                max_frame_bytes=max_frame_bytes,
            )
        except (OSError, UnavailableError) as exc:
            warn_unreachable(host, port, f"lease {self.lease_id}", f"{type(exc).__name__}: {exc}")
            return
        self._link = link

    # --- calls ------------------------------------------------------------------

    def send(
        self, op: str, ids: Sequence[int], args: Sequence[Any], *, whole_reply: bool = False
    ) -> None:
        """Starts ``op`` on envs ``ids`` (``args[k]`` for ``ids[k]``) without waiting.

        ``whole_reply``: the caller waits for every env of ``ids``, so the
        coordinator answers them in one message (LeaseCall.whole_reply).

        A failure to encode the call is each env's answer (an
        :class:`LeaseEnvFailure`), never raised, so every env of ``ids`` answers
        exactly once through :meth:`receive`.
        """
        call_id = next(self._call_ids)
        deadline = time.monotonic() + self.call_timeout
        try:
            request = call_request(
                call_id, op, ids, args, self.prefetch_resets, whole_reply=whole_reply
            )
        except RlfleetError as exc:
            with self._changed:
                for env_id in ids:
                    self._answers[env_id] = LeaseEnvFailure(exc)
                self._changed.notify_all()
            return
        waiting = _Waiting(call_id, deadline)
        with self._changed:
            for env_id in ids:
                self._waiting[env_id] = waiting
                self._answers.pop(env_id, None)
            if self._failure is not None:
                self._fail_waiting(self._failure)
                return
        link = self._link
        if link is None:
            self._requests.put(request)
            return
        try:
            link.send(request)
        except OSError as exc:
            self._reader.join(_WHY_SECONDS)  # the stream may say why first
            self._broken(f"sending call {call_id} failed: {exc}")

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
        answers = self._answers
        first: list[int] | None = None  # the envs ready when count was reached
        drained = False  # a read without waiting found nothing more
        while True:
            with self._changed:
                now = time.monotonic()
                ready, due = self.answered(ids, now)
                earliest = end if due is None or (end is not None and end < due) else due
                link = self._link
                if len(ready) >= count or (end is not None and now >= end):
                    # If the rest's replies (another worker's envs) already
                    # came too, every env answers in this one call, as in sync
                    # mode, instead of one call per reply: read without
                    # waiting. Only all of them: returning some extra ones
                    # would shrink the envs kept in flight (wait_num's point
                    # for envs of uneven step times); those stay for the next.
                    if len(ready) == len(ids):
                        return {i: answers.pop(i) for i in ready}
                    if first is None:
                        first = ready
                    if (
                        drained
                        or link is None
                        or self._failure is not None
                        or not link.readable()
                        or not self._read_lock.acquire(False)
                    ):
                        return {i: answers.pop(i) for i in first}
                    # A frame has begun to arrive: the rest of it follows at once.
                    wait, draining = _REST_OF_FRAME_SECONDS, True
                elif earliest is None:
                    raise UsageError(f"envs {list(ids)} have no call in flight")
                else:
                    wait, draining = max(earliest - now, 0.0) + 1e-3, False
                    # The data channel's replies are read by the waiting thread
                    # itself; another waiter (or a stream without the channel)
                    # waits for the reader's notification.
                    if (
                        link is None
                        or self._failure is not None
                        or not self._read_lock.acquire(False)
                    ):
                        self._changed.wait(wait)
                        continue
            got = self._read_reply(link, wait)
            if draining:
                drained = not got

    def answered(self, ids: Sequence[int], now: float) -> tuple[list[int], float | None]:
        """The envs of ``ids`` with an answer, and the earliest deadline of the others.

        The caller holds the condition (``changed``). An env past its
        ``call_timeout`` at ``now`` is answered here with an
        :class:`LeaseEnvFailure` holding an RlfleetTimeoutError. The answers
        stay until :meth:`take` takes them.

        Returns:
            The answered envs (in ``ids`` order), and the earliest
            ``call_timeout`` deadline of the others with a call in flight
            (None if none has one).
        """
        answers, waiting = self._answers, self._waiting
        earliest = None
        ready = []
        for i in ids:
            if i in answers:
                ready.append(i)
            elif (call := waiting.get(i)) is not None:
                if now >= call.deadline:
                    del waiting[i]
                    answers[i] = self._timed_out(i)
                    ready.append(i)
                elif earliest is None or call.deadline < earliest:
                    earliest = call.deadline
        return ready, earliest

    def take(self, ids: Sequence[int]) -> dict[int, Any]:
        """Removes and returns the answers of ``ids``, each answered (the caller
        holds the condition; see :meth:`answered`)."""
        answers = self._answers
        return {i: answers.pop(i) for i in ids}

    def _read_data(self, link: DataLink) -> None:
        """Reads the data channel until the lease ends (a stream sharing its
        condition: the thread waiting on several streams reads no socket)."""
        while True:
            self._read_lock.acquire()
            with self._changed:
                if self._failure is not None or self._closing:
                    self._read_lock.release()
                    return
            self._read_reply(link, _DATA_READER_WAIT_SECONDS)

    def _read_reply(self, link: DataLink, wait: float) -> bool:
        """Reads and applies one data-channel frame within ``wait`` seconds (the
        caller holds the read lock, released here).

        Returns:
            Whether a frame came (False: none within ``wait``, or the link broke).
        """
        event = why = None
        try:
            data = link.receive_within(wait)
            if data is None:
                why = "the coordinator closed it"
            else:
                event = decode_lease_response(data, self._check)
        except TimeoutError:
            pass  # the caller's loop expires what is due
        except OSError as exc:
            why = f"broken: {exc}"
        except RlfleetError as exc:  # a reply that does not decode
            why = str(exc)
        with self._changed:
            self._read_lock.release()
            if isinstance(event, LeaseRepliedEvent):
                self._apply(event)
            self._changed.notify_all()
        if why is not None:
            if not self._closing:
                # Usually the stream says why the lease ended (its own, precise error).
                self._reader.join(_WHY_SECONDS)
            self._broken(why)
        return event is not None

    def take_prefetched(
        self, ids: Sequence[int], args: Sequence[Any]
    ) -> dict[int, tuple[Any, dict[str, Any]]]:
        """The prefetched resets that answer a reset of ``ids`` without a round trip.

        Only a reset without seed and options (``args[k]``, reset's kwargs)
        is answered this way; the prefetched resets of every env of ``ids``
        are used up either way (a seeded reset makes them stale).
        """
        with self._changed:
            found = {i: self._prefetched.pop(i) for i in ids if i in self._prefetched}
        return {
            i: found[i]
            for i, kwargs in zip(ids, args, strict=True)
            if i in found and all(value is None for value in kwargs.values())
        }

    def close(self, timeout: float = 5.0) -> None:
        """Releases the lease: sends close and waits up to ``timeout`` seconds for the end."""
        self._closing = True
        link = self._link
        if link is None:
            self._requests.put(CLOSE_REQUEST)
        else:
            with contextlib.suppress(
                OSError
            ):  # broken: the coordinator releases the lease when it notices
                link.send(CLOSE_REQUEST)
        self._requests.put(None)
        self._reader.join(timeout)
        self._call.cancel()
        if link is not None:
            link.close()
        if self._data_reader is not None:
            self._data_reader.join(timeout)  # the closed link woke it

    # --- the stream ----------------------------------------------------------------

    def _outgoing(self) -> Iterator[bytes]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self) -> None:
        failure: RlfleetError
        try:
            for data in self._call:
                event = decode_lease_response(data, self._check)
                if isinstance(event, LeaseOpenedEvent):
                    self._check = ReplyCheck(
                        [spec.observation_space for spec in event.env_specs], self._unpickle
                    )
                    self._opened_event = event
                    self._opened.set()
                elif isinstance(event, LeaseRepliedEvent):
                    self._on_reply(event)
            failure = UsageError("the lease is closed")
        except grpc.RpcError as exc:
            failure = call_error(exc, what="Lease", timeout=None)
        except RlfleetError as exc:  # a reply that does not decode
            failure = exc
            self._call.cancel()
        with self._changed:
            if self._failure is None:
                self._failure = failure
            self._fail_waiting(self._failure)
        self._requests.put(None)
        self._opened.set()
        if self._link is not None:
            self._link.close()

    def _broken(self, why: str) -> None:
        """The data connection failed: every call waiting fails, and the lease with it."""
        with self._changed:
            if self._failure is None:
                self._failure = UnavailableError(
                    f"lease {self.lease_id}: its data connection to the coordinator ended "
                    f"({why}); open a new lease"
                )
            self._fail_waiting(self._failure)
        self._call.cancel()

    def _on_reply(self, reply: LeaseRepliedEvent) -> None:
        with self._changed:
            self._apply(reply)
            self._changed.notify_all()

    def _apply(self, reply: LeaseRepliedEvent) -> None:
        """Stores the answers of a reply (the caller holds the lock)."""
        for env_id, worker in reply.workers.items():
            if 0 <= env_id < len(self.env_workers):
                self.env_workers[env_id] = worker  # the host now (a lost one's replacement)
        resets = reply.resets
        for env_id, answer in zip(reply.env_ids, reply.answers, strict=True):
            waiting = self._waiting.get(env_id)
            if waiting is None or waiting.call_id != reply.call_id:
                continue  # the answer of a call that already timed out
            del self._waiting[env_id]
            self._answers[env_id] = answer
            if env_id in resets:
                self._prefetched[env_id] = resets[env_id]

    def _timed_out(self, env_id: int) -> LeaseEnvFailure:
        """The answer of an env past its call_timeout."""
        return LeaseEnvFailure(
            RlfleetTimeoutError(
                f"env {self.first_env + env_id} of lease {self.lease_id} did not answer within "
                f"{self.call_timeout:g} seconds (call_timeout)"
            )
        )

    def _fail_waiting(self, failure: RlfleetError) -> None:
        for env_id in list(self._waiting):
            self._answers[env_id] = LeaseEnvFailure(failure)
        self._waiting.clear()
        self._changed.notify_all()
