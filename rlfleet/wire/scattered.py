"""A batch of several chunks, decoded where its bytes arrived: no join.

A result larger than one message reaches the learner as several chunks,
consecutive slices of one serialized ``EpisodeBatch`` (batch.proto).
Joining them into one buffer before decoding copies every byte once, and
placing the decoded rows into the answer (rlfleet.wire.results) copies them
again. Here the chunks stay as they came:

* :class:`Spliced` reads the chunks as one byte sequence for the message's
  headers (tags, lengths, dtypes, shapes, keys: a few hundred bytes), and
  never joins their data;
* a tensor that lies inside one chunk is a read-only view of it, as
  :func:`~rlfleet.wire.decode_batch` makes; one that runs across chunks is a
  :class:`Scattered`: its dtype, shape and byte pieces, which
  :meth:`Scattered.copy_into` writes straight to their place in the answer;
* :func:`decode_scattered` checks everything :func:`~rlfleet.wire.decode_batch`
  and the ``EpisodeBatch`` constructor check (dtypes, shapes against the
  data and the spaces, lengths, step types, bool bytes) and returns a
  :class:`ScatteredBatch`, which :meth:`ScatteredBatch.materialized` turns
  into an ``EpisodeBatch`` (one copy of each scattered tensor) for any
  other use.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

import numpy as np

from rlfleet.core._arrays import map_nested
from rlfleet.core._validation import accepted_shapes, check_infos
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import WireFormatError
from rlfleet.v1 import tensor_pb2
from rlfleet.wire._protowire import LEN, ByteSource, duplicate_error, iter_fields, wire_type_error
from rlfleet.wire.tensors import (
    bad_bool,
    read_tensor_map,
    tensor_fields,
    tensor_layout,
)

#: A decoded tensor of a scattered batch: a view of one chunk, or its pieces.
Tensor: TypeAlias = "np.ndarray | Scattered"


class Spliced:
    """Consecutive byte pieces read as one sequence (indexing and slicing only).

    What the protobuf readers of rlfleet.wire do to their buffer: read a
    byte, or a short slice (a key, a packed shape), which is joined when it
    runs across pieces. Tensor data is never sliced here (:meth:`pieces`).

    Args:
        pieces: The byte pieces, in order.
    """

    def __init__(self, pieces: Sequence[bytes | memoryview]) -> None:
        self._pieces = tuple(memoryview(piece).cast("B") for piece in pieces)
        self._starts: list[int] = []
        size = 0
        for piece in self._pieces:
            self._starts.append(size)
            size += len(piece)
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self._size)
            if step != 1:  # the readers never step; joined whole, as bytes would
                return b"".join(self._pieces)[key]
            return b"".join(self.pieces(start, max(stop - start, 0)))
        if not 0 <= key < self._size:
            # The readers check offsets against their message's end first.
            raise WireFormatError(f"byte {key} read past the end of a {self._size}-byte message")
        i = bisect.bisect_right(self._starts, key) - 1
        return self._pieces[i][key - self._starts[i]]

    def pieces(self, offset: int, nbytes: int) -> list[memoryview]:
        """The views of bytes ``offset .. offset + nbytes`` (no copy), in order."""
        out: list[memoryview] = []
        end = offset + nbytes
        i = max(bisect.bisect_right(self._starts, offset) - 1, 0)
        while offset < end and i < len(self._pieces):
            start = self._starts[i]
            piece = self._pieces[i]
            take = piece[offset - start : min(end - start, len(piece))]
            if len(take):
                out.append(take)
                offset += len(take)
            i += 1
        return out


@dataclasses.dataclass(frozen=True)
class Scattered:
    """A tensor whose bytes run across several chunks, left where they are.

    Attributes:
        dtype: Its (little-endian) dtype.
        shape: Its shape (at least one dimension).
        pieces: Its data, C order, as consecutive byte views of the chunks.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    pieces: tuple[memoryview, ...]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (one index of axis 0)."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def head(self, rows: int) -> Scattered:
        """Its first ``rows`` rows (views of the same pieces)."""
        if rows >= self.shape[0]:
            return self
        left = rows * self.row_bytes
        kept: list[memoryview] = []
        for piece in self.pieces:
            if left <= 0:
                break
            kept.append(piece[:left])
            left -= len(kept[-1])
        return Scattered(self.dtype, (rows, *self.shape[1:]), tuple(kept))

    def copy_into(self, out: np.ndarray, first_row: int) -> None:
        """Writes its rows to ``out[first_row:]``, piece by piece: the one copy.

        ``out`` is C-contiguous, of this dtype and trailing shape.
        """
        flat = out.reshape(-1).view(np.uint8)
        pos = first_row * self.row_bytes
        for piece in self.pieces:
            flat[pos : pos + len(piece)] = np.frombuffer(piece, np.uint8)
            pos += len(piece)

    def joined(self) -> np.ndarray:
        """A new array holding it (one copy)."""
        out = np.empty(self.shape, self.dtype)
        self.copy_into(out, 0)
        return out

    def stand_in(self) -> np.ndarray:
        """A zero-stride array of its shape and dtype, for checks of shapes only."""
        return np.broadcast_to(np.zeros((), self.dtype), self.shape)


def _scattered_tensor(buf: ByteSource, pos: int, end: int, where: str) -> Tensor:
    """Reads a Tensor of a :class:`Spliced` buffer: a view if in one piece, else Scattered."""
    spliced = cast(Spliced, buf)
    offset, nbytes, dtype_code, shape, codec = tensor_fields(buf, pos, end, where)
    dtype, _ = tensor_layout(nbytes, dtype_code, shape, codec, where)
    pieces = spliced.pieces(offset, nbytes)
    if dtype_code == tensor_pb2.DTYPE_BOOL:
        first = 0
        for piece in pieces:
            error = bad_bool(np.frombuffer(piece, np.uint8), where, first)
            if error is not None:
                raise error
            first += len(piece)
    if len(pieces) <= 1 or not shape:
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return np.ndarray(shape, dtype, buffer=data)
    return Scattered(dtype, tuple(shape), tuple(pieces))


def _joined(value: Any) -> Any:
    return value.joined() if isinstance(value, Scattered) else value


def _stand_in(value: Any) -> Any:
    return value.stand_in() if isinstance(value, Scattered) else value


#: EpisodeBatch's fields on the wire (batch.proto), and which are maps.
_FIELDS = {
    2: ("episode_infos", True),
    3: ("observations", False),
    4: ("last_observations", False),
    5: ("actions", False),
    6: ("rewards", False),
    7: ("env_infos", True),
    8: ("agent_infos", True),
    9: ("step_types", False),
    10: ("lengths", False),
}
_STEP_TYPE_RANGE = (int(min(StepType)), int(max(StepType)))


@dataclasses.dataclass(frozen=True)
class ScatteredBatch:
    """An EpisodeBatch whose tensors may be :class:`Scattered`, checked as one.

    The per-episode ``lengths`` and ``episode_infos`` are always arrays
    (joined if they ran across chunks: a few bytes an episode), so that a
    result's episodes can be counted, ordered and renumbered without
    touching its steps. Attributes are those of ``EpisodeBatch``.
    """

    env_spec: EnvSpec
    episode_infos: dict[str, Any]
    observations: Tensor
    last_observations: Tensor
    actions: Tensor
    rewards: Tensor
    env_infos: dict[str, Any]
    agent_infos: dict[str, Any]
    step_types: Tensor
    lengths: np.ndarray

    @property
    def n_episodes(self) -> int:
        """Number of episodes."""
        return len(self.lengths)

    @property
    def total_steps(self) -> int:
        """Number of steps."""
        return int(self.lengths.sum())

    def with_episode_infos(self, **columns: np.ndarray) -> ScatteredBatch:
        """This batch with episode_infos columns added or replaced (as EpisodeBatch's).

        Raises:
            InvalidBatchError: If a column does not hold one row per episode.
        """
        infos = {**self.episode_infos, **columns}
        check_infos("EpisodeBatch.episode_infos", infos, self.n_episodes, "number of episodes")
        return dataclasses.replace(self, episode_infos=infos)

    def materialized(self) -> EpisodeBatch:
        """The EpisodeBatch it stands for: each scattered tensor joined (one copy)."""
        return EpisodeBatch.prechecked(
            env_spec=self.env_spec,
            episode_infos=self.episode_infos,
            lengths=self.lengths,
            check_actions=False,
            **self.map_tensors(_joined),
        )

    def map_tensors(self, function: Callable[[Tensor], np.ndarray]) -> dict[str, Any]:
        """``function`` of every per-step tensor (and of every info leaf), by field name."""
        return {
            "observations": function(self.observations),
            "last_observations": function(self.last_observations),
            "actions": function(self.actions),
            "rewards": function(self.rewards),
            "env_infos": map_nested(function, self.env_infos),
            "agent_infos": map_nested(function, self.agent_infos),
            "step_types": function(self.step_types),
        }


def _skeleton(batch: ScatteredBatch) -> EpisodeBatch:
    """Runs the EpisodeBatch constructor's checks on ``batch``'s shapes and dtypes.

    Scattered tensors stand in as zero-stride arrays: the constructor reads
    values only of lengths and step types (checked here over the pieces)
    and, for spaces without fixed shapes, of row 0 (those tensors are joined
    by :func:`decode_scattered` first).
    """
    step_types = batch.step_types
    if isinstance(step_types, Scattered) and step_types.dtype.kind in "iu":
        low, high = _STEP_TYPE_RANGE
        for piece in step_types.pieces:
            values = np.frombuffer(piece, step_types.dtype)
            if len(values) and (int(values.min()) < low or int(values.max()) > high):
                step_types = step_types.joined()  # the constructor names the value
                break
    return EpisodeBatch(
        env_spec=batch.env_spec,
        episode_infos=batch.episode_infos,
        lengths=batch.lengths,
        **dataclasses.replace(batch, step_types=step_types).map_tensors(_stand_in),
    )


def decode_scattered(pieces: Sequence[memoryview], env_spec: EnvSpec) -> ScatteredBatch:
    """Decodes a serialized ``EpisodeBatch`` cut into ``pieces``, without joining them.

    Accepts and refuses exactly what :func:`~rlfleet.wire.decode_batch`
    (with ``env_spec`` given) and the ``EpisodeBatch`` constructor do.

    Raises:
        WireFormatError: If the bytes are malformed, a tensor is missing or
            inconsistent, or the arrays do not form a valid batch.
    """
    buf = cast(ByteSource, Spliced(pieces))
    message = "EpisodeBatch"
    spans: dict[int, tuple[int, int]] = {}
    for number, wire_type, value, next_pos in iter_fields(buf, 0, len(buf), message):
        if number not in _FIELDS and number != 1:
            continue  # unknown field (or the env_spec, which env_spec overrides)
        name = _FIELDS[number][0] if number in _FIELDS else "env_spec"
        if wire_type != LEN:
            raise wire_type_error(message, name, wire_type, "message")
        if number in spans:
            raise duplicate_error(message, name)
        spans[number] = (value, next_pos)
    values: dict[str, Any] = {}
    for number, (name, is_map) in _FIELDS.items():
        where = f"{message}.{name}"
        span = spans.get(number)
        if is_map:
            values[name] = read_tensor_map(buf, *span, where, _scattered_tensor) if span else {}
            continue
        if span is None:
            raise WireFormatError(f"{where}: missing; every {message} carries it")
        values[name] = _scattered_tensor(buf, *span, where)
    for name, dtype in (("step_types", np.dtype("u1")), ("lengths", np.dtype("<i8"))):
        if values[name].dtype != dtype:
            raise WireFormatError(
                f"{message}.{name}: expected a {dtype.name} tensor, got {values[name].dtype.name}"
            )
    values["lengths"] = _joined(values["lengths"])
    values["episode_infos"] = map_nested(_joined, values["episode_infos"])
    for name, space in (
        ("observations", env_spec.observation_space),
        ("last_observations", env_spec.observation_space),
        ("actions", env_spec.action_space),
    ):
        if accepted_shapes(space) is None:
            values[name] = _joined(values[name])
    batch = ScatteredBatch(env_spec=env_spec, **values)
    try:
        _skeleton(batch)
    except ValueError as error:
        raise WireFormatError(f"the decoded {message} is inconsistent: {error}") from error
    return batch


__all__ = ["Scattered", "ScatteredBatch", "Spliced", "decode_scattered"]
