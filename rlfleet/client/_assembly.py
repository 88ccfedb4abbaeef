"""Reassemble a response's chunked results into one ordered EpisodeBatch.

The coordinator forwards the workers' chunks untouched; each result is a
batch serialized once on its worker. Here the chunks are joined, decoded
zero-copy, the episodes the answer does not include are dropped and the
rest are put in the order the contract fixes (episode index; fragments by
stream, episode, fragment: :func:`rlfleet.sampling.sort_fragments`), so the
batch equals ``LocalSampler``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import ProtocolError
from rlfleet.sampling import sort_fragments
from rlfleet.v1 import worker_pb2
from rlfleet.wire import Chunk, ChunkAssembler, decode_batch

#: dtype of step_types in assembled batches: LocalSampler's (the wire carries
#: uint8), so that a remote batch equals the local one dtype for dtype.
STEP_TYPES_DTYPE = np.dtype(np.int64)


@dataclass(frozen=True)
class Result:
    """One decoded EpisodeResult.

    Attributes:
        meta: The result's metadata (from the message carrying chunk 0).
        batch: Its episodes (read-only views of the received bytes).
    """

    meta: worker_pb2.EpisodeResult
    batch: EpisodeBatch


class ResultAssembler:
    """Joins the chunks of the results of one response stream.

    A batch's chunks are contiguous on the stream of their sender, but the
    coordinator forwards the batches of several workers, whose batch ids are
    numbered per worker. So chunks are assembled per worker id; a chunk
    past index 0 that carries no worker id (the metadata lives on chunk 0)
    continues the batch begun last.
    """

    def __init__(self, env_spec: EnvSpec | None = None) -> None:
        self.env_spec = env_spec
        self._assemblers: dict[int, ChunkAssembler] = {}
        self._metas: dict[int, worker_pb2.EpisodeResult] = {}
        self._last_key = 0

    def add(self, meta: worker_pb2.EpisodeResult, chunk: Chunk | None) -> Result | None:
        """Takes one result message; returns the decoded result once complete.

        Raises:
            ProtocolError: If no env spec is known yet (no header came first),
                or the chunk is missing or out of order.
            WireFormatError: If the joined bytes are not a valid batch.
        """
        if chunk is None:
            raise ProtocolError("the coordinator sent a result without a batch chunk")
        key = meta.worker_id if (chunk.index == 0 or meta.worker_id) else self._last_key
        self._last_key = key
        if chunk.index == 0:
            self._metas[key] = meta
        assembler = self._assemblers.setdefault(key, ChunkAssembler())
        payload = assembler.add(chunk)
        if payload is None:
            return None
        first = self._metas.pop(key, None)
        if first is None:
            raise ProtocolError(f"a result from worker {key} ended without its first chunk")
        if self.env_spec is None:
            raise ProtocolError("the coordinator sent results before the header with the env spec")
        batch = decode_batch(payload, env_spec=self.env_spec)
        if not isinstance(batch, EpisodeBatch):  # the default kind; narrows the type
            raise ProtocolError(f"a result decoded to a {type(batch).__name__}")
        _check_metadata(first, batch)
        return Result(first, batch)


def assemble_episodes(results: Sequence[Result], num_episodes: int) -> EpisodeBatch:
    """The episodes 0..num_episodes-1 of the results, in index order.

    Results may hold episodes past ``num_episodes`` (run speculatively);
    they are dropped.

    Raises:
        ProtocolError: If an episode below ``num_episodes`` is missing or
            came twice.
    """
    batch = _concatenate(results)
    indices = _info(batch, "episode_index")
    kept = np.flatnonzero(indices < num_episodes)
    order = kept[np.argsort(indices[kept], kind="stable")]
    if not np.array_equal(indices[order], np.arange(num_episodes)):
        got = np.sort(indices[kept])
        missing = np.setdiff1d(np.arange(num_episodes), got)
        duplicated = got[1:][got[1:] == got[:-1]]
        raise ProtocolError(
            f"the coordinator's answer should hold episodes 0..{num_episodes - 1} once each; "
            f"missing {missing[:10].tolist()}, duplicated {np.unique(duplicated)[:10].tolist()}"
        )
    return canonical(batch.take_episodes(order))


def assemble_fragments(results: Sequence[Result]) -> EpisodeBatch:
    """Every fragment of the results, in LocalSampler's order (stream, episode, fragment)."""
    return canonical(sort_fragments(_concatenate(results)))


def canonical(batch: EpisodeBatch) -> EpisodeBatch:
    """The batch with step_types in :data:`STEP_TYPES_DTYPE` (itself if already so)."""
    if batch.step_types.dtype == STEP_TYPES_DTYPE:
        return batch
    return dataclasses.replace(batch, step_types=batch.step_types.astype(STEP_TYPES_DTYPE))


def _concatenate(results: Sequence[Result]) -> EpisodeBatch:
    if not results:
        raise ProtocolError("the coordinator's answer holds no results")
    return EpisodeBatch.concatenate(*(result.batch for result in results))


def _info(batch: EpisodeBatch, name: str) -> np.ndarray:
    value = batch.episode_infos.get(name)
    if not isinstance(value, np.ndarray) or value.shape != (batch.n_episodes,):
        raise ProtocolError(
            f"a result's episode_infos lack the ({batch.n_episodes},) array {name!r} the "
            "contract requires (batch.proto)"
        )
    return value


def _check_metadata(meta: worker_pb2.EpisodeResult, batch: EpisodeBatch) -> None:
    """The metadata must describe the batch (the coordinator checked it too)."""
    if list(meta.lengths) != batch.lengths.tolist():
        raise ProtocolError(
            f"result of task {meta.task_id} from worker {meta.worker_id}: metadata lengths "
            f"{list(meta.lengths)[:10]} disagree with the batch's {batch.lengths[:10].tolist()}"
        )
