"""Fragment streams over several coordinators: who runs what, and how streams are numbered.

A fragment stream is one env slot of a coordinator's fleet, and its
episodes continue across calls on that slot (docs/reliability.md); so a
sharded ``obtain_fragments`` cannot cut one request into ranges that any
coordinator may run, as episode requests are cut (:mod:`rlfleet.client.shards`).
Instead every coordinator runs its own streams, under a base seed of its
own (:func:`rlfleet.core.seeding.shard_seed`), for a share of the amount in
proportion to its env slots, and the learner numbers the streams of all of
them into one set (docs/sharding.md, "Fragments and subscriptions").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlfleet.client.status import FleetStatus
from rlfleet.core import EpisodeBatch
from rlfleet.wire.results import Result


def env_slots(status: FleetStatus) -> int:
    """The env slots a coordinator's fragment request runs on: those of workers not leaving."""
    return sum(worker.envs for worker in status.workers if worker.state != "leaving")


def fragment_shares(amount: int, slots: Sequence[int]) -> list[int]:
    """Steps each coordinator is asked for, in proportion to its env slots.

    A coordinator plans ``ceil(share / (its slots * fragment_length))``
    windows of every stream; with shares ``ceil(amount * slots / total)``,
    that is ``ceil(amount / (total * fragment_length))`` on every one, the
    number one coordinator with all the slots would plan: every stream runs
    the same windows, however the slots are spread.

    Args:
        amount: Steps the learner asked for (>= 1).
        slots: Env slots of each coordinator, in address order.

    Returns:
        One share per coordinator; 0 for one without slots. With no slots
        anywhere, an even split: each coordinator then waits for its workers
        as one would.
    """
    total = sum(slots)
    if total == 0:
        return [math.ceil(amount / len(slots))] * len(slots)
    return [-(-amount * count // total) for count in slots]


def global_stream(local: np.ndarray, shard: int, shards: int) -> np.ndarray:
    """The learner's number of stream ``local`` of coordinator ``shard`` of ``shards``.

    Interleaved (``local * shards + shard``) so that a stream keeps its
    number across calls whatever the other coordinators' workers do, and
    so that coordinators with ``n`` slots each number their streams
    ``0 .. shards * n - 1``, as one coordinator with all of them would.
    """
    return np.asarray(local, dtype=np.int64) * shards + shard


def renumbered(result: Result, shard: int, shards: int) -> Result:
    """``result`` with its ``stream`` infos in the learner's numbering (:func:`global_stream`).

    A result without the column is returned as it is (the assembler names
    what it lacks).
    """
    local = result.arrays.episode_infos.get("stream")
    if not isinstance(local, np.ndarray):
        return result
    return result.with_episode_infos(stream=global_stream(local, shard, shards))


def renumbered_batch(batch: EpisodeBatch, shard: int, shards: int) -> EpisodeBatch:
    """``batch`` with its ``stream`` infos in the learner's numbering (:func:`global_stream`).

    Only the one info column is new; the step data stays the received views.
    A batch without the column is returned as it is (the assembler names
    what it lacks).
    """
    local = batch.episode_infos.get("stream")
    if not isinstance(local, np.ndarray):
        return batch
    return batch.with_episode_infos(stream=global_stream(local, shard, shards))
