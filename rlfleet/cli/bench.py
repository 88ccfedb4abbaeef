"""``rlfleet bench``: fleet sampling throughput against single-process baselines.

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
        help="measure fleet sampling throughput against single-process baselines",
        description=(
            "Measure end-to-end obtain_samples throughput of an embedded local fleet "
            "(W workers x K envs, CartPole-v1, mlp-categorical 32x32) against one process "
            "stepping K envs (VecWorker) and gymnasium's AsyncVectorEnv with W x K envs, "
            "and print a table of steps/s and ratios."
        ),
    )
    bench.add_arguments(parser)
    parser.set_defaults(func=bench.run_from_args)
