"""The one pass's compiled value screens (rlfleet/wire/_result_check.c ``values_pass``)
give numpy's verdicts, on arrays read where they lie in a result's bytes."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlfleet.core.space_checks import space_screen
from rlfleet.wire import _result_check
from rlfleet.wire._layout_frames import _bounds_spec, _spec, _sum_spec, _Tensor

INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float32, np.float64]


def placed(
    array: np.ndarray, offset: int, cut: int | None
) -> tuple[bytes | tuple[bytes, ...], int]:
    """``array``'s bytes at ``offset`` of a result's bytes (unaligned as a writer
    leaves them), whole or cut in two chunks at ``cut``."""
    data = bytes(range(offset % 7, offset % 7 + offset)) + array.tobytes() + b"\x05" * 3
    if cut is None:
        return data, offset
    cut %= len(data) + 1
    return (data[:cut], data[cut:]), offset


def compiled(
    spec: bytes, array: np.ndarray, offset: int, cut: int | None, per_episode: bool = False
) -> bool:
    """The compiled screen's verdict on ``array`` placed in a result's bytes."""
    data, at = placed(array, offset, cut)
    rows = len(array)
    episodes, steps = (rows, 10**6) if per_episode else (10**6, rows)
    return _result_check.values_pass(data, (("x", spec),), {"x": at}, episodes, steps)


def numpy_within(array: np.ndarray, low: object, high: object) -> bool:
    """The reference: numpy's comparisons, as the numpy screen makes them."""
    below = low is not None and bool(np.any(array < low))
    above = high is not None and bool(np.any(array > high))
    return not (below or above)


def values_near(dtype: np.dtype, bounds: list[float | int]) -> list[object]:
    """Values of ``dtype`` at, around and far from ``bounds``: its extremes, 0,
    NaN and infinities for floats."""
    out: list[float | int] = [0, 1, -1]
    if dtype.kind == "f":
        info = np.finfo(dtype)
        out += [np.nan, np.inf, -np.inf, float(info.max), float(info.min), float(info.tiny)]
        for b in bounds:
            if math.isfinite(b):
                value = dtype.type(b)
                out.append(float(value))
                for toward in (np.inf, -np.inf):
                    out.append(float(np.nextafter(value, dtype.type(toward))))
    else:
        limits = np.iinfo(dtype)
        out += [int(limits.min), int(limits.max), int(limits.min) + 1, int(limits.max) - 1]
        for b in bounds:
            if math.isfinite(b):
                for near in (math.floor(b) - 1, math.floor(b), math.ceil(b), math.ceil(b) + 1):
                    if limits.min <= near <= limits.max:
                        out.append(near)
    kept = []
    for value in out:
        if dtype.kind != "f" and not np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max:
            continue
        kept.append(np.array(value).astype(dtype) if dtype.kind == "f" else dtype.type(value))
    return kept


@st.composite
def boxes(draw: st.DrawFn) -> tuple[gym.Space, np.dtype, tuple[int, ...], bool]:
    """A Box (bounds anywhere in its dtype, infinite ones for floats, equal
    everywhere or per element), Discrete or MultiDiscrete, or a flattened Box
    and the dtype and row shape of the rows checked against it."""
    kind = draw(st.sampled_from(["box", "box", "discrete", "multidiscrete", "flat"]))
    if kind == "discrete":
        start = draw(st.sampled_from([0, -3, 5, -(2**62), 2**53 + 1, 2**63 - 10]))
        n = draw(st.sampled_from([1, 2, 7, 2**40, 2**62]))
        if start + n > 2**63 - 1:
            n = 2**63 - 1 - start
        space: gym.Space = gym.spaces.Discrete(n, start=start)
        dtype = np.dtype(draw(st.sampled_from(INTEGERS)))
        return space, dtype, (), draw(st.booleans())
    if kind == "multidiscrete":
        nvec = draw(st.lists(st.integers(1, 300), min_size=1, max_size=5))
        dtype = np.dtype(draw(st.sampled_from(INTEGERS)))
        space = gym.spaces.MultiDiscrete(nvec)
        return space, dtype, (len(nvec),), draw(st.booleans())
    dtype = np.dtype(draw(st.sampled_from(INTEGERS + FLOATS)))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    size = math.prod(shape)
    if dtype.kind == "f":
        finite = st.floats(-1e6, 1e6, width=dtype.itemsize * 8)
        element = st.one_of(finite, st.sampled_from([-np.inf, np.inf]))
    else:
        info = np.iinfo(dtype)
        element = st.one_of(st.integers(int(info.min), int(info.max)), st.sampled_from([0, 1]))
    if draw(st.booleans()):
        ends = sorted([draw(element), draw(element)])
        low, high = np.full(shape, ends[0], dtype), np.full(shape, ends[1], dtype)
    else:
        pairs = [sorted([draw(element), draw(element)]) for _ in range(size)]
        low = np.array([p[0] for p in pairs], dtype).reshape(shape)
        high = np.array([p[1] for p in pairs], dtype).reshape(shape)
    if dtype.kind == "f":
        low[np.isposinf(low)] = 0  # a low bound of +inf: no value fits (gymnasium refuses it)
        high[np.isneginf(high)] = 0
        high = np.maximum(low, high)
    space = gym.spaces.Box(low, high, shape, dtype)
    if kind == "flat":  # flattened rows: float64 bounds, any real dtype of rows
        rows_dtype = np.dtype(draw(st.sampled_from(INTEGERS + FLOATS)))
        return space, rows_dtype, (size,) if len(shape) > 1 else (size, 1), False
    return space, dtype, shape, draw(st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=boxes(),
    data=st.data(),
    rows=st.integers(1, 70),
    offset=st.integers(1, 40),
    cut=st.none() | st.integers(0, 10**6),
)
def test_a_compiled_screen_gives_the_numpy_screens_verdict(
    case: tuple[gym.Space, np.dtype, tuple[int, ...], bool],
    data: st.DataObject,
    rows: int,
    offset: int,
    cut: int | None,
) -> None:
    """Random spaces, dtypes, row shapes and values (each dtype's extremes,
    values at and beside the bounds, NaN, infinities), at unaligned offsets of
    a result's bytes, whole or in two chunks: the compiled screen's verdict is
    the numpy screen's (and numpy's plain comparisons', kept here)."""
    space, dtype, row_shape, actions = case
    tensor = _Tensor("x", dtype, row_shape, False)
    spec = _bounds_spec(tensor, space, actions)
    screen = space_screen(space, dtype, row_shape, actions=actions)
    event(f"compiled: {spec is not None}")
    if spec is None:
        return
    assert screen is not None
    if isinstance(space, gym.spaces.Box) and space.shape == row_shape:
        low, high = space.low, space.high
    elif isinstance(space, gym.spaces.Box):
        low, high = space.low.reshape(row_shape), space.high.reshape(row_shape)
    else:
        assert isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
        start = np.asarray(space.start, np.float64)
        n = space.n if isinstance(space, gym.spaces.Discrete) else space.nvec
        low, high = start, start + n - 1
    if actions and isinstance(space, gym.spaces.Box) and space.dtype.kind == "f":
        largest = float(np.finfo(space.dtype).max)  # float Box actions: finite only
        low, high = (
            np.full(row_shape, -largest, space.dtype),
            np.full(row_shape, largest, space.dtype),
        )
    nears = [float(b) for b in np.ravel([] if low is None else low)]
    nears += [float(b) for b in np.ravel([] if high is None else high)]
    pool = values_near(dtype, nears)
    inside = data.draw(st.booleans())
    size = rows * max(math.prod(row_shape), 1)
    picks = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=size, max_size=size))
    array = np.array([pool[i] for i in picks], dtype).reshape(rows, *row_shape)
    if inside and low is not None and high is not None and dtype.kind == "f":
        array = np.clip(array, low, high).astype(dtype)
    verdict = compiled(spec, array, offset, cut)
    assert verdict == screen(array)
    assert verdict == numpy_within(array, low, high)


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(FLOATS),
    values=st.lists(
        st.one_of(
            st.floats(-1e30, 1e30),
            st.sampled_from([np.nan, np.inf, -np.inf, 3.0e38, -3.0e38, 1.7e308, -1.7e308]),
        ),
        min_size=1,
        max_size=60,
    ),
    offset=st.integers(1, 40),
    cut=st.none() | st.integers(0, 10**6),
)
def test_compiled_rewards_are_finite_where_their_numpy_sum_is(
    dtype: type, values: list[float], offset: int, cut: int | None
) -> None:
    """A pass means numpy's float64 sum is finite; a fail, that a reward is not
    finite or (float64) is large enough for the general path's sum to decide."""
    with np.errstate(over="ignore"):
        rewards: np.ndarray = np.array(values, np.float64).astype(dtype)
        numpy_finite = math.isfinite(np.add.reduce(rewards, dtype=np.float64))
    spec = _sum_spec(_Tensor("x", np.dtype(dtype), (), False))
    assert spec is not None
    verdict = compiled(spec, rewards, offset, cut)
    if verdict:
        assert numpy_finite
    small = bool(np.all(np.abs(rewards.astype(np.float64)) <= 1e300 / len(rewards)))
    if dtype is np.float32 or small:
        assert verdict == numpy_finite


@settings(max_examples=100, deadline=None)
@given(
    raw=st.binary(min_size=1, max_size=80),
    offset=st.integers(1, 40),
    cut=st.none() | st.integers(0, 10**6),
)
def test_compiled_bools_pass_only_bytes_of_0_and_1(
    raw: bytes, offset: int, cut: int | None
) -> None:
    ones = bytes(b & 1 for b in raw)
    spec = _spec(b"o", "?", "?", _Tensor("x", np.dtype("?"), (), False))
    for values in (raw, ones):
        array = np.frombuffer(values, np.uint8)
        assert compiled(spec, array, offset, cut) == bool(np.all(array <= 1))


def test_a_compiled_screen_reads_per_episode_rows_and_refuses_an_array_past_the_end() -> None:
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    spec = _bounds_spec(_Tensor("x", np.dtype(np.float32), (2,), True), space, False)
    assert spec is not None
    rows = np.zeros((3, 2), np.float32)
    assert compiled(spec, rows, 3, None, per_episode=True)
    data, at = placed(rows, 3, None)
    # One more episode than the bytes hold: not a pass (the general path names it).
    assert not _result_check.values_pass(data, (("x", spec),), {"x": at}, 400, 3)
    assert not _result_check.values_pass(data, (("x", spec),), {"x": len(data)}, 3, 3)
    with pytest.raises(ValueError, match="does not hold a screen"):
        _result_check.values_pass(data, (("x", spec[:-1]),), {"x": at}, 3, 3)
