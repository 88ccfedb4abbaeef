"""A worker's episode results checked in one pass, with the layout its first result had.

A worker's results repeat one layout: the same fields, info keys, dtypes
and trailing shapes, only the numbers of episodes and steps change. The
general path (:func:`~rlfleet.wire.results.decode_result` then
:func:`~rlfleet.wire.result_checks.check_result`) walks every field's
bytes, builds an EpisodeBatch with its shape checks and checks it: about
450 Python and numpy calls per result, 0.1-0.25 ms on the coordinator's
path. :class:`ResultLayoutCheck` learns the layout of a worker session's
first result that passed that path, and checks each later one in one pass:

* the bytes around the arrays (tags, dtypes, shapes, lengths) must be
  exactly those rlfleet's writer (and protobuf's) gives that layout for the
  header's numbers of episodes and steps, worked out once per pair of
  numbers; then every array is a view at a known offset;
* the values are checked as the general path checks them (metadata,
  episode infos, units' seeds, step types, values against the spaces,
  rewards, bool infos), each with the comparisons the layout leaves: a
  uint8 frame of a 0..255 Box needs none, bounds are worked out once;
* for episodes, what the header's numbers and the task's units tell (the
  lengths column and the int64 episode infos: indices, worker, agent
  version, seeds) is compared as bytes, with the bytes around the arrays,
  in one gather and one comparison; the uint8 step types are counted as
  bytes. numpy is left the value screens: about 20 numpy calls per result.

A result of several chunks is checked where its chunks are: only the
bytes around the arrays and the arrays checked are read, so a result's
uint8 frames are never copied to be checked (the general path joins them).

Any difference from the layout, and any check that does not pass, sends the
result down the general path, which raises with its own text (or finds
nothing wrong: the quick checks may ask it to look closer, never let
through what it refuses) and then relearns the layout. So every check still
runs once, at this trust boundary, and a refusal reads as it always did.
Every episodes result of a worker whose lengths or episode infos are not
int64, or whose step types are not uint8, takes the general path
(rlfleet's workers and the Node worker write those).

A fragment window takes the same pass with its own layout (two more
episode_infos columns, ``stream`` and ``fragment_index``): the metadata and
values as above, then the window's rules on views of its columns
(:func:`~rlfleet.wire.result_checks.window_problems`, the general path's
own: the streams of the task, each stream's ``fragment_length`` steps, its
pieces' continuity and seeds, the step types of pieces that may be cut).
It is answered with the window's batch, of views in the received bytes,
for the coordinator's books of the streams.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import operator
import struct
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

from rlfleet._util.flags import any_set
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.core.space_checks import space_screen
from rlfleet.wire._protowire import len_prefix
from rlfleet.wire._result_bytes import int64s, repeated, step_types_pass, unit_seeds
from rlfleet.wire.chunks import Payload, Pieces
from rlfleet.wire.result_checks import (
    FragmentWindow,
    ResultExpectation,
    WindowPieces,
    check_result,
    window_problems,
)
from rlfleet.wire.results import (
    EPISODE_INFO_KEYS,
    FRAGMENT_INFO_KEYS,
    JoinedResult,
    ResultHeader,
    decode_result,
)
from rlfleet.wire.tensors import dtype_code, encode_key_field, rows_header

#: Skeletons kept per layout (one per pair of episode and step counts).
_MAX_SKELETONS = 256
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
# The int64 columns compared with the header's numbers and the task's units, in order.
_KNOWN = ("lengths", *(_INFO[key] for key in _KNOWN_INFOS))


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


# A TensorMap's entries: key field bytes and a tensor or a nested map.
_Tree = tuple[tuple[bytes, "_Tensor | _Tree"], ...]


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
        spans: (offset, size) of each run of bytes between arrays, then of
            the int64 columns the header's numbers tell (:data:`_KNOWN`).
        known: The position of each byte of ``spans``, in their order.
    """

    between: bytes
    spans: tuple[tuple[int, int], ...]
    known: np.ndarray

    def gather(self, source: _Source) -> bytes:
        """The bytes of :attr:`spans` in a result: one gather of a joined one."""
        _, read, whole = source
        if whole is not None:
            return np.frombuffer(whole, np.uint8)[self.known].tobytes()
        return b"".join([read(offset, size) for offset, size in self.spans])


_F = TypeVar("_F", bound=_Frame)

#: The frames of the process's layouts, by (layout number, episodes, steps):
#: a frame depends on the layout alone, and a per-env worker's results hardly
#: repeat their counts, so a learner's views take the frame its embedded
#: coordinator's check built for the same result (``Fleet.local``)
#: (``tests/test_result_layout.py::test_a_results_frame_is_built_once_in_the_learners_process``).
_FRAMES: dict[tuple[int, int, int], _Frame] = {}
_SHAPES: dict[tuple[tuple[int, _Tensor | _Tree], ...], int] = {}  # each layout's number
_shape_numbers = itertools.count()


def _shape_number(blocks: tuple[tuple[int, _Tensor | _Tree], ...]) -> int:
    """A distinct layout's number, never reused (:data:`_SHAPES` starts afresh when full)."""
    found = _SHAPES.get(blocks)
    if found is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        found = _SHAPES[blocks] = next(_shape_numbers)
    return found


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
        self._skeletons: dict[tuple[int, int], _Skeleton] = {}
        self._shape = _shape_number(blocks)
        self._block_parts: dict[tuple[int, ...], tuple[_BlockParts, int]] = {}
        # The numbers of rows each block's bytes depend on.
        self._rows = tuple(_rows_key(item) for _, item in blocks)
        obs, act = spec.observation_space, spec.action_space
        screen = self._screen
        self.screens = tuple(
            (name, check)
            for name, check in (
                ("observations", screen("observations", obs, False)),
                ("last_observations", screen("last_observations", obs, False)),
                ("actions", screen("actions", act, True)),
            )
            if check is not None
        )
        rewards = self.tensors["rewards"].dtype
        self.finite_rewards = rewards.kind == "f"

    def _screen(
        self, name: str, space: gym.Space, actions: bool
    ) -> Callable[[np.ndarray], bool] | None:
        tensor = self.tensors[name]
        return space_screen(space, tensor.dtype, tensor.row_shape, actions=actions)

    def fitting(self, episodes: int, steps: int, size: int) -> _Skeleton | None:
        """The layout's skeleton for ``episodes`` and ``steps`` if a result of
        ``size`` bytes can have it, else None."""
        return _fitting(self.skeleton, episodes, steps, size)

    def skeleton(self, episodes: int, steps: int) -> _Skeleton:
        """The layout's bytes for ``episodes`` and ``steps``, worked out once per pair."""
        kept = self._skeletons
        found = kept.get((episodes, steps))
        if found is None:
            if len(kept) >= _MAX_SKELETONS:
                kept.clear()  # a worker's step counts wander: keep the cache small
            found = kept[(episodes, steps)] = _build_skeleton(
                self.blocks, episodes, steps, self.frame
            )
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
        key = (block, *self._rows[block](episodes, steps))
        found = self._block_parts.get(key)
        if found is None:
            if len(self._block_parts) >= 4 * _MAX_SKELETONS:
                self._block_parts.clear()
            number, item = self.blocks[block]
            found = self._block_parts[key] = _block_parts(number, item, episodes, steps)
        return found


def _fitting(of: Callable[[int, int], _F], episodes: int, steps: int, size: int) -> _F | None:
    if steps > size:  # every step takes a byte or more: no skeleton for forged counts
        return None
    found = of(episodes, steps)
    return found if found.size == size else None


def _rows_key(item: _Tensor | _Tree) -> Callable[[int, int], tuple[int, ...]]:
    """What a block's bytes depend on: the episodes, the steps, or both."""
    kinds = {t.per_episode for t in _walk(((0, item),))}
    if kinds == {True}:
        return lambda episodes, steps: (episodes,)
    if kinds == {False}:
        return lambda episodes, steps: (-1, steps)
    return lambda episodes, steps: (episodes, steps)


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

    def tensor_parts(number: int, t: _Tensor) -> tuple[list[bytes | _Tensor], int]:
        rows = episodes if t.per_episode else steps
        nbytes = rows * t.row_bytes
        header = rows_header(dtype_code(t.dtype), t.row_shape)(rows, nbytes)
        prefix = len_prefix(number, len(header) + nbytes)
        return [prefix + header, t], len(prefix) + len(header) + nbytes

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

    parts, size = (
        tensor_parts(number, item) if isinstance(item, _Tensor) else map_parts(number, item)
    )
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
            if tensor is None:
                continue
            offsets[tensor.name] = position
            position += (episodes if tensor.per_episode else steps) * tensor.row_bytes
    return _Frame(position, tuple(headers), offsets)


def _build_skeleton(
    blocks: tuple[tuple[int, _Tensor | _Tree], ...],
    episodes: int,
    steps: int,
    frame_of: Callable[[int, int], _Frame] | None = None,
) -> _Skeleton:
    """The skeleton of ``blocks`` for these numbers of episodes and steps:
    their frame (:func:`_build_frame`, or ``frame_of(episodes, steps)``) and
    the bytes the one pass compares."""
    frame = _build_frame(blocks, episodes, steps) if frame_of is None else frame_of(episodes, steps)
    headers, offsets = frame.headers, frame.offsets
    spans = [(offset, len(run)) for offset, run in headers]
    spans += [(offsets[name], 8 * episodes) for name in _KNOWN]
    # Each byte's position: a run of positions per span, in one repeat.
    starts, sizes = np.array(spans, dtype=np.intp).T
    ends = np.cumsum(sizes)
    known = np.arange(ends[-1], dtype=np.intp) + np.repeat(starts - (ends - sizes), sizes)
    between = b"".join(run for _, run in headers)
    return _Skeleton(frame.size, headers, offsets, between, tuple(spans), known)


class ResultLayoutCheck:
    """One worker session's episode results, checked in one pass once its layout is known.

    Keeps the layout of the session's last episodes result that passed the
    general path, and that of its last fragment window, for the env spec
    each was checked against (an env update brings another spec, and the
    next result relearns). Safe to share between a worker's Join stream and
    its lease data connection: a layout is replaced whole.
    """

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._window_layout: _Layout | None = None

    @property
    def learned(self) -> bool:
        """Whether an episodes layout is known (the next result of it takes the one pass)."""
        return self._layout is not None

    @property
    def window_learned(self) -> bool:
        """Whether a fragment window's layout is known (its next window takes the one pass)."""
        return self._window_layout is not None

    def check(
        self, joined: JoinedResult, env_spec: EnvSpec, expect: ResultExpectation
    ) -> EpisodeBatch | None:
        """Checks a whole result: in one pass if it has the layout learned for
        its mode (episodes, or a fragment window), else by the general path
        (which then learns it).

        Returns:
            A fragment window's batch (``expect.window`` set), for the books
            of its streams: views in the received bytes after the one pass,
            the decoded batch after the general path. None for episodes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.result_checks.check_result`
                and :func:`~rlfleet.wire.results.decode_result` raise, with
                their text.
        """
        window = expect.window is not None
        layout = self._window_layout if window else self._layout
        if layout is not None and layout.spec is env_spec:
            source = _reader(joined.payload)
            if _passes(layout, joined.header, source, expect):
                return _batch_of_views(layout, joined.header, source) if window else None
        decoded = decode_result(joined, env_spec)
        check_result(decoded, expect)
        if window:
            self._window_layout = _learn(decoded.batch, window=True)
            return decoded.batch
        self._layout = _learn(decoded.batch, window=False)
        return None


#: Reads ``size`` bytes at an offset of a result's bytes.
_Read = Callable[[int, int], "bytes | memoryview"]
#: A result's bytes: their size, their reader, and the bytes if joined.
_Source = tuple[int, _Read, "memoryview | None"]


def _reader(payload: Payload | Pieces) -> _Source:
    """A result's bytes, joined or left in its chunks, to read by offset.

    A read inside one chunk is a view of it; one across chunks joins the
    slices (only the bytes around the arrays and the arrays checked are
    read: a result's uint8 frames are never copied to be checked).
    """
    if not isinstance(payload, tuple):
        whole = memoryview(payload)  # slices are views, not copies
        return len(whole), lambda offset, size: whole[offset : offset + size], whole
    pieces = payload
    starts = list(itertools.accumulate((len(piece) for piece in pieces), initial=0))

    def read(offset: int, size: int) -> bytes | memoryview:
        index = bisect.bisect_right(starts, offset) - 1
        local = offset - starts[index]
        if local + size <= len(pieces[index]):
            return pieces[index][local : local + size]
        parts, end = [], offset + size
        while offset < end and index < len(pieces):
            local = offset - starts[index]
            part = pieces[index][local : local + end - offset]
            parts.append(part)
            offset += len(part)
            index += 1
        return b"".join(parts)

    return starts[-1], read, None


def _passes(
    layout: _Layout, header: ResultHeader, payload: _Source, expect: ResultExpectation
) -> bool:
    """Whether a result has the layout and passes every check (False: look closer)."""
    lengths = header.lengths
    episodes = len(lengths)
    if not episodes or len(header.episode_indices) != episodes or min(lengths) < 1:
        return False
    steps = sum(lengths)
    size, read, _ = payload
    skeleton = layout.fitting(episodes, steps, size)
    if skeleton is None:
        return False
    view = _viewer(layout, skeleton, episodes, steps, payload)

    # The metadata and the episode infos (_metadata_problems, _episode_problems).
    version = header.agent_version
    if header.env_generation != expect.env_generation:
        return False
    if expect.agent_version >= 0 and version != expect.agent_version:
        return False
    latest = expect.latest_agent_version
    if latest is not None and not 0 <= version <= latest:
        return False
    limit = expect.env_spec.max_episode_length
    if limit is not None and max(lengths) > limit:
        return False
    window = expect.window
    if window is not None:  # a fragment window: its own rules from here
        for offset, expected in skeleton.headers:
            if read(offset, len(expected)) != expected:
                return False
        batch_lengths = view("lengths")
        if batch_lengths.tolist() != list(lengths):
            return False
        if view("episode_infos['episode_index']").tolist() != list(header.episode_indices):
            return False
        return _window_passes(
            layout, view, window, worker_id=expect.worker_id, version=version, lengths=batch_lengths
        )
    indices = header.episode_indices
    if indices[0] < 0 or not all(map(operator.lt, indices, indices[1:])):
        return False  # not ascending
    # One comparison: the bytes around the arrays, and the int64 columns
    # the header's numbers and the task's units tell (lengths, episode
    # infos), against those bytes in the result.
    try:
        index_bytes = int64s(indices)
        expected_bytes = b"".join(
            (
                skeleton.between,
                int64s(lengths),
                index_bytes,
                repeated(expect.worker_id, episodes),
                repeated(version, episodes),
            )
        )
    except (struct.error, OverflowError):  # a number past int64: the general path names it
        return False
    found = skeleton.gather(payload)
    if expect.native:
        seeds: bytes | None = repeated(NO_ENV_SEED, episodes) + repeated(NO_POLICY_SEED, episodes)
    elif expect.units is not None:
        seeds = unit_seeds(expect.units, indices, index_bytes)
    else:  # nothing to hold them to
        seeds = found[len(expected_bytes) :]
    if seeds is None or found != expected_bytes + seeds:
        return False
    # Step types (which also keeps every value in StepType's range).
    if not step_types_pass(bytes(read(skeleton.offsets["step_types"], steps)), lengths):
        return False
    return _values_pass(layout, view)


#: An array of a result checked in one pass, by name (views, not copies, where they can be).
_View = Callable[[str], np.ndarray]


def _viewer(layout: _Layout, frame: _Frame, episodes: int, steps: int, payload: _Source) -> _View:
    """The arrays of a result of ``layout`` whose bytes match ``frame``."""
    _, read, whole = payload
    tensors, offsets = layout.tensors, frame.offsets

    def view(name: str) -> np.ndarray:
        t = tensors[name]
        rows = episodes if t.per_episode else steps
        if whole is not None:
            return np.ndarray((rows, *t.row_shape), t.dtype, buffer=whole, offset=offsets[name])
        data = read(offsets[name], rows * t.row_bytes)
        return np.frombuffer(data, t.dtype).reshape(rows, *t.row_shape)

    return view


def _values_pass(layout: _Layout, view: _View) -> bool:
    """Values against the declared spaces, rewards, bool infos (value_problems, the decode)."""
    for name, screen in layout.screens:
        if not screen(view(name)):
            return False
    if layout.finite_rewards and not math.isfinite(
        np.add.reduce(view("rewards"), dtype=np.float64)
    ):
        return False
    return not any(any_set(view(name).view(np.uint8) > 1) for name in layout.bools)


def _window_passes(
    layout: _Layout,
    view: _View,
    window: FragmentWindow,
    *,
    worker_id: int,
    version: int,
    lengths: np.ndarray,
) -> bool:
    """The rest of a fragment window's checks, after the metadata both modes share
    (``version``: the result's agent version; ``lengths``: its pieces')."""
    for name, want in (("worker", worker_id), ("agent_version", version)):
        if any_set(view(f"episode_infos[{name!r}]") != want):
            return False
    pieces = WindowPieces.of(
        lambda key: view(f"episode_infos[{key!r}]"), lengths, view("step_types")
    )
    if window_problems(pieces, window):
        return False
    return _values_pass(layout, view)


def _batch_of_views(layout: _Layout, header: ResultHeader, payload: _Source) -> EpisodeBatch:
    """A fragment window that passed in one pass, as a batch of views of its bytes."""
    lengths = header.lengths
    episodes, steps = len(lengths), sum(lengths)
    view = _viewer(layout, layout.skeleton(episodes, steps), episodes, steps, payload)
    keys = layout.keys

    def arrays(item: _Tensor | _Tree) -> Any:
        if isinstance(item, _Tensor):
            return view(item.name)
        return {keys[key_field]: arrays(child) for key_field, child in item}

    # An empty map is not written: its field is absent from the blocks.
    fields: dict[str, Any] = {"episode_infos": {}, "env_infos": {}, "agent_infos": {}}
    for number, item in layout.blocks:
        fields[_FIELD_NAMES[number]] = arrays(item)
    return EpisodeBatch.prechecked(env_spec=layout.spec, check_actions=False, **fields)


__all__ = ["ResultLayoutCheck"]
