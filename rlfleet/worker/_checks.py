"""Cheap, vectorised checks of what policies and envs hand a worker.

Actions are checked once per vector step with a handful of calls (never a
loop over rows): shape, dtype kind, Discrete / MultiDiscrete / MultiBinary
range, and NaN. Box bounds are deliberately not enforced: garage does not
clip either, and gymnasium's Box envs clip (or reject) out-of-range actions
themselves. Observations are checked per finished episode, in one call (a native
backend's per vector step, in a few whole-batch calls: :class:`SuspectRows`):
for NaN and inf (the worker's ``--nonfinite`` setting) and against the env's
declared space, so that an honest env that leaves its space is an
``EnvError`` from the worker, the same in ``LocalSampler`` as in a fleet,
rather than a result the coordinator refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlfleet._util.int_ranges import UNSIGNED, all_within
from rlfleet.core.space_checks import _bounds, find_space_problem
from rlfleet.errors import PolicyError
from rlfleet.worker._numeric import all_finite

#: Finds the first invalid row of an action batch (None if all are valid).
RangeCheck = Callable[[np.ndarray], int | None]


class ActionChecker:
    """Validates action batches against an action space and splits them per env.

    The split rows are what gymnasium's own vector envs pass to ``step``:
    numpy scalars for Discrete spaces, row views otherwise.

    Args:
        space: The env's action space.
        enabled: If False, only count and split (for trusted, hot policies).
    """

    def __init__(self, space: gym.Space, *, enabled: bool = True) -> None:
        self.space = space
        self.enabled = enabled
        self._row_shape = tuple(space.shape) if space.shape is not None else None
        self._kinds, self._problem, self._range_check = _rules(space)
        # (dtype, shape) of the last batch that passed the shape and dtype
        # checks: a policy returns the same ones step after step, and a batch
        # that matches them needs only its range check.
        self._passed: tuple[np.dtype, tuple[int, ...]] | None = None

    def __call__(
        self, actions: Any, slots: Sequence[int], owner: str, method: str = "get_actions"
    ) -> np.ndarray:
        """Checks a batch and returns one action per env.

        Args:
            actions: What the policy returned, one row per entry of ``slots``.
            slots: The env index of each row (named in errors).
            owner: The policy's class name (named in errors).
            method: The policy method that returned ``actions`` (named in errors).

        Returns:
            The actions as an array; iterating it gives the per-env actions,
            in row order.

        Raises:
            PolicyError: Naming the env index and the offending action.
        """
        passed = self._passed
        if (
            passed is not None
            and type(actions) is np.ndarray
            and actions.dtype is passed[0]
            and actions.shape == passed[1]
            and len(slots) == passed[1][0]
        ):
            check = self._range_check
            if check is None or check(actions) is None:
                return actions
        if not isinstance(actions, np.ndarray):
            if self.enabled:
                raise PolicyError(
                    f"{owner}.{method} returned actions of type {type(actions).__name__}; "
                    "expected a numpy array with one row per observation"
                )
            actions = np.asarray(actions)
        n = len(slots)
        if actions.ndim == 0 or len(actions) != n:
            raise PolicyError(
                f"{owner}.{method} returned actions of shape {actions.shape} for {n} envs "
                f"(env indices {list(slots)}); expected one row per observation"
            )
        if not self.enabled:
            return actions
        if self._row_shape is not None and actions.shape[1:] != self._row_shape:
            raise PolicyError(
                f"{owner}.{method} returned actions of shape {actions.shape} for {n} "
                f"envs (env indices {list(slots)}); expected {(n, *self._row_shape)} "
                f"for action space {self.space}"
            )
        if self._kinds and actions.dtype.kind not in self._kinds:
            raise PolicyError(
                f"{owner}.{method} returned actions of dtype {actions.dtype} for action "
                f"space {self.space}; expected a dtype of kind {sorted(self._kinds)}"
            )
        if self._range_check is not None:
            bad_row = self._range_check(actions)
            if bad_row is not None:
                action = np.asarray(actions[bad_row]).tolist()
                raise PolicyError(
                    f"{owner}.{method} returned an invalid action for env {slots[bad_row]}: "
                    f"{action!r} is {self._problem} action space {self.space}; check the "
                    "policy's parameters and that env's observations"
                )
        if type(actions) is np.ndarray and actions.ndim:
            self._passed = (actions.dtype, actions.shape)
        # Iterating the array gives the same per-env values as a list would.
        return actions


#: Observation layouts whose scratch arrays a :class:`SuspectRows` keeps.
_MAX_LAYOUTS = 8


def _first(mask: np.ndarray) -> int | None:
    """Row index of the first True in a per-element mask, or None."""
    rows = mask.reshape(len(mask), -1).any(axis=1)
    return int(np.argmax(rows)) if rows.any() else None


def _rules(space: gym.Space) -> tuple[str, str, RangeCheck | None]:
    """(allowed dtype kinds, what the range check finds, range check) of a space."""
    if isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n)

        def discrete(actions: np.ndarray) -> int | None:
            inside = all_within(actions, high - 1) if low == 0 else None
            if inside is not None:
                if inside:
                    return None
            else:
                # min/max of a short Python list beat two numpy reductions.
                values = actions.tolist()
                if not values or (min(values) >= low and max(values) < high):
                    return None
            return _first((actions < low) | (actions >= high))

        return "iu", "outside", discrete
    if isinstance(space, gym.spaces.MultiDiscrete):
        return "iu", "outside", _multi_discrete_check(space)
    if isinstance(space, gym.spaces.MultiBinary):

        def multi_binary(actions: np.ndarray) -> int | None:
            if all_within(actions, 1):
                return None
            return _first((actions != 0) & (actions != 1))

        return "biu", "outside", multi_binary
    if isinstance(space, gym.spaces.Box):
        if space.dtype.kind != "f":
            return "iu", "", None

        def box_nan(actions: np.ndarray) -> int | None:
            # One reduction in the common case: NaN propagates through a sum.
            if actions.dtype.kind == "f" and np.isnan(actions.sum()):
                return _first(np.isnan(actions))
            return None

        return "fiu", "NaN for", box_nan
    return "", "", None


def _multi_discrete_check(space: gym.spaces.MultiDiscrete) -> RangeCheck:
    """The range check of a MultiDiscrete space: two or three numpy calls on a valid batch.

    ``action - start``, seen unsigned, is below ``nvec`` exactly when the
    action is in range (a wrapped subtraction stays exact for an interval
    shorter than the dtype's range); batches of another dtype than the
    space's take the two comparisons.
    """
    # start + nvec can overflow the space's dtype (gymnasium's contains says so too).
    start, high = space.start, space.start + (space.nvec - 1)
    dtype = np.dtype(space.dtype)
    unsigned = UNSIGNED.get(dtype)
    nvec = space.nvec.astype(unsigned if unsigned is not None else dtype)
    from_zero = not np.any(start)

    def multi_discrete(actions: np.ndarray) -> int | None:
        if unsigned is not None and actions.dtype == dtype:
            offsets = actions if from_zero else np.subtract(actions, start)
            inside = np.less(offsets.view(unsigned), nvec)
            if np.count_nonzero(inside) == inside.size:
                return None
        return _first((actions < start) | (actions > high))

    return multi_discrete


def nonfinite_rows(rows: np.ndarray) -> np.ndarray:
    """Per row, whether any element is NaN or infinite.

    Args:
        rows: Array (T, *O).

    Returns:
        Bool array (T,); all False for integer dtypes.
    """
    if rows.dtype.kind not in "fc":
        return np.zeros(len(rows), dtype=bool)
    return ~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)


def outside_space_error(
    observations: np.ndarray, space: gym.Space, env_name: str, where: str, first_step: int
) -> tuple[str, int] | None:
    """The EnvError message of a segment's observations outside the env's space.

    Args:
        observations: The segment's observations, its last one included.
        space: The env's declared observation space.
        env_name: The env, as messages name it (its id).
        where: The episode, as messages name it.
        first_step: The episode step of the segment's first observation.

    Returns:
        None if every observation lies in the space; else the message and
        the episode step at fault.
    """
    problem = find_space_problem("observations", observations, space)
    if problem is None:
        return None
    if problem.row is None:
        return f"env {env_name} in {where}: {problem.text}; the episode was dropped", first_step
    step = first_step + problem.row
    what = f"the observation of step {step}" if step else "the reset observation"
    return (
        f"env {env_name} left its observation space in {where}: {what} holds "
        f"{problem.value!r}, outside {space}; the episode was dropped. Fix the env, or "
        "declare an observation_space that holds what it returns",
        step,
    )


class SuspectRows:
    """A quick whole-batch check of observations: the exact check only where it may fail.

    For a native backend, whose episodes end a few at a time every vector
    step: checking each episode's observations when it ends would cost
    several numpy calls per episode; calling this costs three or four per
    vector step (one comparison per bound, preallocated), and finds the rows
    that may fail :func:`outside_space_error` (or hold NaN or inf) for the
    exact check to look at when their episode ends. The other backends
    check each segment when it ends with :meth:`all_pass`, and run the exact
    check only on a segment it does not pass.

    In ``"error"`` mode infinite bounds are replaced by the dtype's largest
    value, so that the bounds' comparisons find NaN and inf too (NaN fails
    every comparison); in the other modes a NaN makes its row suspect all
    the same, and the exact check lets it through. Symmetric bounds (``low
    == -high``, most Box spaces) take one comparison of the absolute values.

    Args:
        space: The observation space (the rows have its shape and dtype).
        nonfinite: Whether non-finite values are errors (``"error"`` mode).
    """

    def __init__(self, space: gym.Space, *, nonfinite: bool) -> None:
        self._space = space
        dtype = np.dtype(space.dtype) if space.dtype is not None else np.dtype(object)
        bounds = _bounds(space, False, False) if space.shape is not None else None
        floats = dtype.kind == "f"
        self._nonfinite = nonfinite and floats
        #: "exact": find_space_problem every step (whole numbers in a float
        #: array need more than comparisons); "none": no bounds to check.
        self._mode = "none"
        if bounds is not None and floats and bool(np.any(bounds.integral)):
            self._mode = "exact"
        elif (
            bounds is not None
            and dtype.kind in "iubf"
            # Bounds the dtype can break (none for uint8 frames of a 0..255 Box).
            and (any(b is not None for b in bounds.checks(dtype)) or self._nonfinite)
        ):
            shape = tuple(space.shape or ())
            kept = dtype if floats else np.dtype(np.float64)
            low = np.broadcast_to(bounds.low, shape).astype(kept)
            high = np.broadcast_to(bounds.high, shape).astype(kept)
            if floats:
                largest = float(np.finfo(cast(Any, kept)).max)  # a float dtype here
                low[np.isneginf(low)], high[np.isposinf(high)] = -largest, largest
            self._low, self._high = low, high
            self._mode = "abs" if floats and np.array_equal(low, -high) else "range"
        self._buffers: dict[tuple[Any, ...], tuple[np.ndarray, ...]] = {}

    def all_pass(self, rows: np.ndarray) -> bool:
        """Whether every row surely passes: the check of a whole segment, of any length.

        One comparison per bound on fresh arrays (a segment's length varies,
        so no scratch array is kept): about 5 us for a CartPole episode,
        where :func:`outside_space_error` takes about 20. False means "look
        closer", never "at fault": the exact check then finds the row, if any.

        Args:
            rows: Observations shaped ``(T, *space.shape)``, of the space's dtype.
        """
        mode = self._mode
        if mode == "none":
            return not self._nonfinite or all_finite(rows)
        if mode == "exact":
            return False
        if mode == "abs":
            inside = np.less_equal(np.abs(rows), self._high)
        else:
            inside = np.less_equal(self._low, rows)
            inside &= np.less_equal(rows, self._high)
        return np.count_nonzero(inside) == inside.size

    def __call__(self, rows: np.ndarray) -> np.ndarray | None:
        """None if every row passes, else a bool per row: True where it may not.

        Args:
            rows: One observation per slot, shaped as the space.
        """
        mode = self._mode
        if mode == "none":
            if self._nonfinite and not all_finite(rows):
                return nonfinite_rows(rows)
            return None
        if mode == "exact":
            if find_space_problem("observations", rows, self._space) is None and not (
                self._nonfinite and not all_finite(rows)
            ):
                return None
            return np.ones(len(rows), dtype=bool)
        # Keyed by layout too: gymnasium's vector envs return their
        # observations transposed (Fortran order), and a comparison whose
        # operands share the layout costs a third of one that mixes them.
        key = (rows.shape, rows.strides)
        buffers = self._buffers.get(key)
        if buffers is None:
            if len(self._buffers) >= _MAX_LAYOUTS:
                self._buffers.clear()
            # Bounds broadcast to the batch's shape: comparing with a broadcast
            # operand costs numpy twice as much as with a same-shaped one.
            low, high = np.empty_like(rows), np.empty_like(rows)
            low[...], high[...] = self._low, self._high
            buffers = self._buffers[key] = (
                low,
                high,
                np.empty_like(rows),
                np.empty_like(rows, dtype=bool),
                np.empty_like(rows, dtype=bool),
            )
        low, high, scratch, inside, also = buffers
        if mode == "abs":
            np.less_equal(np.abs(rows, out=scratch), high, out=inside)
        else:
            np.less_equal(low, rows, out=inside)
            np.logical_and(inside, np.less_equal(rows, high, out=also), out=inside)
        # count_nonzero: a third of the cost of ndarray.all() on small arrays.
        if np.count_nonzero(inside) == inside.size:
            return None
        return np.asarray(~inside.reshape(len(rows), -1).all(axis=1))
