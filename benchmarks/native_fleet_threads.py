"""The native bench's fleet, CPU per step by thread: ``python -m benchmarks.native_fleet_threads``.

Starts the fleet ``rlfleet bench --native vector_entry_point`` times:
``Fleet.local(workers=W, envs_per_worker=K)`` on CartPole's vector entry
point, ``mlp-categorical`` 32x32, the coordinator in this process, an
agent update pushed with every request. ``--per-env`` starts the fleet
plain ``rlfleet bench`` times instead: one ``gymnasium.make`` CartPole per
slot, 8 slots per worker unless ``--envs`` says otherwise, 50,000-step
requests unless ``--request-steps`` does. After ``--warmup`` requests it
reads every thread's CPU (``/proc/<pid>/task/<tid>/schedstat``) and
context switches, of this process (the coordinator and the learner) and of
the workers, around ``--requests`` requests of ``--request-steps`` steps,
and prints each kind of thread's CPU microseconds per delivered step: the
coordinator's threads grouped as ``benchmarks.capacity --threads`` groups
them, the learner's main thread (the client) on its own line, the workers'
threads by name (``main`` is the stepping thread; grpcio's threads are
named from their stacks when ``py-spy`` is on the PATH).

It also prints the results the coordinator forwarded in those requests
(its ``rlfleet_results`` counter) and the steps per result they average:
a result costs the coordinator's threads and the learner's about the same
CPU whatever its size, so fewer steps per result than the worker's
``flush_steps`` (8,192) cost CPU per step (docs/performance.md, "The
coordinator's threads besides the result lane").

Linux only. Other processes' load adds to every figure: compare runs taking
turns with a baseline tree.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping

from benchmarks import capacity_threads, worker_threads
from rlfleet.bench.report import BenchConfig
from rlfleet.client import Fleet
from rlfleet.envs import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.policies.spec import PolicySpec

#: The learner's main thread: the client (receive, parse, place), not the coordinator.
LEARNER_MAIN = "learner main thread"
#: The bench's policy.
HIDDEN_SIZES = (32, 32)
#: ``rlfleet bench``'s defaults (slots per worker, steps per request) for ``--per-env``.
PER_ENV = BenchConfig()


def own_thread_names() -> dict[int, str]:
    """``{tid: name}`` of this process's threads: Python's names, else ``/proc`` comm."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    names[threading.main_thread().native_id or os.getpid()] = LEARNER_MAIN
    pid = os.getpid()
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) in names:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:
            continue
    return names


def _by_group(
    before: capacity_threads.Counters,
    after: capacity_threads.Counters,
    names: Mapping[int, str],
    group: bool,
) -> dict[str, list[int]]:
    """``{group or name: [CPU ns, voluntary, involuntary switches, minor faults]}``."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for tid, counts in after.items():
        start = before.get(tid, (0, 0, 0, 0))
        name = names.get(tid, str(tid))
        key = name if not group or name == LEARNER_MAIN else capacity_threads.group_of(name)
        for i, (a, b) in enumerate(zip(counts, start, strict=True)):
            totals[key][i] += a - b
    return totals


def _per_step(totals: Mapping[str, list[int]], steps: int) -> dict[str, dict[str, float]]:
    return {
        name: {
            "us_per_step": ns / max(steps, 1) / 1e3,
            "voluntary": float(voluntary),
            "involuntary": float(involuntary),
        }
        for name, (ns, voluntary, involuntary, _) in sorted(
            totals.items(), key=lambda item: -item[1][0]
        )
    }


def measure(
    workers: int,
    envs: int,
    request_steps: int,
    requests: int,
    warmup: int = 2,
    *,
    per_env: bool = False,
) -> dict[str, object]:
    """Runs the fleet and returns the figures (see the module docstring)."""
    capacity_threads.require_proc()
    env = EnvConfig("CartPole-v1", vectorization=None if per_env else "vector_entry_point")
    params = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=HIDDEN_SIZES, seed=1)
    update = params.get_param_values()
    policy = PolicySpec("mlp-categorical", {"hidden_sizes": list(HIDDEN_SIZES)})
    fleet = Fleet.local(workers=workers, envs_per_worker=envs, env=env, seed=1, policy=policy)
    with fleet as sampler:
        registry = fleet.server.coordinator.metrics.registry
        for itr in range(warmup):
            sampler.obtain_samples(itr, request_steps, agent_update=update)
        pids = [worker.process.pid for worker in fleet.workers]
        names: dict[int, str] = {}
        for pid in pids:
            names.update(worker_threads.thread_names(pid))
            names[pid] = "main"
        me = os.getpid()
        results_before = registry.get_sample_value("rlfleet_results_total") or 0.0
        before = capacity_threads.thread_counters(me)
        workers_before = {pid: capacity_threads.thread_counters(pid) for pid in pids}
        started = time.monotonic()
        steps = 0
        for itr in range(warmup, warmup + requests):
            steps += sampler.obtain_samples(itr, request_steps, agent_update=update).total_steps
        seconds = time.monotonic() - started
        after = capacity_threads.thread_counters(me)
        workers_after = {pid: capacity_threads.thread_counters(pid) for pid in pids}
        results = (registry.get_sample_value("rlfleet_results_total") or 0.0) - results_before
        own_names = own_thread_names()
    worker_totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for pid in pids:
        for name, counts in _by_group(
            workers_before[pid], workers_after[pid], names, False
        ).items():
            for i, count in enumerate(counts):
                worker_totals[name][i] += count
    learner = _per_step(_by_group(before, after, own_names, True), steps)
    workers_threads = _per_step(worker_totals, steps)
    return {
        "env": env.to_dict(),
        "envs_per_worker": envs,
        "steps": steps,
        "seconds": seconds,
        "results": results,
        "steps_per_result": steps / max(results, 1.0),
        # Every step passes the one coordinator: its threads' CPU over all steps.
        "learner_process_us_per_step": sum(t["us_per_step"] for t in learner.values()),
        # Summed over the workers, over all their steps: per worker, per its own step.
        "workers_us_per_step": sum(t["us_per_step"] for t in workers_threads.values()),
        "learner_process": learner,
        "workers": workers_threads,
    }


def main(argv: list[str] | None = None) -> int:
    """Prints the figures (``--json``: as one JSON object); returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--envs", type=int, help="envs of each worker (default: 64, with --per-env 8)"
    )
    parser.add_argument("--request-steps", type=int, help="default: 200,000, --per-env 50,000")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="requests before the timed ones")
    parser.add_argument(
        "--per-env", action="store_true", help="rlfleet bench's per-env fleet (gym.make envs)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    envs = args.envs or (PER_ENV.envs_per_worker if args.per_env else 64)
    request_steps = args.request_steps or (PER_ENV.request_steps if args.per_env else 200_000)
    figures = measure(
        args.workers, envs, request_steps, args.requests, args.warmup, per_env=args.per_env
    )
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"{figures['steps']:,} steps in {figures['seconds']:.2f} s, {figures['results']:.0f} "
        f"results ({figures['steps_per_result']:,.0f} steps each); load "
        f"{os.getloadavg()[0]:.2f}"
    )
    for title, key, total in (
        ("coordinator and learner (this process)", "learner_process", "learner_process"),
        ("workers (each, per step it takes)", "workers", "workers"),
    ):
        print(f"  {title}: {figures[f'{total}_us_per_step']:.4f} us per step")
        threads: dict[str, dict[str, float]] = figures[key]  # type: ignore[assignment]
        for name, t in threads.items():
            print(
                f"    {name:36s} {t['us_per_step']:8.4f} us/step  context switches "
                f"{t['voluntary']:7.0f} voluntary {t['involuntary']:7.0f} involuntary"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
