"""A learner that dies without closing its Fleet.local leaves no process behind.

A real script starts ``Fleet.local(workers=2)`` (env subprocesses in each
worker; with ``coordinators=2`` also two coordinator processes), samples
once, prints every pid of its fleet and then ends the way a killed or
crashed learner does: SIGKILL, ``os._exit``. Every worker, env and
coordinator process must be gone within a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = str(Path(__file__).resolve().parent.parent)
#: Seconds the fleet's processes get to end after their learner died.
DEADLINE = 60.0

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import psutil
    from rlfleet.client import Fleet
    from rlfleet.envs import EnvConfig

    how, coordinators = sys.argv[1], int(sys.argv[2])
    holder = {}

    def start():
        holder["fleet"] = Fleet.local(
            2, 2, EnvConfig("CartPole-v1", vectorization="subprocess"), seed=1,
            coordinators=coordinators,
        )

    if how == "sigkill-after-thread":
        # Started from a thread that ends first: Linux sends the parent-death
        # signal when the forking *thread* ends; the workers must stay.
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
    else:
        start()
    fleet = holder["fleet"]
    fleet.sampler.obtain_samples(0, 200)
    pids = [coordinator.process.pid for coordinator in fleet.coordinators]
    for worker in fleet.workers:
        process = psutil.Process(worker.process.pid)
        pids += [process.pid, *(c.pid for c in process.children(recursive=True))]
    print(json.dumps({"pids": pids, "log_dir": str(fleet.log_dir)}), flush=True)
    if how == "os._exit":
        os._exit(3)
    time.sleep(600)  # the test SIGKILLs this process
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_learner(
    how: str, logs: list[str], coordinators: int = 1
) -> tuple[subprocess.Popen[str], list[int]]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    learner = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, how, str(coordinators)],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    assert learner.stdout is not None
    line = learner.stdout.readline()  # the script's sampler call has its own deadline
    assert line, f"the learner script ended before starting its fleet (exit {learner.wait()})"
    started = json.loads(line)
    pids = started["pids"]
    logs.append(started["log_dir"])  # a killed learner cannot remove its workers' logs
    # One coordinator runs in the learner; more are processes of their own.
    expected = 6 + (coordinators if coordinators > 1 else 0)
    assert len(pids) >= expected, (
        f"expected 2 workers with 2 env processes each and {coordinators} coordinator(s), "
        f"got pids {pids}"
    )
    return learner, pids


def assert_all_end(pids: list[int]) -> None:
    deadline = time.monotonic() + DEADLINE
    try:
        while not all(gone(pid) for pid in pids):
            left = [pid for pid in pids if not gone(pid)]
            assert time.monotonic() < deadline, (
                f"processes {left} of the dead learner's fleet still run after {DEADLINE:g} s"
            )
            time.sleep(0.1)
    finally:
        for pid in pids:  # nothing survives a failed test
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


@pytest.fixture
def logs() -> Iterator[list[str]]:
    """Log folders of the learners' fleets, removed after the test."""
    folders: list[str] = []
    yield folders
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("how", ["sigkill", "sigkill-after-thread"])
def test_workers_end_when_their_learner_is_sigkilled(how: str, logs: list[str]) -> None:
    learner, pids = run_learner(how, logs)
    try:
        if how == "sigkill-after-thread":
            # Linux sent the parent-death signal when the thread ended: the
            # workers must not have taken it for their parent's death.
            assert all(not gone(pid) for pid in pids), "a worker left while its learner ran"
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=30)
        assert_all_end(pids)
    finally:
        learner.kill()
        learner.wait(timeout=30)


def test_workers_end_when_their_learner_calls_os_exit(logs: list[str]) -> None:
    learner, pids = run_learner("os._exit", logs)
    assert learner.wait(timeout=30) == 3
    assert_all_end(pids)


@pytest.mark.parametrize("how", ["sigkill", "os._exit"])
def test_coordinator_processes_and_workers_end_when_their_learner_dies(
    how: str, logs: list[str]
) -> None:
    learner, pids = run_learner(how, logs, coordinators=2)
    try:
        if how == "sigkill":
            learner.send_signal(signal.SIGKILL)
        assert learner.wait(timeout=30) == (3 if how == "os._exit" else -signal.SIGKILL)
        assert_all_end(pids)
    finally:
        learner.kill()
        learner.wait(timeout=30)
