"""CPU sets: taskset-style lists (``3``, ``0,2``, ``0-3``), and pinning a process to one.

A worker pinned to one core runs its main thread and its gRPC threads
(channel poller, result sender) on that core: they wake where the
stepping loop runs instead of on another core (docs/performance.md
measures what that saves, and what it costs on a shared machine). Pinning
uses Linux's ``sched_setaffinity``; elsewhere asking for it is an error,
never a no-op.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

from rlfleet.errors import ConfigError

#: One item of a CPU list: a CPU number or an inclusive range.
_ITEM = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
#: Where the kernel lists a process's threads.
_TASKS = "/proc/self/task"
#: Above Linux's largest CPU count (CONFIG_NR_CPUS <= 8192): a bigger number
#: is a typo, and a range up to it would be a set of billions.
MAX_CPU = (1 << 16) - 1
#: What a CPU list looks like, for messages.
CPU_LIST_EXAMPLES = "3, 0,2 or 0-3 (taskset -c's lists)"


def can_pin() -> bool:
    """Whether this platform can pin a process to CPUs (Linux's ``sched_setaffinity``)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on: its affinity (a container's cpuset, taskset's...).

    Where the platform cannot tell, every CPU the machine has.
    """
    if can_pin():
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def one_cpu_each(count: int) -> list[frozenset[int]]:
    """``count`` processes' CPUs: process ``i`` on the ``i``-th CPU this process may use.

    Round-robin when there are more processes than CPUs: the same deal for
    a fleet's workers and for the plain loops a benchmark sets them against.
    """
    cpus = sorted(allowed_cpus())
    return [frozenset({cpus[i % len(cpus)]}) for i in range(count)]


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a taskset-style list: ``"3"``, ``"0,2"``, ``"0-3,8"``.

    Raises:
        ConfigError: If ``text`` is not such a list (or is empty, or has a
            range whose end is below its start).
    """
    cpus: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"{text!r} is not a CPU list; write CPU numbers and ranges, e.g. "
                f"{CPU_LIST_EXAMPLES}, of the CPUs this process may use: "
                f"{cpu_list_text(allowed_cpus())}"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if max(first, last) > MAX_CPU:
            raise ConfigError(
                f"{text!r} names CPU {max(first, last)}; CPU numbers go up to {MAX_CPU} at most "
                f"(this process may use {cpu_list_text(allowed_cpus())})"
            )
        if last < first:
            raise ConfigError(
                f"{text!r} has the range {first}-{last}, which ends before it starts; "
                f"write the lower CPU first ({last}-{first})"
            )
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def cpu_list_text(cpus: Iterable[int]) -> str:
    """``cpus`` as the shortest taskset-style list (``{0, 1, 2, 5}`` -> ``"0-2,5"``)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = 0
    for i, cpu in enumerate(ordered):
        if i + 1 < len(ordered) and ordered[i + 1] == cpu + 1:
            continue
        first = ordered[start]
        parts.append(str(first) if first == cpu else f"{first}-{cpu}")
        start = i + 1
    return ",".join(parts)


def check_allowed(cpus: Iterable[int], where: str) -> frozenset[int]:
    """Checks that this process may run on every CPU of ``cpus``; returns them as a set.

    Args:
        cpus: The CPUs asked for.
        where: What asked for them, for the message (``"--cpus '5'"``).

    Raises:
        ConfigError: If the set is empty, or names a CPU outside this
            process's affinity (naming those it may use).
    """
    wanted = frozenset(cpus)
    allowed = allowed_cpus()
    if not wanted:
        raise ConfigError(f"{where} names no CPU; give CPUs among {cpu_list_text(allowed)}")
    outside = wanted - allowed
    if outside:
        raise ConfigError(
            f"{where} names CPU(s) {cpu_list_text(outside)}, which this process may not use: "
            f"it may use CPUs {cpu_list_text(allowed)} (its affinity: the cpuset of its "
            "container, e.g. the one the kubelet's static CPU manager gives a pod, or "
            "taskset's); give CPUs among those, or leave pinning off"
        )
    return wanted


def pin_process(cpus: Iterable[int], where: str) -> frozenset[int]:
    """Pins this process, every thread it has and every one it starts later, to ``cpus``.

    Call it before the process starts threads of its own: the calling
    thread is pinned first, so threads it starts afterwards inherit the set;
    threads already running (a BLAS pool started when numpy loaded) are
    pinned one by one.

    Args:
        cpus: The CPUs.
        where: What asked for them, for messages (``"--cpus '5'"``).

    Returns:
        The CPUs the process is pinned to.

    Raises:
        ConfigError: If this platform cannot pin, or ``cpus`` is not a
            non-empty subset of the CPUs this process may use.
    """
    if not can_pin():
        raise ConfigError(
            f"{where}: pinning to CPUs needs Linux (os.sched_setaffinity), and this is "
            f"{sys.platform}; leave it unset here"
        )
    wanted = check_allowed(cpus, where)
    os.sched_setaffinity(0, wanted)
    try:
        threads = os.listdir(_TASKS)
    except OSError:
        threads = []  # no /proc: the calling thread is pinned, later threads inherit it
    for tid in threads:
        try:
            os.sched_setaffinity(int(tid), wanted)
        except (ProcessLookupError, ValueError):
            continue  # a thread that ended meanwhile
    return wanted


__all__ = [
    "CPU_LIST_EXAMPLES",
    "MAX_CPU",
    "allowed_cpus",
    "can_pin",
    "check_allowed",
    "cpu_list_text",
    "one_cpu_each",
    "parse_cpu_list",
    "pin_process",
]
