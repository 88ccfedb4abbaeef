"""SampleStream: a subscription's batches as they land, each with its agent version."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, NamedTuple

import grpc

from rlfleet._util.closing import ClosesOnExit
from rlfleet._util.values import check_int
from rlfleet.client._errors import call_error
from rlfleet.client._learner_messages import ResponsePart
from rlfleet.client._responses import ResponseReader
from rlfleet.core import EpisodeBatch
from rlfleet.errors import ConfigError, RlfleetError
from rlfleet.protocol.learner_calls import SubscribeAsk
from rlfleet.protocol.modes import Mode
from rlfleet.wire.results import DecodedResult, ScatteredResult

#: Receive window of a subscription's channel: what the transport may hold
#: for a reader that stopped reading (see ``RemoteSampler.stream``).
STREAM_WINDOW_BYTES = 256 * 1024

_STREAM_MODES = {"episodes": Mode.EPISODES, "fragments": Mode.FRAGMENTS}


def subscribe_ask(
    mode: Literal["episodes", "fragments"],
    fragment_length: int | None,
    max_buffered_steps: int | None,
    seed: int | None,
) -> SubscribeAsk:
    """What ``RemoteSampler.stream``'s arguments ask a coordinator for.

    Raises:
        ConfigError: If an argument is out of the protocol's range, or
            fragments mode lacks its ``fragment_length``.
    """
    if mode not in _STREAM_MODES:
        raise ConfigError(f"stream mode must be 'episodes' or 'fragments', got {mode!r}")
    length = 0
    if mode == "fragments":
        if fragment_length is None:
            raise ConfigError("stream(mode='fragments') needs a fragment_length")
        check_int("fragment_length", fragment_length, minimum=1, maximum=2**32 - 1)
        length = fragment_length
    if max_buffered_steps is not None:
        check_int("max_buffered_steps", max_buffered_steps, minimum=1, maximum=2**63 - 1)
    return SubscribeAsk(
        _STREAM_MODES[mode],
        fragment_length=length,
        seed=seed,
        max_buffered_steps=max_buffered_steps or 0,
    )


class StreamedBatch(NamedTuple):
    """One result of a subscription.

    Attributes:
        batch: Its episodes (or fragments), ordered as the worker sent them.
        agent_version: The agent version that produced every one of them.
    """

    batch: EpisodeBatch
    agent_version: int


class SampleStream(ClosesOnExit):
    """Iterates a subscription's results; cancels the call when closed.

    Use as a context manager (``with sampler.stream() as stream:``) so the
    subscription ends, and the coordinator stops sampling for it, when the
    block ends. Iteration raises the typed rlfleet error if the call fails.

    Args:
        call: The Subscribe call (an iterator of its responses, read).
        what: Names the call in error messages.
        reader: Reads the call's responses.
        timeout: The call's deadline in seconds, for error messages.
        channel: The subscription's own channel, closed with the stream.
        failed: Turns a failed call into its typed error (the sampler's,
            which also tells a refused TLS certificate from an outage);
            None: :func:`call_error`.
    """

    def __init__(
        self,
        call: grpc.CallIterator[ResponsePart],
        what: str,
        reader: ResponseReader,
        timeout: float | None,
        channel: grpc.Channel,
        *,
        failed: Callable[[grpc.RpcError], RlfleetError] | None = None,
    ) -> None:
        self._call = call
        self._channel = channel
        self._responses: Iterator[ResponsePart] = iter(call)
        self._what = what
        self._reader = reader
        self._timeout = timeout
        self._failed = failed
        self._closed = False

    def __iter__(self) -> SampleStream:
        return self

    def __next__(self) -> StreamedBatch:
        """The next result.

        Raises:
            StopIteration: Once the stream was closed (or the coordinator
                ended it cleanly).
            RlfleetError: The typed error of a failed call (e.g.
                UnavailableError when the coordinator went away).
        """
        while not self._closed:
            try:
                item = next(self._responses)
            except StopIteration:
                self._closed = True
                break
            except grpc.RpcError as exc:
                if self._closed:
                    break
                if self._failed is not None:
                    raise self._failed(exc) from None
                raise call_error(exc, what=self._what, timeout=self._timeout) from None
            response = self._reader.read(item)
            if isinstance(response, DecodedResult | ScatteredResult):
                return StreamedBatch(response.batch, response.header.agent_version)
            # Headers are the reader's; a subscription has no footer (tolerated).
        # builtin on purpose: the iterator protocol ends a for loop on StopIteration.
        raise StopIteration

    def close(self) -> None:
        """Ends the subscription (idempotent)."""
        if not self._closed:
            self._closed = True
            self._call.cancel()
            self._channel.close()

    def __del__(self) -> None:
        # An abandoned stream must not keep the coordinator sampling for it.
        if not getattr(self, "_closed", True):
            self.close()


#: Results each shard's reader may hold for the caller of a merged stream:
#: few, so a caller that stops reading stops the readers, and the
#: coordinators' backpressure stops their workers as for one subscription.
MERGED_QUEUE_PER_SHARD = 2
#: Seconds a reader waits to hand over a result before it looks whether the
#: stream was closed (a closed stream's readers end within this).
_HANDOVER_POLL_SECONDS = 0.1


class MergedStream(SampleStream):
    """One iterator over a subscription on each of several coordinators.

    A reader thread per coordinator reads its subscription and hands each
    result over through one small queue, so :meth:`__next__` returns
    whichever coordinator's result landed first. Closing it (or leaving the
    ``with`` block) ends every subscription. A failure of one (e.g. its
    coordinator went away) is raised by :meth:`__next__`, after every
    subscription was ended.

    Args:
        streams: One subscription per coordinator (closed with this one).
        relabel: Applied to each result of ``streams[i]`` as ``relabel(i,
            result)`` (fragment streams renumbered for the learner).
    """

    def __init__(
        self,
        streams: Sequence[SampleStream],
        relabel: Callable[[int, StreamedBatch], StreamedBatch],
    ) -> None:
        self._streams = list(streams)
        self._relabel = relabel
        self._closed = False
        self._queue: queue.Queue[tuple[int, StreamedBatch | BaseException | None]] = queue.Queue(
            MERGED_QUEUE_PER_SHARD * len(self._streams)
        )
        self._running = len(self._streams)
        self._readers = [
            threading.Thread(target=self._read, args=(i,), name=f"rlfleet-stream-{i}", daemon=True)
            for i in range(len(self._streams))
        ]
        for reader in self._readers:
            reader.start()

    def __next__(self) -> StreamedBatch:
        """The next result of any coordinator.

        Raises:
            StopIteration: Once the stream was closed, or every coordinator
                ended its subscription cleanly.
            RlfleetError: The typed error of the first subscription that
                failed (naming its coordinator); the others are ended first.
        """
        while not self._closed and self._running:
            try:
                index, item = self._queue.get(timeout=_HANDOVER_POLL_SECONDS)
            except queue.Empty:
                continue
            if item is None:
                self._running -= 1
            elif isinstance(item, BaseException):
                self.close()
                raise item
            else:
                return self._relabel(index, item)
        raise StopIteration

    def close(self) -> None:
        """Ends every coordinator's subscription (idempotent)."""
        if not self._closed:
            self._closed = True
            for stream in self._streams:
                stream.close()

    def _read(self, index: int) -> None:
        """Hands ``streams[index]``'s results over until it ends, fails or is closed."""
        stream = self._streams[index]
        item: StreamedBatch | BaseException | None
        while True:
            try:
                item = next(stream)
            except StopIteration:
                item = None
            except BaseException as exc:  # handed to the caller, who raises it
                item = exc
            while not self._closed:
                try:
                    self._queue.put((index, item), timeout=_HANDOVER_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if item is None or isinstance(item, BaseException) or self._closed:
                return
