"""benchmarks/capacity_threads.py reads and groups a process's threads from /proc.

The process read is this test's own: two threads named like the
coordinator's result lanes spin until their own CPU clock has moved, and
their group must get that CPU; the figures are CPU counters, never
wall-clock times.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import pytest

from benchmarks import capacity, capacity_threads
from rlfleet.errors import NotInstalledError

#: CPU seconds each spinning thread burns before it is read.
SPIN_CPU = 0.02
WAIT_SECONDS = 60.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux only)")


def test_threads_are_grouped_by_name_and_unknown_names_go_to_other() -> None:
    group = capacity_threads.group_of
    assert group("rlfleet-data-results-1") == "result lanes"
    assert group("rlfleet-data-loop") == "data loop"
    assert group("rlfleet-learner-requests-0042") == "requests on the results connection"
    assert group("rlfleet-join-ipv4:127.0.0.1:55088") == "Join readers"
    assert group("Thread-1 (_serve)") == "gRPC completion queue"
    assert group("event_engine") == "gRPC event_engine"
    assert group("rlfleet-coordinator-liveness") == "liveness, acceptor, timers, main"
    assert group("rlfleet-coordinator_2") == "rlfleet-coordinator_2"
    assert group("python") == capacity_threads.OTHER
    assert group("") == capacity_threads.OTHER


def test_two_spinning_lane_threads_get_their_cpu_in_their_group() -> None:
    capacity_threads.require_proc()
    stop = threading.Event()
    spun = [threading.Event(), threading.Event()]

    def spin(done: threading.Event) -> None:
        while time.thread_time() < SPIN_CPU:
            pass
        done.set()
        stop.wait(WAIT_SECONDS)  # alive (in /proc) until read

    threads = [
        threading.Thread(target=spin, args=(done,), name=f"rlfleet-data-results-{i}")
        for i, done in enumerate(spun)
    ]
    before = capacity_threads.thread_counters(os.getpid())
    for thread in threads:
        thread.start()
    try:
        for done in spun:
            assert done.wait(WAIT_SECONDS), f"a thread did not spin within {WAIT_SECONDS} s"
        after = capacity_threads.thread_counters(os.getpid())
    finally:
        stop.set()
        for thread in threads:
            thread.join(WAIT_SECONDS)
    names = {thread.native_id: thread.name for thread in threads if thread.native_id}
    names[threading.main_thread().native_id or 0] = "MainThread"
    totals = capacity_threads.grouped(before, after, names)
    # Both lanes, born after the first reading, counted from zero.
    assert totals["result lanes"][0] >= 2 * SPIN_CPU * 1e9 * 0.99
    assert set(totals) <= {"result lanes", "liveness, acceptor, timers, main", "other"}
    report = capacity_threads.per_result(totals, results=2)
    assert next(iter(report)) == "result lanes" and list(report)[-1] == capacity_threads.ALL
    assert report[capacity_threads.ALL]["us_per_result"] >= report["result lanes"]["us_per_result"]


def test_threads_option_parses_and_a_system_without_proc_is_told_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert capacity._parser().parse_args(["--threads"]).threads is True
    assert capacity._parser().parse_args([]).threads is False

    def no_proc() -> None:
        raise NotInstalledError("no /proc here; run without --threads")

    monkeypatch.setattr(capacity_threads, "require_proc", no_proc)
    assert capacity.main(["--threads", "--shapes", "cartpole"]) == 2
    assert "run without --threads" in capsys.readouterr().err


def test_the_capacity_benchmark_reports_the_coordinators_threads_per_result() -> None:
    shape = dataclasses.replace(
        capacity.SHAPES[0], request_steps=tuple(s // 20 for s in capacity.SHAPES[0].request_steps)
    )
    (report,) = capacity.run(
        [shape], workers=2, num_envs=16, repeats=1, carriers=("data",), threads=True
    )
    for setting in report["settings"]:
        threads = setting["threads"]
        # The data carrier's results are booked on the data loop (the lanes
        # take over only while one holds a worker's work: a row of their own).
        assert threads["result lanes"]["us_per_result"] >= 0, threads
        assert threads["data loop"]["us_per_result"] > 0, threads
        assert list(threads)[-1] == capacity_threads.ALL
        for figures in threads.values():
            assert all(value >= 0 for value in figures.values()), threads
