"""The tests' one way to wait: poll a condition until it holds, or fail at a deadline.

Tests synchronise on conditions, never on sleeps: a sleep long enough for a
busy 2-core machine makes every run slow, and one short enough for a quiet
machine fails on a busy one. The deadline is generous (:data:`PATIENCE`) and
is reached only when the test fails; a passing run waits only as long as the
condition takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds a test waits for something that takes well under a second on a
#: quiet machine: long enough for a 2-core machine with a busy core.
PATIENCE = 60.0


def wait_until(
    probe: Callable[[], T | None],
    what: str,
    *,
    timeout: float = PATIENCE,
    interval: float = 0.05,
    describe: Callable[[], str] | None = None,
) -> T:
    """Polls ``probe`` until it returns a true value (not None, False, 0 or empty).

    Args:
        probe: The condition; its first true value is returned.
        what: What is awaited, for the failure message ("2 ready workers").
        timeout: Seconds before the wait fails.
        interval: Seconds between polls.
        describe: Called on failure; its text (process logs, state) ends the message.

    Returns:
        The probe's value.

    Raises:
        AssertionError: The condition did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f":\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)
