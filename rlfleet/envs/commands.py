"""The commands a vector env runs on its envs, and how an env's failure travels.

Every backend executes the same commands (:func:`run_command`), in this
process (``DummyVectorEnv``), in a child process (``SubprocVectorEnv``) or
on a fleet worker (``RemoteVectorEnv``), and answers a failure with a
:class:`FailedCall` so that one env's error never loses the others' answers.

Envs are duck-typed, as in tianshou: anything with gymnasium's ``reset``
and ``step`` works. Attribute commands reach through gymnasium wrappers
(``get_wrapper_attr``) when the env has them, and use plain attributes
otherwise.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import gymnasium as gym

from rlfleet.errors import ConfigError, VectorEnvError, WrongTypeError

#: An env factory: a callable returning a gymnasium env (or any object with
#: gymnasium's ``reset``/``step``).
EnvFactory: TypeAlias = Callable[[], gym.Env]

# The commands an env executes, with the argument a backend sends:
#   RESET: reset kwargs (dict); STEP: the env's action; RENDER: render kwargs;
#   SEED: the seed (int or None; answer: what tianshou's seed() returns);
#   GET_ATTR: the attribute name; SET_ATTR: (name, value);
#   CALL: (method name, args tuple, kwargs dict);
#   CLASS_NAMES: None (answer: qualified names of every class in the wrapper stack).
RESET, STEP, RENDER, GET_ATTR, SET_ATTR = "reset", "step", "render", "get_attr", "set_attr"
CALL, CLASS_NAMES, SEED = "call", "class_names", "seed"
#: Not a command: names the env factory call in error messages.
MAKE = "make"


def _class_names(env: Any) -> list[str]:
    """Qualified names of every class (bases included) of every wrapper layer."""
    names: list[str] = []
    layer: Any = env
    while layer is not None:
        for cls in type(layer).__mro__:
            name = f"{cls.__module__}.{cls.__qualname__}"
            if name not in names:
                names.append(name)
        layer = getattr(layer, "env", None) if isinstance(layer, gym.Wrapper) else None
    return names


def get_attr(env: Any, name: str) -> Any:
    """Attribute ``name`` of an env, found through gymnasium wrappers.

    gymnasium 1.0 wrappers no longer forward plain attribute access, hence
    ``get_wrapper_attr``; a duck-typed env has plain attributes.
    """
    if isinstance(env, gym.Env):
        return env.get_wrapper_attr(name)
    return getattr(env, name)


def set_attr(env: Any, name: str, value: Any) -> None:
    """Sets attribute ``name`` where it lives in the wrapper stack, else on the unwrapped env.

    The second half is tianshou's rule (its workers set ``env.unwrapped``'s
    attribute), so code that reads the attribute back from the env itself
    finds it.
    """
    layer: Any = env
    # gymnasium's set_wrapper_attr, except where a new attribute lands.
    while isinstance(layer, gym.Wrapper) and not hasattr(layer, name):
        layer = layer.env
    setattr(layer, name, value)


def seed_env(env: Any, seed: int | None) -> list[int | None] | Any:
    """tianshou's seeding of one env: its own ``seed()`` if it has one, else ``reset(seed=...)``.

    Returns:
        What the env's ``seed()`` returned, or ``[seed]`` after a reset.
    """
    own_seed = getattr(env, "seed", None)
    if callable(own_seed):
        return own_seed(seed)
    env.reset(seed=seed)
    return [seed]


def seeds_reset(env: Any) -> bool:
    """Whether :func:`seed_env` resets this env (it has no ``seed()`` method of its own)."""
    return not callable(getattr(env, "seed", None))


_COMMANDS: dict[str, Callable[[Any, Any], Any]] = {
    RESET: lambda env, kwargs: env.reset(**kwargs),
    STEP: lambda env, action: env.step(action),
    RENDER: lambda env, kwargs: env.render(**kwargs),
    SEED: seed_env,
    GET_ATTR: get_attr,
    SET_ATTR: lambda env, item: set_attr(env, *item),
    CALL: lambda env, item: get_attr(env, item[0])(*item[1], **item[2]),
    CLASS_NAMES: lambda env, _: _class_names(env),
}


def run_command(env: Any, command: str, arg: Any) -> Any:
    """Runs one vector-env command on one env and returns the env's answer."""
    return _COMMANDS[command](env, arg)


@dataclass(frozen=True)
class EnvFailure:
    """An exception raised by an env, in a form that crosses process boundaries.

    Attributes:
        summary: ``"ExceptionType: message"``.
        traceback: The formatted traceback.
        config_error: The exception itself when it is a ConfigError: a bad
            env config is the user's to fix, so when the factory raised it,
            it keeps its type.
    """

    summary: str
    traceback: str
    config_error: ConfigError | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> EnvFailure:
        """Captures ``exc`` and its traceback."""
        return cls(
            summary=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
            config_error=exc if isinstance(exc, ConfigError) else None,
        )

    def error(self, env_index: int, command: str) -> Exception:
        """Returns the exception to raise in the caller for this failure."""
        if command == MAKE and self.config_error is not None:
            return self.config_error
        hint = ""
        if command in (RESET, STEP):
            hint = f"; reset it (reset(id={env_index})) before stepping it again"
        elif command == MAKE:
            hint = "; check the env factory"
        return VectorEnvError(
            f"{command}() raised {self.summary}{hint}\n"
            f"--- traceback in the env ---\n{self.traceback.rstrip()}",
            env_index=env_index,
        )


@dataclass(frozen=True)
class FailedCall:
    """An env's answer that is an error instead of a result.

    Backends return it from :meth:`BaseVectorEnv._receive` so that one env's
    failure does not lose the answers of the others.

    Attributes:
        error: What the caller gets raised (usually a VectorEnvError naming
            the env, and the seconds for a timeout).
    """

    error: Exception


def make_checked(factory: EnvFactory) -> Any:
    """Calls an env factory and checks that it returned an env.

    As in tianshou, an env is duck-typed: a ``gymnasium.Env`` or any object
    with callable ``reset`` and ``step``.

    Raises:
        WrongTypeError: If the factory returned something else.
    """
    env = factory()
    if not isinstance(env, gym.Env) and not (
        callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))
    ):
        raise WrongTypeError(
            f"the env factory returned {type(env).__name__}, which is neither a gymnasium.Env "
            "nor an object with reset() and step() methods"
        )
    return env


def build_env(factory: EnvFactory, env_index: int) -> Any:
    """Calls an env factory in this process, with vector-env errors.

    Raises:
        ConfigError: If the factory raised it (a bad EnvConfig).
        VectorEnvError: If the factory raised anything else or returned
            something that is not an env (see :func:`make_checked`).
    """
    try:
        return make_checked(factory)
    except ConfigError:
        raise
    except Exception as exc:
        raise EnvFailure.from_exception(exc).error(env_index, MAKE) from exc


def check_env_fns(env_fns: Sequence[EnvFactory]) -> list[EnvFactory]:
    """Checks that ``env_fns`` is a non-empty sequence of callables."""
    if isinstance(env_fns, str | bytes) or not isinstance(env_fns, Sequence):
        raise ConfigError(
            f"a vector env takes a list of env factories, got {type(env_fns).__name__}"
        )
    if not env_fns:
        raise ConfigError("a vector env needs at least one env factory, got an empty list")
    for index, fn in enumerate(env_fns):
        if not callable(fn):
            raise ConfigError(
                f"env factory {index} is a {type(fn).__name__}, not a callable returning "
                "a gymnasium.Env (pass EnvConfig('CartPole-v1') or a function)"
            )
    return list(env_fns)


__all__ = [
    "CALL",
    "CLASS_NAMES",
    "GET_ATTR",
    "MAKE",
    "RENDER",
    "RESET",
    "SEED",
    "SET_ATTR",
    "STEP",
    "EnvFactory",
    "EnvFailure",
    "FailedCall",
    "build_env",
    "check_env_fns",
    "make_checked",
    "run_command",
]
