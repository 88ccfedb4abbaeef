"""Native vector envs: many envs stepped by one call, with their own autoreset.

A native vector env steps all of its envs in one call, in C (envpool) or in
numpy (gymnasium's ``vector_entry_point``, e.g. CartPole's). It is what makes
the env stop being the cost of a worker's step. The price is control: it
cannot reset one env with a seed of its own, and it resets finished envs
itself. Both backends here use the *next-step* autoreset (gymnasium's
``AutoresetMode.NEXT_STEP``, envpool's only mode): the step after an env's
episode ended ignores that env's action and returns the first observation
of its next episode, with reward 0 and neither flag set.

:class:`NativeVectorEnv` gives both backends one interface: rlfleet's
:class:`~rlfleet.envs.BaseVectorEnv` (tianshou's API), with what a native
env cannot do refused by a clear error. The worker's engine
(``rlfleet.worker._native_slots``) maps its slots onto it and calls its
whole-env methods, :meth:`NativeVectorEnv.reset_all` and
:meth:`NativeVectorEnv.step_all`, directly: that is the hot path. What this
means for seeds and determinism is in docs/reliability.md ("Native
vector-env backends").
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlfleet._util.int_ranges import UNSIGNED, all_within
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.batching import EnvIds, EnvRows
from rlfleet.envs.commands import (
    CALL,
    CLASS_NAMES,
    GET_ATTR,
    RENDER,
    RESET,
    SET_ATTR,
    STEP,
    FailedCall,
)
from rlfleet.errors import ConfigError, EnvNotFoundError, UsageError, VectorEnvError

#: gymnasium's native vector env: ``gym.make_vec(..., vectorization_mode="vector_entry_point")``.
VECTOR_ENTRY_POINT = "vector_entry_point"
#: envpool (the ``envpool`` extra): ``envpool.make_gymnasium``.
ENVPOOL = "envpool"
#: The native values of ``EnvConfig.vectorization`` (None: one ``gym.make`` env per slot).
NATIVE_VECTORIZATIONS = (VECTOR_ENTRY_POINT, ENVPOOL)


#: Where tianshou's per-env vector envs step some envs, reset some, render,
#: or reach any attribute or method of one env.
_PER_ENV = "DummyVectorEnv or SubprocVectorEnv of EnvConfig(env_id) (one env per slot)"
#: What the refused commands would do, for their errors.
_REFUSED = {
    SET_ATTR: "set an attribute of",
    RENDER: "render",
    CALL: "call a method of",
    CLASS_NAMES: "list the wrappers of",
}


class NativeVectorEnv(BaseVectorEnv):
    """One native vector env of ``num_envs`` envs, as a :class:`~rlfleet.envs.BaseVectorEnv`.

    The tianshou API, with the rules of a native env:

    * ``reset()`` and ``step(actions)`` take every env at once (``id`` None
      or all of them); a subset is refused with :class:`UsageError`.
    * One seed seeds them all: ``reset(seed=s)`` (or ``seed(s)``) reseeds
      the whole native env with ``s`` (gymnasium's: its one generator;
      envpool: env k gets ``s + k``). A list of per-env seeds is taken only
      as ``s, s + 1, ...``, what ``seed=s`` means for the other vector envs;
      any other list is refused.
    * Next-step autoreset instead of ``reset(id=...)``: the step after an
      env's episode ended ignores its action and returns the first
      observation of its next episode, with reward 0, both flags False and
      ``infos[k]["autoreset"]`` True. Only the first ``step`` needs a
      ``reset`` before it (and any step after a failed call).
    * ``get_env_attr`` answers ``observation_space`` and ``action_space``
      (one env's spaces), ``metadata`` and ``max_episode_length``.
      ``set_env_attr``, ``render``, ``call_env_method``, ``class_names``,
      ``step_and_reset`` and the async mode are refused.

    Args:
        env_id: The env id (gymnasium's registry, or envpool's list).
        kwargs: Constructor kwargs of the env.
        vectorization: ``"vector_entry_point"`` or ``"envpool"``.
        num_envs: Number of envs.
        max_episode_length: Steps after which the env truncates an episode
            itself; None takes the id's registered limit.

    Raises:
        ConfigError: If the env has no native vector entry point, envpool is
            not installed or does not have the task, or no episode limit is
            known.
        EnvNotFoundError: If gymnasium has no env registered under the id.
    """

    def __init__(
        self,
        env_id: str,
        kwargs: dict[str, Any],
        vectorization: str,
        num_envs: int,
        max_episode_length: int | None = None,
    ) -> None:
        if vectorization not in NATIVE_VECTORIZATIONS:
            raise ConfigError(
                f"unknown vectorization {vectorization!r} for env {env_id!r}; give one of "
                f"{list(NATIVE_VECTORIZATIONS)} or None (one gymnasium.make env per slot)"
            )
        _check_task(env_id, vectorization)
        self.env_id = env_id
        self.vectorization = vectorization
        self.num_envs = num_envs
        self.max_episode_length = _episode_limit(env_id, vectorization, max_episode_length)
        self._kwargs = dict(kwargs)
        # The env's action space when it has the quick check (vector entry point only).
        self._quick: QuickMultiDiscrete | None = None
        self._env: Any = self._make(seed=0)
        # The env is made again by an envpool reset: release closes the current one.
        box = self._box = [self._env]
        super().__init__(num_envs, lambda: _close_current(box))
        self._answers: dict[int, Any] = {}
        # Envs whose episode ended at the last step: the next step restarts them.
        self._ended = np.zeros(num_envs, dtype=bool)
        if vectorization == VECTOR_ENTRY_POINT:
            self.single_observation_space: gym.Space = self._env.single_observation_space
            self.single_action_space: gym.Space = self._env.single_action_space
        else:
            # envpool's spaces are those of one env.
            self.single_observation_space = self._env.observation_space
            self.single_action_space = self._env.action_space

    @property
    def name(self) -> str:
        """``'CartPole-v1' (envpool)``, for messages."""
        return f"{self.env_id!r} ({self.vectorization})"

    def env_spec(self) -> EnvSpec:
        """The spaces of one env and the episode limit the env enforces."""
        return EnvSpec(
            self.single_observation_space, self.single_action_space, self.max_episode_length
        )

    def reset_all(self, seed: int | None) -> np.ndarray:
        """Starts a new episode in every env, seeded from ``seed`` (the engine's reset).

        gymnasium's native envs are reseeded by ``reset(seed=...)``. envpool
        takes its seed only when it is made (env k gets ``seed + k``), so it
        is made again (it takes int32 seeds: env k gets ``seed % (2**31 -
        num_envs) + k``); that costs about a millisecond. None goes on
        from the envs' own generators.

        Returns:
            The first observation of every env, one row per env.
        """
        if self.vectorization == ENVPOOL:
            if seed is not None:
                _close(self._env)
                self._env = self._box[0] = self._make(seed=seed % (2**31 - self.num_envs))
            observations, _ = self._env.reset()
        else:
            observations, _ = self._env.reset(seed=seed)
        return np.asarray(observations)

    def vouches_for(self, space: gym.Space) -> bool:
        """Whether the env's own action check may take a batch checked against ``space`` as passed.

        True when ``space`` is a ``Discrete`` from 0 and the env's action
        space a :class:`QuickMultiDiscrete` whose every entry ranges over the
        same values: a batch of the env's shape and dtype whose entries all
        lie in ``space`` then passes the env's check too, so
        :meth:`step_all` may spare that check its second pass.
        """
        quick = self._quick
        return (
            quick is not None
            and type(space) is gym.spaces.Discrete
            and int(space.start) == 0
            and quick.quick_high() == int(space.n) - 1
        )

    def step_all(
        self, actions: np.ndarray, vouched: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps every env (next-step autoreset; the engine's step); infos are not returned.

        Args:
            actions: One action per env.
            vouched: Every entry of ``actions`` was found in the range of a
                space :meth:`vouches_for` accepts: the env's own check of
                this array skips its range reduction (its shape and dtype
                are still checked).

        Returns:
            ``(observations, rewards, terminated, truncated)``, one row per env.
        """
        quick = self._quick
        if vouched and quick is not None:
            quick.vouched = actions
            try:
                observations, rewards, terminated, truncated, _ = self._env.step(actions)
            finally:
                quick.vouched = None
        else:
            observations, rewards, terminated, truncated, _ = self._env.step(actions)
        return observations, rewards, terminated, truncated

    # --- tianshou's API (BaseVectorEnv) ------------------------------------------------

    def reset(
        self, id: EnvIds = None, *, env_id: EnvIds = None, **kwargs: Any
    ) -> tuple[Any, np.ndarray]:
        """Resets every env (see the class docstring for what is refused).

        Raises:
            UsageError: For a subset of the envs, kwargs other than ``seed``,
                or per-env seeds other than ``s, s + 1, ...``.
        """
        self._check_open()
        self._whole(env_id if id is None else id, "reset", "reset()")
        unknown = sorted(set(kwargs) - {"seed"})
        if unknown:
            raise UsageError(
                f"{self.name}: reset() takes only seed=, not {unknown}; use {_PER_ENV} for "
                "reset options"
            )
        return super().reset(**kwargs)

    def step(
        self, action: Any, id: EnvIds = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps every env, one action row each (next-step autoreset: see the class docstring).

        Raises:
            UsageError: For a subset of the envs.
            VectorEnvError: Before the first reset, or after a failed call.
        """
        self._check_open()
        self._whole(id, "step", "step(actions) with one row per env")
        # The envs whose episode ended restart on this step by themselves.
        self._needs_reset[self._ended] = False
        return super().step(action)

    def _seed_envs(self, ids: list[int], seeds: list[int | None]) -> list[Any]:
        """seed(): a native env is seeded by a reset of all its envs (tianshou's way)."""
        self._call(ids, RESET, [{"seed": seed} for seed in seeds])
        return [[seed] for seed in seeds]

    def reset_env(self, id: int, seed: int | None) -> Any:
        """Refused: a native env is reset as a whole (:meth:`reset_all`)."""
        raise UsageError(
            f"{self.name} resets all its envs together with one seed; call reset_all() "
            f"(or use {_PER_ENV} to reset one env with a seed of its own)"
        )

    def step_envs(self, ids: list[int], actions: Sequence[Any] | np.ndarray) -> EnvRows:
        """Refused: a native env steps all its envs together (:meth:`step_all`)."""
        raise UsageError(
            f"{self.name} steps all its envs together; call step_all() (or use {_PER_ENV} "
            "to step some of them)"
        )

    def step_and_reset(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: a native env resets a finished env itself, on the next :meth:`step`."""
        raise UsageError(
            f"{self.name} resets a finished env itself on the next step(); call step() "
            f"(or use {_PER_ENV} for step_and_reset)"
        )

    # --- the backend contract ---------------------------------------------------------

    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        answers: list[Any]
        try:
            if command == RESET:
                first = self.reset_all(_one_seed([a["seed"] for a in args], self.name))
                self._ended[:] = False
                answers = [(first[i], {}) for i in ids]
            elif command == STEP:
                observations, rewards, terminated, truncated = self.step_all(np.asarray(args))
                restarted = self._ended
                self._ended = np.asarray(terminated, dtype=bool) | np.asarray(truncated, bool)
                answers = [
                    (
                        observations[i],
                        rewards[i],
                        terminated[i],
                        truncated[i],
                        {"autoreset": True} if restarted[i] else {},
                    )
                    for i in ids
                ]
            elif command == GET_ATTR:
                answers = [self._attribute(args[0])] * len(ids)
            else:
                raise UsageError(
                    f"{self.name} cannot {_REFUSED[command]} one env (it holds no env objects "
                    f"of its own); use {_PER_ENV}"
                )
        except UsageError as exc:
            self._answers.update((i, FailedCall(exc)) for i in ids)
            return
        except Exception as exc:  # answered, as the contract asks: one failure for every env
            self._ended[:] = False  # unknown state: step() needs a reset() first
            error = VectorEnvError(
                f"{command}() of {self.name} raised {type(exc).__name__}: {exc}; every env's "
                "state is unknown now: call reset() before stepping again",
                env_index=ids[0],
            )
            self._answers.update((i, FailedCall(error)) for i in ids)
            return
        self._answers.update(zip(ids, answers, strict=True))

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        return {i: self._answers.pop(i) for i in ids if i in self._answers}

    def _attribute(self, key: str) -> Any:
        attributes = {
            "observation_space": self.single_observation_space,
            "action_space": self.single_action_space,
            "metadata": getattr(self._env, "metadata", {}),
            "max_episode_length": self.max_episode_length,
        }
        if key not in attributes:
            raise UsageError(
                f"{self.name} has no per-env attribute {key!r}; it answers {list(attributes)} "
                f"(use {_PER_ENV} for any attribute of an env)"
            )
        return attributes[key]

    def _whole(self, id: EnvIds, call: str, instead: str) -> None:
        if id is not None and self._ids(id) != list(range(self.env_num)):
            raise UsageError(
                f"{self.name} can only {call} all its {self.env_num} envs together; call "
                f"{instead} (id=None), or use {_PER_ENV} to {call} some of them"
            )

    def _make(self, seed: int) -> Any:
        limit: dict[str, Any] = {"max_episode_steps": self.max_episode_length}
        if self.vectorization == VECTOR_ENTRY_POINT:
            try:
                env = gym.make_vec(
                    self.env_id,
                    num_envs=self.num_envs,
                    vectorization_mode=VECTOR_ENTRY_POINT,
                    **limit,
                    **self._kwargs,
                )
            except TypeError as exc:
                raise ConfigError(
                    f"env {self.name} rejected kwargs {self._kwargs!r}: {exc}"
                ) from exc
            self._quick = _quicken_action_check(env)
            return env
        try:
            return _envpool().make_gymnasium(
                self.env_id, num_envs=self.num_envs, seed=seed, **limit, **self._kwargs
            )
        except (TypeError, ValueError, AssertionError) as exc:
            # envpool checks its config with asserts and raises on unknown keys.
            raise ConfigError(
                f"envpool rejected env {self.env_id!r} with kwargs {self._kwargs!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


class QuickMultiDiscrete(gym.spaces.MultiDiscrete):
    """gymnasium's ``MultiDiscrete``, whose ``contains`` takes one reduction on a whole batch.

    gymnasium's native vector envs (CartPole's) check every step's actions
    with ``assert self.action_space.contains(actions)``: five numpy calls per
    vector step, a few percent of a worker's CPU. For what they are handed
    step after step (an array of the space's shape and dtype, every entry
    with the same range ``0 .. n - 1``) this answers with one reduction over
    the entries seen as unsigned (a negative one is then huge), the same
    answer; anything else takes gymnasium's own check. The space is
    otherwise gymnasium's (same state, generator, equality and repr): only
    the class of the env's own space object is changed
    (:func:`_quicken_action_check`).
    """

    #: The one array whose range the caller checked already, for one step
    #: (:meth:`NativeVectorEnv.step_all`'s ``vouched``); None otherwise.
    vouched: np.ndarray | None = None

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a valid member of this space (gymnasium's answer)."""
        if type(x) is np.ndarray and x.shape == self.shape and x.dtype == self.dtype and x.size:
            high = self.__dict__.get("_quick_high")
            if high is None:
                high = self.quick_high()
            if high >= 0:
                # The worker's own check of this very array found every entry in
                # 0 .. high (NativeVectorEnv.vouches_for): the same answer.
                return x is self.vouched or bool(all_within(x, high))
        return super().contains(x)

    def quick_high(self) -> int:
        """The largest valid entry if every entry's range is ``0 .. n - 1``, the same n; else -1."""
        high = self.__dict__.get("_quick_high")
        if high is None:
            high = self.__dict__["_quick_high"] = _uniform_high(self)
        return high


def _uniform_high(space: gym.spaces.MultiDiscrete) -> int:
    """The largest valid entry if every entry's range is ``0 .. n - 1``, the same n; else -1."""
    high = space.start + (space.nvec - 1)
    if (
        space.dtype not in UNSIGNED
        or space.nvec.size == 0
        or np.any(space.start != 0)
        or np.any(high != high.flat[0])
    ):
        return -1
    return int(high.flat[0])


def _quicken_action_check(env: Any) -> QuickMultiDiscrete | None:
    """Gives a gymnasium native env's MultiDiscrete action space the quick ``contains``.

    Returns:
        That space, or None if the env's action space is not a MultiDiscrete.
    """
    space = getattr(getattr(env, "unwrapped", env), "action_space", None)
    if type(space) is not gym.spaces.MultiDiscrete:
        return None
    space.__class__ = QuickMultiDiscrete
    return cast(QuickMultiDiscrete, space)


def _close(env: Any) -> list[BaseException]:
    close = getattr(env, "close", None)
    try:
        if close is not None:
            close()
    except Exception as exc:  # returned: BaseVectorEnv.close raises the first
        return [exc]
    return []


def _close_current(box: list[Any]) -> list[BaseException]:
    return _close(box[0])


def _one_seed(seeds: Sequence[int | None], name: str) -> int | None:
    """The one seed of a whole reset, from per-env seeds ``s, s + 1, ...`` (or all None).

    Raises:
        UsageError: For seeds that do not follow that rule.
    """
    if all(seed is None for seed in seeds):
        return None
    first = seeds[0]
    if first is None or list(seeds) != [first + k for k in range(len(seeds))]:
        raise UsageError(
            f"{name} is seeded as a whole by one seed s (a list must read s, s + 1, ...); "
            f"got {list(seeds)}. Give seed=s (an int), or use {_PER_ENV} for seeds of your "
            "choice"
        )
    return first


def _check_task(env_id: str, vectorization: str) -> None:
    """Refuses an env the chosen backend cannot make, saying what to do instead."""
    if vectorization == VECTOR_ENTRY_POINT:
        if env_id not in gym.registry:
            raise EnvNotFoundError(f"no gymnasium env is registered under id {env_id!r}")
        if gym.spec(env_id).vector_entry_point is None:
            raise ConfigError(
                f"env {env_id!r} has no native vector entry point (gymnasium's "
                "vector_entry_point); use vectorization=None (one env per slot) or "
                "'envpool' if envpool has the task"
            )
    elif env_id not in _envpool().list_all_envs():
        raise ConfigError(
            f"envpool has no task {env_id!r}; envpool.list_all_envs() names its tasks, or "
            "use vectorization=None (one gymnasium.make env per slot)"
        )


def _episode_limit(env_id: str, vectorization: str, given: int | None) -> int:
    """The limit the native env is made with: given, else the registered one.

    The engine cuts episodes at the same step (TIMEOUT), so the native env
    must truncate there too: otherwise its episode would go on unseen.
    """
    if given is not None:
        return given
    registered = gym.spec(env_id).max_episode_steps if env_id in gym.registry else None
    if registered is None:
        raise ConfigError(
            f"env {env_id!r} ({vectorization}) has no registered episode limit; give "
            "EnvConfig(max_episode_length=...) so the native env truncates where the worker does"
        )
    return int(registered)


def _envpool() -> Any:
    try:
        return importlib.import_module("envpool")
    except ImportError as exc:
        raise ConfigError(
            "vectorization='envpool' needs envpool on the worker: pip install 'rlfleet[envpool]'"
        ) from exc


__all__ = ["ENVPOOL", "NATIVE_VECTORIZATIONS", "VECTOR_ENTRY_POINT", "NativeVectorEnv"]
