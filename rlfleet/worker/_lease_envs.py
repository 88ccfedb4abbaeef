"""One leased env: building it, running one op on it, and the reply's encoding.

The worker's :class:`~rlfleet.worker._leases.LeaseHost` decides where and
when envs run (inline or on its pool); this module is what happens to one
env and how answers become a ``LeaseReply`` (protos/rlfleet/v1/leases.proto).
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.envs import EnvConfig
from rlfleet.envs._base import CALL, CLASS_NAMES, GET_ATTR, RENDER, SET_ATTR, run_command
from rlfleet.errors import ConfigError, EnvError, PolicyError
from rlfleet.v1 import leases_pb2, updates_pb2
from rlfleet.wire import decode_tensor, encode_tensor, encode_tensor_map

logger = logging.getLogger("rlfleet.worker")

#: Spaces a lease carries as one tensor per call.
_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
#: The vector-env command each op runs (rlfleet.envs._base.run_command).
COMMANDS: dict[int, str] = {
    leases_pb2.LEASE_OP_RENDER: RENDER,
    leases_pb2.LEASE_OP_GET_ATTR: GET_ATTR,
    leases_pb2.LEASE_OP_SET_ATTR: SET_ATTR,
    leases_pb2.LEASE_OP_CALL: CALL,
    leases_pb2.LEASE_OP_CLASS_NAMES: CLASS_NAMES,
}
#: Info key of an env that was lost with its worker and re-created here.
ENV_LOST_KEY = "rlfleet_env_lost"


@dataclass
class LeasedEnv:
    env: gym.Env
    env_id: int
    lost: bool = False
    step_seconds: float = 0.0  # moving average


@dataclass
class LeaseAnswer:
    """One env's answer to a call: its fields, or the exception it raised."""

    env_id: int
    observation: Any = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    value: Any = None  # the answer of RENDER, GET_ATTR, CALL, CLASS_NAMES
    reset: tuple[Any, dict[str, Any]] | None = None  # a prefetched reset (obs, info)


def lease_config(update: updates_pb2.EnvUpdate, imports: tuple[str, ...]) -> EnvConfig:
    """The EnvConfig of a lease; refuses what must not come from the network."""
    if update.pickled_env_factory:
        raise ConfigError("leased envs are built from an env id, never from a pickled factory")
    if ":" in update.env_id:
        raise ConfigError(
            f"env id {update.env_id!r} names a module to import, which this worker refuses "
            "from the network; start the worker with --import MODULE and lease the plain id"
        )
    if update.vectorization:
        raise ConfigError(
            f"leased envs are single envs stepped one by one; {update.env_id!r} with "
            f"vectorization={update.vectorization!r} is a native vector env: lease it "
            "without vectorization"
        )
    kwargs = json.loads(update.kwargs_json) if update.kwargs_json else {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"env kwargs must be a JSON object, got {update.kwargs_json[:200]!r}")
    length = update.max_episode_length if update.HasField("max_episode_length") else None
    return EnvConfig(update.env_id, kwargs, length, imports)


def check_spaces(env: gym.Env, env_id: str) -> None:
    for name in ("observation_space", "action_space"):
        space = getattr(env, name)
        if not isinstance(space, _ARRAY_SPACES):
            raise ConfigError(
                f"env {env_id!r}: leases carry Box, Discrete, MultiDiscrete and MultiBinary "
                f"spaces; its {name} is a {type(space).__name__}. Flatten it with a "
                "gymnasium wrapper (FlattenObservation) in a registered env"
            )


def call_args(call: leases_pb2.LeaseCall) -> list[Any]:
    """Per env: (seed, options) for a reset, the action row for a step."""
    count = len(call.env_ids)
    if call.op == leases_pb2.LEASE_OP_RESET:
        seeds: list[int | None] = [None if s < 0 else int(s) for s in call.seeds] or [None] * count
        if len(seeds) != count:
            raise ConfigError(f"a reset of {count} envs carries {len(seeds)} seeds")
        options = json.loads(call.options_json) if call.options_json else None
        if options is not None and not isinstance(options, dict):
            raise ConfigError("reset options must be a JSON object")
        return [(seed, options) for seed in seeds]
    if call.op == leases_pb2.LEASE_OP_STEP:
        actions = decode_tensor(call.actions, name="LeaseCall.actions")
        if actions.ndim < 1 or actions.shape[0] != count:
            raise ConfigError(
                f"a step of {count} envs carries actions of shape {actions.shape}; the "
                "first dimension must be the number of envs"
            )
        return list(actions)
    if call.op == leases_pb2.LEASE_OP_SET_ATTR:
        return [(call.name, _json(call.value_json, "SET_ATTR value_json"))] * count
    if call.op == leases_pb2.LEASE_OP_CALL:
        args, kwargs = _json(call.value_json, "CALL value_json") or ([], {})
        return [(call.name, tuple(args), dict(kwargs))] * count
    if call.op == leases_pb2.LEASE_OP_GET_ATTR:
        return [call.name] * count
    if call.op in COMMANDS:
        return [{}] * count if call.op == leases_pb2.LEASE_OP_RENDER else [None] * count
    raise ConfigError(f"LeaseCall.op {call.op} is not an op a learner may call")


def check_actions(rows: list[Any], space: gym.Space, lease_id: int) -> None:
    """Refuses actions of the wrong shape or kind before any env sees them.

    Raises:
        PolicyError: Naming the lease, the shapes and the space.
    """
    actions = np.asarray(rows)
    want = space.shape or ()
    integral = isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    if actions.shape[1:] != tuple(want) or (integral and actions.dtype.kind not in "iu"):
        raise PolicyError(
            f"lease {lease_id}: actions of shape {actions.shape[1:]} and dtype {actions.dtype} "
            f"per env do not fit the action space {space}"
        )


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc


def run_env(leased: LeasedEnv, op: int, arg: Any, prefetch: bool = False) -> LeaseAnswer:
    """Runs one op on one env; never raises (the outcome holds the error).

    With ``prefetch``, a step that ends the episode is followed by a reset
    (no seed, no options) whose result rides along (LeaseCall.prefetch_reset).
    """
    env = leased.env
    started = time.perf_counter()
    try:
        if op == leases_pb2.LEASE_OP_RESET:
            seed, options = arg
            obs, info = env.reset(seed=seed, options=options)
            outcome = LeaseAnswer(leased.env_id, _typed(env, obs), info=_lost_info(leased, info))
        elif op != leases_pb2.LEASE_OP_STEP:
            outcome = LeaseAnswer(leased.env_id, value=run_command(env, COMMANDS[op], arg))
        elif leased.lost:
            # The env's episode died with its old worker: answer the step with a
            # fresh episode's first observation, cut (truncated), and say why.
            obs, info = env.reset()
            outcome = LeaseAnswer(
                leased.env_id, _typed(env, obs), truncated=True, info=_lost_info(leased, info)
            )
        else:
            obs, reward, terminated, truncated, info = env.step(arg)
            outcome = LeaseAnswer(
                leased.env_id,
                _typed(env, obs),
                float(reward),
                bool(terminated),
                bool(truncated),
                info,
            )
    except Exception as exc:
        error = EnvError(
            f"env {leased.env_id} raised {type(exc).__name__} in "
            f"{leases_pb2.LeaseOp.Name(op).removeprefix('LEASE_OP_').lower()}: {exc}",
            env_index=leased.env_id,
            remote_traceback="".join(traceback.format_exception(exc)),
        )
        return LeaseAnswer(leased.env_id, error=error)
    if op == leases_pb2.LEASE_OP_STEP:
        elapsed = time.perf_counter() - started
        leased.step_seconds = 0.8 * leased.step_seconds + 0.2 * elapsed
        if prefetch and (outcome.terminated or outcome.truncated):
            try:
                obs, info = env.reset()
                outcome.reset = (_typed(env, obs), info)
            except Exception:  # the learner's own reset will meet (and report) it
                logger.debug("prefetched reset of leased env %d failed", leased.env_id)
    return outcome


def _typed(env: gym.Env, obs: Any) -> np.ndarray:
    """The observation in its space's dtype, as gymnasium's vector envs batch it
    (many envs return float64 arrays for a float32 Box)."""
    space = env.observation_space
    array = np.asarray(obs, dtype=space.dtype)
    if array.shape != (space.shape or ()):
        raise ValueError(
            f"the env returned an observation of shape {array.shape}; its observation "
            f"space {space} has shape {space.shape}"
        )
    return array


def _lost_info(leased: LeasedEnv, info: Mapping[str, Any]) -> Mapping[str, Any]:
    if not leased.lost:
        return info
    leased.lost = False
    return {**info, ENV_LOST_KEY: True}


def reply_of(
    lease_id: int, call: leases_pb2.LeaseCall, outcomes: list[LeaseAnswer]
) -> leases_pb2.LeaseReply:
    reply = leases_pb2.LeaseReply(lease_id=lease_id, call_id=call.call_id, op=call.op)
    reply.env_ids.extend(o.env_id for o in outcomes)
    if call.op in (leases_pb2.LEASE_OP_RENDER, leases_pb2.LEASE_OP_SET_ATTR):
        frames = [o.value for o in outcomes]
        if call.op == leases_pb2.LEASE_OP_RENDER and all(f is not None for f in frames):
            reply.frames.CopyFrom(encode_tensor(np.stack([np.asarray(f) for f in frames])))
        return reply
    if call.op in COMMANDS:
        reply.values_json.extend(
            json.dumps(o.value, default=_plain, allow_nan=True) for o in outcomes
        )
        return reply
    reply.observations.CopyFrom(
        encode_tensor(np.stack([np.asarray(o.observation) for o in outcomes]))
    )
    if call.op == leases_pb2.LEASE_OP_STEP:
        reply.rewards.CopyFrom(encode_tensor(np.array([o.reward for o in outcomes], np.float64)))
        reply.terminated.CopyFrom(encode_tensor(np.array([o.terminated for o in outcomes], bool)))
        reply.truncated.CopyFrom(encode_tensor(np.array([o.truncated for o in outcomes], bool)))
    for outcome in outcomes:
        arrays, rest = _split_info(outcome.info, f"env {outcome.env_id}")
        reply.infos.append(encode_tensor_map(arrays))
        reply.infos_json.append(rest)
    resets = [(o.env_id, o.reset) for o in outcomes if o.reset is not None]
    if resets:
        reply.reset_env_ids.extend(env_id for env_id, _ in resets)
        rows = np.stack([np.asarray(obs) for _, (obs, _) in resets])
        reply.reset_observations.CopyFrom(encode_tensor(rows))
        for env_id, (_, info) in resets:
            arrays, rest = _split_info(info, f"env {env_id} reset")
            reply.reset_infos.append(encode_tensor_map(arrays))
            reply.reset_infos_json.append(rest)
    return reply


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays; anything else is refused."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise ConfigError(
        f"a {type(value).__name__} is not a plain value; leases carry JSON-compatible "
        "attributes and return values (numbers, strings, lists, dicts, numpy arrays)"
    )


def _split_info(info: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """An info dict as (numeric arrays for a TensorMap, the rest as JSON object text).

    Numbers, bools and their arrays (in nested dicts too) travel as tensors;
    other plain values (None, strings, lists of them, dicts holding any) as
    JSON. The JSON text is empty when there is no such value.

    Raises:
        ConfigError: For a value that is neither (it would be lost otherwise).
    """
    tree: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, Mapping):
            nested, rest = _split_info(value, f"{where} info[{key!r}]")
            if rest:
                extra[key] = value  # a dict mixing kinds travels whole, as JSON
            else:
                tree[key] = nested
            continue
        array = np.asarray(value) if not isinstance(value, str | type(None)) else None
        if array is not None and array.dtype.kind in "biuf":
            tree[key] = array
        else:
            extra[key] = value
    if not extra:
        return tree, ""
    try:
        return tree, json.dumps(extra, default=_plain)
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(
            f"{where}: info holds a value that is neither numeric nor JSON ({exc}); leased "
            "envs' infos carry numbers, bools, arrays and plain JSON values"
        ) from exc


def close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:  # closing a broken env must not stop the others from closing
        logger.warning("closing a leased env failed", exc_info=True)
