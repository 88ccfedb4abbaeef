"""The env restart budget: how many crashed envs a worker may rebuild."""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet._util.values import check_int
from rlfleet.errors import ConfigError


@dataclass(frozen=True)
class EnvRestartBudget:
    """Limits on rebuilding envs that raised, over a worker's lifetime.

    A crashed env is closed, rebuilt and its episode re-run from its seed as
    long as both limits hold. The rate limit stops a worker from spinning on
    an env that crashes at every reset; the total limit stops one that
    crashes now and then from hiding a real bug forever.

    Args:
        max_restarts: At most this many restarts within any
            ``window_seconds`` window.
        window_seconds: Length of the rate window (may be ``math.inf``).
        max_total: At most this many restarts over the worker's lifetime.

    Raises:
        ConfigError: If a count is negative or the window is not positive.
    """

    max_restarts: int = 5
    window_seconds: float = 60.0
    max_total: int = 50

    def __post_init__(self) -> None:
        for name in ("max_restarts", "max_total"):
            value = getattr(self, name)
            check_int(f"EnvRestartBudget.{name}", value, minimum=0)
        window = self.window_seconds
        if isinstance(window, bool) or not isinstance(window, int | float) or not window > 0:
            raise ConfigError(
                f"EnvRestartBudget.window_seconds must be a number > 0, got {window!r}"
            )

    @classmethod
    def coerce(cls, value: int | EnvRestartBudget) -> EnvRestartBudget:
        """Accepts a budget, or an int n meaning "at most n restarts in total".

        Raises:
            ConfigError: If ``value`` is neither.
        """
        if isinstance(value, EnvRestartBudget):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"max_env_restarts must be an int or an EnvRestartBudget, got {value!r}"
            )
        return cls(max_restarts=value, window_seconds=math.inf, max_total=value)


class RestartLedger:
    """Counts restarts against an :class:`EnvRestartBudget`.

    Args:
        budget: The limits.
        clock: Monotonic time in seconds (injectable so tests need no sleeps).
    """

    def __init__(
        self, budget: EnvRestartBudget, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget = budget
        self._clock = clock
        self._recent: collections.deque[float] = collections.deque()
        self.total = 0

    def try_restart(self) -> bool:
        """Records one restart if the budget allows it.

        Returns:
            True if the restart may go ahead (and was counted), False if the
            budget is spent.
        """
        now = self._clock()
        horizon = now - self.budget.window_seconds
        while self._recent and self._recent[0] <= horizon:
            self._recent.popleft()
        if self.total >= self.budget.max_total or len(self._recent) >= self.budget.max_restarts:
            return False
        self._recent.append(now)
        self.total += 1
        return True

    def describe(self) -> str:
        """The budget and what is spent, for error messages."""
        b = self.budget
        return (
            f"restart budget spent: {self.total} of {b.max_total} in total, "
            f"{len(self._recent)} of {b.max_restarts} per {b.window_seconds:g}s"
        )
