"""What every conformance check shares: its record, its result, and the exception that fails it."""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from rlfleet.errors import ConfigError

T = TypeVar("T")


class CheckFailed(Exception):  # noqa: N818 (reads as a statement: "check failed: ...")
    """The implementation did not behave as the protocol requires.

    The message says what was expected and what came instead.
    """


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    Attributes:
        name: The check's name.
        passed: Whether the implementation passed it.
        message: What was verified, or what went wrong and where.
        seconds: How long the check took.
    """

    name: str
    passed: bool
    message: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class Check(Generic[T]):
    """A registered check, of a worker (``Check[WorkerHarness]``) or of a
    coordinator (``Check[CoordinatorTarget]``).

    Attributes:
        name: Its name on the command line (``--checks``).
        summary: One line on what it verifies.
        run: Runs it against what it checks.
    """

    name: str
    summary: str
    run: Callable[[T], CheckResult]


def run_check(name: str, body: Callable[[T], str], target: T) -> CheckResult:
    """Runs a check body: it returns what it verified or raises CheckFailed.

    Raises:
        ConfigError: As the body does (a command or address that cannot
            work fails every check alike: the run stops).
    """
    start = time.monotonic()
    try:
        message, passed = body(target), True
    except CheckFailed as exc:
        message, passed = str(exc), False
    except ConfigError:
        raise
    except Exception as exc:  # a bug in the kit must not hide the other checks
        message, passed = (
            f"the conformance kit itself failed; please report this:\n"
            f"{''.join(traceback.format_exception(exc)).rstrip()}",
            False,
        )
    return CheckResult(name, passed, message, time.monotonic() - start)


def select(names: Sequence[str] | None, registry: Mapping[str, T], timeout: float) -> list[T]:
    """The named checks of ``registry`` in running order (all of them for None).

    Raises:
        ConfigError: For an unknown name, or a timeout that is not positive.
    """
    if not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if names is None:
        return list(registry.values())
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ConfigError(f"unknown checks {unknown}; the checks are: {', '.join(registry)}")
    return [check for name, check in registry.items() if name in names]


__all__ = ["CheckFailed", "CheckResult", "run_check", "select"]
