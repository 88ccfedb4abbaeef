"""``rlfleet bench``: fleet sampling throughput against the plain loop and vector envs.

The measurement lives in :mod:`rlfleet.bench` (shared with
``benchmarks/fleet.py``); this module only wires it to the command line.
"""

from __future__ import annotations

import argparse
from typing import Literal

from rlfleet import bench
from rlfleet.cli._parser import add_command
from rlfleet.cli._settings import CommandSettings, NonNegativeInt, PositiveInt, option

_DEFAULTS = bench.BenchConfig()


class BenchSettings(CommandSettings):
    """The options of ``rlfleet bench`` (and ``benchmarks/fleet.py``)."""

    workers: PositiveInt = option(_DEFAULTS.workers, "fleet workers and plain loops")
    envs_per_worker: PositiveInt = option(_DEFAULTS.envs_per_worker, "envs per worker")
    steps: PositiveInt = option(_DEFAULTS.steps, "env steps per timed run")
    request_steps: PositiveInt = option(
        _DEFAULTS.request_steps, "num_samples of each fleet request"
    )
    repeats: PositiveInt = option(_DEFAULTS.repeats, "timed runs per sampler")
    seed: NonNegativeInt = option(_DEFAULTS.seed, "seed")
    prefetch_factor: NonNegativeInt | None = option(
        None, "the coordinator's prefetch_factor", shown="the coordinator's own"
    )
    coordinators: PositiveInt = option(
        _DEFAULTS.coordinators,
        "the fleet's coordinators: 1 in the learner's process, N > 1 as N coordinator "
        "processes with the workers dealt among them (Fleet.local(coordinators=N))",
    )
    # The values of rlfleet.envs.native.NATIVE_VECTORIZATIONS.
    native: Literal["vector_entry_point", "envpool"] | None = option(
        None,
        "measure the fleet on this native vector-env backend against the same env in plain "
        "loops, and the 1M steps/s moonshot (use --envs-per-worker 64)",
    )
    pin: bool = option(
        False,
        "pin fleet worker i and plain loop i to the same CPU, the i-th this process may use "
        '(Fleet.local(cpu_affinity="auto")); by default neither is pinned, as Fleet.local '
        "leaves its workers",
    )
    check: bool = option(False, "exit 1 if a ratio misses its goal (on a quiet machine)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``bench`` subcommand."""
    add_command(
        subparsers,
        "bench",
        BenchSettings,
        bench.run_from_args,
        help="measure fleet sampling throughput against the plain loop and vector envs",
        description=(
            "In one run, measure W plain single-process sampling loops at once, one "
            "VecWorker of K envs in this process, gymnasium's SyncVectorEnv and "
            "AsyncVectorEnv with W x K envs, and the end-to-end obtain_samples throughput "
            "of an embedded local fleet (W workers x K envs, CartPole-v1, mlp-categorical "
            "32x32). Print steps/s, each process's CPU us per step, and the ratios with "
            "their goals (fleet >= 0.9 x the plain processes; VecWorker >= 0.9 x the plain "
            "loop per CPU-second)."
        ),
    )
