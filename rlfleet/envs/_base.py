"""BaseVectorEnv: tianshou's vector-env API over a list of gymnasium envs.

The base class owns everything that does not depend on where the envs run:
id normalisation, seed bookkeeping, the "reset before step" rule, and
batching of results. A subclass only runs one command on a set of envs
(:meth:`BaseVectorEnv._run`) and says how to release its resources; the
commands themselves are executed by :func:`run_command`, in this process
(``DummyVectorEnv``) or in a child process (``SubprocVectorEnv``).
"""

from __future__ import annotations

import abc
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np

from rlfleet.errors import ConfigError, UsageError, VectorEnvError

EnvFactory: TypeAlias = Callable[[], gym.Env]
#: Which envs a call applies to: None (all), one index, or a sequence of indices.
EnvIds: TypeAlias = int | np.integer | Sequence[int] | np.ndarray | None
Seeds: TypeAlias = int | np.integer | Sequence[int | None] | None

# The commands an env executes; the values are what a subclass sends.
RESET, STEP, RENDER, GET_ATTR, SET_ATTR = "reset", "step", "render", "get_attr", "set_attr"
#: Not a command: names the env factory call in error messages.
MAKE = "make"

_COMMANDS: dict[str, Callable[[gym.Env, Any], Any]] = {
    RESET: lambda env, kwargs: env.reset(**kwargs),
    STEP: lambda env, action: env.step(action),
    RENDER: lambda env, kwargs: env.render(**kwargs),
    # get/set_wrapper_attr reach through gymnasium wrappers, which since
    # gymnasium 1.0 no longer forward plain attribute access.
    GET_ATTR: lambda env, key: env.get_wrapper_attr(key),
    SET_ATTR: lambda env, item: env.set_wrapper_attr(*item),
}


def run_command(env: gym.Env, command: str, arg: Any) -> Any:
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


def make_checked(factory: EnvFactory) -> gym.Env:
    """Calls an env factory and checks that it returned a gymnasium env.

    Raises:
        TypeError: If the factory returned something else.
    """
    env = factory()
    if not isinstance(env, gym.Env):
        raise TypeError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env")
    return env


def build_env(factory: EnvFactory, env_index: int) -> gym.Env:
    """Calls an env factory in this process, with vector-env errors.

    Raises:
        ConfigError: If the factory raised it (a bad EnvConfig).
        VectorEnvError: If the factory raised anything else or returned
            something that is not a ``gymnasium.Env``.
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


class BaseVectorEnv(abc.ABC):
    """Several gymnasium envs stepped together, with tianshou's API.

    Differences from a single gymnasium env, all as in tianshou:

    * Results are batched: one row per env in ``id`` order. Observations are
      stacked with ``np.stack`` (Dict observations become a dict of stacked
      arrays, Tuple ones a tuple of them; observations of different shapes
      an object array). Rewards are float64, ``terminated``/``truncated``
      bool arrays.
    * ``infos`` is a 1-D numpy object array holding one dict per env, each a
      copy of the env's info with ``"env_id"`` (the env index) added.
    * No autoreset: when an env's episode ends, call ``reset(id=...)`` for
      it. Stepping it before that raises :class:`~rlfleet.errors.VectorEnvError`
      (gymnasium would step a finished episode silently). Envs must also
      be reset once before their first step, and after any failed call.
    * Seeding follows gymnasium 1.x: :meth:`seed` only records seeds; each
      env is seeded by its next ``reset`` (``env.reset(seed=...)``).

    If a ``reset``/``step`` call raises, every env it addressed must be
    reset before it is stepped again (its result was not delivered).

    Args:
        env_num: Number of envs.
        release: Frees the subclass's resources (envs, processes). It must
            not reference the vector env itself; it runs once, at
            :meth:`close`, garbage collection or interpreter exit, and
            returns the errors it met (the first is raised by ``close``).
    """

    #: tianshou's flag for partial (``wait_num``) stepping, which these envs do not do.
    is_async: bool = False

    def __init__(self, env_num: int, release: Callable[[], list[BaseException]]) -> None:
        self.env_num = env_num
        self._pending_seeds: list[int | None] = [None] * env_num
        self._needs_reset = np.ones(env_num, dtype=bool)
        self._closed = False
        self._finalizer = weakref.finalize(self, release)

    @abc.abstractmethod
    def _run(self, ids: list[int], command: str, args: Sequence[Any]) -> list[Any]:
        """Runs ``command`` with ``args[k]`` on env ``ids[k]`` for every k.

        Returns:
            The envs' answers, in ``ids`` order.

        Raises:
            VectorEnvError: If an env raised, died or timed out (the first one).
        """

    def __len__(self) -> int:
        """Returns the number of envs."""
        return self.env_num

    def __enter__(self) -> BaseVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}(env_num={self.env_num}, {state})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def observation_space(self) -> list[gym.Space]:
        """The observation space of each env (a list, as in tianshou)."""
        return self.get_env_attr("observation_space")

    @property
    def action_space(self) -> list[gym.Space]:
        """The action space of each env (a list, as in tianshou)."""
        return self.get_env_attr("action_space")

    def reset(
        self, id: EnvIds = None, *, env_id: EnvIds = None, **kwargs: Any
    ) -> tuple[Any, np.ndarray]:
        """Resets some envs and returns their first observations.

        Args:
            id: Envs to reset: None for all, an index, or a sequence of them.
            env_id: Alias of ``id`` (tianshou 1.x's name); give one of them.
            **kwargs: Passed to each ``env.reset``. ``seed`` may be None, an
                int ``s`` (the k-th env of ``id`` gets ``s + k``, like
                gymnasium's vector envs) or one seed per env of ``id``; it
                replaces seeds recorded by :meth:`seed` for these envs.

        Returns:
            ``(obs, infos)``: batched observations and an object array of
            info dicts, one row per env of ``id``.

        Raises:
            VectorEnvError: If an env raised, died or timed out.
        """
        self._check_open()
        if id is not None and env_id is not None:
            raise TypeError("reset() got both id and env_id; they are the same argument")
        ids = self._ids(env_id if id is None else id)
        if "seed" in kwargs:
            seeds = _expand_seeds(kwargs.pop("seed"), len(ids), "reset(seed=...)")
        else:
            seeds = [self._pending_seeds[i] for i in ids]
        self._needs_reset[ids] = True
        results = self._run(ids, RESET, [{**kwargs, "seed": seed} for seed in seeds])
        self._needs_reset[ids] = False
        for i in ids:
            self._pending_seeds[i] = None
        observations, infos = zip(*results, strict=True)
        return stack_batch(observations), _info_array(infos, ids)

    def step(
        self, action: Any, id: EnvIds = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps some envs, one action row per env.

        Args:
            action: An array or sequence with one row per env of ``id``:
                ``action[k]`` goes to env ``id[k]``.
            id: Envs to step: None for all, an index, or a sequence of them.

        Returns:
            ``(obs, rewards, terminated, truncated, infos)``, one row per env
            of ``id``.

        Raises:
            ValueError: If the number of actions does not match ``id``.
            VectorEnvError: If an env must be reset first, or raised, died or
                timed out.
        """
        self._check_open()
        ids = self._ids(id)
        rows = _action_rows(action, ids)
        blocked = [i for i in ids if self._needs_reset[i]]
        if blocked:
            raise VectorEnvError(
                f"cannot step envs {blocked}: each must be reset first (never reset, "
                f"episode ended, or its last call failed); call reset(id={blocked})",
                env_index=blocked[0],
            )
        self._needs_reset[ids] = True
        results = self._run(ids, STEP, rows)
        observations, rewards, terminated, truncated, infos = zip(*results, strict=True)
        terminated_array = np.asarray(terminated, dtype=bool)
        truncated_array = np.asarray(truncated, dtype=bool)
        self._needs_reset[ids] = terminated_array | truncated_array
        return (
            stack_batch(observations),
            np.asarray(rewards, dtype=np.float64),
            terminated_array,
            truncated_array,
            _info_array(infos, ids),
        )

    def seed(self, seed: Seeds = None) -> list[int | None]:
        """Records the seeds that each env's next ``reset`` will use.

        gymnasium 1.x envs are seeded through ``reset(seed=...)``, so nothing
        happens until then; a ``seed`` passed to ``reset`` wins.

        Args:
            seed: None (next resets do not reseed), an int ``s`` (env ``j``
                gets ``s + j``), or one seed (or None) per env.

        Returns:
            The seed recorded for each env.
        """
        self._check_open()
        self._pending_seeds = _expand_seeds(seed, self.env_num, "seed()")
        return list(self._pending_seeds)

    def render(self, **kwargs: Any) -> list[Any]:
        """Renders every env; returns one frame (or None) per env.

        The envs' ``render_mode`` is chosen when they are made, e.g.
        ``EnvConfig("CartPole-v1", {"render_mode": "rgb_array"})``.
        """
        self._check_open()
        return self._run(self._ids(None), RENDER, [kwargs] * self.env_num)

    def get_env_attr(self, key: str, id: EnvIds = None) -> list[Any]:
        """Returns attribute ``key`` of each env of ``id`` (through wrappers)."""
        self._check_open()
        ids = self._ids(id)
        return self._run(ids, GET_ATTR, [key] * len(ids))

    def set_env_attr(self, key: str, value: Any, id: EnvIds = None) -> None:
        """Sets attribute ``key`` to ``value`` on each env of ``id``.

        The attribute is set where it lives in the wrapper stack, or on the
        outermost wrapper if no layer has it.
        """
        self._check_open()
        ids = self._ids(id)
        self._run(ids, SET_ATTR, [(key, value)] * len(ids))

    def close(self) -> None:
        """Closes every env and frees its resources. Safe to call twice.

        Raises:
            Exception: The first error an env's ``close`` raised, after every
                env was closed anyway.
        """
        self._closed = True
        errors = self._finalizer()
        if errors:
            raise errors[0]

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"{type(self).__name__} is closed; make a new one")

    def _ids(self, id: EnvIds) -> list[int]:
        """Normalises ``id`` to a list of distinct, valid env indices."""
        if id is None:
            return list(range(self.env_num))
        array = np.asarray(id)
        if array.ndim > 1 or array.size == 0 or array.dtype.kind not in "iu":
            raise ValueError(f"id must be None, an env index or a 1-D sequence of them, got {id!r}")
        ids = [int(i) for i in array.reshape(-1)]
        bad = [i for i in ids if not 0 <= i < self.env_num]
        if bad:
            raise IndexError(f"env ids {bad} out of range; there are {self.env_num} envs")
        if len(set(ids)) != len(ids):
            raise ValueError(f"env ids must be distinct, got {ids}")
        return ids


def stack_batch(items: Sequence[Any]) -> Any:
    """Stacks per-env values into a batch (dicts and tuples element-wise).

    Always copies, so the batch never aliases an env's (or a shared-memory)
    buffer.
    """
    first = items[0]
    if isinstance(first, Mapping):
        return {key: stack_batch([item[key] for item in items]) for key in first}
    if isinstance(first, tuple):
        return tuple(stack_batch([item[j] for item in items]) for j in range(len(first)))
    try:
        return np.stack(items)
    except ValueError:
        # Shapes differ (tianshou does the same): keep the rows as objects.
        ragged = np.empty(len(items), dtype=object)
        for row, item in enumerate(items):
            ragged[row] = np.array(item, copy=True)
        return ragged


def _info_array(infos: Sequence[Mapping[str, Any]], ids: list[int]) -> np.ndarray:
    array = np.empty(len(ids), dtype=object)
    for row, (info, env_index) in enumerate(zip(infos, ids, strict=True)):
        array[row] = {**info, "env_id": env_index}
    return array


def _action_rows(action: Any, ids: list[int]) -> list[Any]:
    """Splits a batched action into one action per env of ``ids``."""
    try:
        count = len(action)
    except TypeError:
        raise ValueError(
            f"action must have one row per env stepped ({len(ids)} for ids {ids}), "
            f"got a {type(action).__name__} without rows"
        ) from None
    if count != len(ids):
        raise ValueError(f"action has {count} rows but {len(ids)} envs are stepped (ids {ids})")
    return [action[row] for row in range(count)]


def _expand_seeds(seed: Seeds, count: int, where: str) -> list[int | None]:
    """Turns None / an int / a sequence into one seed (or None) per env."""
    if seed is None:
        return [None] * count
    if isinstance(seed, int | np.integer):
        start = _as_seed(seed, where)
        return [start + k for k in range(count)]
    if isinstance(seed, str | bytes) or not isinstance(seed, Sequence | np.ndarray):
        raise ValueError(f"{where}: seed must be None, an int or a list of ints, got {seed!r}")
    seeds = list(seed)
    if len(seeds) != count:
        raise ValueError(f"{where}: got {len(seeds)} seeds for {count} envs")
    return [None if item is None else _as_seed(item, where) for item in seeds]


def _as_seed(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{where}: seeds must be ints >= 0 (or None), got {value!r}")
    return int(value)


__all__ = ["BaseVectorEnv", "EnvFactory", "EnvIds", "stack_batch"]
