"""Environment-variable defaults for command-line flags.

Containers and Kubernetes set configuration through the environment (a
ConfigMap's keys, the pod's name), so a flag may take its default from a
variable: the command line wins over the variable, the variable over the
built-in default. ``--help`` names the variable of every such flag.

The variable's text is handed to argparse as a string default, which
argparse converts with the flag's ``type`` only when the flag is absent:
a malformed variable never breaks a command that does not use it, and is
overridden by an explicit flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

#: Every variable that names a flag default starts with this.
PREFIX = "RLFLEET_"


class _FromEnv(str):
    """A default that came from an environment variable (for error messages)."""

    variable: str

    def __new__(cls, value: str, variable: str) -> _FromEnv:
        text = super().__new__(cls, value)
        text.variable = variable
        return text


def env_option(
    variable: str,
    *,
    default: Any,
    type: Callable[[str], Any] = str,
    help: str,
) -> dict[str, Any]:
    """Keyword arguments for ``add_argument`` of a flag with an env-var default.

    Example::

        parser.add_argument("--seed", **env_option(
            "RLFLEET_SEED", default=0, type=int, help="base seed"))

    Args:
        variable: The environment variable, ``RLFLEET_...``.
        default: The value when neither the flag nor the variable is set.
        type: Converts the flag's text (and the variable's); raises
            ValueError, TypeError or argparse.ArgumentTypeError on bad text.
        help: The flag's help; the default and the variable are appended.

    Returns:
        ``default``, ``type`` and ``help`` for ``parser.add_argument``.
    """
    if not variable.startswith(PREFIX):
        raise ValueError(f"environment variable {variable!r} must start with {PREFIX}")
    raw = os.environ.get(variable, "").strip()
    value: Any = _FromEnv(raw, variable) if raw else default
    shown = "none" if default is None else default
    return {
        "default": value,
        "type": _naming_variable(type),
        "help": f"{help} (default: {shown}; env {variable})",
    }


def _naming_variable(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wraps a converter so that bad variable text names the variable."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            if isinstance(text, _FromEnv):
                # argparse reports ArgumentTypeError's text after the flag's
                # name; saying where the value came from is the useful part.
                raise argparse.ArgumentTypeError(
                    f"environment variable {text.variable}={str(text)!r} is invalid ({exc}); "
                    "fix or unset it, or pass the flag"
                ) from exc
            raise

    # argparse names the type in "invalid <type> value" messages.
    parse.__name__ = getattr(convert, "__name__", "value")
    return parse
