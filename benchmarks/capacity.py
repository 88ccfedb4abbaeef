"""A coordinator's capacity: its CPU per delivered step and per result, fed by synthetic workers.

Run: ``python -m benchmarks.capacity`` (about a minute; ``--help`` for the knobs).

A real ``rlfleet coordinator`` process serves W **synthetic workers**: each
joins over the real Join protocol (the remote worker's own ``JoinStream``
and message translation), acknowledges env and agent updates without
building a policy, and answers each task at once with results encoded
**once**: a result of ``k`` episodes of ``L`` steps is serialized a single
time, and every answer rewrites only its five episode_infos columns
(episode index, seeds, agent version, worker) in place in those bytes
before cutting them into chunk messages. No env steps and no encoding run
in the workers, so their CPU does not hide the coordinator's cost. What the
coordinator checks still holds for every result: the episode indices and
seeds of the task's units, the agent version, the step types and every
value against the declared spaces; a result it refuses ends the run.

Two step sizes: CartPole-v1's (4 float32 observations) and Atari-sized
(84x84x4 uint8 frames, :data:`benchmarks.capacity_workers.FRAMES_ID`). For each, the learner (this
process, a :class:`~rlfleet.client.RemoteSampler`) makes requests of two
sizes while the workers send results of two sizes, and the coordinator's
CPU time (its process CPU clock, read from here to the nanosecond; a loaded
machine inflates CPU seconds far less than wall time) gives, per coordinator
core:

* steps/s and MB/s of delivered step data (the batch's arrays);
* CPU per delivered step and per result message;
* ``a + b * steps + c * results`` fitted over the requests (non-negative
  least squares): ``b`` per step, ``c`` per result, ``a`` per request;
* the learner's own CPU per delivered step (``time.process_time``).

The workers' results travel on their Join streams (``--carrier join``, gRPC)
or on their lease data connections (``--carrier data``: framed TCP, what a
remote worker that hosts leases uses; leases.proto, "Results on the lease
data channel"), where their Tasks and Cancels come too when the coordinator
grants ``rlfleet.data-tasks``; ``--carrier both`` measures each.

``--shapes cartpole-fragments`` measures fragment windows instead (the
learner's ``obtain_fragments``): the workers answer each FRAGMENTS task's
rounds with windows of their streams, serialized once per phase
(:mod:`benchmarks.capacity_windows`); the two settings are fragment lengths.

``--threads`` (Linux) adds, per result size, the coordinator's CPU and
context switches per result by thread group, read from ``/proc`` around
the same timed requests (:mod:`benchmarks.capacity_threads`).

docs/performance.md ("Coordinator capacity: the model") turns these into workers per
coordinator core.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks import capacity_threads
from benchmarks.capacity_workers import (
    CARRIERS,
    FRAGMENT_SHAPES,
    SHAPES,
    START_SECONDS,
    Shape,
    SyntheticWorker,
)
from benchmarks.worker_threads import thread_names
from rlfleet.client import RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.errors import NotInstalledError

# --- the measurement -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """One timed request.

    Attributes:
        result_episodes: Episodes per result the workers sent (fragments: the
            fragment length).
        steps: Steps delivered.
        data_bytes: Bytes of the delivered batch's step arrays.
        results: Results the workers sent meanwhile.
        messages: Messages they came in.
        tasks: Task messages the workers got meanwhile (refills included).
        coordinator_cpu: The coordinator's CPU seconds.
        learner_cpu: This process's CPU seconds.
        threads: With ``--threads``: ``{group: [CPU ns, voluntary, involuntary
            context switches]}`` of the coordinator's threads
            (:mod:`benchmarks.capacity_threads`); else empty.
    """

    result_episodes: int
    steps: int
    data_bytes: int
    results: int
    messages: int
    tasks: int
    coordinator_cpu: float
    learner_cpu: float
    threads: dict[str, list[int]] = dataclasses.field(default_factory=dict)


def _counts(files: Sequence[Path]) -> tuple[int, int, int]:
    """The workers' results, messages and tasks so far."""
    results = messages = tasks = 0
    for path in files:
        text = path.read_text().split() if path.exists() else []
        if len(text) == 3:
            results += int(text[0])
            messages += int(text[1])
            tasks += int(text[2])
    return results, messages, tasks


def _settled(files: Sequence[Path], quiet: float = 0.3) -> tuple[int, int, int]:
    """The workers' counts once they have not moved for ``quiet`` seconds."""
    deadline = time.monotonic() + START_SECONDS
    last, since = _counts(files), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _counts(files)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise TimeoutError(f"the workers' counts kept moving for {START_SECONDS:g} s")


def _wait_for_port(port_file: Path, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return int(text)
        if process.poll() is not None:
            raise RuntimeError(f"the coordinator exited with {process.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"the coordinator wrote no port file within {START_SECONDS:g} s")


def _batch_bytes(batch: EpisodeBatch) -> int:
    return sum(
        np.asarray(getattr(batch, name)).nbytes
        for name in ("observations", "last_observations", "actions", "rewards", "step_types")
    )


def _cpu_clock(pid: int) -> Callable[[], float]:
    """Return a reader of process ``pid``'s CPU seconds, all threads together.

    Linux keeps a nanosecond CPU clock per process that other processes may
    read (clock id ``(~pid << 3) | 2``, what ``clock_getcpuclockid`` returns).
    The tick-counted ``/proc`` figures psutil reads move in 10 ms steps,
    coarser than a small request's whole coordinator cost.
    """
    if sys.platform == "linux":
        clock = (~pid << 3) | 2
        time.clock_gettime(clock)
        return lambda: time.clock_gettime(clock)
    process = psutil.Process(pid)
    return lambda: float(sum(process.cpu_times()[:2]))


@contextlib.contextmanager
def _stopping(processes: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        # The coordinator first: its workers then see their streams end and exit.
        for process in processes:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)


def measure(
    shape: Shape,
    *,
    workers: int,
    num_envs: int,
    repeats: int,
    carrier: str = "join",
    threads: bool = False,
) -> list[Request]:
    """Runs ``shape``'s requests against a fresh coordinator and synthetic workers
    whose results take ``carrier`` (``join`` or ``data``); with ``threads``, each
    request also reads the coordinator's threads (:attr:`Request.threads`)."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-capacity-") as name:
        return _measure(
            Path(name),
            shape,
            workers=workers,
            num_envs=num_envs,
            repeats=repeats,
            carrier=carrier,
            threads=threads,
        )


def _measure(
    directory: Path,
    shape: Shape,
    *,
    workers: int,
    num_envs: int,
    repeats: int,
    carrier: str,
    threads: bool,
) -> list[Request]:
    port_file, control = directory / "port", directory / "result-episodes"
    control.write_text(str((shape.fragment_lengths or shape.result_episodes)[0]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "rlfleet", "--log-level", "ERROR", "coordinator",
         "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--env", shape.env_id,
         "--capacity-steps", str(shape.capacity_steps)],
        env=env,
    )  # fmt: skip
    processes = [coordinator]
    with _stopping(processes):
        address = f"127.0.0.1:{_wait_for_port(port_file, coordinator)}"
        count_files = [directory / f"counts-{i}" for i in range(workers)]
        for count_file in count_files:
            processes.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "benchmarks.capacity", "--serve-worker", address),
                        *("--envs", str(num_envs), "--episode-steps", str(shape.episode_steps)),
                        *("--control", str(control), "--counts", str(count_file)),
                        *("--carrier", carrier),
                    ],
                    env=env,
                )
            )
        sampler = RemoteSampler(address, seed=0, timeout=600, wait_for_workers=START_SECONDS)
        with sampler:
            _wait_for_workers(sampler, workers)
            fragments = shape.fragment_lengths

            def obtain(itr: int, setting: int, steps: int) -> EpisodeBatch:
                if fragments:
                    return sampler.obtain_fragments(steps, setting)
                return sampler.obtain_samples(itr, steps)

            settings = fragments or shape.result_episodes
            obtain(0, settings[0], shape.request_steps[0])  # warm-up
            cpu = _cpu_clock(coordinator.pid)
            # Named outside the timed windows: naming (py-spy dump) pauses the coordinator.
            names = thread_names(coordinator.pid) if threads else {}
            readings: list[tuple[capacity_threads.Counters, capacity_threads.Counters]] = []
            rows = []
            itr = 1
            for per_result in settings:
                control.write_text(str(per_result))
                if per_result != settings[0]:
                    # Untimed, as the first setting's: a coordinator's receive
                    # buffers grow to the frames of this size in flight once.
                    obtain(itr, per_result, shape.request_steps[0])
                    itr += 1
                for steps in shape.request_steps:
                    for _ in range(repeats):
                        before = _settled(count_files)
                        threads_before = (
                            capacity_threads.thread_counters(coordinator.pid) if threads else {}
                        )
                        coordinator_before = cpu()
                        learner_before = time.process_time()
                        batch = obtain(itr, per_result, steps)
                        learner_cpu = time.process_time() - learner_before
                        after = _settled(count_files)
                        coordinator_cpu = cpu() - coordinator_before
                        if threads:
                            readings.append(
                                (threads_before, capacity_threads.thread_counters(coordinator.pid))
                            )
                        itr += 1
                        rows.append(
                            Request(
                                per_result,
                                batch.total_steps,
                                _batch_bytes(batch),
                                after[0] - before[0],
                                after[1] - before[1],
                                after[2] - before[2],
                                coordinator_cpu,
                                learner_cpu,
                            )
                        )
                        del batch
            if threads:  # threads born during the run: named now, still outside the windows
                names = {**thread_names(coordinator.pid), **names}
                rows = [
                    dataclasses.replace(row, threads=capacity_threads.grouped(b, a, names))
                    for row, (b, a) in zip(rows, readings, strict=True)
                ]
        return rows


def _wait_for_workers(sampler: RemoteSampler, count: int) -> None:
    deadline = time.monotonic() + START_SECONDS
    while len(sampler.status().workers) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} synthetic workers did not join within {START_SECONDS} s")
        time.sleep(0.1)


def nonnegative_fit(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (costs are never negative).

    Exact for a few columns: the best unconstrained fit over every subset of
    columns whose coefficients all come out non-negative.
    """
    columns = design.shape[1]
    best, best_error = np.zeros(columns), float(np.sum(target**2))
    for size in range(1, columns + 1):
        for subset in itertools.combinations(range(columns), size):
            coef, *_ = np.linalg.lstsq(design[:, subset], target, rcond=None)
            if np.any(coef < 0):
                continue
            error = float(np.sum((design[:, subset] @ coef - target) ** 2))
            if error < best_error:
                best, best_error = np.zeros(columns), error
                best[list(subset)] = coef
    return best


def summarize(shape: Shape, rows: Sequence[Request], carrier: str = "join") -> dict[str, Any]:
    """The report of one shape: per result size, and the fit over all its requests."""
    settings = []
    for per_result in shape.fragment_lengths or shape.result_episodes:
        mine = [r for r in rows if r.result_episodes == per_result]
        steps = sum(r.steps for r in mine)
        cpu = sum(r.coordinator_cpu for r in mine)
        results = sum(r.results for r in mine)
        setting: dict[str, Any] = {}
        settings.append(setting)
        setting.update(
            {
                # A window: every stream's fragment (the learner's answer may end sooner).
                "result_steps": steps // max(results, 1)
                if shape.fragment_lengths
                else per_result * shape.episode_steps,
                "requests": len(mine),
                "steps": steps,
                "results": results,
                "messages": sum(r.messages for r in mine),
                "tasks_per_result": sum(r.tasks for r in mine) / max(results, 1),
                "coordinator_us_per_step": cpu / steps * 1e6,
                "coordinator_us_per_result": cpu / max(results, 1) * 1e6,
                "steps_per_core_second": steps / cpu if cpu > 0 else math.inf,
                "mb_per_core_second": sum(r.data_bytes for r in mine) / cpu / 1e6
                if cpu > 0
                else math.inf,
                "learner_us_per_step": sum(r.learner_cpu for r in mine) / steps * 1e6,
            }
        )
        if any(r.threads for r in mine):
            totals: dict[str, list[int]] = {}
            for r in mine:
                for group, counts in r.threads.items():
                    total = totals.setdefault(group, [0] * len(counts))
                    for i, count in enumerate(counts):
                        total[i] += count
            setting["threads"] = capacity_threads.per_result(totals, results)
    design = np.array([[1.0, r.steps, r.results] for r in rows])
    per_request, per_step, per_result_cpu = nonnegative_fit(
        design, np.array([r.coordinator_cpu for r in rows])
    )
    steps = sum(r.steps for r in rows)
    return {
        "shape": shape.name,
        "carrier": carrier,
        "bytes_per_step": sum(r.data_bytes for r in rows) / steps,
        "settings": settings,
        "fit": {
            "us_per_step": per_step * 1e6,
            "us_per_result": per_result_cpu * 1e6,
            "ms_per_request": per_request * 1e3,
        },
    }


def _print(report: dict[str, Any]) -> None:
    print(
        f"{report['shape']}, results on {report['carrier']}: "
        f"{report['bytes_per_step']:,.0f} bytes of step data per step"
    )
    print(
        f"  {'result steps':>12} {'requests':>8} {'steps':>9} {'results':>7} {'msgs':>6} "
        f"{'coord us/step':>13} {'coord us/result':>15} {'steps/s/core':>13} "
        f"{'MB/s/core':>9} {'learner us/step':>15} {'tasks/result':>12}"
    )
    for s in report["settings"]:
        print(
            f"  {s['result_steps']:>12,} {s['requests']:>8} {s['steps']:>9,} "
            f"{s['results']:>7} {s['messages']:>6} {s['coordinator_us_per_step']:>13.3f} "
            f"{s['coordinator_us_per_result']:>15.0f} {s['steps_per_core_second']:>13,.0f} "
            f"{s['mb_per_core_second']:>9,.0f} {s['learner_us_per_step']:>15.3f} "
            f"{s['tasks_per_result']:>12.2f}"
        )
        for group, t in s.get("threads", {}).items():
            print(
                f"    {group:>32}: {t['us_per_result']:8.1f} us/result, context switches per "
                f"result {t['voluntary_per_result']:6.2f} voluntary "
                f"{t['involuntary_per_result']:6.2f} involuntary, "
                f"{t['minor_faults_per_result']:6.1f} minor faults"
            )
    fit = report["fit"]
    print(
        f"  fit: {fit['us_per_step']:.3f} us per step + {fit['us_per_result']:.0f} us per "
        f"result + {fit['ms_per_request']:.2f} ms per request (coordinator CPU)"
    )


def run(
    shapes: Sequence[Shape],
    *,
    workers: int = 2,
    num_envs: int = 64,
    repeats: int = 1,
    carriers: Sequence[str] = ("join",),
    threads: bool = False,
) -> list[dict[str, Any]]:
    """Measures every shape over every carrier; returns one report each (see :func:`summarize`).

    With ``threads``, each setting also has ``threads``: the coordinator's CPU
    and context switches per result by thread group (:mod:`benchmarks.capacity_threads`).
    """
    reports = []
    for shape in shapes:
        for carrier in carriers:
            rows = measure(
                shape,
                workers=workers,
                num_envs=num_envs,
                repeats=repeats,
                carrier=carrier,
                threads=threads,
            )
            report = summarize(shape, rows, carrier)
            _print(report)
            reports.append(report)
    return reports


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__)
    parser.add_argument("--workers", type=int, default=2, help="synthetic workers")
    parser.add_argument("--envs", type=int, default=64, help="Hello.num_envs of each")
    parser.add_argument("--repeats", type=int, default=2, help="requests per setting")
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=[s.name for s in SHAPES],
        choices=[s.name for s in (*SHAPES, *FRAGMENT_SHAPES)],
        help="step sizes to measure; cartpole-fragments: fragment windows (obtain_fragments)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplies every request's steps (tiny runs)"
    )
    parser.add_argument(
        "--carrier",
        choices=(*CARRIERS, "both"),
        default="both",
        help="where the workers' results travel: their Join streams (gRPC), their lease data "
        "connections (framed TCP), or both, measured one after the other",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also the coordinator's CPU and context switches per result by thread group, from "
        "/proc/<pid>/task/*/schedstat and status around each timed request (Linux only; "
        "threads named by py-spy dump when it is on the PATH)",
    )
    # A synthetic worker's own process (started by the benchmark).
    parser.add_argument("--serve-worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--episode-steps", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--control", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--counts", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark (or, with ``--serve-worker``, one synthetic worker)."""
    args = _parser().parse_args(argv)
    if args.serve_worker:
        return SyntheticWorker(
            args.serve_worker,
            num_envs=args.envs,
            episode_steps=args.episode_steps,
            control=args.control,
            counts=args.counts,
            carrier=args.carrier,
        ).run()
    by_name = {shape.name: shape for shape in (*SHAPES, *FRAGMENT_SHAPES)}
    shapes = [
        dataclasses.replace(
            by_name[name],
            request_steps=tuple(
                max(int(steps * args.scale), 1) for steps in by_name[name].request_steps
            ),
        )
        for name in args.shapes
    ]
    if args.threads:
        try:
            capacity_threads.require_proc()
        except NotInstalledError as error:
            print(f"python -m benchmarks.capacity: {error}", file=sys.stderr)
            return 2
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores")
    carriers = CARRIERS if args.carrier == "both" else (args.carrier,)
    run(
        shapes,
        workers=args.workers,
        num_envs=args.envs,
        repeats=args.repeats,
        carriers=carriers,
        threads=args.threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
