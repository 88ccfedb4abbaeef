"""Values against a declared space, vectorised over rows.

A row is checked as ``Space.contains`` would (dtype of a Box, bounds,
whole numbers in discrete spaces, also inside flattened Dict and Tuple
elements) with a few numpy calls for the whole array, not a Python loop
per row: results of thousands of steps are checked on the coordinator's
hot path. Two deliberate differences from ``contains``:

* actions of a float Box need only be finite: Gaussian policies sample
  outside the box and the env clips (garage and SB3 store the sample, which
  is what the log-probability is of);
* NaN passes the bounds of float values: whether NaN observations are an
  error, a flag or let through is the worker's ``--nonfinite`` setting
  (docs/reliability.md). In a discrete space NaN is not a whole number.

Spaces without a fixed layout (Graph, Sequence) are not checked here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from rlfleet._util.flags import any_set
from rlfleet.core._identity_cache import IdentityCache


@dataclasses.dataclass(frozen=True)
class _Bounds:
    """Per-element bounds of a space's values, in the array layout the batch uses."""

    low: np.ndarray
    high: np.ndarray
    integral: np.ndarray  # bool: where values must be whole numbers
    dtype: np.dtype | None  # the dtype the array must have (None: any real dtype)

    @functools.cached_property
    def _scalar_low(self) -> np.ndarray | np.generic:
        # A bound equal everywhere is compared as one number: no broadcast
        # of a frame-sized bounds array against every row.
        return _uniform(self.low)

    @functools.cached_property
    def _scalar_high(self) -> np.ndarray | np.generic:
        return _uniform(self.high)

    def checks(
        self, dtype: np.dtype
    ) -> tuple[np.ndarray | np.generic | None, np.ndarray | np.generic | None]:
        """The (low, high) bounds an array of ``dtype`` can break; None: it cannot.

        An infinite bound holds every value, and so does one at or past
        the limits of an integer dtype: nothing in a uint8 array lies
        outside a Box of 0..255, so frames of such a Box cost no pass over
        their bytes. The answer is cached per dtype.
        """
        cache: dict[np.dtype, tuple[object, object]] = self.__dict__.setdefault("_checks", {})
        found = cache.get(dtype)
        if found is None:
            if dtype.kind in "iub":
                info = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
                low_needed = bool(np.any(self.low > info[0]))
                high_needed = bool(np.any(self.high < info[1]))
            else:
                low_needed = bool(np.isfinite(self.low).any())
                high_needed = bool(np.isfinite(self.high).any())
            found = (
                self._scalar_low if low_needed else None,
                self._scalar_high if high_needed else None,
            )
            cache[dtype] = found
        return found  # type: ignore[return-value]


def _uniform(bound: np.ndarray) -> np.ndarray | np.generic:
    """``bound`` as one number (of its own dtype) if every element is that number."""
    flat = np.asarray(bound).reshape(-1)
    if flat.size and bool(np.all(flat == flat[0])):
        return flat[0]
    return np.asarray(bound)


#: Each (space, flat, actions)'s bounds.
_BOUNDS: IdentityCache[_Bounds | None] = IdentityCache()


def _bounds(space: gym.Space, flat: bool, actions: bool) -> _Bounds | None:
    """The bounds of ``space``'s elements, own-shaped or flattened (None: unsupported).

    Actions of a float Box are only required to be finite: Gaussian policies
    sample outside the box and the env clips (garage and SB3 store the
    sample, which is what the log-probability is of).
    """
    return _BOUNDS.get(space, (flat, actions), lambda: _compute_bounds(space, flat, actions))


def _compute_bounds(space: gym.Space, flat: bool, actions: bool) -> _Bounds | None:
    if not flat:
        if isinstance(space, gym.spaces.Box):
            integer = np.issubdtype(space.dtype, np.integer)
            integral = np.full(space.shape, integer)
            low, high = space.low, space.high
            if actions and not integer:
                largest = np.finfo(space.dtype).max
                low, high = np.full(space.shape, -largest), np.full(space.shape, largest)
            return _Bounds(low, high, integral, np.dtype(space.dtype))
        if isinstance(space, gym.spaces.Discrete):
            low = np.asarray(space.start, dtype=np.float64)
            return _Bounds(low, low + space.n - 1, np.asarray(True), None)
        if isinstance(space, gym.spaces.MultiDiscrete):
            low = np.asarray(space.start, dtype=np.float64)
            return _Bounds(low, low + space.nvec - 1, np.full(space.shape, True), None)
        if isinstance(space, gym.spaces.MultiBinary):
            shape = space.shape
            return _Bounds(np.zeros(shape), np.ones(shape), np.full(shape, True), None)
        return None
    parts = _flat_parts(space, actions)
    if parts is None:
        return None
    low, high, integral = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return _Bounds(low, high, integral.astype(bool), None)


def _flat_parts(
    space: gym.Space, actions: bool
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """(low, high, integral) of each piece of ``gymnasium.spaces.flatten``'s layout."""
    if isinstance(space, gym.spaces.Dict):
        spaces: Sequence[gym.Space] = list(space.spaces.values())
    elif isinstance(space, gym.spaces.Tuple):
        spaces = space.spaces
    elif isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        size = int(gym.spaces.flatdim(space))  # one-hot
        return [(np.zeros(size), np.ones(size), np.ones(size, dtype=bool))]
    else:
        own = _bounds(space, False, actions)
        if own is None:
            return None
        integral = np.broadcast_to(own.integral, own.low.shape)
        return [(own.low.reshape(-1), own.high.reshape(-1), integral.reshape(-1))]
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for sub in spaces:
        sub_parts = _flat_parts(sub, actions)
        if sub_parts is None:
            return None
        parts += sub_parts
    return parts


@dataclasses.dataclass(frozen=True)
class SpaceProblem:
    """The first thing wrong with rows of values as elements of a space.

    Attributes:
        text: What is wrong, naming the array, the row, the value and the space.
        row: The first row at fault (None: the whole array, e.g. its dtype).
        value: The offending element's value (None with ``row``).
    """

    text: str
    row: int | None = None
    value: float | int | None = None


def space_problem(
    name: str, array: np.ndarray, space: gym.Space, *, actions: bool = False
) -> str | None:
    """What is wrong with the rows of ``array`` as elements of ``space``.

    Args:
        name: The array's name, for the message (``"observations"``).
        array: One row per step, in the space's own or flattened shape
            (checked before: :meth:`EpisodeBatch.__post_init__`).
        space: The declared space.
        actions: The rows are actions: a float Box's bounds do not apply.

    Returns:
        The first problem, naming the row and value, or None.
    """
    problem = find_space_problem(name, array, space, actions=actions)
    return None if problem is None else problem.text


def find_space_problem(
    name: str, array: np.ndarray, space: gym.Space, *, actions: bool = False
) -> SpaceProblem | None:
    """:func:`space_problem`, with the row and value at fault apart from the text."""
    if array.shape[0] == 0:
        return None
    plan = _plan(space, array.dtype, array.shape[1:], actions)
    if plan is None:
        return None  # a space with no fixed layout: its shape was checked at decode
    if isinstance(plan, str):
        return SpaceProblem(f"{name} are {array.dtype}{plan}")
    bounds, low, high, integral = plan
    # Two comparisons and two any(): ~40 us for 4608 CartPole steps, where
    # per-column min/max reductions took ~500 us. Bounds the dtype cannot
    # break are skipped (infinite ones; 0..255 for uint8). A bound equal
    # everywhere is one number; integers against it take one min() or max()
    # pass, no boolean temporary. NaN passes (both comparisons are false):
    # whether NaN observations are an error, a flag or let through is the
    # worker's --nonfinite setting (docs/reliability.md). In a discrete space
    # it fails the integral check.
    below = low is not None and _any_below(array, low)
    above = high is not None and _any_above(array, high)
    fractional = integral and not bool(np.all(~bounds.integral | (array == np.floor(array))))
    if not (below or above or fractional):
        return None
    inside = ~((array < bounds.low) | (array > bounds.high))
    if integral:
        inside &= ~bounds.integral | (array == np.floor(array))
    if inside.all():
        return None
    bad = np.argwhere(~inside)[0]
    step = int(bad[0])
    value = array[tuple(bad)].item()
    return SpaceProblem(f"{name}[{step}] holds {value!r}, outside the space {space}", step, value)


#: A bound to compare with, or None where the dtype cannot break it.
_Bound = np.ndarray | np.generic | None


def _plan(
    space: gym.Space, dtype: np.dtype, row_shape: tuple[int, ...], actions: bool
) -> tuple[_Bounds, _Bound, _Bound, bool] | str | None:
    """How rows of ``dtype`` and ``row_shape`` are checked against ``space``.

    Returns:
        None if they are not checked here (no fixed layout); the end of a
        problem's text if the dtype alone breaks the space (``"<name> are
        <dtype>"`` goes before it); else the bounds, the (low, high) bounds
        the dtype can break and whether whole numbers must be checked.
    """
    flat = space.shape is None or row_shape != tuple(space.shape)
    bounds = _bounds(space, flat, actions)
    if bounds is None:
        return None
    if bounds.dtype is not None and dtype != bounds.dtype:
        return f", the space {space} holds {bounds.dtype}"
    if dtype.kind not in "iubf":
        return ", not numbers"
    if bounds.dtype is None and not flat and dtype.kind == "f":
        return f"; the discrete space {space} holds integers"
    integral = dtype.kind == "f" and bool(bounds.integral.any())
    low, high = bounds.checks(dtype)
    return bounds, low, high, integral


def space_screen(
    space: gym.Space, dtype: np.dtype, row_shape: tuple[int, ...], *, actions: bool = False
) -> Callable[[np.ndarray], bool] | None:
    """A quick pass over rows of one layout: True when every row fits ``space``.

    Worked out once per layout (a worker's results repeat theirs), so a
    result's check is the comparisons alone. False means "look closer":
    :func:`space_problem` then names the problem, or finds none.

    Args:
        space: The declared space.
        dtype: The rows' dtype.
        row_shape: One row's shape (the space's own or its flattened one).
        actions: The rows are actions (as :func:`space_problem`'s).

    Returns:
        The pass, or None where nothing in such rows can break the space
        (uint8 frames of a 0..255 Box; no fixed layout).
    """
    plan = _plan(space, dtype, row_shape, actions)
    if plan is None:
        return None
    if isinstance(plan, str):
        return _never
    _, low, high, integral = plan
    if integral:  # whole numbers in a float layout: the full check, every time
        return functools.partial(_fits, space=space, actions=actions)
    if low is None and high is None:
        return None
    return _bounds_screen(low, high, row_shape)


def screen_bounds(
    space: gym.Space, dtype: np.dtype, row_shape: tuple[int, ...], *, actions: bool = False
) -> tuple[_Bound, _Bound] | None:
    """The (low, high) bounds :func:`space_screen` compares rows with, when that is all it does.

    For a compiled screen of the same verdicts (rlfleet/wire/_result_check.c):
    each bound is one number (``np.generic``), an array of ``row_shape``
    (one bound per element of a row), or None where the dtype cannot break
    it. None where the screen does more or less than compare (the dtype alone
    breaks the space, whole numbers are checked, no fixed layout) or has no
    bound to compare with.
    """
    plan = _plan(space, dtype, row_shape, actions)
    if plan is None or isinstance(plan, str):
        return None
    _, low, high, integral = plan
    if integral or (low is None and high is None):
        return None
    return low, high


def _bounds_screen(
    low: _Bound, high: _Bound, row_shape: tuple[int, ...]
) -> Callable[[np.ndarray], bool]:
    """The screen of :func:`_within` for these bounds, with what depends on
    the bounds alone worked out now: a result's rows are then one or two
    numpy comparisons and counts, without a Python call per bound.

    Per-element bounds of short rows (CartPole's 4) are repeated once (for
    every screen of these bounds) to :data:`_SCREEN_ELEMENTS` elements, so a
    contiguous array that size or smaller, a native worker's 8,192 CartPole
    steps among them, is compared as one long row (as :func:`_any_outside`
    does up to :data:`_WIDE_MIN_ELEMENTS`);
    an integer array against a bound equal everywhere takes one ``min`` or
    ``max`` pass, any other one comparison. Anything else takes
    :func:`_within`.
    """
    general = functools.partial(_within, low=low, high=high)
    bounds = [bound for bound in (low, high) if bound is not None]
    if all(isinstance(bound, np.generic) for bound in bounds):
        # One number each (a Discrete's actions, a Box equal everywhere).
        has_low = isinstance(low, np.generic)
        has_high = isinstance(high, np.generic)

        def scalars(array: np.ndarray) -> bool:
            if not array.size:
                return True
            if array.dtype.kind in "iu":  # one min() or max() pass, no boolean temporary
                if has_low and np.minimum.reduce(array, axis=None) < low:
                    return False
                return not (has_high and np.maximum.reduce(array, axis=None) > high)
            if has_low and np.count_nonzero(array < low):
                return False
            return not (has_high and np.count_nonzero(array > high))

        return scalars
    if not all(isinstance(bound, np.ndarray) and bound.shape == row_shape for bound in bounds):
        return general
    row = max(int(np.prod(row_shape)), 1)
    repeats = -(-_SCREEN_ELEMENTS // row)
    low_wide = None if low is None else _tiled(low, repeats)
    high_wide = None if high is None else _tiled(high, repeats)

    def elements(array: np.ndarray) -> bool:
        size = array.size
        if size > _SCREEN_ELEMENTS or not array.flags.c_contiguous or array.shape[1:] != row_shape:
            return general(array)
        flat = array.reshape(-1)
        if low_wide is not None and np.count_nonzero(flat < low_wide[:size]):
            return False
        return not (high_wide is not None and np.count_nonzero(flat > high_wide[:size]))

    return elements


def _never(array: np.ndarray) -> bool:
    return False


def _fits(array: np.ndarray, *, space: gym.Space, actions: bool) -> bool:
    return find_space_problem("rows", array, space, actions=actions) is None


def _within(array: np.ndarray, *, low: _Bound, high: _Bound) -> bool:
    if not array.shape[0]:
        return True
    if low is not None and _any_below(array, low):
        return False
    return not (high is not None and _any_above(array, high))


def _any_below(array: np.ndarray, low: np.ndarray | np.generic) -> bool:
    if isinstance(low, np.generic):
        if array.dtype.kind in "iu":  # the ufunc's reduce: ndarray.min's wrapper costs as much
            return bool(np.minimum.reduce(array, axis=None) < low)
        return any_set(array < low)
    return _any_outside(array, low, np.less)


def _any_above(array: np.ndarray, high: np.ndarray | np.generic) -> bool:
    if isinstance(high, np.generic):
        if array.dtype.kind in "iu":
            return bool(np.maximum.reduce(array, axis=None) > high)
        return any_set(array > high)
    return _any_outside(array, high, np.greater)


#: Elements per compared row when short rows are compared as wide ones.
_WIDE_ROW = 256
#: Arrays of at most this many elements are compared whole against the
#: bound repeated to this length; larger ones ``k`` rows at a time.
_WIDE_MIN_ELEMENTS = 8192
#: Arrays of at most this many elements are compared whole by a screen
#: (:func:`space_screen`), against its bounds repeated to this length, once
#: per bound: with 4-element rows, a worker's results of up to 16,384 steps.
#: Rows of 8,192 CartPole steps in 256-element rows (:func:`_any_outside`)
#: cost 1.5-2x as much (numpy's loop restarted per row).
_SCREEN_ELEMENTS = 1 << 16
#: Each (bound, repeats)'s bound repeated: bounds live as long as their space.
_TILED: IdentityCache[np.ndarray] = IdentityCache()


def _tiled(bound: np.ndarray | np.generic, repeats: int) -> np.ndarray:
    """``bound`` flattened and repeated ``repeats`` times, made once per bound."""
    return _TILED.get(bound, repeats, lambda: np.tile(np.asarray(bound).reshape(-1), repeats))


def _any_outside(array: np.ndarray, bound: np.ndarray, compare: np.ufunc) -> bool:
    """``any(compare(array, bound))`` for per-element bounds of each row.

    Rows of a few elements (CartPole's 4) broadcast against their bound
    run numpy's inner loop a few elements at a time, about 20x slower than
    one long loop (400 CartPole rows: 10.9 against 0.5 us). So the rows of
    a contiguous array are compared as one long row against the bound
    repeated as often: the whole array, if it is small, against a slice of
    the bound repeated to :data:`_WIDE_MIN_ELEMENTS` elements (worked out
    once per bound); else ``k`` rows at a time against it repeated ``k``
    times. The same comparisons, in another shape.
    """
    row = bound.size
    rows = array.shape[0] if array.ndim else 0
    if not row or bound.shape != array.shape[1:] or not array.flags.c_contiguous:
        return any_set(compare(array, bound))
    if array.size <= _WIDE_MIN_ELEMENTS:
        whole = _tiled(bound, -(-_WIDE_MIN_ELEMENTS // row))
        return any_set(compare(array.reshape(-1), whole[: array.size]))
    repeats = _WIDE_ROW // row
    if repeats < 2:
        return any_set(compare(array, bound))
    tiled = _tiled(bound, repeats)
    wide = rows // repeats * repeats
    head = array[:wide].reshape(wide // repeats, repeats * row)
    if any_set(compare(head, tiled)):
        return True
    return any_set(compare(array[wide:], bound))


__all__ = [
    "SpaceProblem",
    "find_space_problem",
    "screen_bounds",
    "space_problem",
    "space_screen",
]
