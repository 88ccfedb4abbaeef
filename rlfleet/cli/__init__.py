"""The ``rlfleet`` command line.

Each subcommand lives in its own module: a settings model (one field per
option: type, bounds, default, help, ``RLFLEET_*`` variable, config-file
key; ``cli/_settings.py``) and ``register(subparsers)``, which adds a parser
built from the model (``cli/_parser.py``) whose ``func`` default runs the
command and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Literal

from rlfleet._version import __version__
from rlfleet.cli._logging import configure_logging
from rlfleet.cli._parser import (
    SettingsParser,
    add_arguments,
    check_environment,
    misspelt_variables,
    print_config,
    subcommands,
)
from rlfleet.cli._settings import CommandSettings, option, settings_table
from rlfleet.errors import REMOTE_TRACEBACK, RlfleetError


class GlobalSettings(CommandSettings):
    """The options every command takes (before the command's name)."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = option("INFO", "logging level")
    log_format: Literal["text", "json"] = option(
        "text",
        "text lines, or JSON lines with timestamp, level, logger, worker, request and task ids",
    )


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
        environ: Where ``RLFLEET_*`` variables are read (default: ``os.environ``).

    Raises:
        ConfigError: If a variable of a switch or choice option is malformed.
    """
    environ = os.environ if environ is None else environ
    parser = SettingsParser(
        prog="rlfleet",
        description="Collect reinforcement-learning experience on a fleet of workers.",
    )
    parser.add_argument("--version", action="version", version=f"rlfleet {__version__}")
    add_arguments(parser, GlobalSettings)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rlfleet.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"rlfleet.cli.{name}":
                raise
            continue
        module.register(subparsers)
    for each in (parser, *subcommands(parser).values()):
        each.environ = environ  # type: ignore[attr-defined]
        each.commands = COMMANDS  # type: ignore[attr-defined]
        settings = getattr(each, "settings", None)
        if settings is not None:
            check_environment(settings, environ)
    for name, sub in subcommands(parser).items():
        sub.set_defaults(command=name)
    return parser


#: The commands whose options docs/operations.md's settings table lists.
DOCUMENTED = ("coordinator", "worker", "sample", "status", "health")


def settings_reference() -> str:
    """The Markdown table of docs/operations.md: every option of :data:`DOCUMENTED`."""
    parsers = subcommands(build_parser({}))
    models = {"rlfleet": GlobalSettings}
    models.update({name: parsers[name].settings for name in DOCUMENTED})  # type: ignore[attr-defined]
    return settings_table(models)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses a command line with its environment and config file.

    Raises:
        ConfigError: For a malformed variable or config file.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    command = getattr(args, "command", None)
    if command is not None and getattr(args, "print_config", False):
        sys.stdout.write(print_config(subcommands(parser)[command], args))
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
