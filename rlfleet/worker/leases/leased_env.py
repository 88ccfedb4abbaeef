"""One leased env: building it and running one op on it.

The worker's :class:`~rlfleet.worker.leases.host.LeaseHost` decides where and
when envs run (inline or on its pool); this module is what happens to one
env. Orders and answers are rlfleet types (rlfleet.wire.leases
translates them from and to protos/rlfleet/v1/leases.proto).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.values import json_object, json_value
from rlfleet.envs import EnvConfig
from rlfleet.envs.commands import (
    CALL,
    CLASS_NAMES,
    GET_ATTR,
    RENDER,
    SET_ATTR,
    make_checked,
    run_command,
)
from rlfleet.errors import ConfigError, EnvError, InvalidValueError, PolicyError, WireFormatError
from rlfleet.security.pickle import PickleGate
from rlfleet.wire import encode_space
from rlfleet.wire.lease_values import PICKLES_HINT
from rlfleet.wire.leases import LeaseAnswer, LeaseCallOrder, LeasedEnvSource

logger = logging.getLogger("rlfleet.worker")

#: Spaces a lease carries as one tensor per call.
_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
#: The vector-env command each op runs (rlfleet.envs.commands.run_command).
COMMANDS: dict[str, str] = {
    "render": RENDER,
    "get_attr": GET_ATTR,
    "set_attr": SET_ATTR,
    "call": CALL,
    "class_names": CLASS_NAMES,
}
#: Info key of an env that was lost with its worker and re-created here.
ENV_LOST_KEY = "rlfleet_env_lost"


#: How much an env's step estimate may rise per step beyond doubling
#: (see LeasedEnv.step_seconds).
_STEP_RISE_SECONDS = 1e-5


@dataclass
class LeasedEnv:
    """A leased env and what the host learned about it.

    Attributes:
        step_seconds: How long its steps take, robust to the odd outlier:
            the first step sets it; each later one moves it towards the
            step's seconds, but at most x2 + 10 us up and /2 down. An env
            that waits 1 ms per step reaches 0.2 ms (the pool's threshold)
            at once and stays there through a quick step or two, while a
            10 us env whose thread the OS held back for a few ms once drops
            under it within a few steps (a moving average took such envs to
            the pool on a loaded machine, where the pool's hand-offs cost
            more than their steps).
        reset_seconds: The same for its resets, which may take far longer
            than its steps (a simulator loading a scene).
        steps_timed: A step was timed (until then its calls run on the
            pool, so that slow envs never wait for each other on their
            first step).
        resets_timed: A reset was timed (likewise).
        space: Its observation space, read once (through every wrapper
            layer that is a property chain).
        needs_reset: Not reset yet: a step is refused. The env is built
            without gymnasium's OrderEnforcing (``make_env(...,
            worker_checked=True)``), so this flag is the check, one
            attribute read per step instead of a wrapper layer.
        typed: Its observations are arrays, typed to the space's dtype and
            shape (Box, Discrete, MultiDiscrete, MultiBinary); the others
            (an env of a lease of pickled factories) are sent as the env
            returns them.
    """

    env: gym.Env
    env_id: int
    lost: bool = False
    step_seconds: float = 0.0
    reset_seconds: float = 0.0
    steps_timed: bool = False
    resets_timed: bool = False
    needs_reset: bool = True
    space: gym.Space = field(init=False)
    obs_dtype: Any = field(init=False)
    obs_shape: tuple[int, ...] = field(init=False)
    typed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.space = self.env.observation_space
        self.obs_dtype = self.space.dtype
        self.obs_shape = tuple(self.space.shape or ())
        self.typed = isinstance(self.space, _ARRAY_SPACES)

    def timed(self, elapsed: float) -> None:
        """Records a step that took ``elapsed`` seconds."""
        self.step_seconds = _estimate(self.step_seconds, elapsed, self.steps_timed)
        self.steps_timed = True

    def reset_timed(self, elapsed: float) -> None:
        """Records a reset that took ``elapsed`` seconds."""
        self.reset_seconds = _estimate(self.reset_seconds, elapsed, self.resets_timed)
        self.resets_timed = True

    def slow(self, op: str, threshold: float) -> bool:
        """Whether ``op`` on this env should run on the pool: its estimate is
        above ``threshold`` seconds, or a step or reset was never timed."""
        if op == "reset":
            return not self.resets_timed or self.reset_seconds > threshold
        if op == "step":
            return not self.steps_timed or self.step_seconds > threshold
        return self.step_seconds > threshold


def _estimate(last: float, elapsed: float, timed_before: bool) -> float:
    """The new estimate of an op's seconds (see LeasedEnv.step_seconds)."""
    if not timed_before:
        return elapsed
    return min(max(elapsed, last / 2), 2 * last + _STEP_RISE_SECONDS)


def lease_factories(update: LeasedEnvSource, pickle: PickleGate) -> list[Callable[[], Any]]:
    """The env factories of a lease built from pickled factories, where this worker allows it.

    Raises:
        PermissionDeniedError: If this worker takes no pickles (docs/security.md).
        ConfigError: If the bytes do not unpickle to a list of callables.
    """
    factories = pickle.loads(update.pickled, "LeaseCreate.env.pickled_env_factory", ConfigError)
    if not isinstance(factories, list) or not all(callable(f) for f in factories):
        raise ConfigError(
            "LeaseCreate.env.pickled_env_factory must hold a list of env factories, got "
            f"{type(factories).__name__}"
        )
    return factories


def build_from_factory(factories: list[Callable[[], Any]], env_id: int) -> Any:
    """Calls the factory of env ``env_id`` of a lease (its own, as tianshou's env_fns[i])."""
    if env_id >= len(factories):
        raise ConfigError(f"the lease has {len(factories)} env factories, none for env {env_id}")
    return make_checked(factories[env_id])


def lease_config(update: LeasedEnvSource, imports: tuple[str, ...]) -> EnvConfig:
    """The EnvConfig of a lease; refuses what must not come from the network."""
    if update.pickled:
        raise ConfigError("this lease's envs come from pickled factories, not from an env id")
    if ":" in update.env_id:
        raise ConfigError(
            f"env id {update.env_id!r} names a module to import, which this worker refuses "
            "from the network; start the worker with --import MODULE and lease the plain id"
        )
    if update.vectorization:
        raise ConfigError(
            f"leased envs are single envs stepped one by one in the worker's process; "
            f"{update.env_id!r} with vectorization={update.vectorization!r} is not: lease it "
            "without vectorization"
        )
    kwargs = json_object(update.kwargs_json, "EnvUpdate.kwargs_json")
    return EnvConfig(update.env_id, kwargs, update.max_episode_length, imports)


def check_spaces(env: gym.Env, env_id: str, *, pickles: bool = False) -> None:
    """Refuses spaces a lease cannot carry.

    Actions travel as one tensor per call, so action spaces are Box,
    Discrete, MultiDiscrete or MultiBinary. So are observation spaces,
    except on a lease of pickled factories (``pickles``), where any
    observation travels pickled (rlfleet.wire.lease_values).

    Raises:
        ConfigError: Naming the space and what to do.
    """
    if not isinstance(env.action_space, _ARRAY_SPACES):
        raise ConfigError(
            f"env {env_id!r}: leased envs take actions of a Box, Discrete, MultiDiscrete or "
            f"MultiBinary space; its action_space is a {type(env.action_space).__name__}. "
            "Give the env a flat one (gymnasium.spaces.flatten_space) and unflatten its actions"
        )
    space = env.observation_space
    if pickles:
        try:
            encode_space(space)  # the lease's EnvSpec carries it
        except WireFormatError as exc:
            raise ConfigError(
                f"env {env_id!r}: its observation_space cannot travel in the lease's EnvSpec "
                f"({exc}); give the env a space of those kinds"
            ) from exc
    elif not isinstance(space, _ARRAY_SPACES):
        raise ConfigError(
            f"env {env_id!r}: leases of env ids carry Box, Discrete, MultiDiscrete and "
            f"MultiBinary observation spaces; its observation_space is a "
            f"{type(space).__name__}. Flatten it with a gymnasium wrapper "
            f"(FlattenObservation) in a registered env, {PICKLES_HINT}"
        )


def call_args(call: LeaseCallOrder) -> list[Any]:
    """Per env: (seed, options) for a reset, the action row for a step."""
    count = len(call.env_ids)
    if call.op == "reset":
        seeds: list[int | None] = [None if s < 0 else int(s) for s in call.seeds] or [None] * count
        if len(seeds) != count:
            raise ConfigError(f"a reset of {count} envs carries {len(seeds)} seeds")
        options = (
            json_object(call.options_json, "LeaseCall.options_json") if call.options_json else None
        )
        return [(seed, options) for seed in seeds]
    if call.op == "step":
        if call.bad_actions is not None:
            raise call.bad_actions
        actions = call.actions
        if actions is None or actions.ndim < 1 or actions.shape[0] != count:
            raise ConfigError(
                f"a step of {count} envs carries actions of shape "
                f"{None if actions is None else actions.shape}; the "
                "first dimension must be the number of envs"
            )
        # Numpy scalars (Discrete) or row views, as gymnasium's vector envs pass them.
        return list(actions)
    if call.op == "set_attr":
        return [(call.name, json_value(call.value_json, "SET_ATTR value_json"))] * count
    if call.op == "call":
        args, kwargs = json_value(call.value_json, "CALL value_json") or ([], {})
        return [(call.name, tuple(args), dict(kwargs))] * count
    if call.op == "get_attr":
        return [call.name] * count
    if call.op in COMMANDS:
        return [{}] * count if call.op == "render" else [None] * count
    raise ConfigError(f"LeaseCall {call.op} is not an op a learner may call")


def check_actions(actions: np.ndarray, space: gym.Space, lease_id: int) -> None:
    """Refuses actions (one row per env) of the wrong shape or kind before any env sees them.

    Raises:
        PolicyError: Naming the lease, the shapes and the space.
    """
    want = space.shape or ()
    integral = isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    if actions.shape[1:] != tuple(want) or (integral and actions.dtype.kind not in "iu"):
        raise PolicyError(
            f"lease {lease_id}: actions of shape {actions.shape[1:]} and dtype {actions.dtype} "
            f"per env do not fit the action space {space}"
        )


def run_env(leased: LeasedEnv, op: str, arg: Any, prefetch: bool = False) -> LeaseAnswer:
    """Runs one op on one env; never raises (the outcome holds the error).

    With ``prefetch``, a step that ends the episode is followed by a reset
    (no seed, no options) whose result rides along (LeaseCall.prefetch_reset).
    """
    env = leased.env
    if op == "step" and leased.needs_reset and not leased.lost:
        return LeaseAnswer(
            leased.env_id,
            error=EnvError(
                f"env {leased.env_id} was stepped before its first reset; reset it first "
                f"(reset(id=[{leased.env_id}]) on the learner's vector env)",
                env_index=leased.env_id,
            ),
        )
    started = time.perf_counter()
    try:
        if op == "step" and not leased.lost:  # the hot path first
            obs, reward, terminated, truncated, info = env.step(arg)
            outcome = LeaseAnswer(
                leased.env_id,
                _typed(leased, obs),
                float(reward),
                bool(terminated),
                bool(truncated),
                info,
            )
        elif op == "step":
            # The env's episode died with its old worker: answer the step with a
            # fresh episode's first observation, cut (truncated), and say why.
            obs, info = env.reset()
            leased.needs_reset = False
            outcome = LeaseAnswer(
                leased.env_id, _typed(leased, obs), truncated=True, info=_lost_info(leased, info)
            )
        elif op == "reset":
            seed, options = arg
            obs, info = env.reset(seed=seed, options=options)
            leased.reset_timed(time.perf_counter() - started)
            leased.needs_reset = False
            outcome = LeaseAnswer(leased.env_id, _typed(leased, obs), info=_lost_info(leased, info))
        else:
            outcome = LeaseAnswer(leased.env_id, value=run_command(env, COMMANDS[op], arg))
    except Exception as exc:
        error = EnvError(
            f"env {leased.env_id} raised {type(exc).__name__} in {op}: {exc}",
            env_index=leased.env_id,
            remote_traceback="".join(traceback.format_exception(exc)),
        )
        return LeaseAnswer(leased.env_id, error=error)
    if op == "step":
        leased.timed(time.perf_counter() - started)
        if prefetch and (outcome.terminated or outcome.truncated):
            try:
                obs, info = env.reset()
                outcome.reset = (_typed(leased, obs), info)
            except Exception:  # the learner's own reset will meet (and report) it
                logger.debug("prefetched reset of leased env %d failed", leased.env_id)
    return outcome


def _typed(leased: LeasedEnv, obs: Any) -> Any:
    """The observation in its space's dtype, as gymnasium's vector envs batch it
    (many envs return float64 arrays for a float32 Box); as the env returned it
    where its space is not an array space (a lease of pickled factories)."""
    if not leased.typed:
        return obs
    array = np.asarray(obs, dtype=leased.obs_dtype)
    if array.shape != leased.obs_shape:
        raise InvalidValueError(
            f"the env returned an observation of shape {array.shape}; its observation "
            f"space {leased.space} has shape {leased.space.shape}"
        )
    return array


def _lost_info(leased: LeasedEnv, info: Mapping[str, Any]) -> Mapping[str, Any]:
    if not leased.lost:
        return info
    leased.lost = False
    return {**info, ENV_LOST_KEY: True}
