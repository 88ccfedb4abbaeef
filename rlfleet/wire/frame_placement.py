"""A learner's answer placed straight from its results' frames: no view of a result.

A result a learner views with its worker's layout
(:class:`~rlfleet.wire.result_views.ViewedResult`) passed its checks
against the plan of its counts, which says where each of its arrays lies in
its frame. :func:`placed_frame_episodes` builds the answer of
:func:`~rlfleet.wire.placement.placed_episodes` from those frames and
offsets: the same layout of the answer's rows (array operations over the
results), and each array of the answer one call into the compiled gather
(:func:`~rlfleet.wire._gather.gather`) over the frames, its pieces the
results' rows at their arrays' offsets. No numpy view, no dict and no batch
is made per result, and a frame's buffer is exported once per array of the
answer (a memoryview's, a few dozen instructions, where a numpy view's
costs about 1,200). Results of several layouts' shapes (other info keys,
dtypes or trailing shapes), or any result not viewed so, take
:func:`~rlfleet.wire.placement.placed_episodes`, over their batches.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.wire.placement import (
    Empty,
    _kept_episodes,
    _Layout,
    _MisfitError,
    _row_layouts,
)

with compiled("gather", "rlfleet/wire/_gather.c"):
    from rlfleet.wire._gather import gather

_FRAME = operator.attrgetter("frame")
_HEADER_LENGTHS = operator.attrgetter("header.lengths")
#: The answer's fields that are arrays placed from the results, or dicts of them.
_PLACED = ("episode_infos", "observations", "last_observations", "actions", "rewards")


def placed_frame_episodes(
    results: Sequence[Any], num_episodes: int, empty: Empty = np.empty
) -> EpisodeBatch | None:
    """The episodes 0..num_episodes-1 of ``results``, in index order, from their frames.

    Args:
        results: The answer's results.
        num_episodes: The answer's episodes.
        empty: Makes the answer's arrays.

    Returns:
        The answer, as :func:`~rlfleet.wire.placement.placed_episodes`
        places it from the results' batches; None where it would (the
        episodes' indices do not make the answer) and where a result is no
        viewed one or the results' layouts differ in shape: the caller
        then takes that function.
    """
    try:
        frames = list(map(_FRAME, results))
    except AttributeError:  # a result decoded another way, or given another batch
        return None
    if not frames:
        return None
    views = frames[0][2]
    shape = views.shape
    for frame in frames:
        if frame[2].shape is not shape:
            return None
    fields = dict(views.fields)
    infos = fields.get("episode_infos")
    episode_index = (
        None if isinstance(infos, int) or infos is None else dict(infos).get("episode_index")
    )
    tensors = shape[1]
    if (
        not isinstance(episode_index, int)
        or tensors[episode_index][1] != ()
        or not all(name in fields for name in ("lengths", *_PLACED[1:], "step_types"))
    ):
        return None
    try:
        return _placed(
            results,
            frames,
            views=views,
            fields=fields,
            episode_index=episode_index,
            num_episodes=num_episodes,
            empty=empty,
        )
    except (_MisfitError, OverflowError):
        return None


def _placed(
    results: Sequence[Any],
    frames: list[Any],
    *,
    views: Any,
    fields: dict[str, Any],
    episode_index: int,
    num_episodes: int,
    empty: Empty,
) -> EpisodeBatch:
    """:func:`placed_frame_episodes` once the results are known to share a shape.

    Raises:
        _MisfitError: If the episodes' indices do not make the answer.
        OverflowError: If a length is past int64 (the batches' path names it).
    """
    wholes = [frame[0] for frame in frames]
    offsets = np.frombuffer(b"".join([frame[1].offsets for frame in frames]), np.int64)
    offsets = offsets.reshape(len(frames), -1)
    lengths = list(map(_HEADER_LENGTHS, results))
    counts = np.fromiter(map(len, lengths), np.int64, len(lengths))
    tensors = views.tensors

    def arrays_of(index: int, layout: _Layout | None, rows: int, pieces: np.ndarray) -> np.ndarray:
        tensor = tensors[index]
        out = empty((rows, *tensor.row_shape), tensor.dtype)
        pieces = pieces.copy() if layout is None else layout.byte_pieces(tensor.row_bytes).copy()
        pieces[:, 1] += offsets[pieces[:, 0], index]
        if not gather(out, wholes, pieces):
            raise _MisfitError
        return out

    # The episodes' indices: each result's whole column, one after the other.
    index_size = tensors[episode_index].dtype.itemsize
    every = np.stack([np.arange(len(frames)), np.zeros_like(counts), counts * index_size], axis=1)
    joined = arrays_of(episode_index, None, int(counts.sum()), every)
    kept, dest, known = _kept_episodes(joined, counts.tolist(), num_episodes, empty)
    own = np.fromiter(itertools.chain.from_iterable(lengths), np.int64, int(counts.sum()))
    pieces, steps, answer_lengths = _row_layouts(own, counts, kept, dest)

    def array(index: int) -> np.ndarray:
        layout = pieces if tensors[index].per_episode else steps
        return arrays_of(index, layout, layout.rows, every)

    def placed(tree: Any, known: dict[str, np.ndarray] | None = None) -> Any:
        return _placed_tree(tree, array, known or {})

    return EpisodeBatch(
        env_spec=views.layout.spec,
        episode_infos=placed(fields["episode_infos"], known),
        observations=placed(fields["observations"]),
        last_observations=placed(fields["last_observations"]),
        actions=placed(fields["actions"]),
        rewards=placed(fields["rewards"]),
        env_infos=placed(fields["env_infos"]) if "env_infos" in fields else {},
        agent_infos=placed(fields["agent_infos"]) if "agent_infos" in fields else {},
        step_types=placed(fields["step_types"]),
        lengths=answer_lengths,
    )


def _placed_tree(
    tree: Any, array: Callable[[int], np.ndarray], known: dict[str, np.ndarray]
) -> Any:
    """The answer's array (``array`` of its index) or dict of arrays a map of the
    views stands for (``known``: a dict's entries worked out already, by key).

    A module function, not a closure that calls itself: such a closure is a
    reference cycle (the function in its own cell) that would hold the
    answer's frames, through ``array``'s, until the garbage collector ran,
    so that their receive buffers could not be taken again by the next
    answer's reads, which would read into fresh memory.
    """
    if isinstance(tree, int):
        return array(tree)
    return {
        key: known[key] if key in known else _placed_tree(child, array, {}) for key, child in tree
    }


__all__ = ["placed_frame_episodes"]
