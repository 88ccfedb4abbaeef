"""A learner's results decoded as views, with the layout of their worker's last one.

The coordinator checked every value of a result before passing it on
(:class:`~rlfleet.wire.result_layout.ResultLayoutCheck`); the learner only
decodes what it receives. A result of one chunk with the layout its worker's
last result had (the same bytes around the arrays for its numbers of
episodes and steps) is viewed at that layout's offsets: one call into a C
check of the bytes between the arrays and the values decoding checks
(:func:`~rlfleet.wire._view_check.view_check`, rlfleet/wire/_view_check.c)
and the views (the fields of one structured array, for counts seen
before), instead of walking every field (about 230
Python and numpy calls) and building the EpisodeBatch with its checks. What
decoding checks on values still holds: the lengths are the header's, the
step types in StepType's range, bools 0 or 1. Anything else (another layout,
a value those checks refuse, a result of several chunks, a space whose rows
are checked by ``contains``) takes :func:`~rlfleet.wire.results.decode_kept`,
which raises with its own text, or decodes and relearns the worker's layout.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet._util.prebuilt import prebuilt_of
from rlfleet.core._validation import accepted_shapes, check_step_types
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError
from rlfleet.wire._layout_frames import _FIELD_NAMES, _Layout, _learn, _Tensor, _Tree
from rlfleet.wire.chunks import Chunk, Payload
from rlfleet.wire.results import DecodedResult, JoinedResult, Result, ResultHeader, decode_kept

with compiled("view check", "rlfleet/wire/_view_check.c"):
    from rlfleet.wire._view_check import view_check

_BYTE = np.dtype(np.uint8)
_new = object.__new__
#: Sets an attribute past a frozen dataclass's own ``__setattr__``.
_setattr = object.__setattr__
_MAX_STEP_TYPE = int(max(StepType))


class ResultLayoutViews:
    """A learner's decoder of results to views, one learned layout per worker."""

    #: Workers whose layouts are kept (a fleet past it starts again).
    MAX_WORKERS = 4096
    #: Plans kept per layout (one per pair of episode and step counts).
    MAX_PLANS = 256

    def __init__(self) -> None:
        self._layouts: dict[int, _Views] = {}
        #: Results decoded in one pass and by the general path (tests count them).
        self.viewed = 0
        self.decoded = 0

    def decode(self, joined: JoinedResult, env_spec: EnvSpec) -> Result:
        """The result's batch as views of its bytes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.results.decode_kept`, with its text.
        """
        payload = joined.payload
        if not isinstance(payload, tuple):
            viewed = self.view(
                joined.header, joined.chunks, payload, joined.message_sizes, env_spec
            )
            if viewed is not None:
                return viewed
        return self.decode_other(joined, env_spec)

    def view(
        self,
        header: ResultHeader,
        chunks: tuple[Chunk, ...],
        payload: Payload,
        message_sizes: tuple[int, ...],
        env_spec: EnvSpec,
    ) -> Result | None:
        """:meth:`decode` of the one-payload result of these fields where its worker's
        layout views it (made without its :class:`~rlfleet.wire.results.JoinedResult`);
        None where :meth:`decode_other` must read it.

        A one-chunk result of the layout is checked: its frame and plan are kept
        (:class:`ViewedResult`: uint8 step types, checked in C), or its batch is
        read-only views of ``payload`` (as :func:`~rlfleet.wire.batches.decode_batch`
        leaves them) where other step types take ``check_step_types``.
        """
        kept = self._layouts.get(header.worker_id)
        if kept is None or kept.layout.spec is not env_spec:
            return None
        # One call from the reader to the result (a call more costs a few
        # hundred instructions a result): the checks, then the result.
        lengths = header.lengths
        episodes = len(lengths)
        if not episodes or min(lengths) < 1:
            return None
        steps = sum(lengths)
        # A frame's chunk is a read-only view of its bytes already (as the views
        # leave it): a memoryview more costs about 1,200 instructions, its
        # read-only copy 1,000.
        if type(payload) is memoryview and payload.readonly and payload.c_contiguous:
            whole = payload if payload.format == "B" and payload.ndim == 1 else payload.cast("B")
        else:
            whole = memoryview(payload)
            if whole.format != "B" or whole.ndim != 1:
                whole = whole.cast("B")
            whole = whole.toreadonly()
        plan = kept.plans.get((episodes, steps))
        if plan is None:
            if steps > len(whole):  # every step takes a byte or more: no plan for forged counts
                return None
            plan = kept.plan(episodes, steps)
        else:
            plan.seen = True  # the counts came again: they may well keep coming
        if plan.size != len(whole):
            return None
        # The bytes between the arrays, the lengths, uint8 step types (never
        # below the lowest, 0) and bools, in one pass over the bytes concerned.
        if not view_check(
            whole,
            plan.runs,
            plan.joined,
            plan.lengths_at,
            kept.lengths_size,
            kept.lengths_signed,
            lengths,
            plan.limits,
        ):
            return None
        if kept.checked_types:
            # Its batch's views are made if asked for: an answer placed
            # from the frames (rlfleet.wire.frame_placement) never does.
            self.viewed += 1
            # Its fields are its dict, made once (prebuilt_of's copy costs a dict more).
            viewed = _new(ViewedResult)
            _setattr(
                viewed,
                "__dict__",
                {
                    "header": header,
                    "chunks": chunks,
                    "message_sizes": message_sizes,
                    "seq": 0,
                    "at": 0.0,
                    "frame": (whole, plan, kept),
                },
            )
            return viewed
        fields = {
            "header": header,
            "chunks": chunks,
            "message_sizes": message_sizes,
            "seq": 0,
            "at": 0.0,
        }
        # Other step types' dtypes take check_step_types, on the batch's views.
        batch = _batch(kept, plan, whole)
        try:
            check_step_types("step_types", batch.step_types, steps, "steps")
        except InvalidBatchError:
            return None
        fields["batch"] = batch
        self.viewed += 1
        return prebuilt_of(DecodedResult, fields)

    def view_terms(self, env_spec: EnvSpec) -> tuple[Any, ...]:
        """What :meth:`view` reads a result of ``env_spec`` with, for a reader that
        takes it in one call (``rlfleet.wire.result_message.read_frame_made``):
        these views (their count), the kept layouts by worker, the spec and the check."""
        return self, self._layouts, env_spec, view_check

    def decode_other(self, joined: JoinedResult, env_spec: EnvSpec) -> Result:
        """:meth:`decode` of a result :meth:`view` leaves: the general path, which
        learns (or forgets) its worker's layout.

        Raises:
            ResultError: As :func:`~rlfleet.wire.results.decode_kept`, with its text.
        """
        result = decode_kept(joined, env_spec)
        self.decoded += 1
        if isinstance(result, DecodedResult):
            learned = _learn(result.batch, False)
            worker = joined.header.worker_id
            if learned is not None and _viewable(learned):
                if len(self._layouts) >= self.MAX_WORKERS:
                    self._layouts.clear()
                self._layouts[worker] = _Views(learned)
            else:
                self._layouts.pop(worker, None)
        return result


#: The layouts' shapes (:attr:`_Views.shape`), each kept once.
_SHAPES: dict[tuple[Any, ...], tuple[Any, ...]] = {}

#: A map of the batch: an array's place among a result's views, or a map's
#: entries (key, map of the entry).
_Map: TypeAlias = "int | tuple[tuple[str, _Map], ...]"


class _Views:
    """What viewing a worker's results of one layout takes, worked out once: the
    arrays in the layout's order and the batch's dicts of them; then per pair
    of counts, its :class:`_Plan`, so that a later result of those counts is
    one comparison of the bytes between the arrays, the views and the dicts,
    no walk over the layout.

    Attributes:
        layout: The layout.
        tensors: Its arrays, in the order they are written.
        fields: The batch's fields that hold arrays: (name, map of their views).
        array_names: Those that are arrays (not dicts), by name.
        array_views: Takes their views from a result's (one C call).
        maps: Those that are dicts: (name, their keys, takes their views
            from a result's) for a dict of arrays (the infos), made in C;
            (name, map of their views, None) for a nested one.
        lengths: Where the lengths are among the views.
        lengths_size: Their integers' size in bytes.
        lengths_signed: Whether they are signed.
        step_types: Where the step types are.
        checked_types: Whether the step types are uint8, range-checked by
            the C check (others by ``check_step_types``).
        bools: Where the bool arrays are.
        shape: What the answer takes of the layout: its fields and their
            arrays' dtypes and rows, one object per such shape.
        names: The fields of a plan's record: the arrays'.
        views: Takes a record's fields, in the layout's order (one C call).
        plans: By (episodes, steps).
        taken_with: The layout's spec, the plans, lengths_size,
            lengths_signed and checked_types, in one attribute for a reader
            that takes a result in one call.
    """

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        tensors: list[_Tensor] = []

        def tree(item: _Tensor | _Tree) -> _Map:
            if isinstance(item, _Tensor):
                tensors.append(item)
                return len(tensors) - 1
            return tuple((layout.keys[key_field], tree(child)) for key_field, child in item)

        self.fields = tuple((_FIELD_NAMES[number], tree(item)) for number, item in layout.blocks)
        arrays = [(name, item) for name, item in self.fields if isinstance(item, int)]
        self.array_names = tuple(name for name, _ in arrays)
        self.array_views = _getter([item for _, item in arrays])
        self.maps = tuple(
            _flat(name, item) for name, item in self.fields if not isinstance(item, int)
        )
        self.tensors = tuple(tensors)
        where = {t.name: index for index, t in enumerate(tensors)}
        self.lengths = where["lengths"]
        self.step_types = where["step_types"]
        self.checked_types = tensors[self.step_types].dtype == _BYTE
        lengths_dtype = tensors[self.lengths].dtype
        self.lengths_size = lengths_dtype.itemsize
        self.lengths_signed = lengths_dtype.kind == "i"
        self.bools = tuple(where[name] for name in layout.bools)
        #: The answer's fields and arrays this layout gives (dtypes, rows),
        #: one object for every worker's layout alike: results of one are
        #: placed together from their frames (rlfleet.wire.frame_placement).
        self.shape = _SHAPES.setdefault(
            key := (self.fields, tuple((t.dtype, t.row_shape, t.per_episode) for t in tensors)),
            key,
        )
        if len(_SHAPES) > ResultLayoutViews.MAX_WORKERS:
            _SHAPES.clear()
        self.names = [f"a{index}" for index in range(len(tensors))]
        self.views = _getter(self.names)
        self.plans: dict[tuple[int, int], _Plan] = {}
        #: What a reader that takes a result in one call reads of these views
        #: (``rlfleet.wire.result_message.read_frame_made``), in one attribute.
        self.taken_with = (
            layout.spec,
            self.plans,
            self.lengths_size,
            self.lengths_signed,
            self.checked_types,
        )

    def plan(self, episodes: int, steps: int) -> _Plan:
        """The plan of results of ``episodes`` and ``steps`` (worked out once per pair)."""
        plans = self.plans
        if len(plans) >= ResultLayoutViews.MAX_PLANS:
            plans.clear()  # a worker's step counts wander: keep the plans few
        frame = self.layout.frame(episodes, steps)  # not the one pass's skeleton
        offsets = frame.offsets
        arrays = tuple(
            ((episodes if t.per_episode else steps, *t.row_shape), t.dtype, offsets[t.name])
            for t in self.tensors
        )
        # The bytes the C check bounds: uint8 step types by StepType's range, bools by 1.
        bounded = [(index, 1) for index in self.bools]
        if self.checked_types:
            bounded.append((self.step_types, _MAX_STEP_TYPE))
        limits = [
            (arrays[index][2], math.prod(arrays[index][0]) * arrays[index][1].itemsize, most)
            for index, most in bounded
        ]
        plan = plans[(episodes, steps)] = _Plan(
            frame.size, frame.headers, arrays, arrays[self.lengths][2], limits
        )
        return plan


class _Plan:
    """Where the bytes between the arrays and the arrays of a result of one
    pair of counts are, and what the C check of such a result is given.

    Attributes:
        size: A result's size.
        headers: (offset, bytes) of each run of bytes between the arrays.
        arrays: Each array's (shape, dtype, offset).
        runs: (offset, bytes) of each run of bytes between the arrays, as
            int64 pairs.
        joined: Those runs' bytes in a result of the layout, one after the other.
        lengths_at: Where the lengths are.
        limits: (offset, bytes, largest value) of the bytes whose values the
            check bounds (uint8 step types, bools), as int64 triples.
        offsets: Each array's offset, in the layout's order, as int64s.
        seen: Whether a second result of the counts came.
        checked_with: Its size, runs, joined, lengths_at and limits, in one
            attribute for a reader that takes a result in one call.
        record: Once the plan serves a second result: one structured dtype
            of the arrays at their offsets, whose fields are the views (one
            ``np.ndarray`` for them all, where each array took one); None
            before (counts that never repeat, as a native worker's, do not
            pay for it).
    """

    __slots__ = (
        "arrays",
        "checked_with",
        "headers",
        "joined",
        "lengths_at",
        "limits",
        "offsets",
        "record",
        "runs",
        "seen",
        "size",
    )

    def __init__(
        self,
        size: int,
        headers: Sequence[tuple[int, bytes]],
        arrays: tuple[tuple[tuple[int, ...], np.dtype, int], ...],
        lengths_at: int,
        limits: Sequence[tuple[int, int, int]],
    ) -> None:
        self.size = size
        self.headers = tuple(headers)
        self.arrays = arrays
        self.runs = np.array([(offset, len(run)) for offset, run in headers], np.int64).tobytes()
        self.joined = b"".join(run for _, run in headers)
        self.lengths_at = lengths_at
        self.limits = np.array(limits, np.int64).tobytes()
        self.record: np.dtype | None = None
        self.seen = False
        self.offsets = np.array([offset for _, _, offset in arrays], np.int64).tobytes()
        self.checked_with = (size, self.runs, self.joined, lengths_at, self.limits)

    def make_record(self, names: list[str]) -> np.dtype:
        """Works out :attr:`record`, its fields named ``names`` (and returns it)."""
        arrays = self.arrays
        record = self.record = np.dtype(
            {
                "names": names,
                "formats": [(dtype, shape) for shape, dtype, _ in arrays],
                "offsets": [offset for _, _, offset in arrays],
                "itemsize": self.size,
            }
        )
        return record


def _getter(items: list[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """Takes ``items`` of its argument at once, as a tuple (of one or none, too)."""
    if not items:
        return lambda whole: ()
    if len(items) == 1:
        (item,) = items
        return lambda whole: (whole[item],)
    return operator.itemgetter(*items)


def _built(tree: _Map, views: Sequence[np.ndarray]) -> Any:
    if isinstance(tree, int):
        return views[tree]
    return {
        key: views[child] if isinstance(child, int) else _built(child, views) for key, child in tree
    }


def _flat(
    name: str, tree: tuple[tuple[str, _Map], ...]
) -> tuple[str, Any, Callable[[Any], tuple[Any, ...]] | None]:
    """A dict field's entry of :attr:`_Views.maps`."""
    if all(isinstance(child, int) for _, child in tree):
        return name, tuple(key for key, _ in tree), _getter([child for _, child in tree])
    return name, tree, None


def _viewable(layout: _Layout) -> bool:
    """Whether decoding checks nothing of the layout's rows but their shape
    (a space without accepted shapes has its first row checked by ``contains``)."""
    spec = layout.spec
    lengths = layout.tensors["lengths"].dtype
    return (
        accepted_shapes(spec.observation_space) is not None
        and accepted_shapes(spec.action_space) is not None
        and layout.tensors["step_types"].dtype.kind in "iu"
        # What the C check reads: integers in this machine's byte order.
        and lengths.kind in "iu"
        and lengths.isnative
    )


#: A result checked against its worker's layout, not yet viewed: its frame
#: (read-only), the plan of its counts, and its worker's :class:`_Views`.
ViewedFrame: TypeAlias = "tuple[memoryview, _Plan, _Views]"


class ViewedResult(DecodedResult):
    """A :class:`~rlfleet.wire.results.DecodedResult` whose frame passed its
    worker's layout: its batch's views are made when first asked for (an
    answer placed from the frames, rlfleet.wire.frame_placement, reads the
    arrays at the plan's offsets instead).

    Attributes:
        frame: Its frame, the plan of its counts and its worker's views
            (absent from a copy made by ``dataclasses.replace``, which is
            given its batch).
    """

    frame: ViewedFrame

    @functools.cached_property
    def batch(self) -> EpisodeBatch:
        """Its episodes: read-only views of the received bytes, made once."""
        whole, plan, kept = self.frame
        return _batch(kept, plan, whole)


def _batch(kept: _Views, plan: _Plan, whole: memoryview) -> EpisodeBatch:
    """The batch of a result that passed its plan's checks, as views of ``whole``."""
    views: Sequence[np.ndarray]
    if not plan.seen:
        views = [np.ndarray(shape, dtype, whole, offset) for shape, dtype, offset in plan.arrays]
    else:
        record = plan.record if plan.record is not None else plan.make_record(kept.names)
        views = kept.views(np.ndarray((), record, whole))
    # An empty map is not written: its field is absent from the plan.
    fields: dict[str, Any] = {
        "env_spec": kept.layout.spec,
        "episode_infos": {},
        "env_infos": {},
        "agent_infos": {},
    }
    fields.update(zip(kept.array_names, kept.array_views(views), strict=True))
    for name, tree, getter in kept.maps:
        fields[name] = (
            _built(tree, views) if getter is None else dict(zip(tree, getter(views), strict=True))
        )
    # What EpisodeBatch.prechecked builds, without its call.
    return prebuilt_of(EpisodeBatch, fields)


__all__ = ["ResultLayoutViews", "ViewedFrame", "ViewedResult"]
