"""``rlfleet bench``: fleet sampling throughput against the plain loop and vector envs.

The measurement lives in :mod:`rlfleet.bench` (shared with
``benchmarks/fleet.py``); this module only wires it to the command line.
"""

from __future__ import annotations

import argparse

from rlfleet import bench


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
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
    bench.add_arguments(parser)
    parser.set_defaults(func=bench.run_from_args)
