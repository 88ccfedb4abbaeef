"""BaseVectorEnv: tianshou's vector-env API over a list of envs.

The base class owns everything that does not depend on where the envs run:
id normalisation, seeding, the "reset before step" rule, batching of
results and tianshou's asynchronous mode (``wait_num``/``timeout``). A
backend subclass only starts a command on some envs (``_send``) and collects
the answers that are ready (``_receive``), see
:class:`~rlfleet.envs.dispatch.CommandDispatch`; the commands themselves are
executed by :func:`~rlfleet.envs.commands.run_command`, in this process
(``DummyVectorEnv``), in a child process (``SubprocVectorEnv``) or on a fleet
worker (``RemoteVectorEnv``). A tianshou-style subclass may instead override
the public methods themselves.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.closing import ClosesOnExit
from rlfleet.envs.batching import (
    Answered,
    EnvIds,
    EnvRows,
    Seeds,
    action_rows,
    env_ids,
    expand_seeds,
    info_array,
    stack_batch,
    stack_observations,
    step_each,
)
from rlfleet.envs.commands import (
    CALL,
    CLASS_NAMES,
    GET_ATTR,
    RENDER,
    RESET,
    SEED,
    SET_ATTR,
    STEP,
    EnvFactory,
)
from rlfleet.envs.dispatch import CommandDispatch
from rlfleet.errors import (
    ConfigError,
    InvalidValueError,
    UsageError,
    VectorEnvError,
    WrongTypeError,
)


def _release_nothing() -> list[BaseException]:
    return []


class BaseVectorEnv(ClosesOnExit, CommandDispatch):
    """Several envs stepped together, with tianshou's API.

    Differences from a single gymnasium env, all as in tianshou:

    * Results are batched: one row per env in ``id`` order. Observations are
      stacked with ``np.stack`` (Dict observations become an object array of
      the envs' dicts, as tianshou's ``np.stack`` makes it; Tuple ones, which
      tianshou refuses, a tuple of stacked arrays; observations of different
      shapes an object array). Rewards are float64, ``terminated``/``truncated``
      bool arrays.
    * ``infos`` is a 1-D numpy object array holding one dict per env, each a
      copy of the env's info with ``"env_id"`` (the env index) added.
    * No autoreset: when an env's episode ends, call ``reset(id=...)`` for
      it. Stepping it before that raises :class:`~rlfleet.errors.VectorEnvError`
      (gymnasium would step a finished episode silently). Envs must also
      be reset (or seeded) once before their first step, and reset after
      any failed call.
    * :meth:`seed` reseeds at once: an env with a ``seed()`` method of its
      own (old gym API) gets it called; any other env is reset with the seed
      (``env.reset(seed=...)``), which is how tianshou seeds a gymnasium env.
      Either way the env may be stepped right after.
    * Envs are duck-typed: a ``gymnasium.Env`` or any object with
      gymnasium's ``reset``/``step``; attributes are read through gymnasium
      wrappers when there are any.

    If a ``reset``/``step`` call raises, every env it addressed must be
    reset before it is stepped again (its result was not delivered).

    **Asynchronous mode** (tianshou's): with ``wait_num`` < ``env_num`` or a
    ``timeout``, :meth:`step` sends the actions of the envs in ``id`` and
    returns as soon as ``wait_num`` of all the envs with a step in flight
    have answered, or ``timeout`` seconds have passed and at least one has:
    one slow env never blocks the batch. It returns only the ready envs,
    in env-index order; ``infos[k]["env_id"]`` says which env row ``k`` is.
    The others stay in flight and come back from a later ``step`` (whose
    ``id`` must not name them). ``reset``, ``render`` and the attribute
    calls refuse envs with a step in flight.

    Subclassing: a backend implements :meth:`_send` and :meth:`_receive`
    (and passes a ``release`` function); every public method, the async
    bookkeeping and the error rules then come from this class. A
    tianshou-style subclass instead calls ``super().__init__(env_fns)`` and
    overrides the public methods it needs (``step``, ``reset``, ``seed``,
    ``render``, ``close``); a public method it did not override raises
    :class:`~rlfleet.errors.UsageError` saying so.

    **A worker's engine** steps a backend through three more methods:
    :meth:`reset_env` (one env, with its episode's seed), :meth:`step_envs`
    (some envs at once, failures returned, not raised) and
    :meth:`rebuild_env` (a new env after a crash). The first two work on
    any backend through :meth:`_send`/:meth:`_receive`; a backend may
    specialise them (DummyVectorEnv calls its envs directly) and must
    implement :meth:`rebuild_env` to let a worker restart crashed envs.

    Args:
        env_num: Number of envs, or the env factories themselves (tianshou's
            ``BaseVectorEnv(env_fns)``: kept as ``self._env_fns``, not called).
        release: Frees the subclass's resources (envs, processes). It must
            not reference the vector env itself; it runs once, at
            :meth:`close`, garbage collection or interpreter exit, and
            returns the errors it met (the first is raised by ``close``).
        wait_num: In async mode, how many envs :meth:`step` waits for (1 to
            ``env_num``); None means ``env_num``.
        timeout: In async mode, seconds :meth:`step` waits for ``wait_num``
            envs before returning the ones ready (at least one); None waits
            for ``wait_num``. It is no deadline: backends have their own
            (e.g. ``SubprocVectorEnv(call_timeout=...)``).

    Raises:
        ConfigError: If ``wait_num`` or ``timeout`` is out of range.
    """

    def __init__(
        self,
        env_num: int | Sequence[EnvFactory],
        release: Callable[[], list[BaseException]] = _release_nothing,
        *,
        wait_num: int | None = None,
        timeout: float | None = None,
    ) -> None:
        cls = type(self).__name__
        if not isinstance(env_num, int | np.integer):
            #: tianshou's attribute: the factories a tianshou-style subclass was given.
            self._env_fns = list(env_num)
            env_num = len(self._env_fns)
        if isinstance(env_num, bool) or env_num < 1:
            raise ConfigError(f"{cls} needs at least one env, got {env_num!r}")
        env_num = int(env_num)
        if wait_num is not None and (
            isinstance(wait_num, bool)
            or not isinstance(wait_num, int | np.integer)
            or not 1 <= wait_num <= env_num
        ):
            raise ConfigError(
                f"{cls}(wait_num={wait_num!r}): give 1 to {env_num} (the envs), or None"
            )
        if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
            raise ConfigError(f"{cls}(timeout={timeout!r}): give seconds > 0, or None")
        self.env_num = env_num
        #: How many envs an async :meth:`step` waits for.
        self.wait_num = env_num if wait_num is None else int(wait_num)
        #: Seconds an async :meth:`step` waits for ``wait_num`` envs (None: no limit).
        self.timeout = timeout
        #: tianshou's flag: True if :meth:`step` may return only some of the envs.
        self.is_async = self.wait_num != env_num or timeout is not None
        # Seeds for the envs' next reset without a seed (RemoteVectorEnv(seed=...)).
        self._pending_seeds: list[int | None] = [None] * env_num
        self._init_dispatch(env_num)
        self._closed = False
        self._finalizer = weakref.finalize(self, release)

    # --- the public API ------------------------------------------------------

    def __len__(self) -> int:
        """Returns the number of envs."""
        return self.env_num

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}(env_num={self.env_num}, {state})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def waiting_id(self) -> list[int]:
        """tianshou's name: the envs whose async step has not been returned yet."""
        return sorted((self._in_flight - self._stale) | set(self._undelivered))

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
            UsageError: If an env of ``id`` has a step in flight (async mode).
            VectorEnvError: If an env raised, died or timed out.
        """
        self._check_open()
        if id is not None and env_id is not None:
            raise WrongTypeError("reset() got both id and env_id; they are the same argument")
        ids = self._ids(env_id if id is None else id)
        args = self._reset_args(ids, kwargs, "reset")
        (results,) = self._call_many([(ids, RESET, args)])
        return self._reset_results(ids, results)

    def step(
        self, action: Any, id: EnvIds = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps some envs, one action row per env.

        Args:
            action: An array or sequence with one row per env of ``id``:
                ``action[k]`` goes to env ``id[k]``.
            id: Envs to step: None for all, an index, or a sequence of them.
                In async mode it may be empty (``step([], id=[])``), or
                ``action`` None (tianshou's ``step(None, id=venv.waiting_id)``):
                that only collects steps in flight.

        Returns:
            ``(obs, rewards, terminated, truncated, infos)``: one row per env
            of ``id`` in ``id`` order; in async mode, one row per ready env
            in env-index order (``infos[k]["env_id"]`` names it).

        Raises:
            InvalidValueError: If the number of actions does not match ``id``.
            UsageError: If an env of ``id`` has a step in flight (async mode).
            VectorEnvError: If an env must be reset first, or raised, died or
                timed out.
        """
        self._check_open()
        if action is None and self.is_async:
            ids: list[int] = []  # tianshou's step(None, id): only collect
        else:
            ids = self._ids(id, allow_empty=self.is_async)
        rows = self._step_rows(ids, [] if action is None else action)
        if self.is_async:
            if ids:
                self._start(ids, STEP, rows)
            ids, results = self._collect_ready()
        else:
            (results,) = self._call_many([(ids, STEP, rows)])
        return self._step_results(ids, results)

    def step_and_reset(
        self, action: Any, id: EnvIds, reset_id: EnvIds, **kwargs: Any
    ) -> tuple[tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[Any, np.ndarray]]:
        """Steps envs ``id`` and resets envs ``reset_id`` in one round (sync mode).

        The same as ``step(action, id)`` then ``reset(reset_id, **kwargs)``,
        but the envs run both at once: one round trip instead of two for
        remote envs. gymnasium's next-step autoreset uses it.

        Args:
            action: One action row per env of ``id``.
            id: Envs to step; may be empty.
            reset_id: Envs to reset; may be empty; none may be in ``id``.
            **kwargs: As for :meth:`reset`.

        Returns:
            ``(step results, reset results)``, as :meth:`step` and
            :meth:`reset` return them (empty batches for empty ids).

        Raises:
            UsageError: In async mode.
            InvalidValueError: If an env is in both ``id`` and ``reset_id``.
        """
        self._check_open()
        if self.is_async:
            raise UsageError("step_and_reset() is for sync mode; use step() and reset()")
        ids = self._ids(id, allow_empty=True)
        reset_ids = self._ids(reset_id, allow_empty=True)
        both = sorted(set(ids) & set(reset_ids))
        if both:
            raise InvalidValueError(f"step_and_reset(): envs {both} are both stepped and reset")
        rows = self._step_rows(ids, action)
        args = self._reset_args(reset_ids, kwargs, "step_and_reset")
        step_results, reset_results = self._call_many([(ids, STEP, rows), (reset_ids, RESET, args)])
        return self._step_results(ids, step_results), self._reset_results(reset_ids, reset_results)

    def seed(self, seed: Seeds = None) -> list[Any]:
        """Reseeds every env now, as tianshou does.

        An env with a ``seed()`` method of its own (old gym API) gets it
        called; any other env is reset with the seed (``env.reset(seed=...)``,
        its first observation dropped). Every env may then be stepped.

        Args:
            seed: None, an int ``s`` (env ``j`` gets ``s + j``), or one seed
                (or None) per env.

        Returns:
            Per env, what its ``seed()`` returned, or ``[seed]`` (tianshou's
            answer).

        Raises:
            UsageError: If an env has a step in flight (async mode).
            VectorEnvError: If an env raised, died or timed out (every env
                then needs a reset).
        """
        self._check_open()
        seeds = expand_seeds(seed, self.env_num, "seed()")
        ids = self._ids(None)
        self._check_idle(ids, "seed")
        self._needs_reset[ids] = True  # until every env has answered
        answers = self._seed_envs(ids, seeds)
        self._needs_reset[ids] = False
        self._pending_seeds = [None] * self.env_num
        return answers

    def _seed_envs(self, ids: list[int], seeds: list[int | None]) -> list[Any]:
        """Seeds envs ``ids`` (see :meth:`seed`); a backend whose envs have no
        ``seed()`` of their own may reset them instead."""
        return self._call(ids, SEED, seeds)

    def _seed_next_reset(self, seed: Seeds) -> None:
        """Records seeds that each env's next reset without a seed uses (once)."""
        self._pending_seeds = expand_seeds(seed, self.env_num, "seed")

    def render(self, **kwargs: Any) -> list[Any]:
        """Renders every env; returns one frame (or None) per env.

        The envs' ``render_mode`` is chosen when they are made, e.g.
        ``EnvConfig("CartPole-v1", {"render_mode": "rgb_array"})``.
        """
        self._check_open()
        ids = self._ids(None)
        self._check_idle(ids, "render")
        return self._call(ids, RENDER, [kwargs] * self.env_num)

    def get_env_attr(self, key: str, id: EnvIds = None) -> list[Any]:
        """Returns attribute ``key`` of each env of ``id`` (through wrappers)."""
        self._check_open()
        ids = self._ids(id)
        self._check_idle(ids, "get_env_attr")
        return self._call(ids, GET_ATTR, [key] * len(ids))

    def set_env_attr(self, key: str, value: Any, id: EnvIds = None) -> None:
        """Sets attribute ``key`` to ``value`` on each env of ``id``.

        The attribute is set where it lives in the wrapper stack, or on the
        outermost wrapper if no layer has it.
        """
        self._check_open()
        ids = self._ids(id)
        self._check_idle(ids, "set_env_attr")
        self._call(ids, SET_ATTR, [(key, value)] * len(ids))

    def call_env_method(
        self,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        id: EnvIds = None,
    ) -> list[Any]:
        """Calls method ``name`` (found through wrappers) on each env of ``id``.

        Returns:
            Each env's return value, in ``id`` order.
        """
        self._check_open()
        ids = self._ids(id)
        self._check_idle(ids, "call_env_method")
        item = (name, tuple(args), dict(kwargs or {}))
        return self._call(ids, CALL, [item] * len(ids))

    def class_names(self, id: EnvIds = None) -> list[list[str]]:
        """Returns, per env of ``id``, the qualified names of every class in its wrapper stack.

        Bases are included, so ``"gymnasium.core.Wrapper"`` is there for any
        wrapped env. This is how adapters answer "is env k wrapped in X"
        without sending a class to where the env runs.
        """
        self._check_open()
        ids = self._ids(id)
        self._check_idle(ids, "class_names")
        return self._call(ids, CLASS_NAMES, [None] * len(ids))

    def close(self) -> None:
        """Closes every env and frees its resources. Safe to call twice.

        Steps still in flight (async mode) are abandoned.

        Raises:
            Exception: The first error an env's ``close`` raised, after every
                env was closed anyway.
        """
        self._closed = True
        self._undelivered.clear()
        errors = self._finalizer()
        if errors:
            raise errors[0]

    # --- a worker's engine: one env at a time, failures returned ------------------

    def reset_env(self, id: int, seed: int | None) -> Any:
        """Resets env ``id`` with ``seed`` and returns its first observation.

        With :meth:`step_envs` and :meth:`rebuild_env`, what a worker's
        engine steps a backend with: it resets each env before stepping it
        and after its episode ends, so these skip tianshou's reset-before-step
        bookkeeping (envs driven this way count as needing a :meth:`reset`
        for :meth:`step`). Sync mode only.

        Raises:
            Exception: What the env raised, or the backend's error for it
                (e.g. VectorEnvError if its process died).
        """
        self._check_open()
        self._check_idle([id], "reset_env")
        ((observation, _),) = self._call([id], RESET, [{"seed": seed}])
        return observation

    def step_envs(self, ids: list[int], actions: Sequence[Any] | np.ndarray) -> EnvRows:
        """Steps envs ``ids`` once each, ``actions[k]`` to env ``ids[k]``, all at once.

        One env's failure does not fail the call: it is returned with the
        others' results (see :meth:`reset_env` for the bookkeeping skipped).
        A backend sends every action before waiting for any answer.

        Returns:
            ``(observations, rewards, ended, infos, failures)``: one
            observation and reward per env of ``ids`` (None and 0.0 for a
            failed env; an observation may view the backend's buffer until
            its next call); ``(env, terminated, truncated)`` of the envs
            whose episode ended; ``(env, info)`` of the envs whose info dict
            is not empty; ``(env, exception)`` of the envs that failed.
        """
        self._check_open()
        self._check_idle(ids, "step_envs")
        # An action array is its own rows (as action_rows gives them to _send).
        answers = self._wait_all([(ids, STEP, actions)])  # type: ignore[list-item]
        return step_each({i: Answered(answers[i]) for i in ids}, ids, actions)

    def rebuild_env(self, id: int) -> None:
        """Replaces env ``id`` (e.g. after a crash) with a new one from its factory.

        The old env is closed first (an error its close raises is ignored:
        it may have crashed). The new env needs a reset before a step.

        Raises:
            UsageError: If the backend cannot rebuild one env (this base's answer).
        """
        raise UsageError(
            f"{type(self).__name__} cannot rebuild one env; close it and make a new vector env"
        )

    # --- bookkeeping shared by every backend -------------------------------------

    def _reset_args(self, ids: list[int], kwargs: dict[str, Any], call: str) -> list[Any]:
        """Checks a reset of ``ids`` and returns each env's reset kwargs."""
        if "seed" in kwargs:
            seeds = expand_seeds(kwargs.pop("seed"), len(ids), f"{call}(seed=...)")
        else:
            seeds = [self._pending_seeds[i] for i in ids]
        self._check_idle(ids, call)
        self._needs_reset[ids] = True
        return [{**kwargs, "seed": seed} for seed in seeds]

    def _reset_results(self, ids: list[int], results: list[Any]) -> tuple[Any, np.ndarray]:
        self._needs_reset[ids] = False
        for i in ids:
            self._pending_seeds[i] = None
        if not ids:
            return np.empty(0), np.empty(0, dtype=object)
        observations, infos = zip(*results, strict=True)
        return stack_observations(observations), info_array(infos, ids)

    def _step_rows(self, ids: list[int], action: Any) -> Sequence[Any]:
        """Checks a step of ``ids`` and splits ``action`` into one row per env."""
        rows = action_rows(action, ids)
        self._check_idle(ids, "step")
        blocked = [i for i in ids if self._needs_reset[i]]
        if blocked:
            raise VectorEnvError(
                f"cannot step envs {blocked}: each must be reset first (never reset, "
                f"episode ended, or its last call failed); call reset(id={blocked})",
                env_index=blocked[0],
            )
        self._needs_reset[ids] = True
        return rows

    def _step_results(
        self, ids: list[int], results: list[Any]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not ids:
            empty = np.empty(0, dtype=bool)
            return np.empty(0), np.empty(0), empty, empty, np.empty(0, dtype=object)
        observations, rewards, terminated, truncated, infos = zip(*results, strict=True)
        terminated_array = np.asarray(terminated, dtype=bool)
        truncated_array = np.asarray(truncated, dtype=bool)
        self._needs_reset[ids] = terminated_array | truncated_array
        return (
            stack_observations(observations),
            np.asarray(rewards, dtype=np.float64),
            terminated_array,
            truncated_array,
            info_array(infos, ids),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"{type(self).__name__} is closed; make a new one")

    def _ids(self, id: EnvIds, *, allow_empty: bool = False) -> list[int]:
        """Normalises ``id`` to a list of distinct, valid env indices."""
        return env_ids(id, self.env_num, allow_empty=allow_empty)


__all__ = ["BaseVectorEnv", "EnvFactory", "EnvIds", "EnvRows", "Seeds", "stack_batch"]
