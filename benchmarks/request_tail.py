"""A native worker's request tail, in one process: ``python -m benchmarks.request_tail``.

A fleet worker of a native vector env steps all its envs at every vector
step, however few of its slots run an episode the request still needs. Once
a request's units are all started (its queue is dry), its slots go idle one
by one as their episodes end, and the vector steps until the last one ends
(the request's *tail*) cost about what a full one does for a few rows each.
This runs the bench's ``VecWorker`` (CartPole's vector entry point, 64 envs,
an MLP 32x32 with a categorical sample) through back-to-back requests of
``--units`` episode units each, every unit submitted at the request's start
(a fleet worker's refills arrive while its queue still holds units), and
prints, for each request size, per request: its vector steps, those of its
tail and their rows, and the thread CPU of its vector steps per delivered
step, with the tail's share. No network, no coordinator: what a request
costs a worker beyond its steps because its episodes end one by one.

Its figures are one process's on a shared machine: compare request sizes
within a run, or trees in turns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker

#: The bench's native env and policy (``rlfleet bench --native vector_entry_point``).
ENV = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
HIDDEN_SIZES = (32, 32)


@dataclass
class RequestFigures:
    """Medians over the requests of one size."""

    units: int
    requests: int
    steps: float  # delivered steps per request
    vector_steps: float
    tail_vector_steps: float  # after the queue ran dry, fewer slots running than envs
    tail_rows: float  # the tail's recorded rows (its delivered steps)
    us_per_step: float  # vector steps' thread CPU per delivered step
    tail_share: float  # the tail's share of that CPU


def run_request(vec: VecWorker, units: int, request: int) -> list[int]:
    """Runs one request of ``units`` units (its id ``request``); returns its [steps,
    vector steps, tail vector steps, tail rows, CPU ns, tail CPU ns]."""
    n_envs = vec.n_envs
    vec.submit(make_units(1, request, range(units)))
    steps = vector_steps = tail = tail_rows = cpu = tail_cpu = 0
    while not vec.idle:
        dry = not vec.queued_count and vec.active_count < n_envs
        started = time.thread_time_ns()
        rows = vec.step()
        spent = time.thread_time_ns() - started
        steps, vector_steps, cpu = steps + rows, vector_steps + 1, cpu + spent
        if dry:
            tail, tail_rows, tail_cpu = tail + 1, tail_rows + rows, tail_cpu + spent
        if vec.finished_steps >= 16_384:  # a native worker's result size
            vec.take_finished_pieces(request=request)
    vec.take_finished_pieces(request=request)
    return [steps, vector_steps, tail, tail_rows, cpu, tail_cpu]


def measure(sizes: list[int], requests: int, n_envs: int = 64) -> list[RequestFigures]:
    """Runs each size's requests in turn with the others (one request of each per round)."""
    policy = MLPCategoricalPolicy(ENV.env_spec(), hidden_sizes=HIDDEN_SIZES, seed=1)
    vec = VecWorker(n_envs=n_envs, seed=1)
    try:
        vec.update_env(ENV)
        vec.update_agent(policy)
        run_request(vec, max(sizes), 0)  # warm-up: the ring grows to its size
        rows: dict[int, list[list[int]]] = {size: [] for size in sizes}
        request = 0
        for _ in range(requests):
            for size in sizes:
                request += 1
                rows[size].append(run_request(vec, size, request))
    finally:
        vec.shutdown()
    median = statistics.median
    out = []
    for size, runs in rows.items():
        out.append(
            RequestFigures(
                units=size,
                requests=len(runs),
                steps=median(r[0] for r in runs),
                vector_steps=median(r[1] for r in runs),
                tail_vector_steps=median(r[2] for r in runs),
                tail_rows=median(r[3] for r in runs),
                us_per_step=median(r[4] / r[0] / 1e3 for r in runs),
                tail_share=median(r[5] / r[4] for r in runs),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Prints the figures (``--json``: a list of objects); returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--units",
        type=int,
        nargs="+",
        default=[1_150, 4_600],
        help="episode units per request, one size per figure (default: about a 50,000- "
        "and a 200,000-step request's share of one of the bench's two workers)",
    )
    parser.add_argument("--requests", type=int, default=20, help="requests of each size")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = measure(args.units, args.requests, args.envs)
    if args.json:
        print(json.dumps([asdict(f) for f in figures]))
        return 0
    for f in figures:
        print(
            f"{f.units:6,} units ({f.steps:8,.0f} steps) per request, {f.requests} requests: "
            f"{f.vector_steps:5.0f} vector steps, {f.tail_vector_steps:3.0f} of them the tail "
            f"({f.tail_rows:4.0f} rows); {f.us_per_step:.3f} us per step, "
            f"{100 * f.tail_share:.1f}% of it the tail's"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
