"""Checks of the results workers send, before they are forwarded.

The coordinator forwards a worker's chunks to the learner untouched, so it
must be sure of them first: the metadata it schedules on must describe the
batch, and the batch must fit the fleet's env spec. The batch is decoded
zero-copy (views of the received bytes) only to check it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.v1 import batch_pb2, worker_pb2
from rlfleet.wire import decode_batch


class ResultError(ProtocolError):
    """A worker's result breaks the protocol; the worker is dropped."""


def check_metadata(meta: worker_pb2.EpisodeResult, *, fragments: bool) -> None:
    """Checks the metadata on a result's chunk 0 (before any decoding).

    Raises:
        ResultError: Naming the task and what is wrong.
    """
    where = f"result of task {meta.task_id}"
    indices, lengths = list(meta.episode_indices), list(meta.lengths)
    if not indices:
        raise ResultError(f"{where}: no episode_indices (chunk 0 carries the metadata)")
    if len(indices) != len(lengths):
        raise ResultError(f"{where}: {len(indices)} episode_indices but {len(lengths)} lengths")
    if min(lengths) < 1:
        raise ResultError(f"{where}: lengths must be >= 1, got {lengths[:10]}")
    if min(indices) < 0:
        raise ResultError(f"{where}: episode indices must be >= 0, got {indices[:10]}")
    if not fragments and any(b <= a for a, b in itertools.pairwise(indices)):
        raise ResultError(f"{where}: episode_indices must ascend, got {indices[:10]}")


def check_batch(
    meta: worker_pb2.EpisodeResult,
    payload: bytes | memoryview,
    kind: int,
    env_spec: EnvSpec,
    *,
    worker_id: int,
    streams: range | None = None,
) -> EpisodeBatch:
    """Decodes a result's batch and checks it against its metadata.

    Args:
        meta: The result's metadata.
        payload: The joined chunks.
        kind: The chunks' PayloadKind.
        env_spec: The env the episodes must come from.
        worker_id: The sender (episode_infos["worker"] must name it).
        streams: For fragments, the sender's fragment streams.

    Returns:
        The decoded batch (views of ``payload``).

    Raises:
        ResultError: If the batch is malformed or disagrees with ``meta``.
    """
    where = f"result of task {meta.task_id}"
    if kind != batch_pb2.PAYLOAD_KIND_EPISODE_BATCH:
        raise ResultError(f"{where}: payload kind {kind} is not PAYLOAD_KIND_EPISODE_BATCH")
    try:
        batch = decode_batch(payload, env_spec=env_spec, kind=EpisodeBatch)
    except WireFormatError as exc:
        raise ResultError(f"{where}: {exc}") from None
    if not isinstance(batch, EpisodeBatch):  # decode_batch returns the kind asked for
        raise TypeError(f"decode_batch returned a {type(batch).__name__}")
    if batch.lengths.tolist() != list(meta.lengths):
        raise ResultError(
            f"{where}: metadata lengths {list(meta.lengths)[:10]} disagree with the batch's "
            f"{batch.lengths[:10].tolist()}"
        )
    infos = batch.episode_infos
    _expect_info(infos, "episode_index", meta.episode_indices, where)
    _expect_info(infos, "agent_version", [meta.agent_version] * batch.n_episodes, where)
    _expect_info(infos, "worker", [worker_id] * batch.n_episodes, where)
    if streams is not None:
        stream = _info(infos, "stream", batch.n_episodes, where)
        outside = stream[(stream < streams.start) | (stream >= streams.stop)]
        if outside.size:
            raise ResultError(
                f"{where}: fragment streams {outside[:5].tolist()} are not this worker's "
                f"({streams.start}..{streams.stop - 1})"
            )
        _info(infos, "fragment_index", batch.n_episodes, where)
    return batch


def _info(infos: object, key: str, n: int, where: str) -> np.ndarray:
    value = infos.get(key) if isinstance(infos, Mapping) else None
    if not isinstance(value, np.ndarray) or value.shape != (n,) or value.dtype.kind not in "iu":
        raise ResultError(
            f"{where}: episode_infos[{key!r}] must be an integer array of shape ({n},) "
            "(batch.proto lists the keys every result carries)"
        )
    return value


def _expect_info(infos: object, key: str, expected: Sequence[int], where: str) -> None:
    value = _info(infos, key, len(expected), where)
    if not np.array_equal(value, np.asarray(expected, dtype=np.int64)):
        raise ResultError(
            f"{where}: episode_infos[{key!r}] is {value[:10].tolist()}, the metadata says "
            f"{list(expected)[:10]}"
        )


def check_versions(
    meta: worker_pb2.EpisodeResult, *, agent_version: int, env_generation: int, current: int
) -> None:
    """Checks a result's agent version and env generation against its task's.

    Args:
        meta: The result's metadata.
        agent_version: The version the task asked for (-1: any version sent so far).
        env_generation: The generation the task asked for.
        current: The latest agent version sent to workers.

    Raises:
        ResultError: If they disagree.
    """
    where = f"result of task {meta.task_id}"
    if meta.env_generation != env_generation:
        raise ResultError(
            f"{where}: env generation {meta.env_generation}, the task asked for {env_generation}"
        )
    if agent_version >= 0 and meta.agent_version != agent_version:
        raise ResultError(
            f"{where}: agent version {meta.agent_version}, the task asked for {agent_version}"
        )
    if not 0 <= meta.agent_version <= current:
        raise ResultError(f"{where}: agent version {meta.agent_version} was never sent")
