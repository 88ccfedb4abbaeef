"""Do results on the lease data channel stall other sessions' lease calls?

Run: ``python -m benchmarks.result_stalls`` (about a minute; ``--help`` for the knobs).

The coordinator handles a worker's results that come on its lease data
connection on the data channel's one selector thread, the thread that also
relays every lease call and reply (docs/data_plane.md, "Results on the data
channel"). This measures what that costs other sessions: a learner steps a
``RemoteVectorEnv`` of CartPole envs leased on one real worker, one call at
a time, while synthetic workers (benchmarks/capacity.py's, replaying
pre-encoded results) answer a ``RemoteSampler``'s requests as fast as the
coordinator takes them, their results on their Join streams (``join``, each
checked on its stream's reader thread) or on their data connections
(``data``, checked on the selector thread). It reports the lease step's round
trip (median, 99th percentile, max) for each, with no sampling load as the
floor, and the coordinator's CPU per delivered step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.capacity import CARRIERS, _cpu_clock, _stopping, _wait_for_port, _wait_for_workers
from rlfleet.client import RemoteSampler, RemoteVectorEnv

_START_SECONDS = 120.0


class _Fleet:
    """A coordinator and one lease-hosting worker; synthetic workers on demand."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> str:
        """Starts the coordinator and the lease worker; returns the address."""
        port_file = self.directory / "port"
        self.coordinator = subprocess.Popen(
            [sys.executable, "-m", "rlfleet", "--log-level", "ERROR", "coordinator",
             "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--env", "CartPole-v1",
             "--capacity-steps", "16384"],
            env=self.env,
        )  # fmt: skip
        self.processes.append(self.coordinator)
        self.address = f"127.0.0.1:{_wait_for_port(port_file, self.coordinator)}"
        worker = [sys.executable, "-m", "rlfleet", "--log-level", "ERROR", "worker"]
        worker += ["--coordinator", self.address, "--envs", "1", "--lease-slots", "8"]
        self.processes.append(subprocess.Popen(worker, env=self.env))
        return self.address

    def start_synthetic(self, carrier: str, workers: int) -> None:
        """Starts ``workers`` synthetic workers sending 8,000-step results on ``carrier``."""
        control = self.directory / "result-episodes"
        control.write_text("80")  # the longest checks of the capacity benchmark
        for i in range(workers):
            self.processes.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "benchmarks.capacity", "--serve-worker"),
                        *(self.address, "--envs", "64", "--episode-steps", "100"),
                        *("--carrier", carrier, "--control", str(control)),
                        *("--counts", str(self.directory / f"counts-{i}")),
                    ],
                    env=self.env,
                )
            )


def measure(carrier: str | None, *, steps: int, workers: int) -> dict[str, float]:
    """Lease step round trips (ms) while ``carrier``'s results flow (None: no sampling)."""
    with (
        tempfile.TemporaryDirectory(prefix="rlfleet-stalls-") as name,
        contextlib.ExitStack() as stack,
    ):
        fleet = _Fleet(Path(name))
        stack.enter_context(_stopping(fleet.processes))
        address = fleet.start()
        sampler = stack.enter_context(
            RemoteSampler(address, seed=0, timeout=600, wait_for_workers=_START_SECONDS)
        )
        _wait_for_workers(sampler, 1)
        # Leased before the synthetic workers join: its envs go to the real worker.
        venv = stack.enter_context(RemoteVectorEnv(address, "CartPole-v1", 4))
        venv.reset(seed=0)
        if carrier is not None:
            fleet.start_synthetic(carrier, workers)
            _wait_for_workers(sampler, 1 + workers)
        return _time_steps(venv, sampler if carrier else None, fleet.coordinator.pid, steps)


def _time_steps(
    venv: RemoteVectorEnv, sampler: RemoteSampler | None, pid: int, steps: int
) -> dict[str, float]:
    stop = threading.Event()
    delivered = [0]

    def sample() -> None:
        itr = 0
        while sampler is not None and not stop.is_set():
            delivered[0] += sampler.obtain_samples(itr, 160_000).total_steps
            itr += 1

    cpu = _cpu_clock(pid)
    thread = threading.Thread(target=sample, daemon=True)
    actions = np.zeros(4, np.int64)
    times = []
    before = cpu()
    thread.start()
    for _ in range(steps):
        start = time.perf_counter()
        _, _, terminated, truncated, _ = venv.step(actions)
        times.append(time.perf_counter() - start)
        done = np.flatnonzero(terminated | truncated).tolist()
        if done:
            venv.reset(done)
    stop.set()
    thread.join(600)
    spent = cpu() - before
    ms = np.array(times) * 1e3
    return {
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "coordinator_us_per_sampled_step": spent / delivered[0] * 1e6 if delivered[0] else 0.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Measures the floor and each carrier."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.result_stalls", description=__doc__)
    parser.add_argument("--steps", type=int, default=3000, help="lease steps timed per case")
    parser.add_argument("--workers", type=int, default=2, help="synthetic workers")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        f"{'results on':>10} {'median ms':>9} {'p99 ms':>7} {'max ms':>7} "
        f"{'coord us/sampled step':>21}"
    )
    for carrier in (None, *CARRIERS):
        row = measure(carrier, steps=args.steps, workers=args.workers)
        print(
            f"{carrier or '(none)':>10} {row['median_ms']:>9.2f} {row['p99_ms']:>7.2f} "
            f"{row['max_ms']:>7.1f} {row['coordinator_us_per_sampled_step']:>21.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
