"""A result layout's skeleton program: what the compiled skeleton builder evaluates.

A layout's bytes around its arrays change with the numbers of episodes and
steps only in their varints (an array's rows and data length, the lengths
of the fields around it). :func:`skeleton_program` turns a layout's blocks
(:mod:`rlfleet.wire._layout_frames`) once into the items a writer writes
(fixed bytes, a varint of a number of rows or data bytes, a varint of the
size of the items it spans, an array's data), and :func:`skeleton`
(rlfleet/wire/_skeleton.c) evaluates them at any pair of counts in one call.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING

from rlfleet._util.compiled import compiled
from rlfleet.wire._protowire import LEN, tag
from rlfleet.wire._tensor_header import (
    _ENTRY_MAP,
    _ENTRY_TENSOR,
    _MAP_ENTRIES,
    dtype_code,
    rows_header_parts,
)

with compiled("skeleton builder", "rlfleet/wire/_skeleton.c"):
    from rlfleet.wire._skeleton import skeleton

if TYPE_CHECKING:  # for annotations only: the layout module imports this one
    from rlfleet.wire._layout_frames import _Tensor, _Tree

#: ``skeleton`` is the compiled builder the programs are for; the layout's
#: skeletons are built with it from here.
__all__ = ["SkeletonProgram", "skeleton", "skeleton_program"]

#: A layout's skeleton program (rlfleet/wire/_skeleton.c's ``skeleton``):
#: its items (int64s, five an item), the bytes its BYTES items write, the
#: arrays' names by DATA items' index, and the indices of the placed arrays.
SkeletonProgram = tuple[bytes, tuple[bytes, ...], tuple[str, ...], bytes]
# Its items' kinds: a block's start (a run ends there), fixed bytes, a
# varint of rows times a number, a varint of the size of the items after it
# up to an item, an array's data.
_BREAK, _BYTES, _COUNT, _SPAN, _DATA = range(5)
# An item's rows: none, one per episode, one per step; and a condition of none.
_NO_ROWS, _EPISODE_ROWS, _STEP_ROWS, _ALWAYS = 0, 1, 2, -1


def skeleton_program(
    blocks: tuple[tuple[int, _Tensor | _Tree], ...], placed_names: tuple[str, ...]
) -> SkeletonProgram:
    """The items batch_parts writes for ``blocks`` (write_tensor, write_tensor_map),
    as ``_layout_frames._block_parts`` works them out, for the compiled call to
    evaluate at any numbers of episodes and steps: only varints change with them.

    Args:
        blocks: A layout's blocks (``_layout_frames._Layout.blocks``).
        placed_names: The arrays whose offsets follow the runs in a
            skeleton's ``places``, in order (``_layout_frames._PLACED``).
    """
    items: list[list[int]] = []
    pieces: list[bytes] = []
    names: list[str] = []

    def write(data: bytes, rows: int = _NO_ROWS, row_bytes: int = _ALWAYS) -> None:
        # With row_bytes: written only when the array has data (rows_header's tag).
        pieces.append(data)
        items.append([_BYTES, rows, 0, len(pieces) - 1, row_bytes])

    def span() -> list[int]:  # its end set once the spanned items are written
        item = [_SPAN, _NO_ROWS, 0, 0, _ALWAYS]
        items.append(item)
        return item

    def tensor(number: int, t: _Tensor) -> None:
        rows = _EPISODE_ROWS if t.per_episode else _STEP_ROWS
        lead, rest, data = rows_header_parts(dtype_code(t.dtype), t.row_shape)
        write(tag(number, LEN))
        whole = span()
        write(lead)
        packed = span()
        items.append([_COUNT, rows, 1, 0, _ALWAYS])
        write(rest)
        packed[3] = len(items)
        write(data, rows, t.row_bytes)
        items.append([_COUNT, rows, t.row_bytes, 0, t.row_bytes])
        names.append(t.name)
        items.append([_DATA, rows, t.row_bytes, len(names) - 1, _ALWAYS])
        whole[3] = len(items)

    def tree(number: int, entries: _Tree) -> None:
        write(tag(number, LEN))
        whole = span()
        for key_field, child in entries:
            write(tag(_MAP_ENTRIES, LEN))
            entry = span()
            write(key_field)
            if isinstance(child, tuple):  # a nested map's entries
                tree(_ENTRY_MAP, child)
            else:
                tensor(_ENTRY_TENSOR, child)
            entry[3] = len(items)
        whole[3] = len(items)

    for number, item in blocks:
        items.append([_BREAK, _NO_ROWS, 0, 0, _ALWAYS])
        if isinstance(item, tuple):  # a TensorMap's entries
            tree(number, item)
        else:
            tensor(number, item)
    index = {name: k for k, name in enumerate(names)}
    placed = [index.get(name, -1) for name in placed_names]  # -1: the Python builder's KeyError
    packed_items = struct.pack(f"={5 * len(items)}q", *itertools.chain.from_iterable(items))
    return packed_items, tuple(pieces), tuple(names), struct.pack(f"={len(placed)}q", *placed)
