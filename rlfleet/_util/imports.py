"""Resolving ``"package.module:name"`` import paths, and packages' names
imported on first use: the one place each is done.

Policies, callbacks, filters' owners and policy-mapping functions reach
workers as import paths of code installed there, never as pickles.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping
from typing import Any

from rlfleet.errors import ConfigError


def split_import_path(name: str) -> tuple[str, str] | None:
    """Splits ``"pkg.mod:Attr.Sub"`` into module and attribute path, or None."""
    module, sep, attribute = name.partition(":")
    parts = [*module.split("."), *attribute.split(".")]
    if not sep or not all(part.isidentifier() for part in parts):
        return None
    return module, attribute


def import_object(name: str, what: str, allowed_modules: Collection[str] | None = None) -> Any:
    """Imports the object an import path names.

    Args:
        name: ``"package.module:Attr"`` (``Attr`` may be dotted).
        what: What the object is for, e.g. ``"policy"``, for messages.
        allowed_modules: If not None, the module must be one of these or
            inside one of these packages; checked before anything is imported.

    Returns:
        The object.

    Raises:
        ConfigError: If the path is malformed, not allowed, cannot be
            imported, or names no attribute.
    """
    split = split_import_path(name) if isinstance(name, str) else None
    if split is None:
        raise ConfigError(f"{what} {name!r} is not an import path 'package.module:name'")
    module_name, attribute = split
    if allowed_modules is not None and not any(
        module_name == allowed or module_name.startswith(allowed + ".")
        for allowed in allowed_modules
    ):
        raise ConfigError(
            f"{what} {name!r}: module {module_name!r} is not allowed here "
            f"(allowed: {sorted(allowed_modules)}); allow it where the worker is started"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{what} {name!r}: cannot import module {module_name!r} ({exc}); "
            "install the package where it is used (the worker)"
        ) from exc
    except Exception as exc:  # the module's own code raised while importing
        raise ConfigError(
            f"{what} {name!r}: importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{what} {name!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


class LazyNames:
    """A package's names, each imported from its home module on first use.

    A package's ``__getattr__`` (PEP 562) returns ``lazy(name)``, so that
    importing the package does not import what only some callers need (gRPC,
    the conformance checks, ...).

    Args:
        package: The package's ``__name__``, for messages.
        homes: Each lazy name's home module.
    """

    def __init__(self, package: str, homes: Mapping[str, str]) -> None:
        self._package = package
        self._homes = dict(homes)

    def __call__(self, name: str) -> Any:
        """The object ``name`` names, from its home module."""
        home = self._homes.get(name)
        if home is None:
            # builtin on purpose: PEP 562 (hasattr, getattr's default and
            # `from package import name` rely on an AttributeError).
            raise AttributeError(f"module {self._package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)
