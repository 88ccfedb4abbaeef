"""A Sample or Subscribe call's responses, read into what the learner gets.

A Sample call answers with a header (the agent version, the env spec),
results (chunked ``EpisodeResult``\\ s of several workers, interleaved) and
a footer; a Subscribe call the same without the footer. The call's
deserializer (``rlfleet.client._learner_messages``) turns each response into
a :data:`~rlfleet.client._learner_messages.ResponsePart`; the sampler and the
stream read those through :class:`ResponseReader`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from rlfleet._util.prebuilt import prebuilt
from rlfleet.client._learner_messages import ResponsePart
from rlfleet.client._result_route import DataResults
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import ProtocolError, UnavailableError
from rlfleet.protocol.learner_calls import CallHeader, ResultPart
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.transport.receive_buffers import ANSWER_KEPT_BYTES, ReceiveBuffers
from rlfleet.wire import parse_env_spec
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.result_views import ResultLayoutViews, ViewedResult
from rlfleet.wire.results import (
    DecodedResult,
    JoinedResult,
    Result,
    ResultAssembler,
    ResultHeader,
    ScatteredResult,
    assemble_episodes,
    assemble_fragments,
)


@dataclass(frozen=True)
class AnswerHeader:
    """A ``SampleHeader``: what the answer was sampled with.

    Attributes:
        agent_version: The agent version the episodes come from.
        env_spec: The env's spec, when the header carries it.
        coordinator_id: The answering coordinator's id ("" if not sent).
    """

    agent_version: int
    env_spec: EnvSpec | None
    coordinator_id: str = ""


@dataclass
class SampleAnswer:
    """What a Sample call returned (over several coordinators: its pieces together)."""

    header: AnswerHeader
    footer: Footer
    results: list[Result]


#: The responses that are results (a tuple: ``A | B`` would be made anew per response).
_RESULTS = (DecodedResult, ScatteredResult)

#: What one response stands for (None: a chunk of a result still arriving).
Response: TypeAlias = AnswerHeader | Result | Footer | None


class ResponseReader:
    """Reads one call's responses in order.

    Args:
        what: Names the call in error messages.
        decode_spec: Decodes a header's serialized EnvSpec (the sampler caches it).
        keep_pieces: Leave results of several chunks in their chunks
            (:class:`~rlfleet.wire.results.ScatteredResult`), for an answer
            assembled from them: their rows are then copied once, from the
            received messages to the answer. A stream, whose batches are
            the results themselves, joins them.
        layouts: Decodes kept results, in one pass once their worker's layout is
            known (a sampler keeps one across its calls); a new one if None.
    """

    def __init__(
        self,
        what: str,
        decode_spec: Callable[[bytes], EnvSpec],
        *,
        keep_pieces: bool = False,
        layouts: ResultLayoutViews | None = None,
    ) -> None:
        self.what = what
        self._decode_spec = decode_spec
        self._assembler = ResultAssembler(per_worker=True)
        self._keep_pieces = keep_pieces
        #: Decodes the kept results, in one pass once a worker's layout is known.
        self.layouts = ResultLayoutViews() if layouts is None else layouts

    def read(self, part: ResponsePart) -> Response:
        """What the next response stands for.

        Raises:
            ProtocolError: For an empty response, or a result that breaks
                the protocol (rlfleet.wire.results).
            WireFormatError: For chunks out of order, or a header's
                malformed env spec.
        """
        if isinstance(part, ResultPart):
            return self.read_result(part.header, part.chunk)
        if isinstance(part, CallHeader):
            wire = part.env_spec_wire
            spec = None if wire is None else self._decode_spec(wire)
            if spec is not None:
                self._assembler.env_spec = spec
            return AnswerHeader(part.agent_version, spec, part.coordinator_id)
        if isinstance(part, Footer):
            return part
        raise ProtocolError(f"{self.what}: an empty SampleResponse arrived")

    def frame_context(self, call: int) -> tuple[Any, ...] | None:
        """What the results connection's reader takes call ``call``'s one-chunk results
        with in its one call, as :meth:`read_result` would take them
        (:meth:`~rlfleet.client._result_route.DataResults.results`); None where
        :meth:`read_result` reads each (no env spec yet, or results not kept in
        pieces)."""
        assembler = self._assembler
        spec = assembler.env_spec
        terms = assembler.whole_terms()
        if not self._keep_pieces or spec is None or terms is None:
            return None
        return (call, ViewedResult, *terms, *self.layouts.view_terms(spec), assembler)

    def read_result(self, header: ResultHeader, chunk: Chunk | None) -> Result | None:
        """What a result message stands for (None: a chunk of a result still arriving).

        Raises:
            ProtocolError: As :meth:`read`.
            WireFormatError: As :meth:`read`.
        """
        if self._keep_pieces:
            assembler = self._assembler
            spec = assembler.env_spec
            if chunk is not None and spec is not None and assembler.whole(header, chunk):
                # A result of one chunk (most of them) goes to the views as its
                # fields: no JoinedResult unless the general path reads it.
                data = chunk.data
                chunks = (chunk,)
                sizes = (len(data),)  # join's message_sizes without a size given
                layouts = self.layouts
                viewed = layouts.view(header, chunks, data, sizes, spec)
                if viewed is not None:
                    return viewed
                return layouts.decode_other(
                    prebuilt(
                        JoinedResult,
                        header=header,
                        chunks=chunks,
                        payload=data,
                        message_sizes=sizes,
                    ),
                    spec,
                )
            joined = assembler.join(header, chunk, keep_pieces=True)
            if joined is None:
                return None
            spec = assembler.env_spec  # spec_for is called only to raise
            if spec is None:
                spec = assembler.spec_for(joined)
            return self.layouts.decode(joined, spec)
        return self._assembler.add(header, chunk)


class AnswerMemory:
    """What a sampler keeps across its calls to read their answers.

    The last env spec it decoded (headers repeat the same bytes), its
    workers' result layouts (a worker's later results are decoded as views,
    rlfleet.wire.result_views), and the memory its answers' large arrays are
    made in (an answer the learner let go lends its memory, already touched,
    to a later one: rlfleet.transport.receive_buffers).
    """

    def __init__(self) -> None:
        self._spec: tuple[bytes, EnvSpec] | None = None
        #: Its workers' result layouts, kept across calls.
        self.layouts = ResultLayoutViews()
        self._empty = ReceiveBuffers(ANSWER_KEPT_BYTES).array

    def env_spec_of(self, data: bytes) -> EnvSpec:
        """Decodes a serialized EnvSpec, reusing the last one if the bytes are the same."""
        if self._spec is None or self._spec[0] != data:
            self._spec = (data, parse_env_spec(data))
        return self._spec[1]

    def reader(self, what: str, *, keep_pieces: bool = False) -> ResponseReader:
        """A reader of one call's responses (``keep_pieces``: see :class:`ResponseReader`)."""
        layouts = self.layouts if keep_pieces else None
        return ResponseReader(what, self.env_spec_of, keep_pieces=keep_pieces, layouts=layouts)

    def episodes(self, answer: SampleAnswer, n_episodes: int) -> EpisodeBatch:
        """The first ``n_episodes`` episodes of ``answer`` in request order."""
        return assemble_episodes(answer.results, n_episodes, empty=self._empty)

    def fragments(self, answer: SampleAnswer) -> EpisodeBatch:
        """``answer``'s fragments in request order."""
        return assemble_fragments(answer.results, empty=self._empty)


def collect_answer(
    call: Iterable[ResponsePart],
    reader: ResponseReader,
    mode: int,
    amount: int,
    progress: Callable[[int, int], None] | None,
    *,
    data: DataResults | None = None,
) -> SampleAnswer:
    """Reads a Sample call's responses into its answer.

    Args:
        call: The call's responses.
        reader: Reads them (names the call in errors).
        mode: The request's ``SampleMode`` (progress counts episodes in EPISODES).
        amount: What the request asked for.
        progress: Called with (done, amount) as results land.
        data: The result frames of the call's results connection, when the
            request named one: read, up to their end marker, where the
            header says the results travel there (before the footer), or up
            to the footer where the header says it travels there too.

    Raises:
        ProtocolError: If a footer comes before any header, or the results
            came on a connection the request did not name, or their count
            is not the footer's.
        UnavailableError: If the answer ends before its footer, or its
            results connection before its end marker.
    """
    header: AnswerHeader | None = None
    results: list[Result] = []
    done = 0  # what the results read so far hold, as ``amount`` counts
    by_episodes = mode == Mode.EPISODES  # once: an enum member's lookup is no plain one
    on_data = None
    for item in call:
        if isinstance(item, CallHeader) and item.results_on_data:
            if data is None:
                raise ProtocolError(
                    f"{reader.what}: the header puts the results on a results connection the "
                    "request did not name"
                )
            on_data = data
            data.footer_expected = item.footer_on_data
        first = reader.read(item)
        # After the header of an answer on the results connection: its results.
        taken = (
            ()
            if on_data is None or on_data.used
            else on_data.results(reader.read_result, reader.frame_context(on_data.call))
        )
        for response in itertools.chain((first,), taken):
            if isinstance(response, _RESULTS):
                results.append(response)
                if progress is None and on_data is None:
                    continue
                lengths = response.header.lengths
                done += len(lengths) if by_episodes else sum(lengths)
                if progress is not None:
                    progress(min(done, amount), amount)
                if on_data is not None:
                    # The next frames' wait asks for half of what is left of
                    # the answer at the bytes per step (episode) read so far
                    # (results a little smaller than those are not waited
                    # for), nothing once it is read: what follows, the
                    # results past it and the end marker, is read as it comes.
                    left = amount - done
                    on_data.gather = (
                        left * on_data.result_bytes // (2 * done) if left > 0 < done else 0
                    )
            elif isinstance(response, AnswerHeader):
                header = response
            elif isinstance(response, Footer):
                return _answer(reader, header, response, results, on_data)
        if on_data is not None and on_data.footer is not None:
            # The footer came on the results connection: the answer is whole.
            return _answer(reader, header, on_data.footer, results, on_data)
    raise UnavailableError(
        f"{reader.what}: the answer ended before its footer (the coordinator went away?); retry"
    )


def _answer(
    reader: ResponseReader,
    header: AnswerHeader | None,
    footer: Footer,
    results: list[Result],
    on_data: DataResults | None,
) -> SampleAnswer:
    """The answer a footer ends, once its counts agree with what arrived.

    Raises:
        ProtocolError: If no header came first, or the footer counts other
            results on the results connection than arrived there.
    """
    if header is None:
        raise ProtocolError(f"{reader.what}: a footer came before any header")
    sent = 0 if on_data is None else on_data.count
    if footer.data_results != sent:
        raise ProtocolError(
            f"{reader.what}: the footer counts {footer.data_results} results on "
            f"the results connection, {sent} arrived there"
        )
    return SampleAnswer(header, footer, results)
