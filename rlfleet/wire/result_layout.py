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
  header's numbers of episodes and steps: a few slice comparisons, worked
  out once per pair of numbers; then every array is a view at a known
  offset;
* the values are checked as the general path checks them (metadata,
  episode infos, units' seeds, step types, values against the spaces,
  rewards, bool infos), each with the comparisons the layout leaves: a
  uint8 frame of a 0..255 Box needs none, bounds are worked out once.

A result of several chunks is checked where its chunks are: only the
bytes around the arrays and the arrays checked are read, so a result's
uint8 frames are never copied to be checked (the general path joins them).

Any difference from the layout, and any check that does not pass, sends the
result down the general path, which raises with its own text (or finds
nothing wrong: the quick checks may ask it to look closer, never let
through what it refuses) and then relearns the layout. So every check still
runs once, at this trust boundary, and a refusal reads as it always did.
Fragments take the general path.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.flags import all_set, any_set
from rlfleet.core._validation import accepted_shapes, check_step_types
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.core.space_checks import space_screen
from rlfleet.errors import InvalidBatchError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.wire._protowire import len_prefix, read_varint
from rlfleet.wire.chunks import Payload, Pieces
from rlfleet.wire.result_checks import ResultExpectation, check_result, step_type_problems
from rlfleet.wire.results import (
    EPISODE_INFO_KEYS,
    DecodedResult,
    JoinedResult,
    Result,
    ResultHeader,
    decode_kept,
    decode_result,
)
from rlfleet.wire.tensors import dtype_code, encode_key_field, tensor_header

#: Skeletons kept per layout (one per pair of episode and step counts).
_MAX_SKELETONS = 256

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
# TensorMap's fields (tensor.proto).
_MAP_ENTRIES, _ENTRY_TENSOR, _ENTRY_MAP = 1, 2, 3
_BOOL = np.dtype("?")


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One array of the layout: where it is named, what it holds, how many rows."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    per_episode: bool  # rows: one per episode, else one per step

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize


# A TensorMap's entries: key field bytes and a tensor or a nested map.
_Tree = tuple[tuple[bytes, "_Tensor | _Tree"], ...]


@dataclasses.dataclass(frozen=True)
class _Skeleton:
    """A layout's bytes for some numbers of episodes and steps, the arrays left out.

    Attributes:
        size: Size of the whole message.
        headers: (offset, bytes) of every run of bytes between arrays.
        offsets: Offset of each array's data, by name.
    """

    size: int
    headers: tuple[tuple[int, bytes], ...]
    offsets: dict[str, int]


class _Layout:
    """The fields, keys, dtypes and row shapes of one checked result."""

    def __init__(self, spec: EnvSpec, blocks: tuple[tuple[int, _Tensor | _Tree], ...]) -> None:
        self.spec = spec
        self._blocks = blocks
        self.tensors = {t.name: t for t in _walk(blocks)}
        names = {number: name for number, name, _ in _FIELDS}
        #: The batch's fields by name: a tensor, or a map's entries by key (a learner's views).
        self.fields = tuple((names[number], _keyed(item)) for number, item in blocks)
        self.bools = tuple(t.name for t in self.tensors.values() if t.dtype == _BOOL)
        self._skeletons: dict[tuple[int, int], _Skeleton] = {}
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

    def skeleton(self, episodes: int, steps: int) -> _Skeleton:
        """The layout's bytes for ``episodes`` and ``steps``, worked out once per pair."""
        found = self._skeletons.get((episodes, steps))
        if found is None:
            if len(self._skeletons) >= _MAX_SKELETONS:
                self._skeletons.clear()  # a worker's step counts wander: keep the cache small
            found = _build_skeleton(self._blocks, episodes, steps)
            self._skeletons[(episodes, steps)] = found
        return found


#: A map of the layout by key: its tensors, or nested maps.
_Keyed = tuple[tuple[str, "_Tensor | _Keyed"], ...]


def _keyed(item: _Tensor | _Tree) -> _Tensor | _Keyed:
    """``item`` with each map entry's key field read back into its key."""
    if isinstance(item, _Tensor):
        return item
    entries = []
    for key_field, child in item:
        _, start = read_varint(key_field, 1, len(key_field), "a TensorMap key")
        entries.append((str(key_field[start:], "utf-8"), _keyed(child)))
    return tuple(entries)


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


def _learn(batch: EpisodeBatch) -> _Layout | None:
    """The layout of a decoded batch (None: one the one-pass check does not take)."""

    def tensor(name: str, array: np.ndarray, per_episode: bool) -> _Tensor:
        return _Tensor(name, array.dtype, tuple(array.shape[1:]), per_episode)

    def tree(name: str, infos: Mapping[str, object], per_episode: bool) -> _Tree:
        entries: list[tuple[bytes, _Tensor | _Tree]] = []
        for key, value in infos.items():
            path = f"{name}[{key!r}]"
            key_field = encode_key_field(key, path)
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
    layout = _Layout(batch.env_spec, tuple(blocks))
    names = {f"episode_infos[{key!r}]" for key in EPISODE_INFO_KEYS}
    if not names <= layout.tensors.keys():
        return None
    return layout


def _build_skeleton(
    blocks: tuple[tuple[int, _Tensor | _Tree], ...], episodes: int, steps: int
) -> _Skeleton:
    # The bytes batch_parts writes for arrays of these numbers of rows
    # (write_tensor, write_tensor_map), each array's data left as its size.
    def tensor_parts(number: int, t: _Tensor) -> tuple[list[bytes | _Tensor], int]:
        rows = episodes if t.per_episode else steps
        nbytes = rows * t.row_bytes
        header = tensor_header(dtype_code(t.dtype), (rows, *t.row_shape), nbytes)
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

    headers: list[tuple[int, bytes]] = []
    offsets: dict[str, int] = {}
    position, run, run_start = 0, b"", 0
    for number, item in blocks:
        parts, _ = (
            tensor_parts(number, item) if isinstance(item, _Tensor) else map_parts(number, item)
        )
        for part in parts:
            if isinstance(part, bytes):
                if not run:
                    run_start = position
                run += part
                position += len(part)
                continue
            if run:
                headers.append((run_start, run))
                run = b""
            offsets[part.name] = position
            position += (episodes if part.per_episode else steps) * part.row_bytes
    if run:
        headers.append((run_start, run))
    return _Skeleton(position, tuple(headers), offsets)


class ResultLayoutCheck:
    """One worker session's episode results, checked in one pass once its layout is known.

    Keeps the layout of the session's last result that passed the general
    path, for the env spec it was checked against (an env update brings
    another spec, and the next result relearns). Safe to share between a
    worker's Join stream and its lease data connection: the layout is
    replaced whole.
    """

    def __init__(self) -> None:
        self._layout: _Layout | None = None

    @property
    def learned(self) -> bool:
        """Whether a layout is known (the next result of it takes the one pass)."""
        return self._layout is not None

    def check(self, joined: JoinedResult, env_spec: EnvSpec, expect: ResultExpectation) -> None:
        """Checks a whole result of an episodes task: in one pass if it has the
        layout learned, else by the general path (which then learns it).

        Raises:
            ResultError: As :func:`~rlfleet.wire.result_checks.check_result`
                and :func:`~rlfleet.wire.results.decode_result` raise, with
                their text.
        """
        layout = self._layout
        if (
            layout is not None
            and layout.spec is env_spec
            and expect.window is None
            and _passes(layout, joined.header, _reader(joined.payload), expect)
        ):
            return
        decoded = decode_result(joined, env_spec)
        check_result(decoded, expect)
        if expect.window is None:
            self._layout = _learn(decoded.batch)


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
    size, read, whole = payload
    if steps > size:  # every step takes a byte or more: no skeleton for forged counts
        return False
    skeleton = layout.skeleton(episodes, steps)
    if size != skeleton.size:
        return False
    for offset, expected in skeleton.headers:
        if read(offset, len(expected)) != expected:
            return False
    tensors, offsets = layout.tensors, skeleton.offsets

    def view(name: str) -> np.ndarray:
        t = tensors[name]
        rows = episodes if t.per_episode else steps
        if whole is not None:
            return np.ndarray((rows, *t.row_shape), t.dtype, buffer=whole, offset=offsets[name])
        data = read(offsets[name], rows * t.row_bytes)
        return np.frombuffer(data, t.dtype).reshape(rows, *t.row_shape)

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
    batch_lengths = view("lengths")
    if batch_lengths.tolist() != list(lengths):
        return False
    indices = view("episode_infos['episode_index']")
    if indices.tolist() != list(header.episode_indices):
        return False
    if indices[0] < 0 or any_set(indices[1:] <= indices[:-1]):
        return False
    for name, want in (("worker", expect.worker_id), ("agent_version", version)):
        if any_set(view(f"episode_infos[{name!r}]") != want):
            return False
    env_seeds, policy_seeds = (
        view("episode_infos['env_seed']"),
        view("episode_infos['policy_seed']"),
    )
    if expect.native:
        if any_set(env_seeds != NO_ENV_SEED) or any_set(policy_seeds != NO_POLICY_SEED):
            return False
    elif expect.units is not None and not _seeds_match(
        expect.units, indices, env_seeds, policy_seeds
    ):
        return False
    # Step types (which also keeps every value in StepType's range).
    if step_type_problems(view("step_types"), batch_lengths, None, must_end=True):
        return False
    # Values against the declared spaces, rewards, bool infos (value_problems, the decode).
    for name, screen in layout.screens:
        if not screen(view(name)):
            return False
    if layout.finite_rewards and not math.isfinite(
        np.add.reduce(view("rewards"), dtype=np.float64)
    ):
        return False
    return not any(any_set(view(name).view(np.uint8) > 1) for name in layout.bools)


def _seeds_match(
    units: UnitColumns, indices: np.ndarray, env_seeds: np.ndarray, policy_seeds: np.ndarray
) -> bool:
    positions, found = units.positions(indices)
    if not all_set(found):
        return False
    if any_set(units.env_seeds[positions] != env_seeds):
        return False
    return not any_set(units.policy_seeds[positions] != policy_seeds)


class ResultLayoutViews:
    """A learner's results decoded with the layout of their worker's last one.

    The coordinator checked every value of a result before passing it on
    (:class:`ResultLayoutCheck`); the learner decodes what it receives to
    views of it. A result of one chunk with the layout its worker's last
    result had (the same bytes around the arrays for its numbers of
    episodes and steps) is viewed at the skeleton's offsets: a few slice
    comparisons and a view per array, instead of walking every field
    (about 230 Python and numpy calls) and building the EpisodeBatch with
    its checks. What decoding checks on values still holds: the lengths
    are the header's, the step types in StepType's range, bools 0 or 1.
    Anything else (another layout, a value those checks refuse, a result of
    several chunks, a space whose rows are checked by ``contains``) takes
    :func:`~rlfleet.wire.results.decode_kept`, which raises with its own
    text or decodes and relearns the worker's layout.
    """

    #: Workers whose layouts are kept (a fleet past it starts again).
    MAX_WORKERS = 4096

    def __init__(self) -> None:
        self._layouts: dict[int, _Layout] = {}
        #: Results decoded in one pass and by the general path (tests count them).
        self.viewed = 0
        self.decoded = 0

    def decode(self, joined: JoinedResult, env_spec: EnvSpec) -> Result:
        """The result's batch as views of its bytes.

        Raises:
            ResultError: As :func:`~rlfleet.wire.results.decode_kept`, with its text.
        """
        header = joined.header
        layout = self._layouts.get(header.worker_id)
        payload = joined.payload
        if layout is not None and layout.spec is env_spec and not isinstance(payload, tuple):
            batch = _viewed(layout, header, payload)
            if batch is not None:
                self.viewed += 1
                return DecodedResult(header, batch, joined.chunks, joined.message_sizes)
        result = decode_kept(joined, env_spec)
        self.decoded += 1
        if isinstance(result, DecodedResult):
            learned = _learn(result.batch)
            if learned is not None and _viewable(learned):
                if len(self._layouts) >= self.MAX_WORKERS:
                    self._layouts.clear()
                self._layouts[header.worker_id] = learned
            else:
                self._layouts.pop(header.worker_id, None)
        return result


def _viewable(layout: _Layout) -> bool:
    """Whether decoding checks nothing of the layout's rows but their shape
    (a space without accepted shapes has its first row checked by ``contains``)."""
    spec = layout.spec
    return (
        accepted_shapes(spec.observation_space) is not None
        and accepted_shapes(spec.action_space) is not None
        and layout.tensors["step_types"].dtype.kind in "iu"
    )


def _viewed(layout: _Layout, header: ResultHeader, payload: Payload) -> EpisodeBatch | None:
    """The batch of a one-chunk result with the layout, views of ``payload``
    (read-only, as :func:`~rlfleet.wire.batches.decode_batch` leaves them);
    None for anything the general path must read."""
    lengths = header.lengths
    episodes = len(lengths)
    if not episodes or min(lengths) < 1:
        return None
    steps = sum(lengths)
    whole = memoryview(payload)
    size = whole.nbytes
    if steps > size:  # every step takes a byte or more: no skeleton for forged counts
        return None
    skeleton = layout.skeleton(episodes, steps)
    if size != skeleton.size:
        return None
    if whole.format != "B" or whole.ndim != 1:
        whole = whole.cast("B")
    whole = whole.toreadonly()
    for offset, expected in skeleton.headers:
        if whole[offset : offset + len(expected)] != expected:
            return None
    offsets = skeleton.offsets

    def view(t: _Tensor) -> np.ndarray:
        rows = episodes if t.per_episode else steps
        return np.ndarray((rows, *t.row_shape), t.dtype, buffer=whole, offset=offsets[t.name])

    def tree(entries: _Keyed) -> dict[str, object]:
        return {
            key: view(child) if isinstance(child, _Tensor) else tree(child)
            for key, child in entries
        }

    fields: dict[str, Any] = {
        name: view(item) if isinstance(item, _Tensor) else tree(item)
        for name, item in layout.fields
    }
    batch_lengths = fields["lengths"]
    if batch_lengths.tolist() != list(lengths):
        return None
    try:
        check_step_types("step_types", fields["step_types"], steps, "steps")
    except InvalidBatchError:
        return None
    if any(any_set(view(layout.tensors[name]).view(np.uint8) > 1) for name in layout.bools):
        return None
    for _, name, _ in _FIELDS:
        fields.setdefault(name, {})  # an empty map is not written
    return EpisodeBatch.prechecked(env_spec=layout.spec, check_actions=False, **fields)


__all__ = ["ResultLayoutCheck", "ResultLayoutViews"]
