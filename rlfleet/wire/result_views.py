"""A learner's results decoded as views, with the layout of their worker's last one.

The coordinator checked every value of a result before passing it on
(:class:`~rlfleet.wire.result_layout.ResultLayoutCheck`); the learner only
decodes what it receives. A result of one chunk with the layout its worker's
last result had (the same bytes around the arrays for its numbers of
episodes and steps) is viewed at that layout's offsets: a few slice
comparisons and a view per array, instead of walking every field (about 230
Python and numpy calls) and building the EpisodeBatch with its checks. What
decoding checks on values still holds: the lengths are the header's, the
step types in StepType's range, bools 0 or 1. Anything else (another layout,
a value those checks refuse, a result of several chunks, a space whose rows
are checked by ``contains``) takes :func:`~rlfleet.wire.results.decode_kept`,
which raises with its own text, or decodes and relearns the worker's layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias

import numpy as np

from rlfleet._util.flags import any_set
from rlfleet.core._validation import accepted_shapes, check_step_types
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError
from rlfleet.wire.chunks import Payload
from rlfleet.wire.result_layout import _FIELD_NAMES, _Layout, _learn, _Tensor, _Tree
from rlfleet.wire.results import DecodedResult, JoinedResult, Result, ResultHeader, decode_kept

_BYTE = np.dtype(np.uint8)
_MAX_STEP_TYPE = int(max(StepType))


class ResultLayoutViews:
    """A learner's decoder of results to views, one learned layout per worker."""

    #: Workers whose layouts are kept (a fleet past it starts again).
    MAX_WORKERS = 4096
    #: Plans kept per layout (one per pair of episode and step counts).
    MAX_PLANS = 256

    def __init__(self) -> None:
        # Each worker's layout, and its plans by (episodes, steps).
        self._layouts: dict[int, tuple[_Layout, dict[tuple[int, int], _Plan]]] = {}
        #: Results decoded in one pass and by the general path (tests count them).
        self.viewed = 0
        self.decoded = 0

    def decode(self, joined: JoinedResult, env_spec: EnvSpec) -> Result:
        """The result's batch as views of its bytes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.results.decode_kept`, with its text.
        """
        header = joined.header
        kept = self._layouts.get(header.worker_id)
        payload = joined.payload
        if kept is not None and kept[0].spec is env_spec and not isinstance(payload, tuple):
            batch = _viewed(kept[0], kept[1], header, payload)
            if batch is not None:
                self.viewed += 1
                return DecodedResult(header, batch, joined.chunks, joined.message_sizes)
        result = decode_kept(joined, env_spec)
        self.decoded += 1
        if isinstance(result, DecodedResult):
            learned = _learn(result.batch, False)
            if learned is not None and _viewable(learned):
                if len(self._layouts) >= self.MAX_WORKERS:
                    self._layouts.clear()
                self._layouts[header.worker_id] = (learned, {})
            else:
                self._layouts.pop(header.worker_id, None)
        return result


#: A map of the batch: an array's place among a plan's views, or a map's
#: entries (key, map of the entry).
_Map: TypeAlias = "int | tuple[tuple[str, _Map], ...]"


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What viewing a result of one layout and one pair of counts takes, worked out
    once: a later result of those counts is a few slice comparisons, one
    ``np.ndarray`` per array and the batch's dicts, no walk over the layout.

    Attributes:
        size: The result's bytes.
        headers: (start, end, bytes) of every run of bytes between arrays.
        arrays: (shape, dtype, offset) of every array, in the layout's order.
        fields: The batch's fields that hold arrays: (name, map of their views).
        lengths: Where the lengths are among the views.
        step_types: Where the step types are.
        bools: Where the bool arrays are.
    """

    size: int
    headers: tuple[tuple[int, int, bytes], ...]
    arrays: tuple[tuple[tuple[int, ...], np.dtype, int], ...]
    fields: tuple[tuple[str, _Map], ...]
    lengths: int
    step_types: int
    bools: tuple[int, ...]


def _plan(layout: _Layout, episodes: int, steps: int) -> _Plan:
    """The plan of ``layout``'s results of ``episodes`` and ``steps``."""
    frame = layout.frame(episodes, steps)  # not the one pass's skeleton
    arrays: list[tuple[tuple[int, ...], np.dtype, int]] = []
    where: dict[str, int] = {}

    def tree(item: _Tensor | _Tree) -> _Map:
        if isinstance(item, _Tensor):
            where[item.name] = len(arrays)
            rows = episodes if item.per_episode else steps
            arrays.append(((rows, *item.row_shape), item.dtype, frame.offsets[item.name]))
            return where[item.name]
        return tuple((layout.keys[key_field], tree(child)) for key_field, child in item)

    fields = tuple((_FIELD_NAMES[number], tree(item)) for number, item in layout.blocks)
    return _Plan(
        frame.size,
        tuple((offset, offset + len(run), run) for offset, run in frame.headers),
        tuple(arrays),
        fields,
        where["lengths"],
        where["step_types"],
        tuple(where[name] for name in layout.bools),
    )


def _built(tree: _Map, views: list[np.ndarray]) -> Any:
    if isinstance(tree, int):
        return views[tree]
    return {key: _built(child, views) for key, child in tree}


def _viewable(layout: _Layout) -> bool:
    """Whether decoding checks nothing of the layout's rows but their shape
    (a space without accepted shapes has its first row checked by ``contains``)."""
    spec = layout.spec
    return (
        accepted_shapes(spec.observation_space) is not None
        and accepted_shapes(spec.action_space) is not None
        and layout.tensors["step_types"].dtype.kind in "iu"
    )


def _viewed(
    layout: _Layout, plans: dict[tuple[int, int], _Plan], header: ResultHeader, payload: Payload
) -> EpisodeBatch | None:
    """The batch of a one-chunk result with the layout, read-only views of
    ``payload`` (as :func:`~rlfleet.wire.batches.decode_batch` leaves them);
    None for anything the general path must read. ``plans``: the layout's,
    by counts (a new pair of counts adds one)."""
    lengths = header.lengths
    episodes = len(lengths)
    if not episodes or min(lengths) < 1:
        return None
    steps = sum(lengths)
    whole = memoryview(payload)
    if whole.format != "B" or whole.ndim != 1:
        whole = whole.cast("B")
    size = len(whole)
    plan = plans.get((episodes, steps))
    if plan is None:
        if steps > size:  # every step takes a byte or more: no plan for forged counts
            return None
        if len(plans) >= ResultLayoutViews.MAX_PLANS:
            plans.clear()  # a worker's step counts wander: keep the plans few
        plan = plans[(episodes, steps)] = _plan(layout, episodes, steps)
    if plan.size != size:
        return None
    for start, end, expected in plan.headers:
        if whole[start:end] != expected:
            return None
    whole = whole.toreadonly()
    views = [np.ndarray(shape, dtype, whole, offset) for shape, dtype, offset in plan.arrays]
    if views[plan.lengths].tolist() != list(lengths):
        return None
    types = views[plan.step_types]
    if types.dtype == _BYTE:  # decoding's range check: uint8 is never below the lowest, 0
        if int(np.maximum.reduce(types)) > _MAX_STEP_TYPE:
            return None
    else:
        try:
            check_step_types("step_types", types, steps, "steps")
        except InvalidBatchError:
            return None
    if any(any_set(views[index].view(np.uint8) > 1) for index in plan.bools):
        return None
    # An empty map is not written: its field is absent from the plan.
    fields: dict[str, Any] = {"episode_infos": {}, "env_infos": {}, "agent_infos": {}}
    for name, tree in plan.fields:
        fields[name] = _built(tree, views)
    return EpisodeBatch.prechecked(env_spec=layout.spec, check_actions=False, **fields)


__all__ = ["ResultLayoutViews"]
