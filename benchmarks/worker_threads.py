"""A fleet worker's threads, CPU and wake-ups per step: ``python -m benchmarks.worker_threads``.

Starts ``Fleet.local(workers=W, envs_per_worker=K)`` on CartPole's vector
entry point, warms it with one request, then reads every worker thread's
CPU (``/proc/<pid>/task/<tid>/schedstat``, nanoseconds) and voluntary
context switches (its wake-ups: a wait on a lock, a condition, the GIL or
a socket) before and after ``--requests`` requests of ``--request-steps``
steps. Each line is one kind of thread summed over the workers: CPU
microseconds per step a worker delivers, wake-ups per second per worker,
and CPU microseconds per wake-up. ``main`` is the stepping thread.

Python threads all carry the process's name in ``/proc``; with ``py-spy``
on the PATH, each is named from its Python stack (``gRPC channel spin``
for grpcio's completion-queue thread, ``gRPC request consumer`` for the
thread that feeds a stream call's requests), else by its thread id.

Linux only. Other processes' load adds to every figure: compare runs
interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from collections import defaultdict

from benchmarks import capacity_threads
from rlfleet.client import Fleet
from rlfleet.envs import EnvConfig

#: Seconds ``py-spy dump`` may take to name one process's threads.
DUMP_SECONDS = 30.0

_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "([^"]*)"$', re.MULTILINE)


def thread_counters(pid: int) -> dict[int, tuple[int, int]]:
    """``{tid: (CPU ns, voluntary context switches)}`` of a process's threads
    (threads that end while being read are left out)."""
    return {
        tid: (ns, wakes) for tid, (ns, wakes, *_) in capacity_threads.thread_counters(pid).items()
    }


def thread_names(pid: int) -> dict[int, str]:
    """``{tid: name}`` of a process's threads: from ``py-spy dump`` if it is
    installed (grpcio's unnamed threads by their stacks), else ``/proc`` comm."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:
            continue
    if shutil.which("py-spy") is None:
        return names
    dump = subprocess.run(
        ["py-spy", "dump", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=DUMP_SECONDS,
        check=False,
    ).stdout
    blocks = _THREAD.split(dump)[1:]  # tid, name, stack, tid, name, stack, ...
    for tid, name, stack in zip(blocks[::3], blocks[1::3], blocks[2::3], strict=True):
        if "channel_spin" in stack:
            names[int(tid)] = "gRPC channel spin"
        elif "consume_request_iterator" in stack:
            names[int(tid)] = "gRPC request consumer"
        else:
            names[int(tid)] = name
    return names


def worker_pids() -> list[int]:
    """Pids of this process's children (the fleet's worker processes)."""
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if parent == me:
            pids.append(int(entry))
    return pids


def measure(workers: int, envs: int, request_steps: int, requests: int) -> dict[str, object]:
    """Runs the fleet and returns the figures (see the module docstring)."""
    env = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
    with Fleet.local(workers=workers, envs_per_worker=envs, env=env, seed=1) as sampler:
        sampler.obtain_samples(0, request_steps)
        pids = worker_pids()
        names: dict[int, str] = {}
        for pid in pids:
            names.update(thread_names(pid))
            names[pid] = "main"
        before = {pid: thread_counters(pid) for pid in pids}
        started = time.monotonic()
        steps = 0
        for itr in range(1, requests + 1):
            batch = sampler.obtain_samples(itr, request_steps)
            steps += len(batch.actions)
        seconds = time.monotonic() - started
        after = {pid: thread_counters(pid) for pid in pids}
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for pid in pids:
        for tid, (ns, wakes) in after[pid].items():
            ns0, wakes0 = before[pid].get(tid, (0, 0))
            total = totals[names.get(tid, str(tid))]
            total[0] += ns - ns0
            total[1] += wakes - wakes0
    threads = {
        name: {
            # Summed over the workers, over all their steps: per worker, per its own step.
            "us_per_step": ns / steps / 1e3,
            "wakeups_per_second": wakes / seconds / len(pids),
            "us_per_wakeup": ns / wakes / 1e3 if wakes else 0.0,
        }
        for name, (ns, wakes) in sorted(totals.items(), key=lambda item: -item[1][0])
    }
    other = sum(t["us_per_step"] for name, t in threads.items() if name != "main")
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_second": steps / seconds,
        "other_threads_us_per_step": other,
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> int:
    """Prints the figures (``--json``: as one JSON object); returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=64, help="env slots per worker")
    parser.add_argument("--request-steps", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = measure(args.workers, args.envs, args.request_steps, args.requests)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"{figures['steps']:,} steps in {figures['seconds']:.2f} s "
        f"({figures['steps_per_second']:,.0f}/s); load {os.getloadavg()[0]:.2f}; "
        f"threads besides main: {figures['other_threads_us_per_step']:.4f} us per step"
    )
    threads: dict[str, dict[str, float]] = figures["threads"]  # type: ignore[assignment]
    for name, t in threads.items():
        print(
            f"  {name:28s} {t['us_per_step']:8.4f} us/step {t['wakeups_per_second']:8.1f} "
            f"wake-ups/s {t['us_per_wakeup']:7.1f} us/wake-up"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
