"""``--config FILE.toml`` and ``--print-config`` of the long-running commands.

A config file holds option names (``max-workers = 128``, or with
underscores) at its top level, or in a table named after the command
(``[worker]``), which wins: one file can configure a coordinator and its
workers. Values are TOML values (numbers, strings, booleans, arrays,
tables for JSON options) or the text the flag takes (``"1GiB"``).
Precedence: flag > ``RLFLEET_*`` variable > file > built-in default.

``--print-config`` prints the settings a command would run with, as TOML
that ``--config`` reads back, each line saying where its value came from.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from rlfleet.cli._env import (
    from_environment,
    is_read_elsewhere,
    options,
    set_default,
    variable_of,
)
from rlfleet.errors import ConfigError

#: Options that pick the configuration rather than belong to it.
SELECTORS = {"config", "print_config"}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Adds ``--config`` and ``--print-config`` to a command."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file of option defaults (flag > environment > file > default)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the settings this command would run with (TOML, with sources) and exit",
    )


def apply_config_file(
    parser: argparse.ArgumentParser, command: str, path: Path, commands: Collection[str]
) -> None:
    """Makes the file's values the defaults of the options no variable sets.

    Args:
        parser: The command's parser.
        command: Its name (its table in the file wins over the top level).
        path: The TOML file.
        commands: Every command's name (their tables are theirs, not errors).

    Raises:
        ConfigError: If the file cannot be read or parsed, names an option
            the command does not have, or gives a value of the wrong kind.
    """
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    by_key = _keys(parser)
    section = document.get(command, {})
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [{command}] must be a table")
    # Another command's table is skipped; "coordinator" is also a worker option.
    values = {k: v for k, v in document.items() if not (k in commands and isinstance(v, dict))}
    values.update(section)
    for key, value in values.items():
        action = by_key.get(key.replace("_", "-"))
        if action is None:
            known = ", ".join(sorted(by_key))
            raise ConfigError(
                f"config file {path}: `rlfleet {command}` has no option {key!r} (tables may "
                f"only be named after commands: {', '.join(commands)}); its options: {known}"
            )
        if is_read_elsewhere(action):
            raise ConfigError(
                f"config file {path}: {key!r} is a secret; use {action.option_strings[0]}-file "
                f"or the environment variable {variable_of(action)}"
            )
        if from_environment(action):
            continue  # the variable wins over the file
        set_default(action, value, f"config file {path} key {key!r}")


def print_config(parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]) -> str:
    """The settings of ``args`` as TOML, each line with its source.

    Args:
        parser: The command's parser (after :func:`apply_config_file`).
        args: The parsed options.
        given: Destinations set by flags on the command line.
    """
    lines = []
    for action in options(parser):
        if action.dest in SELECTORS:
            continue
        key = max(action.option_strings, key=len).lstrip("-")
        value = getattr(args, action.dest, None)
        if action.dest in given:
            source = "flag"
        elif isinstance(action.default, str | list) and _source(action.default):
            source = _source(action.default)
        else:
            source = "default"
        if is_read_elsewhere(action):
            shown = "set (hidden)" if value else "unset"
            lines.append(f"# {key}: secret, {shown}; see {variable_of(action)}")
        elif value is None or value == []:
            lines.append(f"# {key} =  # unset ({source})")
        else:
            lines.append(f"{key} = {_toml(value)}  # {source}")
    return "\n".join(lines) + "\n"


def flags_given(root: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations that ``argv`` sets with flags (not defaults)."""
    saved = []
    for parser in _all_parsers(root):
        for action in parser._actions:
            saved.append((action, action.default))
            action.default = argparse.SUPPRESS
    try:
        namespace = root.parse_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return set(vars(namespace))


def _all_parsers(root: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [root]
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_parsers(sub))
    return found


def _keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        max(action.option_strings, key=len).lstrip("-"): action
        for action in options(parser)
        if action.dest not in SELECTORS
    }


def _source(default: str | list[Any]) -> str:
    first = default[0] if isinstance(default, list) and default else default
    return str(getattr(first, "source", ""))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, dict):
        return json.dumps(json.dumps(value))  # JSON options take JSON text
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(str(value))
