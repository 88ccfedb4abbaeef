"""Episode results: the one assembler and validator.

The coordinator, the Python client and the conformance kit all receive
``EpisodeResult`` messages whose batch is chunked (worker.proto,
batch.proto). This module is the only code that joins those chunks, decodes
the batch and checks it, so the three agree on what a valid result is:

* :class:`ResultAssembler` joins a stream's chunks (per worker, on the
  learner's stream, where the coordinator interleaves several workers'
  batches) and keeps the metadata of chunk 0 as a :class:`ResultHeader`;
  :meth:`ResultAssembler.join` stops there (the coordinator classifies a
  result before decoding it), :meth:`ResultAssembler.add` also decodes.
* :func:`~rlfleet.wire.result_checks.check_result` (in
  :mod:`rlfleet.wire.result_checks`) checks a decoded result against what
  its sender was asked for.

The batch is decoded without a copy (views of the received bytes), so a
checked result is forwarded as the chunks it came in. On the learner's
Sample calls (:meth:`ResultAssembler.add_kept`), a result of several chunks is not joined
either: it is decoded where its chunks arrived (:class:`ScatteredResult`,
rlfleet.wire.scattered), and its rows are copied once, straight from the
chunks to their place in the answer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np

from rlfleet._util.prebuilt import prebuilt
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.episode_order import cut_pieces, first_episodes, sort_fragments
from rlfleet.errors import ProtocolError, ResourceExhaustedError, WireFormatError
from rlfleet.wire import Chunk, ChunkAssembler, decode_batch
from rlfleet.wire.batches import payload_kind
from rlfleet.wire.chunks import Payload, Pieces
from rlfleet.wire.frame_placement import placed_frame_episodes
from rlfleet.wire.placement import Empty, placed_episodes, placed_fragments
from rlfleet.wire.scattered import ScatteredBatch, decode_scattered

#: int64 (N,) episode_infos every result carries (batch.proto).
EPISODE_INFO_KEYS = ("agent_version", "env_seed", "policy_seed", "episode_index", "worker")
#: ... and fragments in addition.
FRAGMENT_INFO_KEYS = ("stream", "fragment_index")

#: PayloadKind of an EpisodeBatch: the only kind a result carries.
_EPISODE_BATCH_KIND = payload_kind(EpisodeBatch)


class ResultError(ProtocolError):
    """A result breaks the protocol (the coordinator then drops its worker)."""


class ResultMetadata(Protocol):
    """What :meth:`ResultHeader.of` reads: ``rlfleet.v1.EpisodeResult``'s fields."""

    @property
    def task_id(self) -> int: ...

    @property
    def worker_id(self) -> int: ...

    @property
    def agent_version(self) -> int: ...

    @property
    def env_generation(self) -> int: ...

    @property
    def episode_indices(self) -> Sequence[int]: ...

    @property
    def lengths(self) -> Sequence[int]: ...


@dataclasses.dataclass(frozen=True)
class ResultHeader:
    """The metadata of a result (set on the message carrying chunk 0).

    Attributes:
        task_id: The task it answers.
        worker_id: The sender (0 on a worker's own stream; the coordinator
            sets it when forwarding).
        episode_indices: Its episodes (fragments: as sent).
        lengths: Their lengths.
        agent_version: The agent version that produced it.
        env_generation: The env generation it ran in.
        wire: The ``EpisodeResult`` as received, serialized, where it is to
            be passed on whole (the coordinator forwards a worker's metadata
            to the learner, with fields this version does not know); else
            empty.
    """

    task_id: int
    worker_id: int
    episode_indices: tuple[int, ...]
    lengths: tuple[int, ...]
    agent_version: int
    env_generation: int
    wire: bytes = b""

    @classmethod
    def of(cls, meta: ResultMetadata) -> ResultHeader:
        """The header of an ``EpisodeResult`` message (a header is its own)."""
        if isinstance(meta, ResultHeader):
            return meta
        return cls(
            task_id=int(meta.task_id),
            worker_id=int(meta.worker_id),
            episode_indices=tuple(meta.episode_indices),
            lengths=tuple(meta.lengths),
            agent_version=int(meta.agent_version),
            env_generation=int(meta.env_generation),
        )

    @property
    def where(self) -> str:
        """How errors name the result."""
        sender = f" from worker {self.worker_id}" if self.worker_id else ""
        return f"result of task {self.task_id}{sender}"


@dataclasses.dataclass(frozen=True)
class JoinedResult:
    """A result whose chunks are all in, not decoded yet.

    Attributes:
        header: Its metadata (chunk 0's).
        chunks: The chunks it came in (forwarded as they are).
        payload: The joined bytes (or, kept in pieces, the chunks' data).
        message_sizes: Size of each message that carried a chunk (as given
            to :meth:`ResultAssembler.join`; the chunks' sizes otherwise).
    """

    header: ResultHeader
    chunks: tuple[Chunk, ...]
    payload: Payload | Pieces
    message_sizes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        """Size of the serialized batch."""
        return self.chunks[0].total_bytes


@dataclasses.dataclass(frozen=True)
class DecodedResult:
    """A joined and decoded result.

    Attributes:
        header: Its metadata.
        batch: Its episodes (read-only views of the received bytes).
        chunks: The chunks it came in.
        message_sizes: Size of each message that carried a chunk.
        seq: Stream position of its last chunk (for callers that count).
        at: Arrival time of its last chunk (for callers that time).
    """

    header: ResultHeader
    batch: EpisodeBatch
    chunks: tuple[Chunk, ...] = ()
    message_sizes: tuple[int, ...] = ()
    seq: int = 0
    at: float = 0.0

    @property
    def total_bytes(self) -> int:
        """Size of the serialized batch (0 if built without chunks)."""
        return self.chunks[0].total_bytes if self.chunks else 0

    def infos(self, key: str) -> np.ndarray:
        """An episode_infos column (:func:`check_result` checks that it exists)."""
        return np.asarray(self.batch.episode_infos[key])

    @property
    def arrays(self) -> EpisodeBatch:
        """What the answer is assembled from: the batch."""
        return self.batch

    def with_episode_infos(self, **columns: np.ndarray) -> DecodedResult:
        """This result with episode_infos columns added or replaced."""
        return dataclasses.replace(self, batch=self.batch.with_episode_infos(**columns))


@dataclasses.dataclass(frozen=True)
class ScatteredResult:
    """A result of several chunks, decoded and checked where its chunks arrived.

    What a learner's Sample call keeps until it assembles the answer: its
    rows are copied once, from the chunks to their place in the answer
    (:func:`assemble_episodes`). Attributes as :class:`DecodedResult`'s;
    ``scattered`` stands for its batch.
    """

    header: ResultHeader
    scattered: ScatteredBatch
    chunks: tuple[Chunk, ...] = ()
    message_sizes: tuple[int, ...] = ()
    seq: int = 0
    at: float = 0.0

    @functools.cached_property
    def batch(self) -> EpisodeBatch:
        """Its EpisodeBatch, each tensor that runs across chunks joined (one copy)."""
        return self.scattered.materialized()

    @property
    def arrays(self) -> ScatteredBatch:
        """What the answer is assembled from: the chunks, not joined."""
        return self.scattered

    @property
    def total_bytes(self) -> int:
        """Size of the serialized batch."""
        return self.chunks[0].total_bytes if self.chunks else 0

    def infos(self, key: str) -> np.ndarray:
        """An episode_infos column."""
        return np.asarray(self.scattered.episode_infos[key])

    def with_episode_infos(self, **columns: np.ndarray) -> ScatteredResult:
        """This result with episode_infos columns added or replaced."""
        return ScatteredResult(
            self.header,
            self.scattered.with_episode_infos(**columns),
            self.chunks,
            self.message_sizes,
            self.seq,
            self.at,
        )


#: A decoded result, joined or left in its chunks.
Result: TypeAlias = DecodedResult | ScatteredResult


class ResultAssembler:
    """Joins the chunks of the results of one stream.

    A batch's chunks are contiguous on its sender's stream. On the
    learner's stream the coordinator interleaves several workers' batches,
    whose batch ids are numbered per worker; there (``per_worker=True``)
    chunks are joined per ``worker_id``, and a chunk past index 0 without a
    worker id continues the batch begun last. Metadata belongs on chunk 0
    only: a later chunk that repeats it is refused.

    Not thread-safe: one assembler per stream.

    Args:
        env_spec: The spec batches are decoded with (may be set later, when
            the learner's header brings it).
        per_worker: Join per worker id (a learner's stream).
        max_total_bytes: Largest batch accepted, or None for no limit.
    """

    def __init__(
        self,
        env_spec: EnvSpec | None = None,
        *,
        per_worker: bool = False,
        max_total_bytes: int | None = None,
    ) -> None:
        self.env_spec = env_spec
        self._per_worker = per_worker
        self._max_total_bytes = max_total_bytes
        self._assemblers: dict[int, ChunkAssembler] = {}
        self._partial: dict[int, tuple[ResultMetadata, list[Chunk], list[int]]] = {}
        self._last_key = 0

    @property
    def in_progress(self) -> bool:
        """Whether some result's chunks have arrived but not its last."""
        return bool(self._partial)

    @property
    def buffered_bytes(self) -> int:
        """Bytes reserved for results being reassembled (the in-flight bytes metric)."""
        return sum(assembler.buffered_bytes for assembler in self._assemblers.values())

    def whole(self, meta: ResultMetadata, chunk: Chunk) -> bool:
        """Whether the message is a result of one chunk, whole and within the limit
        (most of them), that :meth:`join` returns at once as its
        :class:`JoinedResult` (of that chunk, its data the payload); if so,
        the message is taken as :meth:`join` takes it, and :meth:`join` must
        not be called with it.
        """
        if (
            chunk.count == 1
            and chunk.kind == _EPISODE_BATCH_KIND
            and len(chunk.data) == chunk.total_bytes
            and (self._max_total_bytes is None or chunk.total_bytes <= self._max_total_bytes)
        ):
            key = meta.worker_id if self._per_worker else 0
            if key not in self._partial:  # else a result of several chunks is cut short
                self._last_key = key
                return True
        return False

    def whole_terms(self) -> tuple[int, int | None, dict[int, Any]] | None:
        """What :meth:`whole` holds a message to, for a reader that takes its result
        in one call (``rlfleet.wire.result_message.read_frame_made``): the kind of a
        batch's chunk, the limit and the results in progress by worker; None where
        results are not kept per worker."""
        if not self._per_worker:
            return None
        return _EPISODE_BATCH_KIND, self._max_total_bytes, self._partial

    def join(
        self,
        meta: ResultMetadata,
        chunk: Chunk | None,
        size: int = 0,
        *,
        keep_pieces: bool = False,
    ) -> JoinedResult | None:
        """Takes one result message; returns the joined result once complete.

        Args:
            meta: The message's EpisodeResult (metadata on chunk 0 only).
            chunk: Its chunk.
            size: The message's serialized size (0: the chunk's data size).
            keep_pieces: Leave a result of several chunks unjoined (its
                payload is then its chunks' data).

        Raises:
            ResultError: If the chunk is missing, of another kind than an
                EpisodeBatch, or carries metadata past chunk 0.
            WireFormatError: If the chunks are out of order or inconsistent.
            ResourceExhaustedError: If the batch is over the size limit.
        """
        if chunk is not None and self.whole(meta, chunk):
            # What the general path below returns, without its assembler.
            return prebuilt(
                JoinedResult,
                header=ResultHeader.of(meta),
                chunks=(chunk,),
                payload=chunk.data,
                message_sizes=(size or len(chunk.data),),
            )
        where = f"EpisodeResult for task {meta.task_id}"
        if chunk is None:
            raise ResultError(f"{where} has no chunk: every EpisodeResult carries a BatchChunk")
        if chunk.kind != _EPISODE_BATCH_KIND:
            raise ResultError(
                f"{where}: chunk kind is {chunk.kind}, expected PAYLOAD_KIND_EPISODE_BATCH "
                f"({_EPISODE_BATCH_KIND})"
            )
        key = 0
        if self._per_worker:
            key = meta.worker_id if (chunk.index == 0 or meta.worker_id) else self._last_key
            self._last_key = key
        if chunk.index == 0:
            self._partial[key] = (meta, [], [])
        elif meta.episode_indices or meta.lengths:
            raise ResultError(
                f"{where}: chunk {chunk.index} repeats episode_indices/lengths; the metadata "
                "is set on the message carrying chunk 0 and left empty on the rest"
            )
        assembler = self._assemblers.get(key)
        if assembler is None:
            assembler = ChunkAssembler(max_total_bytes=self._max_total_bytes)
            self._assemblers[key] = assembler
        try:  # either raises on any disorder
            payload = assembler.keep(chunk) if keep_pieces else assembler.add(chunk)
        except (WireFormatError, ResourceExhaustedError):
            self._partial.pop(key, None)
            raise
        first, chunks, sizes = self._partial[key]  # chunk 0 came: the assembler says so
        chunks.append(chunk)
        sizes.append(size or len(chunk.data))
        if payload is None:
            return None
        del self._partial[key]
        return JoinedResult(ResultHeader.of(first), tuple(chunks), payload, tuple(sizes))

    def add(self, meta: ResultMetadata, chunk: Chunk | None, size: int = 0) -> DecodedResult | None:
        """:meth:`join`, then :func:`decode_result` once the result is complete.

        Raises:
            ResultError: As :meth:`join` and :func:`decode_result`, or if
                no env spec is known yet.
            WireFormatError: If the chunks are out of order or inconsistent.
        """
        joined = self.join(meta, chunk, size)
        return None if joined is None else decode_result(joined, self.spec_for(joined))

    def add_kept(self, meta: ResultMetadata, chunk: Chunk | None, size: int = 0) -> Result | None:
        """:meth:`add`, a result of several chunks left in them (a :class:`ScatteredResult`).

        Raises:
            ResultError: As :meth:`add`.
            WireFormatError: As :meth:`add`.
        """
        joined = self.join(meta, chunk, size, keep_pieces=True)
        return None if joined is None else decode_kept(joined, self.spec_for(joined))

    def spec_for(self, joined: JoinedResult) -> EnvSpec:
        """The env spec ``joined`` decodes with.

        Raises:
            ResultError: If none is known yet.
        """
        if self.env_spec is None:
            raise ResultError(f"{joined.header.where} arrived before the env spec it decodes with")
        return self.env_spec


def decode_result(joined: JoinedResult, env_spec: EnvSpec) -> DecodedResult:
    """Decodes a joined result (views, no copy) and checks its header against it.

    Raises:
        ResultError: If the bytes are not a valid EpisodeBatch of
            ``env_spec`` or disagree with the header's lengths.
    """
    header = joined.header
    payload = joined.payload
    if isinstance(payload, tuple):  # kept in pieces: decode_kept leaves them so
        payload = b"".join(payload)
    try:
        batch = decode_batch(payload, env_spec=env_spec, kind=EpisodeBatch)
    except WireFormatError as exc:
        raise ResultError(f"{header.where}: the batch does not decode: {exc}") from None
    if not isinstance(batch, EpisodeBatch):  # the kind asked for; narrows the type
        raise ResultError(f"{header.where}: decoded to a {type(batch).__name__}")
    _check_lengths(header, batch.lengths)
    return DecodedResult(header, batch, joined.chunks, joined.message_sizes)


def decode_kept(joined: JoinedResult, env_spec: EnvSpec) -> Result:
    """:func:`decode_result`; a result kept in pieces is decoded where they are.

    Raises:
        ResultError: As :func:`decode_result`, with the same checks.
    """
    header = joined.header
    if not isinstance(joined.payload, tuple):
        return decode_result(joined, env_spec)
    try:
        batch = decode_scattered(joined.payload, env_spec)
    except WireFormatError as exc:
        raise ResultError(f"{header.where}: the batch does not decode: {exc}") from None
    _check_lengths(header, batch.lengths)
    return ScatteredResult(header, batch, joined.chunks, joined.message_sizes)


def _check_lengths(header: ResultHeader, lengths: np.ndarray) -> None:
    if lengths.tolist() != list(header.lengths):
        raise ResultError(
            f"{header.where}: metadata lengths {shortened(header.lengths)} disagree with the "
            f"batch's {shortened(lengths.tolist())}"
        )


# --- a learner's answer ------------------------------------------------------------


def assemble_episodes(
    results: Sequence[Result], num_episodes: int, *, empty: Empty = np.empty
) -> EpisodeBatch:
    """The episodes 0..num_episodes-1 of the results, in index order.

    Placed by :mod:`rlfleet.wire.placement`, with no Python per episode:
    step data is copied once, each result's rows straight to their place
    in the answer (rows under 64 bytes of results that interleave there
    go through one aligned scratch buffer per field, which is faster).
    Results whose arrays do not line up (other info keys, trailing shapes)
    take the general path, which names what differs. ``empty`` makes the
    placed answer's arrays (a sampler's reused memory, or ``np.empty``).

    Raises:
        ProtocolError: If an episode below ``num_episodes`` is missing or came
            twice (:func:`~rlfleet.core.episode_order.first_episodes`), or
            the results hold none or lack episode indices.
    """
    if not results:
        raise ResultError("the answer holds no results")
    placed = placed_frame_episodes(results, num_episodes, empty)
    if placed is None:
        placed = placed_episodes([result.arrays for result in results], num_episodes, empty)
    return first_episodes(_concatenate(results), num_episodes) if placed is None else placed


def assemble_fragments(results: Sequence[Result], *, empty: Empty = np.empty) -> EpisodeBatch:
    """Every fragment of the results, in LocalSampler's order (stream, episode, fragment).

    Step data is placed as in :func:`assemble_episodes`: each piece's rows
    go to their place in the order
    :func:`~rlfleet.core.episode_order.sort_fragments` gives. Results whose
    arrays do not line up take the general path, which names what differs.
    ``empty`` as for :func:`assemble_episodes`.
    """
    if not results:
        raise ResultError("the answer holds no results")
    placed = placed_fragments([result.arrays for result in results], empty)
    return sort_fragments(_concatenate(results)) if placed is None else placed


def _concatenate(results: Sequence[Result]) -> EpisodeBatch:
    if not results:
        raise ResultError("the answer holds no results")
    for result in results:
        if not isinstance(result.batch.episode_infos.get("episode_index"), np.ndarray):
            raise ResultError(
                f"{result.header.where}: episode_infos lack the 'episode_index' array the "
                "contract requires (batch.proto)"
            )
    return EpisodeBatch.concatenate(*(result.batch for result in results))


def shortened(values: Sequence[object]) -> str:
    items = list(values)
    if len(items) <= 8:
        return str(items)
    return f"[{', '.join(map(str, items[:8]))}, ... ({len(items)} in all)]"


__all__ = [
    "EPISODE_INFO_KEYS",
    "FRAGMENT_INFO_KEYS",
    "DecodedResult",
    "JoinedResult",
    "Result",
    "ResultAssembler",
    "ResultError",
    "ResultHeader",
    "ScatteredResult",
    "assemble_episodes",
    "assemble_fragments",
    "cut_pieces",
    "decode_kept",
    "decode_result",
]
