"""The unit-columns check: a worker that reads units as columns refuses malformed ones.

A worker that advertises ``rlfleet.unit-columns`` gets a task's units as
three little-endian arrays (worker.proto ``EpisodeUnitColumns``). Columns
that are not a whole number of values, that disagree in length (one written
with the wrong dtype does both), that hold a negative episode index, or that
come beside ``Task.units`` make the task unreadable: the worker answers
``WorkerError`` ``ERROR_KIND_PROTOCOL`` naming the task, runs none of its
units, and goes on serving (docs/conformance.md).
"""

from __future__ import annotations

import itertools

from rlfleet.conformance._expectations import fail_if
from rlfleet.conformance.kit_messages import UNIT_COLUMN_FAULTS, error_of, malformed_task
from rlfleet.conformance.link import WorkerLink, describe, event_kind, kind_name
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.conformance.scripted_coordinator import Inbound
from rlfleet.protocol.error_reports import ErrorKind
from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.transport import rpc as _rpc

#: Units of each malformed task (before its columns are spoilt).
MALFORMED_UNITS = 3
#: Seed of the malformed tasks' units.
MALFORMED_SEED = 41
#: The malformed tasks' ids: apart from the well-formed ones (which count from 1).
_task_ids = itertools.count(1_000_001)
_request_ids = itertools.count(1_000_001)


def check_unit_columns(harness: WorkerHarness) -> str:
    """The unit-columns check: malformed columns are refused by task, nothing is run."""
    link = harness.shared()
    if not link.grants(_rpc.UNIT_COLUMNS_CAPABILITY):
        return (
            "'rlfleet.unit-columns' not advertised: coordinators send units as EpisodeUnit "
            "messages, so nothing was tried"
        )
    refused = []
    for fault in range(UNIT_COLUMN_FAULTS):
        task, what = _send_malformed(link, fault)
        _expect_refusal(link, task, f"Task {task.task_id} {what}")
        refused.append(task)
    good = link.send_episodes(link.num_envs, seed=MALFORMED_SEED)
    link.collect(good)
    link.pump(0.2)  # a unit of a refused task run late would show up now
    problems = [
        f"task {task.task_id} was refused, yet units {sorted(link.returned(task))} of it came "
        "back: a refused task runs none of its units"
        for task in refused
        if link.results[task.task_id]
    ]
    fail_if(link, "a refused task's units were run", problems)
    return (
        f"{len(refused)} tasks with malformed unit columns (a cut column, columns of "
        "different lengths, a uint32 column sent as int64, a negative episode index, columns "
        "beside Task.units) were "
        "each refused with ERROR_KIND_PROTOCOL naming the task, none of their units ran; "
        f"then task {good.task_id} completed"
    )


def _send_malformed(link: WorkerLink, fault: int) -> tuple[TaskAssignment, str]:
    """Sends a well-formed episodes task with its columns broken (``fault``)."""
    request = next(_request_ids)
    units = UnitColumns.seeded(MALFORMED_SEED, request, range(MALFORMED_UNITS))
    task = TaskAssignment(
        next(_task_ids),
        request,
        Mode.EPISODES,
        link.agent_version,
        link.generation,
        units=units,
    )
    what, data = malformed_task(task, fault)
    # Registered with the units it meant: a result for it is checked, then reported.
    link.tasks[task.task_id] = task
    link.results[task.task_id] = []
    try:
        link.session.send(data)
    except RuntimeError as exc:
        raise link.failure(f"cannot send a task: {exc}") from exc
    return task, what


def _expect_refusal(link: WorkerLink, task: TaskAssignment, sent: str) -> None:
    """Waits for the WorkerError refusing ``task`` and checks its kind."""
    want = kind_name(ErrorKind.PROTOCOL)
    event = link.wait_for(
        f"WorkerError {want} naming task {task.task_id}, for the {sent}",
        lambda e: (
            event_kind(e) == "error"
            or (event_kind(e) == "result" and bool(link.results[task.task_id]))
        ),
        allow_errors=True,
    )
    if not isinstance(event, Inbound) or event.message is None:
        raise link.failure(
            f"the worker ran units {sorted(link.returned(task))} of the {sent}; it must "
            f"refuse the task with WorkerError {want} naming it and run none of its units"
        )
    detail = error_of(event.message)
    problems = []
    if detail.kind != ErrorKind.PROTOCOL:
        problems.append(f"its kind is {kind_name(detail.kind)}, expected {want}")
    if detail.task_id != task.task_id:
        problems.append(
            f"its task_id is {detail.task_id}, expected {task.task_id} (the refused task); "
            f"the error was {describe(event)}"
        )
    fail_if(link, f"the WorkerError for the {sent} is not what the protocol asks", problems)
