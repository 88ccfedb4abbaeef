"""Environment variables and config files for command-line options.

Containers and Kubernetes configure through the environment (a ConfigMap's
keys, the pod's name) and through files, so every option of every
subcommand has an ``RLFLEET_*`` variable, and the coordinator and worker
read a TOML file (``--config``). Precedence: flag > variable > file >
built-in default.

The variable is derived from the option's one declaration: by default
``RLFLEET_`` + its long flag in capitals (``--max-workers`` ->
``RLFLEET_MAX_WORKERS``); :func:`env_option` names another one where a
deployment already uses it (``--envs`` -> ``RLFLEET_ENVS_PER_WORKER``).
:func:`bind_environment` walks every parser once it is built, so an option
cannot be added without its variable; ``--help`` names each one.

The variable's (or the file's) text is handed to argparse as a string
default, which argparse converts with the flag's ``type`` only when the flag
is absent: a malformed variable never breaks a command that does not use
it, is overridden by an explicit flag, and its error names where it came
from.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rlfleet.errors import ConfigError

#: Every variable that names a flag default starts with this.
PREFIX = "RLFLEET_"
_VARIABLE = "_rlfleet_variable"  # attribute on a bound action: its variable
_ELSEWHERE = "_rlfleet_read_elsewhere"  # its command reads the variable itself
_FROM_ENV = "_rlfleet_from_env"  # its variable set its default
# A hand-written default at the end of a help: "(default: 10)", "(default
# CartPole-v1)", "(600)", "(none)".
_DEFAULT_SUFFIX = re.compile(r"\s*\((default[: ][^()]*(\([^()]*\)[^()]*)*|[0-9][0-9_,.]*|none)\)$")
#: Options that select configuration instead of being part of it.
_NOT_CONFIGURABLE = {"print_config"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _Sourced(str):
    """A default's text and where it came from (for error messages)."""

    source: str

    def __new__(cls, value: str, source: str) -> _Sourced:
        text = super().__new__(cls, value)
        text.source = source
        return text


def env_option(
    variable: str,
    *,
    default: Any,
    type: Callable[[str], Any] = str,
    help: str,
) -> dict[str, Any]:
    """Keyword arguments for ``add_argument`` of a flag with a named variable.

    Use it only where the derived name (``RLFLEET_`` + the flag) will not do.

    Example::

        parser.add_argument("--envs", **env_option(
            "RLFLEET_ENVS_PER_WORKER", default=1, type=int, help="env slots"))

    Args:
        variable: The environment variable, ``RLFLEET_...``.
        default: The value when neither the flag nor the variable is set.
        type: Converts the flag's text (and the variable's); raises
            ValueError, TypeError or argparse.ArgumentTypeError on bad text.
        help: The flag's help; the default and the variable are appended
            when the parser is bound.

    Returns:
        ``default``, ``type`` and ``help`` for ``parser.add_argument``.
    """
    if not variable.startswith(PREFIX):
        raise ValueError(f"environment variable {variable!r} must start with {PREFIX}")
    convert = _sourced(type)
    setattr(convert, _VARIABLE, variable)
    return {"default": default, "type": convert, "help": help}


def read_elsewhere(action: argparse.Action, variable: str) -> None:
    """Marks an option whose command reads its variable itself (a token).

    Such a variable never becomes the flag's default (a token given by flag
    is logged as visible in the process list), and config files may not set
    the option (secrets belong in files of their own or the environment).
    """
    setattr(action, _VARIABLE, variable)
    setattr(action, _ELSEWHERE, True)


def is_read_elsewhere(action: argparse.Action) -> bool:
    """Whether :func:`read_elsewhere` marked the option."""
    return bool(getattr(action, _ELSEWHERE, False))


def variable_of(action: argparse.Action) -> str:
    """The ``RLFLEET_*`` variable of an option: named, or derived from its flag."""
    named = getattr(action.type, _VARIABLE, None) or getattr(action, _VARIABLE, None)
    if named:
        return str(named)
    flag = max(action.option_strings, key=len)
    return PREFIX + flag.lstrip("-").upper().replace("-", "_")


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The options of one parser that take a value from the environment."""
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if action.dest in _NOT_CONFIGURABLE:
            continue
        yield action


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bind_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Gives every option of ``parser`` and its subcommands its variable.

    Sets the default of each option whose variable is set, and names the
    variable in its help.
    """
    for action in options(parser):
        variable = variable_of(action)
        setattr(action, _VARIABLE, variable)
        if is_read_elsewhere(action):
            continue  # its help names its variables already
        # One "(default: ...; env ...)" suffix for all: a hand-written default
        # is dropped, unless it says more than "none" (a derived default).
        help_text = action.help or ""
        described = action.default is None and _DEFAULT_SUFFIX.search(help_text)
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            action.help = f"{help_text} (env {variable}=1)"
        elif described:
            action.help = f"{help_text} (env {variable})"
        else:
            shown = "none" if action.default is None else action.default
            action.help = f"{_DEFAULT_SUFFIX.sub('', help_text)} (default: {shown}; env {variable})"
        raw = environ.get(variable)
        if raw is not None and raw.strip():
            set_default(action, raw.strip(), f"environment variable {variable}")
            setattr(action, _FROM_ENV, True)
    for sub in subcommands(parser).values():
        bind_environment(sub, environ)


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


def from_environment(action: argparse.Action) -> bool:
    """Whether an option's default came from its environment variable."""
    return bool(getattr(action, _FROM_ENV, False))


def set_default(action: argparse.Action, value: Any, source: str) -> None:
    """Makes ``value`` (text, or a TOML value) an option's default.

    Raises:
        ConfigError: For a value of the wrong kind; names ``source``.
    """
    action.required = False  # the value is given, just not as a flag
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        action.default = _boolean(value, source)
        return
    if isinstance(action, argparse._AppendAction):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{source} must be a list of strings, got {value!r}")
        action.default = [_Sourced(_text(item, source), source) for item in items if item != ""]
        if action.type is not None:
            action.default = [_convert(action, item) for item in action.default]
        return
    action.default = _Sourced(_text(value, source), source)
    if not getattr(action.type, "_rlfleet_sourced", False):
        action.type = _sourced(action.type if callable(action.type) else str)
    if action.choices is not None:
        _check_choice(action, action.default)


def _convert(action: argparse.Action, text: _Sourced) -> Any:
    convert = action.type if callable(action.type) else str
    try:
        return convert(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{text.source}={str(text)!r} is invalid ({exc})") from exc


def _check_choice(action: argparse.Action, text: _Sourced) -> None:
    choices = list(action.choices or ())
    if text not in choices:
        raise ConfigError(
            f"{text.source}={str(text)!r} is not one of {', '.join(map(str, choices))}; "
            "fix or unset it"
        )


def _text(value: Any, source: str) -> str:
    """The command-line text of a TOML or environment value."""
    import json

    if isinstance(value, bool):
        raise ConfigError(f"{source} is a boolean ({value}); this option takes a value")
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _boolean(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{source}={value!r} is not a boolean; use 1/0, true/false or yes/no")


def _sourced(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wraps a converter so that a bad default's error names where it came from."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            if isinstance(text, _Sourced):
                # argparse reports ArgumentTypeError's text after the flag's
                # name; saying where the value came from is the useful part.
                raise argparse.ArgumentTypeError(
                    f"{text.source}={str(text)!r} is invalid ({exc}); "
                    "fix or unset it, or pass the flag"
                ) from exc
            raise

    # argparse names the type in "invalid <type> value" messages.
    parse.__name__ = getattr(convert, "__name__", "value")
    parse._rlfleet_sourced = True  # type: ignore[attr-defined]
    named = getattr(convert, _VARIABLE, None)
    if named:
        setattr(parse, _VARIABLE, named)
    return parse
