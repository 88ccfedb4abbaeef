"""A worker session's results from its lease data connection, booked in order.

The data channel's one selector thread reads every frame of every session.
It hands a worker's frames that are not lease replies here, and at the end
of its wake-up (``defer``, the data loop's ``after_wake_up``: once every
connection ready in it was served) books them itself, as one batch
(``WorkerEvents.on_results``: one lock and one refill for the batch, each
result booked as it would have been alone, in the order they came), and
sends the results whose Sample call takes them on the learner's results
connection there, without waiting (``CallOutbox.try_send_reserved``). The
loop is awake already: a lane's own thread, woken for about one frame
each time, runs with cold caches at 2-7 times the same work done warm
(docs/performance.md, "Coordinator capacity: where a result's CPU goes").

The lane's own thread takes over whatever the loop must not wait for, in
order: a send the learner's connection cannot take at once (another thread
sends on the call, or frames wait on the connection), or the rest of one
the socket took in part, and every later frame of the worker until that
thread is done with what it was given; frames of more than
:data:`_LOOP_BYTES` in one wake-up (a result of megabytes costs its copies
and checks, which would hold the other sessions' lease replies); and
frames that come before the worker's Join stream carried its last result.
There, a learner that reads slowly slows this lane, in order, never the
loop.

A worker that agreed on ``rlfleet.results-switch`` may have sent results on
its Join stream before it moved them here, and those may still be on their
way through gRPC: nothing is booked until the Join stream's reader has
read the results switch marker (or the stream's end), the mirror of the
worker holding data-channel lease commands until the coordinator's switch
marker. The frames wait in the lane's queue meanwhile, counted against the
limit. The lane sets the session's end-of-results event once every result
before the marker (or the connection's end) was booked.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable

import grpc

from rlfleet._util.prebuilt import prebuilt
from rlfleet.coordinator.calls import ReservedSend, by_call
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.coordinator.worker_messages import (
    ResultPiece,
    WorkerEvent,
    parse_worker_message_by_protobuf,
)
from rlfleet.errors import ProtocolError, ResourceExhaustedError, WireFormatError
from rlfleet.protocol.join import WorkerLeaving
from rlfleet.security import InflightBudget
from rlfleet.wire import Chunk
from rlfleet.wire.chunks import DATA_CHANNEL_CHUNK_BYTES, DATA_CHANNEL_METADATA_BYTES
from rlfleet.wire.result_message import read_result_message
from rlfleet.wire.results import JoinedResult

logger = logging.getLogger("rlfleet.coordinator")

#: Seconds the lane's thread waits for work before it looks whether its worker is gone.
_IDLE_SECONDS = 1.0

#: Bytes of a worker's frames in one wake-up of the loop past which its lane's
#: thread books them, not the loop: a result of megabytes costs its copies
#: and checks, which would hold every other session's lease replies, and the
#: lane's wake-up is little next to them (125-frame Atari-sized results, 3.7
#: MB, cost the coordinator 2-10% more booked on the loop, in 5 of 6 pairs).
_LOOP_BYTES = 2 << 20

#: Frames the lane's thread takes from its queue at most at once (their
#: results are booked as one batch; their bytes are bounded by ``limit``).
_BATCH_FRAMES = 64


class _Closed:
    """Queued at the connection's end: nothing more comes."""


class _Sends:
    """Sends of results the data loop booked that could not go (whole) at once:
    the lane's thread makes them (it may wait for the learner), before
    anything queued after them.

    Args:
        jobs: Each a call's send (``CallOutbox.send_reserved``) or the rest
            of one (``CallOutbox.finish_reserved``), in order.
    """

    __slots__ = ("jobs",)

    def __init__(self, jobs: list[Callable[[], None]]) -> None:
        self.jobs = jobs

    def send(self) -> None:
        """Makes every send, in order (may wait for a learner)."""
        for job in self.jobs:
            job()


#: What the lane's thread takes from its queue.
_Item = bytes | memoryview | list[bytes | memoryview] | _Closed | _Sends


class ResultLane:
    """The results of one worker session's data connection, in order: booked on
    the data loop's thread, or on the lane's own when the loop must not.

    Args:
        events: Books each result (``WorkerEvents.on_chunk``) and drops a
            worker whose result breaks the protocol.
        handle: The worker.
        done: Set once every result before the marker, or the connection's
            end, was booked (``handle.data_results_done``).
        limit: Bytes of results received but not yet checked, with the
            session's unfinished results on both carriers
            (max_inflight_bytes_per_worker, the session's ``handle.inflight``).
        close: Closes the data connection, with the reason (after a refusal).
        after: Set once the Join stream carries no more results
            (``handle.join_results_over``): nothing is booked before; None:
            the worker sends every result of its session on one carrier.
        defer: Runs the hand-over of what was queued later, on the caller's
            thread (the data loop's ``after_wake_up``; every :meth:`put`,
            :meth:`put_many` and :meth:`close` then comes from that one
            thread): the frames are booked then, on that thread, or handed
            to the lane's thread with one wake-up, and then the end, in
            order. None: each is handed to the lane's thread at once.
    """

    def __init__(
        self,
        events: WorkerEvents,
        handle: WorkerHandle,
        done: threading.Event,
        limit: int,
        close: Callable[[str], None],
        *,
        after: threading.Event | None = None,
        defer: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self._done = done
        self._after = after
        self._events = events
        self._handle = handle
        self._limit = limit
        self._close = close
        # The session's one budget, shared with its Join stream's results:
        # what this connection holds counts against the same limit.
        self._budget = handle.inflight.carrier()
        # Frames queued, not yet taken by the thread: its count is theirs.
        self._received = handle.inflight.carrier()
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        # Entries given to the thread, and those it is done with (each counter
        # written by one thread): equal, the thread holds nothing of the
        # worker's, and the loop may book the next frames itself.
        self._given = 0
        self._taken = 0
        self._failed = False
        self._defer = defer
        # What was queued since the last hand-over (with ``defer``), in order.
        self._pending: list[_Item] = []
        threading.Thread(
            target=self._run, name=f"rlfleet-data-results-{handle.name}", daemon=True
        ).start()

    def put(self, payload: bytes | memoryview) -> None:
        """Queues one frame that is not a lease reply (the loop thread): a
        result message or the end-of-results marker, as the lane will find.

        Raises:
            ResourceExhaustedError: If the worker has more bytes received and
                not yet checked than the limit (the caller drops it).
        """
        queued, total = self._received.hold(len(payload))
        if total > self._limit:
            raise ResourceExhaustedError(
                f"worker {self._handle.name!r} has {queued} bytes of results received on its "
                f"lease data connection and not yet checked ({total} in flight with its "
                f"unfinished results), over the limit of {self._limit} "
                "(max_inflight_bytes_per_worker); it was dropped. Sample fewer steps per task"
            )
        self._enqueue(payload)

    def put_many(self, payloads: list[bytes | memoryview]) -> None:
        """:meth:`put` for the frames of one wake-up of the loop, in order: one
        count and one queue entry (one wake-up of the lane's thread) for all.

        Raises:
            ResourceExhaustedError: As :meth:`put`, for the first frame past the limit.
        """
        size = sum(map(len, payloads))
        _, total = self._received.hold(size)
        if total > self._limit:
            # Frame by frame, as alone: those within the limit are queued.
            self._received.let_go(size)
            for payload in payloads:
                self.put(payload)
            return
        self._enqueue(payloads)

    def close(self) -> None:
        """The connection ended: once what is queued was booked, nothing more comes."""
        self._enqueue(_Closed())

    def _enqueue(self, item: bytes | memoryview | list[bytes | memoryview] | _Closed) -> None:
        if self._defer is None:
            self._give(item)
            return
        first = not self._pending
        self._pending.append(item)  # before asking: a defer may hand over at once
        if first:
            self._defer(self._hand_over)

    def _give(self, item: _Item) -> None:
        """Queues ``item`` for the lane's thread."""
        self._given += 1
        self._queue.put(item)

    def _hand_over(self) -> None:
        """What was queued since the last hand-over (the data loop's thread, at
        the end of its wake-up): its frames booked here when the lane's
        thread holds nothing of the worker's and its Join stream carries no
        more results, else given to that thread as one entry (one
        wake-up); then the end if it came."""
        items, self._pending = self._pending, []
        frames: list[bytes | memoryview] = []
        end = None
        for item in items:
            if isinstance(item, _Closed):
                end = item
                break  # nothing counts after the end (the lane's thread stops there)
            if isinstance(item, list):
                frames += item
            elif not isinstance(item, _Sends):
                frames.append(item)
        if frames:
            after = self._after
            size = sum(map(len, frames))
            if (
                size <= _LOOP_BYTES
                and self._given == self._taken
                and (after is None or after.is_set())
            ):
                self._book_here(frames, size)
            else:
                self._give(frames)
        if end is not None:
            self._give(end)

    def _book_here(self, frames: list[bytes | memoryview], size: int) -> None:
        """Books ``frames`` on this thread (the data loop's), which must not wait
        for a learner: each call's results go to its results connection if
        they can at once, the others to the lane's thread, which sends them
        (and books what follows) in order."""
        self._received.let_go(size)
        if self._failed:
            return
        sends: list[ReservedSend] = []
        self._book(frames, sends)
        if not sends:
            return
        later: list[Callable[[], None]] = []
        for outbox, sender, forwards in by_call(sends):
            tried = outbox.try_send_reserved(sender, forwards)
            if tried == "refused":
                later.append(functools.partial(outbox.send_reserved, sender, forwards))
            elif tried == "begun":
                later.append(functools.partial(outbox.finish_reserved, sender, len(forwards)))
        if later:
            self._give(_Sends(later))

    def _run(self) -> None:
        handle = self._handle
        if self._after is not None:
            # The results the worker sent on its Join stream come first.
            while not self._after.wait(_IDLE_SECONDS):
                if not handle.alive:
                    self._done.set()  # written off: what is queued is never booked
                    return
        while True:
            try:
                first = self._queue.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                if handle.alive:
                    continue
                # Written off (its data connection's end follows, or the port stopped).
                self._done.set()
                return
            # Every frame queued by now is taken at once: their results are
            # booked as one batch (one lock, one refill), in the order they came.
            items = [first]
            # Only this thread takes from the queue: one that is not empty
            # yields at once (no queue.Empty raised and caught per wake-up).
            while (
                len(items) < _BATCH_FRAMES
                and not isinstance(items[-1], _Closed)
                and not self._queue.empty()
            ):
                items.append(self._queue.get_nowait())
            frames: list[bytes | memoryview] = []
            for item in items:
                if isinstance(item, list):
                    frames += item  # put_many's
                elif isinstance(item, _Sends):
                    # Given only to an idle thread: nothing of the worker's before it.
                    item.send()
                elif not isinstance(item, _Closed):
                    frames.append(item)
            self._received.let_go(sum(map(len, frames)))  # no generator frame per wake-up
            if frames and not self._failed:
                self._book(frames)
            self._taken += len(items)
            if isinstance(items[-1], _Closed):
                self._done.set()
                return

    def _book(
        self, frames: list[bytes | memoryview], sends: list[ReservedSend] | None = None
    ) -> None:
        """Books ``frames``' results; those for a call with a results connection
        are sent by this thread, or, with ``sends``, put there for the caller."""
        handle, events = self._handle, self._events
        results: list[JoinedResult] = []
        try:
            try:
                for payload in frames:
                    item = join_frame(events, handle, self._budget, payload)
                    if item is None:
                        continue  # a result's chunk, not its last
                    if isinstance(item, JoinedResult):
                        results.append(item)
                    elif isinstance(item, WorkerLeaving):
                        # The end-of-results marker: every result before it is booked first.
                        booked, results = results, []
                        events.on_results(handle, booked, send_here=True, sends=sends)
                        self._done.set()
                    else:
                        raise WireFormatError(
                            "a worker's lease data frame must be a WorkerMessage holding only "
                            "lease_reply, result or (the end-of-results marker) leaving "
                            "(leases.proto, 'The lease data channel')"
                        )
            finally:
                # What came whole before a broken frame is booked as it would have been.
                if results:
                    events.on_results(handle, results, send_here=True, sends=sends)
            return
        except ResourceExhaustedError as exc:
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except (ProtocolError, WireFormatError) as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except Exception as exc:  # a bug here must not leave a zombie worker
            logger.exception("internal error on a result of worker %r", handle.name)
            code, message = grpc.StatusCode.INTERNAL, f"coordinator bug: {exc!r}"
        # Refused as on its Join stream; what it sends after is not booked.
        self._failed = True
        events.drop(handle, code, message)
        self._close(message)


def join_frame(
    events: WorkerEvents, handle: WorkerHandle, budget: InflightBudget, payload: bytes | memoryview
) -> JoinedResult | WorkerEvent | None:
    """One frame of a lane: a result's message bounded and joined
    (``WorkerEvents.join_chunk``), or what else the frame holds.

    A result message as protobuf writes it (every frame of rlfleet's workers)
    is read in one call into its header and chunk, with no ``ResultPiece``
    made for it; any other frame is read as ``parse_worker_message`` reads it.

    Returns:
        The result once its last chunk is in; None after a chunk that is not
        its result's last; the event, for a frame that holds no result.

    Raises:
        ProtocolError: For a message past the data channel's bounds, without
            its chunk, or with chunks out of order.
        WireFormatError: If the frame is malformed.
        ResourceExhaustedError: Past the in-flight limit.
    """
    read = read_result_message(payload)
    if read is None:
        item = parse_worker_message_by_protobuf(payload)
        if not isinstance(item, ResultPiece):
            return item
        header, chunk = item.header, item.chunk
    else:
        header, chunk = read
        data = len(chunk.data)
        assembler = handle.data_assembler
        # The common frame, a whole result of one chunk within every bound:
        # joined as join_chunk joins it, with its budget's charge and release
        # (nothing held once it is joined) folded into one look.
        if (
            data <= DATA_CHANNEL_CHUNK_BYTES
            and len(payload) - data <= DATA_CHANNEL_METADATA_BYTES
            and budget.fits(data)
            and assembler.whole(header, chunk)
        ):
            return prebuilt(
                JoinedResult,
                header=header,
                chunks=(chunk,),
                payload=chunk.data,
                message_sizes=(data,),
            )
    _check_size(handle.name, len(payload), chunk)
    return events.join_chunk(handle, handle.data_assembler, budget, header, chunk)


def _check_size(worker: str, frame_bytes: int, chunk: Chunk | None) -> None:
    """Refuses a result message past the data channel's bounds: what a coordinator
    forwards must stay within what every learner accepts
    (``rlfleet.wire.chunks.FORWARDED_RESULT_BYTES``).

    Raises:
        ProtocolError: For a chunk's data above ``DATA_CHANNEL_CHUNK_BYTES``, or
            the rest of the message above ``DATA_CHANNEL_METADATA_BYTES``.
    """
    data = len(chunk.data) if chunk is not None else 0
    if data > DATA_CHANNEL_CHUNK_BYTES:
        raise ProtocolError(
            f"worker {worker!r} sent a result chunk of {data} bytes on its lease data "
            f"connection, over the data channel's {DATA_CHANNEL_CHUNK_BYTES} bytes "
            "(docs/protocol.md, 'Chunking'): cut results into chunks of at most that"
        )
    if frame_bytes - data > DATA_CHANNEL_METADATA_BYTES:
        raise ProtocolError(
            f"worker {worker!r} sent a result message with {frame_bytes - data} bytes "
            "besides its chunk's data on its lease data connection, over the data "
            f"channel's {DATA_CHANNEL_METADATA_BYTES} bytes of metadata (docs/protocol.md, "
            "'Chunking'): send fewer episodes per result"
        )
