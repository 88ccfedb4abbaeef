"""EnvConfig: a gymnasium env described as data (id + JSON kwargs).

An env update travels over the wire as an :class:`EnvConfig`, never as code:
the worker imports the modules it was told to import (its own ``--import``
flag, or the config's ``imports``) and then calls ``gymnasium.make``. The
config is also a picklable env factory (``config()`` builds the env), which
is what :class:`~rlfleet.envs.SubprocVectorEnv` needs under the ``spawn``
start method.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlfleet._util.values import check_int
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs.native import NATIVE_VECTORIZATIONS, NativeVectorEnv
from rlfleet.errors import ConfigError, EnvNotFoundError

_FIELDS = ("id", "kwargs", "max_episode_length", "imports", "vectorization")
#: ``EnvConfig.vectorization`` of a worker whose slots' envs each run in a child process.
SUBPROCESS = "subprocess"
#: The values of ``EnvConfig.vectorization`` (None: one ``gym.make`` env per slot, in-process).
VECTORIZATIONS = (SUBPROCESS, *NATIVE_VECTORIZATIONS)


@dataclass(frozen=True)
class EnvConfig:
    """A gymnasium env id with its constructor kwargs, as plain data.

    ``kwargs`` are stored in their JSON form (tuples become lists, a copy is
    taken), so a config is equal to itself after ``to_json``/``from_json``
    and an env built from a config received over the network gets exactly
    the kwargs a local one gets. Calling the config builds the env, which
    makes it a picklable factory for :class:`~rlfleet.envs.SubprocVectorEnv`.

    Args:
        id: A registered gymnasium id, e.g. ``"CartPole-v1"``.
        kwargs: Keyword arguments of the env constructor (``render_mode``
            included). Must be JSON-serialisable with string keys.
        max_episode_length: Steps after which episodes are truncated
            (``gymnasium.make(max_episode_steps=...)``); None keeps the
            registered limit.
        imports: Modules to import before making the env (custom envs
            register themselves on import).
        vectorization: None (the default) runs one ``gymnasium.make`` env
            per worker slot in the worker's process, each episode reset
            with its own seed. ``"subprocess"`` runs each slot's env in a
            child process of the worker (``SubprocVectorEnv``): the same
            seeds and bit-identical batches, a crashed or killed child
            being rebuilt like a crashed env; it pays only for envs whose
            step costs far more than the pipe round trip (CartPole runs
            about 11x slower than in-process: docs/reliability.md).
            ``"vector_entry_point"`` (gymnasium's native vector env, e.g.
            CartPole's) or ``"envpool"`` (the ``envpool`` extra) makes a
            worker step all its slots with one native vector env; such
            episodes have no seed of their own (docs/reliability.md,
            "Native vector-env backends"). A native config is no
            single-env factory: ``config()`` refuses it.

    Raises:
        ConfigError: If a field has the wrong type, the kwargs are not JSON,
            or the episode length is given twice.
    """

    id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_episode_length: int | None = None
    imports: tuple[str, ...] = ()
    vectorization: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"EnvConfig.id must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "kwargs", _canonical_kwargs(self.id, self.kwargs))
        length = self.max_episode_length
        if length is not None:
            check_int(f"EnvConfig.max_episode_length of {self.id!r}", length)
        if length is not None and "max_episode_steps" in self.kwargs:
            raise ConfigError(
                f"env {self.id!r}: the episode limit is given twice (max_episode_length="
                f"{length} and kwargs['max_episode_steps']); keep only max_episode_length"
            )
        object.__setattr__(self, "imports", _checked_imports(self.id, self.imports))
        if self.vectorization is not None and self.vectorization not in VECTORIZATIONS:
            raise ConfigError(
                f"EnvConfig.vectorization of {self.id!r} is {self.vectorization!r}; give one "
                f"of {list(VECTORIZATIONS)}, or None for one gymnasium.make env per slot"
            )
        if self.native and "max_episode_steps" in self.kwargs:
            raise ConfigError(
                f"env {self.id!r} ({self.vectorization}): give the episode limit as "
                "max_episode_length, not kwargs['max_episode_steps']"
            )

    @property
    def native(self) -> bool:
        """Whether one native vector env steps every slot (``vector_entry_point``, ``envpool``)."""
        return self.vectorization in NATIVE_VECTORIZATIONS

    def __hash__(self) -> int:
        # The kwargs dict is unhashable; the canonical JSON text identifies a config.
        return hash(self.to_json())

    def __call__(self) -> gym.Env:
        """Builds the env (see :func:`make_env`); makes the config an env factory."""
        return make_env(self)

    def make(self, *, extra_imports: Iterable[str] = (), allow_module_ids: bool = False) -> gym.Env:
        """Builds the env. See :func:`make_env` for the arguments and errors."""
        return make_env(self, extra_imports=extra_imports, allow_module_ids=allow_module_ids)

    def env_spec(self, *, extra_imports: Iterable[str] = ()) -> EnvSpec:
        """Builds one env, reads its spaces and episode limit, and closes it.

        Args:
            extra_imports: Modules to import first, as in :func:`make_env`.

        Returns:
            The env's :class:`~rlfleet.core.env_spec.EnvSpec`.
        """
        if self.native:
            native = make_native(self, 1, extra_imports=extra_imports)
            try:
                return native.env_spec()
            finally:
                native.close()
        env = make_env(self, extra_imports=extra_imports)
        try:
            return env_spec_of(env, self.max_episode_length)
        finally:
            env.close()

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as a JSON-compatible dict (``vectorization`` only when set)."""
        data: dict[str, Any] = {
            "id": self.id,
            "kwargs": dict(self.kwargs),
            "max_episode_length": self.max_episode_length,
            "imports": list(self.imports),
        }
        if self.vectorization is not None:
            data["vectorization"] = self.vectorization
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvConfig:
        """Builds a config from :meth:`to_dict`'s output.

        Raises:
            ConfigError: If ``data`` is not a mapping, lacks ``id`` or has
                unknown keys.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"an env config must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise ConfigError(
                f"unknown env config field(s) {unknown}; the fields are {list(_FIELDS)}"
            )
        if "id" not in data:
            raise ConfigError('an env config needs an \'id\', e.g. {"id": "CartPole-v1"}')
        return cls(
            id=data["id"],
            kwargs=data.get("kwargs", {}),
            max_episode_length=data.get("max_episode_length"),
            imports=data.get("imports", ()),
            vectorization=data.get("vectorization"),
        )

    def to_json(self) -> str:
        """Returns compact, key-sorted JSON text (stable for equal configs)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> EnvConfig:
        """Parses :meth:`to_json`'s output.

        Raises:
            ConfigError: If the text is not JSON or not a valid config.
        """
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"env config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def make_env(
    config: EnvConfig,
    *,
    extra_imports: Iterable[str] = (),
    allow_module_ids: bool = False,
    worker_checked: bool = False,
) -> gym.Env:
    """Builds the gymnasium env a config describes.

    Imports ``extra_imports`` and ``config.imports`` first (custom envs
    register themselves on import), then calls ``gymnasium.make``.

    With ``worker_checked`` the env is built without gymnasium's
    ``OrderEnforcing`` and ``PassiveEnvChecker`` wrappers (the EnvSpec
    fields ``order_enforce`` and ``disable_env_checker``): a worker's
    engine never steps an env before resetting it and checks every value
    against the spaces itself, so the two wrappers only cost time (about
    0.4-0.6 us of CartPole's 6.5 us step). ``TimeLimit`` and the env's own
    registered wrappers stay (a worker's ``EnvSource`` takes an outermost
    ``TimeLimit`` off itself, the engine enforcing its limit); the batches
    are the same bits (``tests/test_vec_worker.py``, docs/reliability.md
    section 10).

    Args:
        config: The env to build.
        extra_imports: Modules to import first, e.g. a worker's ``--import``.
        allow_module_ids: Allow ids shaped ``"package.module:Env-v0"``, which
            import ``package.module``. Off by default because a config can
            come from the network and must not choose code to import; only
            turn it on for configs written by the local user.
        worker_checked: Leave out the two wrappers a worker's engine makes
            redundant (see above).

    Returns:
        The env, with a ``TimeLimit`` of ``config.max_episode_length`` if set.

    Raises:
        ConfigError: If the id names a module (and that is not allowed), a
            module cannot be imported, or the env rejects the kwargs.
        EnvNotFoundError: If no env is registered under the id.
    """
    if config.native:
        raise ConfigError(
            f"EnvConfig({config.id!r}, vectorization={config.vectorization!r}) describes a "
            "native vector env, not one env: give it to a worker (VecWorker, Fleet) as its "
            "env, or drop vectorization to build single envs"
        )
    env_id = config.id
    modules = [*extra_imports, *config.imports]
    if ":" in env_id:
        if not allow_module_ids:
            module, _, name = env_id.rpartition(":")
            raise ConfigError(
                f"env id {env_id!r} names a module to import ({module!r}); ids from configs "
                f"must not import code. Import the module with the worker's --import flag "
                f"or EnvConfig(imports=({module!r},)) and use the id {name!r}"
            )
        module, _, env_id = env_id.rpartition(":")
        modules.append(module)
    for module in modules:
        _import_env_module(module, env_id)
    if env_id not in gym.registry:
        raise EnvNotFoundError(_not_found_message(env_id))
    make_kwargs = dict(config.kwargs)
    if config.max_episode_length is not None:
        make_kwargs["max_episode_steps"] = config.max_episode_length
    spec: str | gym.envs.registration.EnvSpec = env_id
    if worker_checked:
        spec = dataclasses.replace(gym.spec(env_id), order_enforce=False)
        make_kwargs["disable_env_checker"] = True
    try:
        return gym.make(spec, **make_kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"env {env_id!r} rejected kwargs {dict(config.kwargs)!r}: {exc}. "
            "Check the names and types against the env's constructor"
        ) from exc


def make_native(
    config: EnvConfig,
    num_envs: int,
    *,
    max_episode_length: int | None = None,
    extra_imports: Iterable[str] = (),
) -> NativeVectorEnv:
    """Builds the native vector env of a config whose ``vectorization`` is set.

    Args:
        config: The env; its id may not name a module.
        num_envs: Envs in the vector env.
        max_episode_length: Overrides ``config.max_episode_length``.
        extra_imports: Modules to import first, e.g. a worker's ``--import``.

    Raises:
        ConfigError: As :class:`~rlfleet.envs.native.NativeVectorEnv`, or if
            the config is not native or its id names a module.
        EnvNotFoundError: If no env is registered under the id.
    """
    if not config.native:
        raise ConfigError(
            f"EnvConfig({config.id!r}, vectorization={config.vectorization!r}) is not a native "
            "vector env: use make_env"
        )
    if ":" in config.id:
        raise ConfigError(
            f"env id {config.id!r} names a module; import it with EnvConfig(imports=...) "
            "or the worker's --import flag and give the plain id"
        )
    for module in [*extra_imports, *config.imports]:
        _import_env_module(module, config.id)
    length = max_episode_length if max_episode_length is not None else config.max_episode_length
    assert config.vectorization is not None  # native
    return NativeVectorEnv(config.id, dict(config.kwargs), config.vectorization, num_envs, length)


def env_spec_of(env: gym.Env, max_episode_length: int | None = None) -> EnvSpec:
    """Returns the EnvSpec of a built env.

    Args:
        env: The env.
        max_episode_length: Overrides the env's registered ``max_episode_steps``.
    """
    return EnvSpec.from_env(env, max_episode_length)


def _canonical_kwargs(env_id: str, kwargs: Any) -> dict[str, Any]:
    """Returns the JSON round trip of ``kwargs``, or raises ConfigError."""
    if not isinstance(kwargs, Mapping):
        raise ConfigError(
            f"EnvConfig.kwargs of {env_id!r} must be a dict, got {type(kwargs).__name__}"
        )
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        # json.dumps would silently turn 1 into "1" and the env would get another key.
        raise ConfigError(f"EnvConfig.kwargs of {env_id!r} must have string keys, got {bad_keys!r}")
    try:
        text = json.dumps(dict(kwargs), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"EnvConfig.kwargs of {env_id!r} must be JSON-serialisable (str, int, float, "
            f"bool, None, lists and dicts of those; no NaN/inf): {exc}"
        ) from exc
    canonical: dict[str, Any] = json.loads(text)
    return canonical


def _checked_imports(env_id: str, imports: Any) -> tuple[str, ...]:
    if isinstance(imports, str) or not isinstance(imports, Iterable):
        raise ConfigError(
            f"EnvConfig.imports of {env_id!r} must be a tuple of module names, got {imports!r}"
        )
    modules = tuple(imports)
    for module in modules:
        if not isinstance(module, str) or not all(
            part.isidentifier() for part in module.split(".")
        ):
            raise ConfigError(
                f"EnvConfig.imports of {env_id!r}: {module!r} is not a module name "
                "like 'mypkg.envs'"
            )
    return modules


def _import_env_module(module: str, env_id: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # an env module can fail with anything at import time
        raise ConfigError(
            f"could not import module {module!r} (imported to register env {env_id!r}): "
            f"{type(exc).__name__}: {exc}. Is it installed on this machine?"
        ) from exc


def _not_found_message(env_id: str) -> str:
    matches = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f" Did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""
    return (
        f"no gymnasium env is registered under id {env_id!r}.{hint} Custom envs must be "
        "imported first: EnvConfig(imports=('mypkg.envs',)) or the worker's --import flag"
    )


__all__ = ["EnvConfig", "env_spec_of", "make_env", "make_native"]
