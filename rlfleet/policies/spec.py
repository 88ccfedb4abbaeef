"""Policy specs: which policy a worker builds, as JSON-able data (no pickle).

A spec is a name plus JSON keyword arguments. The name is a built-in
(``"random"``, ``"mlp-categorical"``, ``"mlp-gaussian"``), ``"torch"`` (a
PyTorch ``nn.Module`` named by its import path in the kwargs, see
:mod:`rlfleet.policies.torch`; needs the ``torch`` extra on the worker) or an
import path ``"package.module:Class"`` of a :class:`Policy` subclass
installed on the worker, constructed as ``Class(env_spec, **kwargs)``. On the wire a spec is
its compact JSON text ``{"name": ..., "kwargs": {...}}``: JSON keeps ints
as ints, which ``google.protobuf.Struct`` would not.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import gymnasium as gym

from rlfleet._util.imports import import_object, split_import_path
from rlfleet._util.values import json_value
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError
from rlfleet.policies._observations import ENCODABLE_SPACES
from rlfleet.policies.base import Policy
from rlfleet.policies.mlp import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.policies.random import RandomPolicy

#: The built-in policies by spec name. Every one takes ``seed`` and is
#: specified in docs/policies.md, so workers in other languages offer them.
BUILTIN_POLICIES: Mapping[str, type[Policy]] = MappingProxyType(
    {
        "random": RandomPolicy,
        "mlp-categorical": MLPCategoricalPolicy,
        "mlp-gaussian": MLPGaussianPolicy,
    }
)
#: Spec name of :class:`rlfleet.policies.torch.TorchPolicy`. Not a built-in:
#: it needs torch on the worker and its module's import path is checked
#: like any import-path policy.
TORCH_POLICY = "torch"


@dataclass(frozen=True)
class PolicySpec:
    """What policy to build: a built-in name or an import path, plus kwargs.

    Args:
        name: A key of :data:`BUILTIN_POLICIES`, or ``"package.module:Class"``
            (``Class`` may be dotted, e.g. ``"pkg.mod:Outer.Inner"``).
        kwargs: Keyword arguments of the policy's constructor. Must be JSON
            (str keys; str, int, float, bool, None, lists and dicts; no NaN or
            infinity). Stored as a normalised copy (tuples become lists), so
            a spec equals its JSON round trip.

    Raises:
        ConfigError: If the name is neither a built-in nor an import path, or
            the kwargs are not JSON.
    """

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not (
            self.name in BUILTIN_POLICIES
            or self.name == TORCH_POLICY
            or split_import_path(self.name) is not None
        ):
            raise ConfigError(
                f"policy spec name {self.name!r} is neither a built-in policy "
                f"({', '.join(BUILTIN_POLICIES)}), {TORCH_POLICY!r}, nor an import path "
                "'package.module:Class'"
            )
        object.__setattr__(self, "kwargs", _normalised_kwargs(self.kwargs, self.name))

    @property
    def is_builtin(self) -> bool:
        """True if the name is a built-in policy rather than an import path."""
        return self.name in BUILTIN_POLICIES

    def to_json(self) -> str:
        """Returns the compact JSON text ``{"name":...,"kwargs":{...}}``."""
        return json.dumps(
            {"name": self.name, "kwargs": self.kwargs}, separators=(",", ":"), allow_nan=False
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> PolicySpec:
        """Parses the text written by :meth:`to_json`.

        Args:
            text: A JSON object with ``"name"`` and optionally ``"kwargs"``.

        Raises:
            ConfigError: If the text is not such an object, or the spec is
                invalid.
        """
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"policy spec is not valid JSON ({exc}): {text[:200]!r}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ConfigError(
                'policy spec JSON must be an object {"name": str, "kwargs": {...}}, '
                f"got {text[:200]!r}"
            )
        unknown = sorted(set(data) - {"name", "kwargs"})
        if unknown:
            raise ConfigError(
                f"policy spec JSON has unknown keys {unknown}; only 'name' and 'kwargs' exist"
            )
        return cls(data["name"], data.get("kwargs", {}))

    def kwargs_json(self) -> str:
        """Returns the kwargs alone as compact JSON text (the proto's ``kwargs_json``)."""
        return json.dumps(self.kwargs, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_kwargs_json(cls, name: str, kwargs_json: str | bytes) -> PolicySpec:
        """Builds a spec from the proto's ``name`` and ``kwargs_json`` fields.

        Args:
            name: The policy name.
            kwargs_json: A JSON object text; empty means no kwargs (the
                proto3 default).

        Raises:
            ConfigError: If the text is not a JSON object, or the spec is
                invalid.
        """
        if not kwargs_json:
            return cls(name)
        return cls(name, json_value(kwargs_json, f"policy spec {name!r}: kwargs_json"))


def make_policy(
    spec: PolicySpec | str,
    env_spec: EnvSpec,
    *,
    seed: int | None = None,
    allowed_modules: Collection[str] | None = None,
) -> Policy:
    """Builds the policy a spec describes.

    Args:
        spec: A PolicySpec, a name (``"mlp-categorical"``,
            ``"pkg.mod:Class"``), or a spec's JSON text (starting with ``{``).
        env_spec: The spaces the policy acts in.
        seed: If not None, seeds the policy. Built-ins receive it as their
            ``seed`` argument (initial weights and generator), overriding a
            ``seed`` in the kwargs; other classes are built from the kwargs
            alone and then reseeded with ``policy.seed(seed)``.
        allowed_modules: If not None, an import path's module must be one of
            these or inside one of these packages; checked before anything is
            imported (a worker passes the modules its operator allowed, so a
            spec from the network cannot import arbitrary modules).

    Returns:
        The new policy.

    Raises:
        ConfigError: If the spec is invalid, its class cannot be imported or
            is not a Policy subclass, or the class rejects the kwargs.
    """
    spec = _as_spec(spec)
    if spec.name == TORCH_POLICY:
        return _torch_policy(spec, env_spec, seed, allowed_modules)
    cls = _policy_class(spec.name, allowed_modules)
    kwargs = dict(spec.kwargs)
    if spec.is_builtin and seed is not None:
        kwargs["seed"] = seed
    try:
        policy = cls(env_spec, **kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"policy spec {spec.to_json()}: {cls.__qualname__} rejected its kwargs: {exc}"
        ) from exc
    if not spec.is_builtin and seed is not None:
        policy.seed(seed)
    return policy


def default_policy_spec(env_spec: EnvSpec) -> PolicySpec:
    """Returns the built-in MLP spec that fits the spaces (default kwargs).

    Args:
        env_spec: The spaces.

    Returns:
        ``mlp-categorical`` for Discrete actions, ``mlp-gaussian`` for float
        Box actions.

    Raises:
        ConfigError: If no built-in MLP fits; the message suggests what to do.
    """
    obs_space, action_space = env_spec.observation_space, env_spec.action_space
    if not isinstance(obs_space, ENCODABLE_SPACES):
        raise ConfigError(
            f"no built-in MLP policy reads {obs_space} observations; flatten them "
            "(gymnasium's FlattenObservation), use 'random', or give an import path "
            "to your own Policy class"
        )
    if isinstance(action_space, gym.spaces.Discrete):
        return PolicySpec("mlp-categorical")
    if isinstance(action_space, gym.spaces.Box) and action_space.dtype.kind == "f":
        return PolicySpec("mlp-gaussian")
    raise ConfigError(
        f"no built-in MLP policy acts in {action_space}; use 'random' or give an "
        "import path to your own Policy class"
    )


def _as_spec(spec: Any) -> PolicySpec:
    if isinstance(spec, PolicySpec):
        return spec
    if isinstance(spec, str):
        return PolicySpec.from_json(spec) if spec.lstrip().startswith("{") else PolicySpec(spec)
    raise ConfigError(
        f"policy spec must be a PolicySpec, a name or JSON text, got {type(spec).__name__}"
    )


def _torch_policy(
    spec: PolicySpec, env_spec: EnvSpec, seed: int | None, allowed: Collection[str] | None
) -> Policy:
    """Builds a TorchPolicy after checking its module's import path like a policy's."""
    path = spec.kwargs.get("module")
    if not isinstance(path, str) or split_import_path(path) is None:
        raise ConfigError(
            f"policy spec {spec.to_json()}: kwargs 'module' must be the import path "
            "'package.module:Class' of an nn.Module"
        )
    import_object(path, "torch module", allowed)  # the allow-list is checked before importing
    try:
        from rlfleet.policies.torch import TorchPolicy
    except ImportError as exc:
        raise ConfigError(
            f"policy spec {spec.to_json()} needs PyTorch where the policy is built: "
            f"pip install torch==2.13.0 (the CPU build), then rlfleet[torch] ({exc})"
        ) from exc
    kwargs = dict(spec.kwargs)
    if seed is not None:
        kwargs["seed"] = seed
    try:
        return TorchPolicy(env_spec, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"policy spec {spec.to_json()}: TorchPolicy rejected it: {exc}") from exc


def _policy_class(name: str, allowed_modules: Collection[str] | None) -> type[Policy]:
    if name in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[name]
    target = import_object(name, "policy", allowed_modules)
    if not (isinstance(target, type) and issubclass(target, Policy)):
        raise ConfigError(
            f"policy {name!r} is {target!r}, not a subclass of rlfleet.policies.Policy"
        )
    if inspect.isabstract(target):
        raise ConfigError(
            f"policy {name!r} is abstract (it lacks {sorted(target.__abstractmethods__)}); "
            "name a concrete Policy subclass"
        )
    return target


def _normalised_kwargs(kwargs: Any, name: str) -> dict[str, Any]:
    if not isinstance(kwargs, Mapping):
        raise ConfigError(
            f"policy spec {name!r}: kwargs must be a mapping, got {type(kwargs).__name__}"
        )
    _check_json(kwargs, f"policy spec {name!r}: kwargs")
    normalised: dict[str, Any] = json.loads(json.dumps(dict(kwargs)))
    return normalised


def _check_json(value: Any, where: str) -> None:
    """Raises ConfigError naming the first part of ``value`` that JSON cannot carry."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} is {value!r}; JSON carries finite numbers only")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where} has key {key!r}; JSON object keys must be str")
            _check_json(item, f"{where}[{key!r}]")
        return
    raise ConfigError(
        f"{where} is a {type(value).__name__} ({value!r}), which is not JSON; use str, "
        "int, float, bool, None, lists and dicts (e.g. int(x) for numpy integers)"
    )
