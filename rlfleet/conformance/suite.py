"""Running a selection of checks against one worker command."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlfleet.conformance._failure import select
from rlfleet.conformance.checks import CHECKS, Check, CheckResult
from rlfleet.conformance.defaults import DEFAULT_ENV_ID, DEFAULT_TIMEOUT
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.conformance.scripted_coordinator import ScriptedCoordinator


def select_checks(names: Sequence[str] | None) -> list[Check]:
    """The named checks in running order; all of them for None.

    Raises:
        ConfigError: For an unknown name.
    """
    return select(names, CHECKS, DEFAULT_TIMEOUT)


def run_conformance(
    worker_command: str,
    *,
    env_id: str = DEFAULT_ENV_ID,
    checks: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Runs conformance checks against a worker implementation.

    Starts a test coordinator on 127.0.0.1, then runs the worker command
    (with ``{address}`` replaced by the coordinator's ``HOST:PORT``) as
    often as the checks need.

    Args:
        worker_command: The command that starts one worker, e.g.
            ``"python -m rlfleet worker --coordinator {address} --envs 2"``.
        env_id: The env the workers are given; its action space must be
            Discrete or float Box (the kit's agent updates).
        checks: Names of the checks to run (see
            :data:`rlfleet.conformance.CHECKS`); None runs all.
        timeout: Longest wait for any one answer from the worker, in seconds.
        on_result: Called with each result as soon as its check ends.

    Returns:
        One result per check, in running order.

    Raises:
        ConfigError: If a check name is unknown, the timeout is not
            positive, or the command does not parse or lacks ``{address}``.
    """
    selected = select(checks, CHECKS, timeout)
    results = []
    with ScriptedCoordinator() as coordinator:
        harness = WorkerHarness(coordinator, worker_command, env_id=env_id, timeout=timeout)
        try:
            for check in selected:
                result = check.run(harness)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            harness.close()
    return results


__all__ = ["run_conformance", "select_checks"]
