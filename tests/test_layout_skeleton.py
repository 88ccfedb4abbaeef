"""A result layout's skeleton worked out in one compiled call (rlfleet/wire/_skeleton.c).

No processes. What holds: for any layout (arrays of any dtype and row
shape, a row per episode or per step, info maps nested or empty, a
fragment window's infos) and any numbers of episodes and steps, the
compiled skeleton is the Python builder's, field for field; counts whose
sizes leave int64 get the Python builder's skeleton (or its error); a
program that is not well formed is refused, never read past. The one
pass's verdicts with it are tests/test_result_layout.py's.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.wire import _layout_frames as layout_frames_module
from rlfleet.wire import _skeleton
from rlfleet.wire._layout_frames import _PLACED, _build_skeleton, _Tensor, _Tree
from rlfleet.wire._skeleton_program import skeleton_program
from rlfleet.wire._tensor_header import encode_key_field
from rlfleet.wire.results import EPISODE_INFO_KEYS, FRAGMENT_INFO_KEYS

Blocks = tuple[tuple[int, "_Tensor | _Tree"], ...]

DTYPES = [np.dtype(t) for t in ("<f4", "<f8", "<f2", "<i8", "<i4", "i1", "u1", "<u8", "?")]
ROW_SHAPES = st.lists(st.integers(0, 300), max_size=3).map(tuple)
KEYS = st.text("abcxyzé_", min_size=1, max_size=12)
# Counts around the varints' widths, and any counts at all.
COUNTS = st.one_of(
    st.integers(0, 300),
    st.sampled_from([127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28]),
    st.integers(0, 2**63 - 1),
)


def tensor(name: str, per_episode: bool) -> st.SearchStrategy[_Tensor]:
    return st.builds(
        _Tensor, st.just(name), st.sampled_from(DTYPES), ROW_SHAPES, st.just(per_episode)
    )


def tree(name: str, per_episode: bool, required: tuple[str, ...], depth: int) -> Any:
    """A TensorMap's entries: ``required`` int64 columns among random ones, maybe nested."""

    @st.composite
    def entries(draw: st.DrawFn) -> _Tree:
        keys = draw(st.lists(KEYS, max_size=4, unique=True))
        keys = list(required) + [key for key in keys if key not in required]
        keys = draw(st.permutations(keys))
        found: list[tuple[bytes, _Tensor | _Tree]] = []
        for key in keys:
            path = f"{name}[{key!r}]"
            if key in required:
                child: _Tensor | _Tree = _Tensor(path, np.dtype("<i8"), (), per_episode)
            elif depth and draw(st.booleans()):
                child = draw(tree(path, per_episode, (), depth - 1))  # maybe empty
            else:
                child = draw(tensor(path, draw(st.booleans()) if depth < 2 else per_episode))
            found.append((encode_key_field(key, path), child))
        return tuple(found)

    return entries()


@st.composite
def layouts(draw: st.DrawFn) -> Blocks:
    """Blocks as rlfleet.wire._layout_frames._learn makes them: batch.proto's fields in order."""
    window = draw(st.booleans())
    infos = EPISODE_INFO_KEYS + FRAGMENT_INFO_KEYS if window else EPISODE_INFO_KEYS
    required = draw(st.sampled_from([infos, infos[:2]]))  # the second: no placed columns
    blocks: list[tuple[int, _Tensor | _Tree]] = []
    for number, name, per_episode in layout_frames_module._FIELDS:
        if name == "episode_infos":
            blocks.append((number, draw(tree(name, True, required, 2))))
        elif name in ("env_infos", "agent_infos"):
            entries = draw(tree(name, False, (), 2))
            if entries:  # an empty map is not written
                blocks.append((number, entries))
        elif name in ("lengths", "step_types"):
            dtype = np.dtype("<i8") if name == "lengths" else np.dtype("u1")
            blocks.append((number, _Tensor(name, dtype, (), per_episode)))
        else:
            blocks.append((number, draw(tensor(name, per_episode))))
    return tuple(blocks)


def python_skeleton(blocks: Blocks, episodes: int, steps: int) -> Any:
    """The Python builder's skeleton's fields, or its error's type and text."""
    try:
        return vars(_build_skeleton(blocks, episodes, steps))
    except Exception as error:
        return (type(error), str(error))


def compiled_skeleton(blocks: Blocks, episodes: int, steps: int) -> Any:
    try:
        made = _build_skeleton(blocks, episodes, steps, None, skeleton_program(blocks, _PLACED))
    except Exception as error:
        return (type(error), str(error))
    assert type(made) is layout_frames_module._Skeleton
    return vars(made)


@settings(max_examples=300, deadline=None)
@given(layouts(), COUNTS, COUNTS)
def test_the_compiled_skeleton_is_the_python_builders(
    blocks: Blocks, episodes: int, steps: int
) -> None:
    assert compiled_skeleton(blocks, episodes, steps) == python_skeleton(blocks, episodes, steps)


@settings(max_examples=100, deadline=None)
@given(layouts(), st.integers(0, 200), st.lists(st.integers(0, 40_000), min_size=1, max_size=8))
def test_a_layouts_new_counts_take_the_compiled_skeleton_and_keep_it_as_their_frame(
    blocks: Blocks, episodes: int, steps: list[int]
) -> None:
    layout = layout_frames_module._Layout.__new__(layout_frames_module._Layout)
    layout.blocks = blocks
    layout._shape = layout_frames_module._shape_number(blocks)  # the process's kept skeletons'
    layout._block_parts, layout._rows = (
        {},
        tuple(layout_frames_module._rows_kind(item) for _, item in blocks),
    )
    for count in steps:
        expected = python_skeleton(blocks, episodes, count)
        if isinstance(expected, tuple):  # a layout without the placed columns
            continue
        skeleton = layout.skeleton(episodes, count)
        assert vars(skeleton) == expected
        assert layout.frame(episodes, count) is skeleton


def cartpole_like() -> Blocks:
    infos = tuple(
        (encode_key_field(key, key), _Tensor(f"episode_infos[{key!r}]", np.dtype("<i8"), (), True))
        for key in EPISODE_INFO_KEYS
    )
    return (
        (2, infos),
        (3, _Tensor("observations", np.dtype("<f4"), (4,), False)),
        (4, _Tensor("last_observations", np.dtype("<f4"), (4,), True)),
        (5, _Tensor("actions", np.dtype("<i8"), (), False)),
        (6, _Tensor("rewards", np.dtype("<f8"), (), False)),
        (9, _Tensor("step_types", np.dtype("u1"), (), False)),
        (10, _Tensor("lengths", np.dtype("<i8"), (), True)),
    )


@pytest.mark.parametrize(
    ("episodes", "steps"), [(2**62, 1), (1, 2**62), (2**63, 5), (5, 2**64), (-1, 5), (5, -1)]
)
def test_counts_whose_sizes_leave_int64_are_the_python_builders(episodes: int, steps: int) -> None:
    blocks = cartpole_like()
    program = skeleton_program(blocks, _PLACED)
    assert _skeleton.skeleton(*program, episodes, steps) is None
    assert compiled_skeleton(blocks, episodes, steps) == python_skeleton(blocks, episodes, steps)


def test_a_program_that_is_not_well_formed_is_refused() -> None:
    items, pieces, names, placed = skeleton_program(cartpole_like(), _PLACED)
    fields = list(struct.unpack(f"={len(items) // 8}q", items))
    assert _skeleton.skeleton(items, pieces, names, placed, 3, 300) is not None
    for field, value in ((0, 9), (1, 3), (2, -1), (4, -2)):  # kind, rows, multiplier, condition
        spoiled = list(fields)
        spoiled[field] = value
        with pytest.raises(ValueError, match="item 0 is not well formed"):
            _skeleton.skeleton(
                struct.pack(f"={len(spoiled)}q", *spoiled), pieces, names, placed, 3, 3
            )
    kinds = fields[::5]
    for kind, value in ((1, len(pieces)), (3, len(kinds) + 1), (3, 0), (4, len(names))):
        at = kinds.index(kind)  # its argument past the pieces, the items, the names
        spoiled = list(fields)
        spoiled[5 * at + 3] = value
        with pytest.raises(ValueError, match=f"item {at} is not well formed"):
            _skeleton.skeleton(
                struct.pack(f"={len(spoiled)}q", *spoiled), pieces, names, placed, 3, 3
            )
    with pytest.raises(ValueError, match="int64 items of five"):
        _skeleton.skeleton(items[:-8], pieces, names, placed, 3, 3)
    with pytest.raises(TypeError, match="pieces must be bytes"):
        _skeleton.skeleton(items, ("x", *pieces[1:]), names, placed, 3, 3)  # type: ignore[arg-type]
    bad_placed = struct.pack("=q", len(names))  # a placed array the layout lacks
    assert _skeleton.skeleton(items, pieces, names, bad_placed, 3, 3) is None
