"""The coordinator's CPU and context switches by thread: ``benchmarks.capacity --threads``.

Each thread's CPU is its ``/proc/<pid>/task/<tid>/schedstat`` run time
(nanoseconds) and its context switches are the ``voluntary_ctxt_switches``
(its waits: a lock, a condition, the GIL, a socket) and
``nonvoluntary_ctxt_switches`` (preemptions) of its ``status``, and its
minor page faults are the ``minflt`` of its ``stat`` (a page the kernel
maps on first touch: fresh memory), read before and after each timed
request. Python threads all carry the process's name
in ``/proc``, so names come from :func:`benchmarks.worker_threads.thread_names`
(``py-spy dump`` when it is on the PATH, else ``comm``; the caller names
them outside the timed windows, since a dump pauses the process). Threads are grouped
by name the way docs/performance.md ("Per thread") does; a name no group
knows goes to ``other``. Linux only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from rlfleet.errors import NotInstalledError

#: ``(group, name prefixes)`` in report order; the first group whose prefix
#: starts a thread's name takes it. Each gRPC handler thread of the
#: coordinator's pool is its own group: one of them runs the learner's
#: Sample call (a learner that sends its requests on its results connection
#: makes none: that connection's thread runs them), the others the Join handlers.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("result lanes", ("rlfleet-data-results",)),
    ("data loop", ("rlfleet-data-loop",)),
    ("requests on the results connection", ("rlfleet-learner-requests",)),
    ("Join readers", ("rlfleet-join-",)),
    ("gRPC completion queue", ("Thread-1 (_serve)",)),
    ("gRPC event_engine", ("event_engine", "lifeguard")),
    (
        "liveness, acceptor, timers, main",
        ("rlfleet-coordinator-liveness", "rlfleet-data-accept", "grpc_global_tim", "MainThread"),
    ),
)
_HANDLER = "rlfleet-coordinator_"
OTHER = "other"
#: The sum of every group, last in a report.
ALL = "all threads"

_SWITCHES = re.compile(r"^(voluntary|nonvoluntary)_ctxt_switches:\s+(\d+)", re.MULTILINE)

#: ``{tid: (CPU ns, voluntary, involuntary context switches, minor page faults)}``.
Counters = dict[int, tuple[int, int, int, int]]
#: Counters per thread.
_COUNTS = 4


def require_proc() -> None:
    """Raises :class:`~rlfleet.errors.NotInstalledError` unless ``/proc`` has thread counters."""
    if not os.path.isfile(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"):
        raise NotInstalledError(
            "--threads reads each coordinator thread's /proc/<pid>/task/<tid>/schedstat, which "
            "this system does not have (Linux with CONFIG_SCHEDSTATS only); run without --threads"
        )


def group_of(name: str) -> str:
    """The report group of a thread called ``name`` (``other`` if none matches)."""
    if name.startswith(_HANDLER):
        return name
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return OTHER


def thread_counters(pid: int) -> Counters:
    """Every thread's CPU ns, context switches and minor page faults (threads
    ending meanwhile are left out)."""
    counters: Counters = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = dict(_SWITCHES.findall(f.read()))
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # After the name in parentheses (which may hold spaces): the
                # state is field 3, minflt field 10.
                minflt = int(f.read().rpartition(")")[2].split()[7])
        except OSError:
            continue
        counters[int(tid)] = (
            ns,
            int(switches.get("voluntary", 0)),
            int(switches.get("nonvoluntary", 0)),
            minflt,
        )
    return counters


def grouped(before: Counters, after: Counters, names: Mapping[int, str]) -> dict[str, list[int]]:
    """``{group: [CPU ns, voluntary, involuntary switches, minor faults]}`` between
    two readings.

    A thread born in between counts from zero; an unnamed one by its comm
    is not known here, so it goes to ``other``.
    """
    totals: dict[str, list[int]] = {}
    for tid, counts in after.items():
        start = before.get(tid, (0,) * _COUNTS)
        total = totals.setdefault(group_of(names.get(tid, "")), [0] * _COUNTS)
        for i in range(_COUNTS):
            total[i] += counts[i] - start[i]
    return totals


def per_result(totals: Mapping[str, list[int]], results: int) -> dict[str, dict[str, float]]:
    """``{group: {us_per_result, voluntary_per_result, involuntary_per_result,
    minor_faults_per_result}}``, report order."""
    order = [g for g, _ in GROUPS] + sorted(g for g in totals if g.startswith(_HANDLER)) + [OTHER]
    n = max(results, 1)
    totals = {**totals, ALL: [sum(t[i] for t in totals.values()) for i in range(_COUNTS)]}
    order.append(ALL)
    return {
        group: {
            "us_per_result": totals[group][0] / n / 1e3,
            "voluntary_per_result": totals[group][1] / n,
            "involuntary_per_result": totals[group][2] / n,
            "minor_faults_per_result": totals[group][3] / n,
        }
        for group in order
        if group in totals
    }
