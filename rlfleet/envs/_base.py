"""BaseVectorEnv: tianshou's vector-env API over a list of gymnasium envs.

The base class owns everything that does not depend on where the envs run:
id normalisation, seed bookkeeping, the "reset before step" rule, batching
of results and tianshou's asynchronous mode (``wait_num``/``timeout``). A
backend subclass only starts a command on some envs (:meth:`BaseVectorEnv._send`)
and collects the answers that are ready (:meth:`BaseVectorEnv._receive`); the
commands themselves are executed by :func:`run_command`, in this process
(``DummyVectorEnv``), in a child process (``SubprocVectorEnv``) or on a fleet
worker (``RemoteVectorEnv``).
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

from rlfleet._util.closing import ClosesOnExit
from rlfleet.errors import (
    ConfigError,
    InvalidValueError,
    OutOfRangeError,
    UsageError,
    VectorEnvError,
    WrongTypeError,
)

EnvFactory: TypeAlias = Callable[[], gym.Env]
#: Which envs a call applies to: None (all), one index, or a sequence of indices.
EnvIds: TypeAlias = int | np.integer | Sequence[int] | np.ndarray | None
Seeds: TypeAlias = int | np.integer | Sequence[int | None] | None
#: What :meth:`BaseVectorEnv.step_envs` returns: observations, rewards, ended, infos, failures.
EnvRows: TypeAlias = tuple[
    list[Any],
    list[Any],
    list[tuple[int, bool, bool]],
    list[tuple[int, Any]],
    list[tuple[int, Exception]],
]

# The commands an env executes, with the argument a backend sends:
#   RESET: reset kwargs (dict); STEP: the env's action; RENDER: render kwargs;
#   GET_ATTR: the attribute name; SET_ATTR: (name, value);
#   CALL: (method name, args tuple, kwargs dict);
#   CLASS_NAMES: None (answer: qualified names of every class in the wrapper stack).
RESET, STEP, RENDER, GET_ATTR, SET_ATTR = "reset", "step", "render", "get_attr", "set_attr"
CALL, CLASS_NAMES = "call", "class_names"
#: Not a command: names the env factory call in error messages.
MAKE = "make"


def _class_names(env: gym.Env) -> list[str]:
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


_COMMANDS: dict[str, Callable[[gym.Env, Any], Any]] = {
    RESET: lambda env, kwargs: env.reset(**kwargs),
    STEP: lambda env, action: env.step(action),
    RENDER: lambda env, kwargs: env.render(**kwargs),
    # get/set_wrapper_attr reach through gymnasium wrappers, which since
    # gymnasium 1.0 no longer forward plain attribute access.
    GET_ATTR: lambda env, key: env.get_wrapper_attr(key),
    SET_ATTR: lambda env, item: env.set_wrapper_attr(*item),
    CALL: lambda env, item: env.get_wrapper_attr(item[0])(*item[1], **item[2]),
    CLASS_NAMES: lambda env, _: _class_names(env),
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


def make_checked(factory: EnvFactory) -> gym.Env:
    """Calls an env factory and checks that it returned a gymnasium env.

    Raises:
        WrongTypeError: If the factory returned something else.
    """
    env = factory()
    if not isinstance(env, gym.Env):
        raise WrongTypeError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env")
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


def _release_nothing() -> list[BaseException]:
    return []


class BaseVectorEnv(ClosesOnExit, abc.ABC):
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
    bookkeeping and the error rules then come from this class. Like
    tianshou's, a subclass may also override the public methods.

    **A worker's engine** steps a backend through three more methods:
    :meth:`reset_env` (one env, with its episode's seed), :meth:`step_envs`
    (some envs at once, failures returned, not raised) and
    :meth:`rebuild_env` (a new env after a crash). The first two work on
    any backend through :meth:`_send`/:meth:`_receive`; a backend may
    specialise them (DummyVectorEnv calls its envs directly) and must
    implement :meth:`rebuild_env` to let a worker restart crashed envs.

    Args:
        env_num: Number of envs.
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
        env_num: int,
        release: Callable[[], list[BaseException]] = _release_nothing,
        *,
        wait_num: int | None = None,
        timeout: float | None = None,
    ) -> None:
        cls = type(self).__name__
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
        self._pending_seeds: list[int | None] = [None] * env_num
        self._needs_reset = np.ones(env_num, dtype=bool)
        # A command was sent and its answer not yet received from the backend.
        # Sets, not bool arrays: a step touches a few envs, and a numpy op on a
        # small array costs about 1 us where a set operation costs 0.1.
        self._in_flight: set[int] = set()
        # In flight, but the call that sent it was interrupted: the answer is
        # discarded when it comes (the caller was told by the interruption).
        self._stale: set[int] = set()
        # Step answers received but not yet returned (an async step raised
        # another env's failure, or was interrupted, after receiving them).
        self._undelivered: dict[int, Any] = {}
        self._closed = False
        self._finalizer = weakref.finalize(self, release)

    # --- the backend contract ------------------------------------------------

    @abc.abstractmethod
    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        """Starts ``command`` with ``args[k]`` on env ``ids[k]`` for every k, without waiting.

        For a step, ``args`` may be the caller's action array itself (its
        rows are the actions): read or copy what is needed before returning,
        as the caller may reuse the array afterwards.

        None of ``ids`` has a command in flight; other envs may (async mode,
        or :meth:`step_and_reset`, which sends two commands to disjoint envs
        before receiving). Every env of ``ids`` must then answer exactly once
        through :meth:`_receive`: a failure to send (the env is gone, the
        argument cannot be encoded) is answered with a :class:`FailedCall`,
        not raised. Only an interruption (e.g. KeyboardInterrupt) may
        propagate; the backend then makes sure no env of ``ids`` answers
        later.
        """

    @abc.abstractmethod
    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        """Collects the answers of envs ``ids``, each of which has one command in flight.

        Returns when at least ``count`` of them have answered, with every
        answer available by then; or when ``timeout`` seconds (None: no
        limit) have passed, with the answers so far (possibly none). An
        answer is the env's result, or a :class:`FailedCall` if it raised,
        died, or passed the backend's own per-call deadline (which must end
        the wait even when ``timeout`` is None).

        It may be interrupted (e.g. KeyboardInterrupt); the answers it had
        collected by then must come from a later call.

        Returns:
            ``{env index: answer}`` for the envs that answered.
        """

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
        # An action array is its own rows (as _action_rows gives them to _send).
        answers = self._wait_all([(ids, STEP, actions)])  # type: ignore[list-item]
        return step_each({i: _Answered(answers[i]) for i in ids}, ids, actions)

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
            seeds = _expand_seeds(kwargs.pop("seed"), len(ids), f"{call}(seed=...)")
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
        return stack_batch(observations), _info_array(infos, ids)

    def _step_rows(self, ids: list[int], action: Any) -> Sequence[Any]:
        """Checks a step of ``ids`` and splits ``action`` into one row per env."""
        rows = _action_rows(action, ids)
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
            stack_batch(observations),
            np.asarray(rewards, dtype=np.float64),
            terminated_array,
            truncated_array,
            _info_array(infos, ids),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"{type(self).__name__} is closed; make a new one")

    def _check_idle(self, ids: list[int], call: str) -> None:
        """Refuses envs whose async step has not been returned yet."""
        busy = []
        in_flight = self._in_flight
        if in_flight:  # else (sync mode, between calls) none is busy
            busy = [i for i in ids if i in in_flight and i not in self._stale]
        if self._undelivered:
            busy += [i for i in ids if i in self._undelivered]
        if busy:
            raise UsageError(
                f"{call}(): envs {sorted(busy)} have a step in flight (async mode); "
                "call step() without them until it returns them"
            )

    def _start(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        """Discards stale answers of ``ids``, then sends them ``command``."""
        stale = [i for i in ids if i in self._stale] if self._stale else []
        while stale:
            for i in self._receive(stale, len(stale), None):
                self._in_flight.discard(i)
                self._stale.discard(i)
            stale = [i for i in stale if i in self._stale]
        try:
            self._send(ids, command, args)
        except BaseException:
            self._needs_reset[ids] = True
            raise
        self._in_flight.update(ids)

    def _call(self, ids: list[int], command: str, args: Sequence[Any]) -> list[Any]:
        """Runs ``command`` on ``ids`` and waits for all of them (see :meth:`_call_many`)."""
        return self._call_many([(ids, command, args)])[0]

    def _call_many(
        self, batches: Sequence[tuple[list[int], str, Sequence[Any]]]
    ) -> list[list[Any]]:
        """Starts every batch (disjoint ids), then waits for every env of all of them.

        Returns:
            Each batch's answers, in its ids' order.

        Raises:
            Exception: The first failure (batches and ids in order), after
                every env answered.
        """
        answers = self._wait_all(batches)
        for batch_ids, _, _ in batches:
            for i in batch_ids:
                if isinstance(answers[i], FailedCall):
                    raise answers[i].error
        return [[answers[i] for i in batch_ids] for batch_ids, _, _ in batches]

    def _wait_all(self, batches: Sequence[tuple[list[int], str, Sequence[Any]]]) -> dict[int, Any]:
        """:meth:`_call_many` without raising: every env's answer, a FailedCall if it failed."""
        ids = [i for batch_ids, _, _ in batches for i in batch_ids]
        started: list[int] = []
        try:
            for batch_ids, command, args in batches:
                if batch_ids:
                    self._start(batch_ids, command, args)
                    started += batch_ids
        except BaseException:
            # Those already sent answer later; that answer is nobody's.
            self._stale.update(started)
            raise
        answers: dict[int, Any] = {}
        try:
            while len(answers) < len(ids):
                rest = [i for i in ids if i not in answers]
                answers.update(self._receive(rest, len(rest), None))
        finally:
            if len(answers) == len(ids):
                self._in_flight.difference_update(ids)
            else:
                for i in ids:
                    if i in answers:
                        self._in_flight.discard(i)
                    else:
                        self._stale.add(i)
        return answers

    def _collect_ready(self) -> tuple[list[int], list[Any]]:
        """Waits for the first ready async steps (tianshou's ``wait_num``/``timeout``).

        Returns:
            The ready env indices, ascending, and their step results.
        """
        ready = self._undelivered
        self._undelivered = {}
        busy = sorted(self._in_flight - self._stale if self._stale else self._in_flight)
        waiting = [i for i in busy if i not in ready] if ready else busy
        if not waiting and not ready:
            raise UsageError("step(): no env was stepped and none has a step in flight")
        try:
            need = min(self.wait_num, len(waiting) + len(ready)) - len(ready)
            if need > 0:
                got = self._receive(waiting, need, self.timeout)
                self._in_flight.difference_update(got)
                ready.update(got)
            while not ready:
                got = self._receive(waiting, 1, None)
                self._in_flight.difference_update(got)
                ready.update(got)
        except BaseException:
            self._undelivered = ready
            raise
        ids = sorted(ready)
        failed = [i for i in ids if isinstance(ready[i], FailedCall)]
        if failed:
            # The other answers (other failures too) come from the next step().
            self._undelivered = {i: ready[i] for i in ids if i != failed[0]}
            raise ready[failed[0]].error
        return ids, [ready[i] for i in ids]

    def _ids(self, id: EnvIds, *, allow_empty: bool = False) -> list[int]:
        """Normalises ``id`` to a list of distinct, valid env indices."""
        if id is None:
            return list(range(self.env_num))
        if type(id) is list and id and all(type(i) is int for i in id):
            # The common case (the ids a step returned, as ints): no numpy round trip.
            ids = list(id)
            if min(ids) >= 0 and max(ids) < self.env_num and len(set(ids)) == len(ids):
                return ids
        array = np.asarray(id)
        if allow_empty and array.size == 0 and array.ndim == 1:
            return []
        if array.ndim > 1 or array.size == 0 or array.dtype.kind not in "iu":
            raise InvalidValueError(
                f"id must be None, an env index or a 1-D sequence of them, got {id!r}"
            )
        ids = [int(i) for i in array.reshape(-1)]
        bad = [i for i in ids if not 0 <= i < self.env_num]
        if bad:
            raise OutOfRangeError(f"env ids {bad} out of range; there are {self.env_num} envs")
        if len(set(ids)) != len(ids):
            raise InvalidValueError(f"env ids must be distinct, got {ids}")
        return ids


def step_each(envs: Any, ids: list[int], actions: Sequence[Any] | np.ndarray) -> EnvRows:
    """Calls ``envs[ids[k]].step(actions[k])`` for each k: :meth:`BaseVectorEnv.step_envs`'s rows.

    The loop is a worker's hot path: per env, the ``step`` call, two
    appends and two tests; nothing is stored for an empty info dict.

    Args:
        envs: Indexable by env index: gymnasium envs, or anything with
            their ``step``.
        ids: The envs to step.
        actions: One action per env of ``ids``.

    Returns:
        As :meth:`BaseVectorEnv.step_envs`; a failure holds what ``step`` raised.
    """
    observations: list[Any] = []
    rewards: list[Any] = []
    add_observation, add_reward = observations.append, rewards.append
    ended: list[tuple[int, bool, bool]] = []
    infos: list[tuple[int, Any]] = []
    failures: list[tuple[int, Exception]] = []
    # strict=False: the caller gives one action per id.
    for i, action in zip(ids, actions, strict=False):
        try:
            observation, reward, terminated, truncated, info = envs[i].step(action)
        except Exception as exc:
            failures.append((i, exc))
            add_observation(None)
            add_reward(0.0)
            continue
        add_observation(observation)
        add_reward(reward)
        if info:
            infos.append((i, info))
        if terminated or truncated:
            ended.append((i, bool(terminated), bool(truncated)))
    return observations, rewards, ended, infos, failures


class _Answered:
    """A step answer received from a backend, in the shape of an env whose step gives it."""

    __slots__ = ("_answer",)

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def step(self, action: Any) -> Any:
        if isinstance(self._answer, FailedCall):
            raise self._answer.error
        return self._answer


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
        if isinstance(first, np.ndarray) and first.dtype != object:
            # Rows of one shape: np.array copies them as np.stack does, at a
            # third of its cost for small rows; differing shapes raise ValueError too.
            return np.array(items)
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


def _action_rows(action: Any, ids: list[int]) -> Sequence[Any]:
    """Splits a batched action into one action per env of ``ids``."""
    try:
        count = len(action)
    except TypeError:
        raise InvalidValueError(
            f"action must have one row per env stepped ({len(ids)} for ids {ids}), "
            f"got a {type(action).__name__} without rows"
        ) from None
    if count != len(ids):
        raise InvalidValueError(
            f"action has {count} rows but {len(ids)} envs are stepped (ids {ids})"
        )
    if isinstance(action, np.ndarray):
        # Its rows are action[k] already; a remote backend encodes it whole
        # (per-row numpy scalars cost ~1 us each to make and to pack again).
        return action  # type: ignore[return-value]  # a sequence of rows, not to mypy
    return [action[row] for row in range(count)]


def _expand_seeds(seed: Seeds, count: int, where: str) -> list[int | None]:
    """Turns None / an int / a sequence into one seed (or None) per env."""
    if seed is None:
        return [None] * count
    if isinstance(seed, int | np.integer):
        start = _as_seed(seed, where)
        return [start + k for k in range(count)]
    if isinstance(seed, str | bytes) or not isinstance(seed, Sequence | np.ndarray):
        raise InvalidValueError(
            f"{where}: seed must be None, an int or a list of ints, got {seed!r}"
        )
    seeds = list(seed)
    if len(seeds) != count:
        raise InvalidValueError(f"{where}: got {len(seeds)} seeds for {count} envs")
    return [None if item is None else _as_seed(item, where) for item in seeds]


def _as_seed(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidValueError(f"{where}: seeds must be ints >= 0 (or None), got {value!r}")
    return int(value)


__all__ = ["BaseVectorEnv", "EnvFactory", "EnvIds", "EnvRows", "FailedCall", "stack_batch"]
