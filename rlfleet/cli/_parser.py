"""The argparse parser built from settings models, and where each value comes from.

:func:`add_command` turns a :class:`~rlfleet.cli._settings.CommandSettings`
model into a subcommand: one flag per field, whose ``--help`` ends with the
default and the ``RLFLEET_*`` variable. A :class:`SettingsParser` then
resolves every option of the command it parses, by precedence **flag >
variable > config file > built-in default**:

- a flag's text is converted and checked by argparse with the field's type
  (a bad flag is argparse's usual error, exit 2);
- a variable's text and a config file's value are converted with the same
  type when the command runs, and only for that command's options: a
  malformed variable never breaks a command that does not read it, is
  overridden by an explicit flag, and its error names the variable (or the
  file and key) and what to do (a malformed switch or choice variable is
  refused when the parser is built, whatever the command);
- a config file (``--config FILE`` or ``RLFLEET_CONFIG``) holds option keys
  (``max-workers = 128``, or with underscores) at its top level or in a
  table named after the command (``[worker]``), which wins.

Each value's source (``flag``, ``environment variable RLFLEET_SEED``,
``config file F key 'seed'``, ``default``) is kept for ``--print-config``,
which prints the settings as TOML that ``--config`` reads back.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from rlfleet.cli._settings import (
    PREFIX,
    CommandSettings,
    choices,
    config_error,
    convert,
    extras,
    fields,
    flag_of,
    is_internal,
    is_list,
    is_switch,
    key_of,
    shown_default,
    variable_name,
)
from rlfleet.errors import ConfigError

#: Where a parsed namespace keeps each option's source, for --print-config.
SOURCES = "settings_sources"
#: The option that names a config file (not a key a file may set).
CONFIG = "config"
_VARIABLE = "_rlfleet_variable"  # on each action: its variable


class SettingsParser(argparse.ArgumentParser):
    """An ArgumentParser that resolves its settings model's options after parsing.

    Attributes:
        settings: The command's model (None: no options of its own).
        environ: Where variables are read.
        commands: Every command's name: config-file tables named after them
            belong to those commands.
    """

    settings: type[CommandSettings] | None = None
    environ: Mapping[str, str] = {}
    commands: tuple[str, ...] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if self.settings is not None:
            _resolve(self, self.settings, parsed)
        return parsed, rest


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    settings: type[CommandSettings],
    run: Callable[[argparse.Namespace], int],
    **parser_kwargs: Any,
) -> argparse.ArgumentParser:
    """Adds a subcommand whose options are ``settings``' fields and which runs ``run``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, **parser_kwargs)
    add_arguments(parser, settings)
    parser.set_defaults(func=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser, settings: type[CommandSettings]) -> None:
    """Adds one flag per field of ``settings`` (and ``--print-config`` beside ``--config``).

    On a :class:`SettingsParser` the flags have no defaults (the parser
    resolves them); on a plain ArgumentParser they default to the model's
    defaults, so other tools can reuse a model's flags.
    """
    resolving = isinstance(parser, SettingsParser)
    if isinstance(parser, SettingsParser):
        parser.settings = settings
    groups: dict[str, Any] = {}
    for name, field in fields(settings):
        where = _container(parser, field, groups)
        variable = variable_name(name, field)
        kwargs = _argument(settings, name, field, resolving)
        action = where.add_argument(flag_of(name, field), **kwargs)
        if is_internal(field):
            action.help = argparse.SUPPRESS
            continue
        action.help = _help(field, variable)
        setattr(action, _VARIABLE, variable)
        if name == CONFIG:
            # Not a field: no variable (a container would print and exit), not a setting.
            where.add_argument(
                "--print-config",
                action="store_true",
                help="print the settings this command would run with (TOML, with sources) and exit",
            )


def _container(parser: argparse.ArgumentParser, field: FieldInfo, groups: dict[str, Any]) -> Any:
    declared = extras(field)
    title, exclusive = declared.get("group"), declared.get("exclusive")
    where: Any = parser
    if title is not None:
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        where = groups[title]
    if exclusive is not None:
        key = f"exclusive:{exclusive}"
        if key not in groups:
            groups[key] = where.add_mutually_exclusive_group()
        where = groups[key]
    return where


def _argument(
    settings: type[CommandSettings], name: str, field: FieldInfo, resolving: bool
) -> dict[str, Any]:
    declared = extras(field)
    default = argparse.SUPPRESS if resolving else field.get_default(call_default_factory=True)
    kwargs: dict[str, Any] = {"dest": name, "default": default}
    if is_switch(field):
        kwargs["action"] = "store_true"
        return kwargs
    if declared.get("metavar"):
        kwargs["metavar"] = declared["metavar"]
    if is_list(field):
        kwargs["action"] = "append"
        if not resolving:
            kwargs["default"] = list(default)
        return kwargs
    kwargs["type"] = _flag_type(settings, name)
    allowed = choices(field)
    if allowed is not None:
        kwargs["choices"] = allowed
    if declared.get("const") is not None:
        kwargs.update(nargs="?", const=declared["const"])
    if declared.get("required") and not resolving:
        kwargs["required"] = True
    return kwargs


def _flag_type(settings: type[CommandSettings], name: str) -> Callable[[str], Any]:
    """argparse type: the field's conversion, its error in argparse's words."""

    def parse(text: str) -> Any:
        try:
            return convert(settings, name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names it in "invalid <type> value"
    return parse


def _help(field: FieldInfo, variable: str) -> str:
    text = (field.description or "").replace("%", "%%")
    if extras(field).get("secret"):
        return text  # its help names its variables already
    if is_switch(field):
        return f"{text} (env {variable}=1)"
    return f"{text} (default: {shown_default(field).replace('%', '%%')}; env {variable})"


def _resolve(
    parser: SettingsParser, settings: type[CommandSettings], namespace: argparse.Namespace
) -> None:
    """Sets every option flags did not give from its variable, the config file or its default."""
    sources: dict[str, str] = dict(getattr(namespace, SOURCES, {}))
    options = dict(fields(settings))
    in_file: dict[str, tuple[Any, str]] = {}
    if CONFIG in options:  # first: the file is a source of the others
        path, sources[CONFIG] = _pick(parser, settings, CONFIG, namespace, in_file)
        setattr(namespace, CONFIG, path)
        if path is not None:
            in_file = _read_config(Path(path), parser.prog.split()[-1], settings, parser)
    for name, field in options.items():
        if name == CONFIG:
            continue
        value, sources[name] = _pick(parser, settings, name, namespace, in_file)
        if value is None and extras(field).get("required"):
            parser.error(
                f"the following arguments are required: {flag_of(name, field)} "
                f"(or {variable_name(name, field)})"
            )
        setattr(namespace, name, value)
    setattr(namespace, SOURCES, sources)


def _pick(
    parser: SettingsParser,
    settings: type[CommandSettings],
    name: str,
    namespace: argparse.Namespace,
    in_file: Mapping[str, tuple[Any, str]],
) -> tuple[Any, str]:
    """One option's value and source, by precedence: flag > variable > file > default."""
    if hasattr(namespace, name):  # flags have no defaults: present means given
        return getattr(namespace, name), "flag"
    field = settings.model_fields[name]
    flag, variable = flag_of(name, field), variable_name(name, field)
    raw = "" if is_internal(field) else parser.environ.get(variable, "").strip()
    if raw and not extras(field).get("secret"):  # a token's variable is read by its command
        source = f"environment variable {variable}"
        return _converted(settings, name, raw, source, flag), source
    if name in in_file:
        found, source = in_file[name]
        return _converted(settings, name, found, source, flag), source
    return copy.deepcopy(field.get_default(call_default_factory=True)), "default"


def _converted(
    settings: type[CommandSettings], name: str, value: Any, source: str, flag: str
) -> Any:
    try:
        return convert(settings, name, value)
    except ValueError as exc:
        raise config_error(source, value, str(exc), flag=flag) from None


def check_environment(settings: type[CommandSettings], environ: Mapping[str, str]) -> None:
    """Refuses a malformed switch or choice variable at once, whatever the command.

    Raises:
        ConfigError: Naming the variable and the values it takes.
    """
    for name, field in fields(settings):
        if not (is_switch(field) or choices(field)) or is_internal(field):
            continue
        variable = variable_name(name, field)
        raw = environ.get(variable, "").strip()
        if raw:
            _converted(
                settings, name, raw, f"environment variable {variable}", flag_of(name, field)
            )


def _read_config(
    path: Path,
    command: str,
    settings: type[CommandSettings],
    parser: SettingsParser,
) -> dict[str, tuple[Any, str]]:
    """The options a TOML file sets for ``command``: ``{field: (value, source)}``.

    Raises:
        ConfigError: If the file cannot be read or parsed, or names an option
            the command does not have, or a secret.
    """
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    by_key = {
        key_of(name, field): name
        for name, field in fields(settings)
        if name != CONFIG and not is_internal(field)
    }
    section = document.get(command, {})
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [{command}] must be a table")
    commands = parser.commands
    # Another command's table is skipped; "coordinator" is also a worker option.
    values = {k: v for k, v in document.items() if not (k in commands and isinstance(v, dict))}
    values.update(section)
    found = {}
    for key, value in values.items():
        name = by_key.get(key.replace("_", "-"))
        if name is None:
            known = ", ".join(sorted(by_key))
            raise ConfigError(
                f"config file {path}: `rlfleet {command}` has no option {key!r} (tables may "
                f"only be named after commands: {', '.join(commands)}); its options: {known}"
            )
        field = settings.model_fields[name]
        if extras(field).get("secret"):
            raise ConfigError(
                f"config file {path}: {key!r} is a secret; use {flag_of(name, field)}-file "
                f"or the environment variable {variable_name(name, field)}"
            )
        source = f"config file {path} key {key!r}"
        if isinstance(value, bool) and not is_switch(field):  # pydantic would take it as 0 or 1
            raise ConfigError(f"{source} is a boolean ({value}); this option takes a value")
        found[name] = (value, source)
    return found


def print_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The settings of ``args`` as TOML, each line with its source.

    Args:
        parser: The command's parser (its settings model lists the options).
        args: The parsed options.
    """
    settings = getattr(parser, "settings", None)
    if settings is None:
        return ""
    sources = getattr(args, SOURCES, {})
    lines = []
    for name, field in fields(settings):
        if name == CONFIG or is_internal(field):
            continue
        key = key_of(name, field)
        value = getattr(args, name, None)
        source = sources.get(name, "default")
        if extras(field).get("secret"):
            shown = "set (hidden)" if value else "unset"
            lines.append(f"# {key}: secret, {shown}; see {variable_name(name, field)}")
        elif value is None or value == []:
            lines.append(f"# {key} =  # unset ({source})")
        else:
            lines.append(f"{key} = {_toml(value)}  # {source}")
    return "\n".join(lines) + "\n"


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


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The options of one parser that take a value from a variable."""
    for action in parser._actions:
        if getattr(action, _VARIABLE, None) is not None:
            yield action


def variable_of(action: argparse.Action) -> str:
    """The ``RLFLEET_*`` variable of an option built by :func:`add_arguments`."""
    return str(getattr(action, _VARIABLE))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def misspelt_variables(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> list[tuple[str, str]]:
    """``(set, meant)`` for each ``RLFLEET_*`` variable no option reads but one nearly does.

    Only near misses are reported: other ``RLFLEET_*`` variables may belong
    to other tools (test harnesses), and a variable meant for another command
    (a ConfigMap shared by coordinator and workers) is read by some option.
    """
    known = {
        variable_of(action)
        for each in (parser, *subcommands(parser).values())
        for action in options(each)
    }
    found = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                found.append((name, close[0]))
    return found
