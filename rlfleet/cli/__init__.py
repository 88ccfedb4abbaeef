"""The ``rlfleet`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``,
which adds a parser whose ``func`` default runs the command and returns an
exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from rlfleet._version import __version__
from rlfleet.errors import RlfleetError

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS = (
    "demo",
    "coordinator",
    "worker",
    "sample",
    "status",
    "bench",
    "health",
    "conformance",
)


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="rlfleet",
        description="Collect reinforcement-learning experience on a fleet of workers.",
    )
    parser.add_argument("--version", action="version", version=f"rlfleet {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: INFO)",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rlfleet.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"rlfleet.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except RlfleetError as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
