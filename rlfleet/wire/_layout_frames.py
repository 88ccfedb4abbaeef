"""A worker's result layout, and the bytes it fixes for some numbers of episodes and steps.

A layout (:class:`_Layout`, learned from a decoded batch by :func:`_learn`)
is the fields, TensorMap keys, dtypes and row shapes of a worker's results;
only the numbers of episodes and steps change from one result to the next.
For each pair of numbers it fixes every byte around the arrays (tags,
lengths, dtypes, shapes) and where each array's data lies: a
:class:`_Frame`, kept once in the process (:data:`_FRAMES`) for the
coordinator's one-pass check (:mod:`rlfleet.wire.result_layout`) and a
learner's views (:mod:`rlfleet.wire.result_views`) alike, and a
:class:`_Skeleton`, the frame with the bytes the one pass compares in one
compiled call, kept once in the process too (:data:`_SKELETONS`). Nothing
here reads a result: it works out what a result of the layout must hold.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import struct
from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np

from rlfleet._util.prebuilt import prebuilt
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.space_checks import screen_bounds, space_screen
from rlfleet.wire._protowire import len_prefix
from rlfleet.wire._skeleton_program import SkeletonProgram, skeleton, skeleton_program
from rlfleet.wire._tensor_header import dtype_code, encode_key_field, rows_header
from rlfleet.wire.results import EPISODE_INFO_KEYS, FRAGMENT_INFO_KEYS

#: Skeletons kept in the process, of every layout (see :data:`_SKELETONS`).
_MAX_SKELETONS = 1024
#: Frames kept in the process, of every layout (see :data:`_FRAMES`).
_MAX_FRAMES = 1024
#: Distinct layouts numbered for the frames' keys before the numbering starts afresh.
_MAX_SHAPES = 1024

# EpisodeBatch's fields (batch.proto) in the order writers write them, and
# whether they hold a row per episode (else a row per step).
_FIELDS = (
    (2, "episode_infos", True),
    (3, "observations", False),
    (4, "last_observations", True),
    (5, "actions", False),
    (6, "rewards", False),
    (7, "env_infos", False),
    (8, "agent_infos", False),
    (9, "step_types", False),
    (10, "lengths", True),
)
_FIELD_NAMES = {number: name for number, name, _ in _FIELDS}
# TensorMap's fields (tensor.proto).
_MAP_ENTRIES, _ENTRY_TENSOR, _ENTRY_MAP = 1, 2, 3
_BOOL = np.dtype("?")
# The columns the one pass reads as bytes: int64 episode infos and lengths, uint8 step types.
_INFO = {key: f"episode_infos[{key!r}]" for key in EPISODE_INFO_KEYS}
_BYTE_COLUMNS = {
    **{name: np.dtype("<i8") for name in (*_INFO.values(), "lengths")},
    "step_types": np.dtype("u1"),
}
_KNOWN_INFOS = ("episode_index", "worker", "agent_version", "env_seed", "policy_seed")
# The int64 columns compared with the header's numbers and the task's units, in
# the order the compiled check takes their offsets (rlfleet/wire/_result_check.c).
_KNOWN = ("lengths", *(_INFO[key] for key in _KNOWN_INFOS))
# The columns whose offsets follow the runs in a skeleton's ``places``.
_PLACED = (*_KNOWN, "step_types")


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One array of the layout: where it is named, what it holds, how many rows."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    per_episode: bool  # rows: one per episode, else one per step

    @functools.cached_property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize

    @functools.cached_property
    def header_of(self) -> Callable[[int, int], bytes]:
        """Its Tensor's bytes before the data for ``(rows, nbytes)`` (``rows_header``)."""
        return rows_header(dtype_code(self.dtype), self.row_shape)


# A TensorMap's entries: key field bytes and a tensor or a nested map.
_Tree = tuple[tuple[bytes, "_Tensor | _Tree"], ...]

#: Reads ``size`` bytes at an offset of a result's bytes.
_Read = Callable[[int, int], "bytes | memoryview"]
#: A result's bytes: their size, their reader, and the bytes if joined.
_Source = tuple[int, _Read, "memoryview | None"]


@dataclasses.dataclass(frozen=True)
class _Frame:
    """Where a layout's arrays are for some numbers of episodes and steps:
    what reading a result's arrays takes (a learner's views).

    Attributes:
        size: Size of the whole message.
        headers: (offset, bytes) of every run of bytes between arrays.
        offsets: Offset of each array's data, by name.
    """

    size: int
    headers: tuple[tuple[int, bytes], ...]
    offsets: dict[str, int]


@dataclasses.dataclass(frozen=True)
class _Skeleton(_Frame):
    """A layout's bytes for some numbers of episodes and steps, the arrays
    left out: its :class:`_Frame` and what the one-pass check compares.

    Attributes:
        between: The runs of ``headers``, joined.
        places: What the compiled check reads where (``episodes_pass``'s
            ``places``, rlfleet/wire/_result_check.c): native int64s, each
            run's (offset, size), then the offsets of the int64 columns the
            header's numbers tell (:data:`_KNOWN`) and of the step types.
    """

    between: bytes
    places: bytes


#: The frames of the process's layouts, by (layout number, episodes, steps):
#: a frame depends on the layout alone, and a per-env worker's results hardly
#: repeat their counts, so a learner's views take the frame its embedded
#: coordinator's check built for the same result (``Fleet.local``)
#: (``tests/test_result_layout.py::test_a_results_frame_is_built_once_in_the_learners_process``).
_FRAMES: dict[tuple[int, int, int], _Frame] = {}
#: The skeletons of the process's layouts, by the same keys: a skeleton
#: depends on its frame alone, so the result lanes of a fleet's workers,
#: whose results share a layout, build each pair of counts once between them.
_SKELETONS: dict[tuple[int, int, int], _Skeleton] = {}
_SHAPES: dict[tuple[tuple[int, _Tensor | _Tree], ...], int] = {}  # each layout's number
#: The skeleton programs (``_skeleton_program.skeleton_program``) of the
#: process's layouts, by layout number: worked out once for every worker
#: session of a layout.
_PROGRAMS: dict[int, SkeletonProgram] = {}
_shape_numbers = itertools.count()


def _shape_number(blocks: tuple[tuple[int, _Tensor | _Tree], ...]) -> int:
    """A distinct layout's number, never reused (:data:`_SHAPES` starts afresh when full)."""
    found = _SHAPES.get(blocks)
    if found is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        found = _SHAPES[blocks] = next(_shape_numbers)
    return found


#: The compiled screens' codes of the dtypes they read (struct's, native order).
_CODES = {np.dtype(t): np.dtype(t).char for t in "bhiBHIfd"} | {
    np.dtype(np.int64): "q",
    np.dtype(np.uint64): "Q",
}


#: A compiled screen's head: op, dtype and bounds' codes, flags, elements per row, bounds each.
_SCREEN_HEAD = struct.Struct("=3sB4xqq")
_PER_EPISODE = 4
_FLOAT64 = np.dtype(np.float64)


def _spec(op: bytes, code: str, compare: str, tensor: _Tensor, *bounds: np.ndarray) -> bytes:
    """A compiled screen of ``tensor`` (rlfleet/wire/_result_check.c's ScreenHead, then bounds)."""
    count = bounds[0].size if bounds else 1
    flags = _PER_EPISODE if tensor.per_episode else 0
    head = _SCREEN_HEAD.pack(
        op + code.encode() + compare.encode(), flags, math.prod(tensor.row_shape), count
    )
    return head + b"".join(bound.tobytes() for bound in bounds)


def _bounds_spec(tensor: _Tensor, space: gym.Space, actions: bool) -> bytes | None:
    """The compiled screen of ``space_screen``'s comparisons for ``tensor``
    (None: numpy's screen, or none)."""
    dtype, row_shape = tensor.dtype, tensor.row_shape
    code = _CODES.get(dtype) if dtype.isnative else None
    found = screen_bounds(space, dtype, row_shape, actions=actions)
    if code is None or found is None or not math.prod(row_shape):
        return None
    size = 1 if all(bound is None or isinstance(bound, np.generic) for bound in found) else None
    if size is None and not all(bound is None or bound.shape == row_shape for bound in found):
        return None
    count = size or math.prod(row_shape)
    compare = dtype
    if dtype.kind == "f":
        compare = np.result_type(dtype, *(bound.dtype for bound in found if bound is not None))
    if compare not in (dtype, _FLOAT64):
        return None
    as_compared = [
        _as_compared(bound, dtype, compare, low, count)
        for bound, low in zip(found, (True, False), strict=True)
    ]
    if any(bound is None for bound in as_compared):
        return None
    return _spec(b"w", code, _CODES[compare], tensor, *as_compared)  # type: ignore[arg-type]


def _as_compared(
    bound: np.ndarray | np.generic | None,
    dtype: np.dtype,
    compare: np.dtype,
    low: bool,
    count: int,
) -> np.ndarray | None:
    """``count`` values of a bound, in the dtype the compiled screen compares
    ``dtype`` values in, breaking it where numpy's comparison breaks it (None:
    it has no such bound).

    numpy compares values with a bound in their promoted dtype: the values'
    own, or float64 (integers and float32 against float64 bounds). A
    float32 array is compared in float64 as numpy does; an integer one in
    its own dtype against the integer each float64 bound draws the line at
    (its values convert to float64 monotonically), so no value is converted.
    A missing bound is one no value breaks.
    """
    if dtype.kind == "f":
        if bound is None:
            return np.full(count, -np.inf if low else np.inf, compare)
        if bound.dtype.kind not in "iuf" or np.result_type(dtype, bound.dtype) != compare:
            return None
        values = np.asarray(bound, compare).reshape(-1)
    else:
        info = np.iinfo(dtype)
        if bound is None:
            return np.full(count, info.min if low else info.max, dtype)
        if bound.dtype.kind not in "iuf":
            return None
        promoted = np.result_type(dtype, bound.dtype)
        if promoted == _FLOAT64:
            lowest, highest = int(info.min), int(info.max)
            lines = [_integer_line(float(b), lowest, highest, low) for b in np.ravel(bound)]
            if any(line is None for line in lines):
                return None
            values = np.array(lines, dtype)
        elif promoted == dtype:
            values = np.asarray(bound, dtype).reshape(-1)
        else:
            return None
    return np.ascontiguousarray(np.broadcast_to(values, (count,)))


def _integer_line(bound: float, lowest: int, highest: int, low: bool) -> int | None:
    """The integer bound in [lowest, highest] equivalent to a float64 one for
    integers converted to float64 (numpy's comparison): for ``low``, the
    least v with float(v) >= bound (v < it: below); else the greatest v with
    float(v) <= bound (v > it: above). None: every value breaks it."""
    if math.isnan(bound):
        return lowest if low else highest  # NaN compares false: nothing breaks it
    # float(v) is monotone in v: search for the line over the dtype's range.
    if low:
        if float(highest) < bound:
            return None
        left, right = lowest, highest  # least v in [left, right] with float(v) >= bound
        while left < right:
            middle = (left + right) // 2
            if float(middle) >= bound:
                right = middle
            else:
                left = middle + 1
        return left
    if float(lowest) > bound:
        return None
    left, right = lowest, highest  # greatest v with float(v) <= bound
    while left < right:
        middle = (left + right + 1) // 2
        if float(middle) <= bound:
            left = middle
        else:
            right = middle - 1
    return left


def _sum_spec(rewards: _Tensor) -> bytes | None:
    """The compiled check that float rewards' float64 sum is finite (None: numpy's)."""
    dtype = rewards.dtype
    if dtype.kind != "f" or not dtype.isnative or dtype not in _CODES:
        return None
    if not math.prod(rewards.row_shape):
        return None
    return _spec(b"f", _CODES[dtype], _CODES[dtype], rewards)


class _Layout:
    """The fields, keys, dtypes and row shapes of one checked result."""

    def __init__(
        self,
        spec: EnvSpec,
        blocks: tuple[tuple[int, _Tensor | _Tree], ...],
        keys: Mapping[bytes, str],
    ) -> None:
        self.spec = spec
        self.blocks = blocks
        self.keys = keys  # each TensorMap key, by its encoded key field
        self.tensors = {t.name: t for t in _walk(blocks)}
        self.bools = tuple(t.name for t in self.tensors.values() if t.dtype == _BOOL)
        self._shape = _shape_number(blocks)
        self._block_parts: dict[tuple[int, ...], tuple[_BlockParts, int]] = {}
        # The numbers of rows each block's bytes depend on (_rows_kind).
        self._rows = tuple(_rows_kind(item) for _, item in blocks)
        # The value screens: compiled where they are comparisons of ints or
        # floats against bounds, finite rewards and bools (one call reads
        # them where they lie); numpy's for the rest (whole numbers in a
        # float layout, a dtype that breaks the space, float16 rewards).
        obs, act = spec.observation_space, spec.action_space
        compiled: list[tuple[str, bytes]] = []
        screens: list[tuple[str, Callable[[np.ndarray], bool]]] = []
        for name, space, actions in (
            ("observations", obs, False),
            ("last_observations", obs, False),
            ("actions", act, True),
        ):
            tensor = self.tensors[name]
            found = _bounds_spec(tensor, space, actions)
            if found is not None:
                compiled.append((name, found))
                continue
            check = space_screen(space, tensor.dtype, tensor.row_shape, actions=actions)
            if check is not None:
                screens.append((name, check))
        rewards = self.tensors["rewards"]
        summed = _sum_spec(rewards)
        if summed is not None:
            compiled.append(("rewards", summed))
        # Rewards of a float dtype the compiled screen does not read: numpy sums them.
        self.finite_rewards = rewards.dtype.kind == "f" and summed is None
        compiled += [
            (name, _spec(b"o", "?", "?", self.tensors[name]))
            for name in self.bools
            if math.prod(self.tensors[name].row_shape)
        ]
        self.compiled_screens = tuple(compiled)
        self.screens = tuple(screens)

    def fitting(self, episodes: int, steps: int, size: int) -> _Skeleton | None:
        """The layout's skeleton for ``episodes`` and ``steps`` if a result of
        ``size`` bytes can have it, else None."""
        if steps > size:  # every step takes a byte or more: no skeleton for forged counts
            return None
        # The kept skeleton looked up here: a result of counts met before makes no call more.
        found = _SKELETONS.get((self._shape, episodes, steps)) or self.skeleton(episodes, steps)
        return found if found.size == size else None

    def skeleton(self, episodes: int, steps: int) -> _Skeleton:
        """The layout's bytes for ``episodes`` and ``steps``, worked out once per
        pair in the process (:data:`_SKELETONS`)."""
        key = (self._shape, episodes, steps)
        found = _SKELETONS.get(key)
        if found is None:
            if len(_SKELETONS) >= _MAX_SKELETONS:
                _SKELETONS.clear()  # a worker's step counts wander: keep the cache small
            program = _PROGRAMS.get(self._shape)
            if program is None:  # once per distinct layout, at its first new counts
                if len(_PROGRAMS) >= _MAX_SHAPES:
                    _PROGRAMS.clear()
                program = _PROGRAMS[self._shape] = skeleton_program(self.blocks, _PLACED)
            found = _SKELETONS[key] = _build_skeleton(
                self.blocks, episodes, steps, self.frame, program
            )
            # A skeleton is its frame: the learner's views in this process take it.
            if len(_FRAMES) >= _MAX_FRAMES:
                _FRAMES.clear()
            _FRAMES.setdefault(key, found)
        return found

    def frame(self, episodes: int, steps: int) -> _Frame:
        """The layout's frame for ``episodes`` and ``steps``, without the bytes only
        the one pass compares (a learner's views keep what they need of it:
        rlfleet.wire.result_views); shared in the process (:data:`_FRAMES`)."""
        key = (self._shape, episodes, steps)
        found = _FRAMES.get(key)
        if found is None:
            if len(_FRAMES) >= _MAX_FRAMES:
                _FRAMES.clear()
            found = _FRAMES[key] = _build_frame(self.blocks, episodes, steps, self._parts)
        return found

    def _parts(self, block: int, episodes: int, steps: int) -> tuple[_BlockParts, int]:
        """A block's parts, kept per number of rows its arrays have: a new pair
        of numbers works out only the blocks whose rows changed (a worker's
        results of as many episodes share their episode infos' bytes)."""
        kind = self._rows[block]
        # No call per block: the key is the numbers its rows depend on.
        key = (
            (block, episodes)
            if kind is _EPISODES
            else (block, -1, steps)
            if kind is _STEPS
            else (block, episodes, steps)
        )
        found = self._block_parts.get(key)
        if found is None:
            if len(self._block_parts) >= _MAX_FRAMES:
                self._block_parts.clear()
            number, item = self.blocks[block]
            found = self._block_parts[key] = _block_parts(number, item, episodes, steps)
        return found


#: What a block's bytes depend on (:func:`_rows_kind`).
_EPISODES, _STEPS, _BOTH = "episodes", "steps", "both"


def _rows_kind(item: _Tensor | _Tree) -> str:
    """What a block's bytes depend on: the episodes, the steps, or both."""
    kinds = {t.per_episode for t in _walk(((0, item),))}
    if kinds == {True}:
        return _EPISODES
    if kinds == {False}:
        return _STEPS
    return _BOTH


def _walk(blocks: tuple[tuple[int, _Tensor | _Tree], ...]) -> list[_Tensor]:
    found: list[_Tensor] = []

    def visit(item: _Tensor | _Tree) -> None:
        if isinstance(item, _Tensor):
            found.append(item)
        else:
            for _, child in item:
                visit(child)

    for _, item in blocks:
        visit(item)
    return found


def _learn(batch: EpisodeBatch, window: bool) -> _Layout | None:
    """The layout of a decoded batch (None: one the one-pass check does not take);
    ``window``: of a fragment window, whose pieces carry more episode infos."""

    def tensor(name: str, array: np.ndarray, per_episode: bool) -> _Tensor:
        return _Tensor(name, array.dtype, tuple(array.shape[1:]), per_episode)

    keys: dict[bytes, str] = {}

    def tree(name: str, infos: Mapping[str, object], per_episode: bool) -> _Tree:
        entries: list[tuple[bytes, _Tensor | _Tree]] = []
        for key, value in infos.items():
            path = f"{name}[{key!r}]"
            key_field = encode_key_field(key, path)
            keys[key_field] = key
            if isinstance(value, Mapping):
                entries.append((key_field, tree(path, value, per_episode)))
            else:  # decoded: an array
                entries.append((key_field, tensor(path, np.asarray(value), per_episode)))
        return tuple(entries)

    blocks: list[tuple[int, _Tensor | _Tree]] = []
    for number, name, per_episode in _FIELDS:
        value = getattr(batch, name)
        if isinstance(value, Mapping):
            if value:  # an empty map is not written
                blocks.append((number, tree(name, value, per_episode)))
        else:
            blocks.append((number, tensor(name, value, per_episode)))
    layout = _Layout(batch.env_spec, tuple(blocks), keys)
    required = EPISODE_INFO_KEYS + FRAGMENT_INFO_KEYS if window else EPISODE_INFO_KEYS
    names = {f"episode_infos[{key!r}]" for key in required}
    if not names <= layout.tensors.keys():
        return None
    if not window:
        for name, dtype in _BYTE_COLUMNS.items():  # else every result takes the general path
            column = layout.tensors.get(name)
            if column is None or column.dtype != dtype or column.row_shape:
                return None
    return layout


#: A block's bytes for some numbers of rows: each array, with the bytes
#: (tags, lengths, dtype, shape) written right before its data; None after
#: the bytes that end a block with no array after them (an empty nested map).
_BlockParts = tuple[tuple[bytes, "_Tensor | None"], ...]


def _block_parts(
    number: int, item: _Tensor | _Tree, episodes: int, steps: int
) -> tuple[_BlockParts, int]:
    """The bytes batch_parts writes for one field (write_tensor, write_tensor_map)
    with arrays of these numbers of rows, each array's data left out; and the
    field's size."""
    if isinstance(item, _Tensor):
        # One array (every field but the info maps, whose rows are the
        # episodes' and kept): its bytes for a new number of steps, with no
        # closure or cell made (a function's cells are made as it starts).
        return _array_parts(number, item, episodes, steps)
    return _map_parts(number, item, episodes, steps)


def _array_parts(number: int, item: _Tensor, episodes: int, steps: int) -> tuple[_BlockParts, int]:
    """:func:`_block_parts` of a field holding one array."""
    rows = episodes if item.per_episode else steps
    nbytes = rows * item.row_bytes
    header = item.header_of(rows, nbytes)
    prefix = len_prefix(number, len(header) + nbytes)
    return ((prefix + header, item),), len(prefix) + len(header) + nbytes


def _map_parts(number: int, item: _Tree, episodes: int, steps: int) -> tuple[_BlockParts, int]:
    """:func:`_block_parts` of a field holding a TensorMap."""

    def tensor_parts(number: int, t: _Tensor) -> tuple[list[bytes | _Tensor], int]:
        ((head, _),), size = _array_parts(number, t, episodes, steps)
        return [head, t], size

    def map_parts(number: int, entries: _Tree) -> tuple[list[bytes | _Tensor], int]:
        body: list[bytes | _Tensor] = []
        size = 0
        for key_field, child in entries:
            parts, child_size = (
                tensor_parts(_ENTRY_TENSOR, child)
                if isinstance(child, _Tensor)
                else map_parts(_ENTRY_MAP, child)
            )
            entry = len_prefix(_MAP_ENTRIES, len(key_field) + child_size) + key_field
            body += [entry, *parts]
            size += len(entry) + child_size
        prefix = len_prefix(number, size)
        return [prefix, *body], len(prefix) + size

    parts, size = map_parts(number, item)
    pairs: list[tuple[bytes, _Tensor | None]] = []
    run = b""
    for part in parts:
        if isinstance(part, bytes):
            run += part
        else:
            pairs.append((run, part))
            run = b""
    if run:
        pairs.append((run, None))
    return tuple(pairs), size


def _build_frame(
    blocks: tuple[tuple[int, _Tensor | _Tree], ...],
    episodes: int,
    steps: int,
    parts_of: Callable[[int, int, int], tuple[_BlockParts, int]] | None = None,
) -> _Frame:
    """The frame of ``blocks`` for these numbers of episodes and steps
    (``parts_of(block, episodes, steps)``: each block's parts, maybe kept)."""
    headers: list[tuple[int, bytes]] = []
    offsets: dict[str, int] = {}
    position = 0
    for block, (number, item) in enumerate(blocks):
        pairs, _ = (
            _block_parts(number, item, episodes, steps)
            if parts_of is None
            else parts_of(block, episodes, steps)
        )
        for run, tensor in pairs:
            if run:
                headers.append((position, run))
                position += len(run)
            if tensor is not None:
                offsets[tensor.name] = position
                position += (episodes if tensor.per_episode else steps) * tensor.row_bytes
    # Its fields are as worked out here: made without the frozen __init__.
    return prebuilt(_Frame, size=position, headers=tuple(headers), offsets=offsets)


def _build_skeleton(
    blocks: tuple[tuple[int, _Tensor | _Tree], ...],
    episodes: int,
    steps: int,
    frame_of: Callable[[int, int], _Frame] | None = None,
    program: SkeletonProgram | None = None,
) -> _Skeleton:
    """The skeleton of ``blocks`` for these numbers of episodes and steps:
    their frame (:func:`_build_frame`, or ``frame_of(episodes, steps)``) and
    the bytes the one pass compares; in one compiled call if ``program``
    (``blocks``' ``_skeleton_program.skeleton_program``) is given and takes
    the counts."""
    if program is not None:
        made = skeleton(*program, episodes, steps)
        if made is not None:  # None: sizes past int64, for Python's integers below
            size, headers, offsets, between, places = made
            return prebuilt(
                _Skeleton,
                size=size,
                headers=headers,
                offsets=offsets,
                between=between,
                places=places,
            )
    frame = _build_frame(blocks, episodes, steps) if frame_of is None else frame_of(episodes, steps)
    headers, offsets = frame.headers, frame.offsets
    numbers = [number for offset, run in headers for number in (offset, len(run))]
    numbers += [offsets[name] for name in _PLACED]
    count = len(numbers)
    # Native int64s, as the compiled check reads them (struct's '=q': no
    # numpy call); made without the frozen __init__, its fields worked out here.
    return prebuilt(
        _Skeleton,
        size=frame.size,
        headers=headers,
        offsets=offsets,
        between=b"".join([run for _, run in headers]),
        places=struct.pack(f"={count}q", *numbers),
    )
