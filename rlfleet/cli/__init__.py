"""The ``rlfleet`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``,
which adds a parser whose ``func`` default runs the command and returns an
exit code. Once every parser is built, each option gets its ``RLFLEET_*``
variable (``cli/_env.py``); commands with ``--config`` read a TOML file
(``cli/_config.py``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from rlfleet._version import __version__
from rlfleet.cli._config import apply_config_file, flags_given, print_config
from rlfleet.cli._env import bind_environment, misspelt_variables, subcommands
from rlfleet.cli._logging import configure_logging
from rlfleet.errors import REMOTE_TRACEBACK, RlfleetError

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


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Builds the argument parser with every available subcommand.

    Args:
        environ: Where ``RLFLEET_*`` defaults come from (default: ``os.environ``).

    Raises:
        ConfigError: If a variable of a boolean or choice option is malformed.
    """
    parser = argparse.ArgumentParser(
        prog="rlfleet",
        description="Collect reinforcement-learning experience on a fleet of workers.",
    )
    parser.add_argument("--version", action="version", version=f"rlfleet {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or JSON lines with timestamp, level, logger, worker, request and "
        "task ids",
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
    for name, sub in subparsers.choices.items():
        sub.set_defaults(command=name)
    bind_environment(parser, os.environ if environ is None else environ)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses a command line with its environment and config file.

    Raises:
        ConfigError: For a malformed variable or config file.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    command = getattr(args, "command", None)
    if command is None:
        return args
    sub = subcommands(parser)[command]
    if getattr(args, "config", None) is not None:
        apply_config_file(sub, command, args.config, COMMANDS)
        args = parser.parse_args(argv)
    if getattr(args, "print_config", False):
        sys.stdout.write(print_config(sub, args, flags_given(parser, argv)))
        args.func = lambda _args: 0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit code."""
    try:
        args = parse_args(argv)
    except RlfleetError as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    for name, meant in misspelt_variables(build_parser(), os.environ):
        logging.getLogger("rlfleet").warning(
            "%s is set, but no rlfleet option reads it: did you mean %s?", name, meant
        )
    func = getattr(args, "func", None)
    if func is None:
        build_parser().print_help()
        return 2
    try:
        return int(func(args))
    except RlfleetError as exc:
        print(f"rlfleet: error: {_without_remote_traceback(exc, args.log_level)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _without_remote_traceback(exc: RlfleetError, log_level: str) -> str:
    """The error as a user reads it: a peer's traceback only with ``--log-level DEBUG``."""
    text = str(exc)
    if REMOTE_TRACEBACK not in text or log_level.upper() == "DEBUG":
        return text
    message = text.split(REMOTE_TRACEBACK, maxsplit=1)[0]
    return f"{message} (`rlfleet --log-level DEBUG ...` shows the remote traceback)"


if __name__ == "__main__":
    sys.exit(main())
