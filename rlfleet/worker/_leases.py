"""Leased envs on a worker: step-level env leases (protos/rlfleet/v1/leases.proto).

A :class:`LeaseHost` owns the envs learners leased on this worker. It runs
on its own thread, beside the session's sampling loop, so a learner's step
never waits for a sampling vector step and the other way round. Commands
arrive from the session (in stream order); replies go straight to the Join
stream's outbox.

Envs whose steps are slow (an env behind a socket, a simulator) are
stepped on a thread pool and answered as they finish, grouped by call: an
env that waits on I/O releases the GIL, so 16 envs that each wait 1 ms take
about 1 ms per step together instead of 16. Fast envs (CartPole takes
~10 us) are stepped inline, where a pool's hand-offs would cost more than
the steps.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet import _rpc
from rlfleet.envs import EnvConfig
from rlfleet.envs._base import CALL, CLASS_NAMES, GET_ATTR, RENDER, SET_ATTR, run_command
from rlfleet.envs.config import env_spec_of
from rlfleet.errors import ConfigError, EnvError, PolicyError
from rlfleet.v1 import leases_pb2, updates_pb2, worker_pb2
from rlfleet.wire import decode_tensor, encode_env_spec, encode_tensor, encode_tensor_map

logger = logging.getLogger("rlfleet.worker")

#: Mean step seconds above which an env is stepped on the pool (see the module doc).
POOL_STEP_SECONDS = 2e-4
#: How long a pooled call's finished envs wait for the rest before they are
#: answered alone: one reply per call when its envs take alike, while one slow
#: env (async stepping, wait_num) does not hold the others back for long.
COALESCE_SECONDS = 0.001
#: Pool threads: enough for every leased env of a big worker to wait at once.
POOL_THREADS = 64
#: Spaces a lease carries as one tensor per call.
_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
#: The vector-env command each op runs (rlfleet.envs._base.run_command).
_COMMANDS: dict[int, str] = {
    leases_pb2.LEASE_OP_RENDER: RENDER,
    leases_pb2.LEASE_OP_GET_ATTR: GET_ATTR,
    leases_pb2.LEASE_OP_SET_ATTR: SET_ATTR,
    leases_pb2.LEASE_OP_CALL: CALL,
    leases_pb2.LEASE_OP_CLASS_NAMES: CLASS_NAMES,
}
#: Info key of an env that was lost with its worker and re-created here.
ENV_LOST_KEY = "rlfleet_env_lost"


@dataclass
class _LeasedEnv:
    env: gym.Env
    env_id: int
    lost: bool = False
    step_seconds: float = 0.0  # moving average


@dataclass
class _Outcome:
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


@dataclass
class _PendingCall:
    """A pooled call: the outcomes not yet sent, and how many envs still run."""

    call: leases_pb2.LeaseCall
    running: int
    outcomes: list[_Outcome] = field(default_factory=list)
    first_done: float | None = None  # time.monotonic() of the first unsent outcome


@dataclass
class _Done:
    """Pool threads put this in the host's queue when an env finished."""

    lease_id: int
    call: leases_pb2.LeaseCall
    outcome: _Outcome


class LeaseHost:
    """Hosts leased envs of one Join session.

    Args:
        worker_name: This worker's name in the fleet (for errors).
        imports: Modules to import before building envs (the worker's ``--import``).
        send: Queues a message on the Join stream.
    """

    def __init__(
        self,
        worker_name: str,
        imports: tuple[str, ...],
        send: Callable[[worker_pb2.WorkerMessage], None],
    ) -> None:
        self._name = worker_name
        self._imports = imports
        self._send = send
        self._envs: dict[tuple[int, int], _LeasedEnv] = {}
        self._inbox: queue.SimpleQueue[leases_pb2.LeaseCommand | _Done | None] = queue.SimpleQueue()
        self._pool: ThreadPoolExecutor | None = None
        # Pooled calls not yet fully answered, by (lease, call).
        self._pending: dict[tuple[int, int], _PendingCall] = {}
        self._thread = threading.Thread(target=self._run, name="rlfleet-leases", daemon=True)
        self._thread.start()

    def submit(self, command: leases_pb2.LeaseCommand) -> None:
        """Queues a command from the coordinator (never blocks)."""
        self._inbox.put(command)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Closes every leased env and stops the thread (waits ``timeout`` seconds)."""
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("leased envs did not close within %g seconds", timeout)

    # --- the host thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._inbox.get(timeout=self._next_flush())
                except queue.Empty:
                    self._flush_pooled()
                    continue
                while item is not None:
                    self._handle(item)
                    try:
                        item = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                else:
                    return
                self._flush_pooled()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            for leased in self._envs.values():
                _close_quietly(leased.env)
            self._envs.clear()

    def _handle(self, item: leases_pb2.LeaseCommand | _Done) -> None:
        if isinstance(item, _Done):
            pending = self._pending[(item.lease_id, item.call.call_id)]
            pending.outcomes.append(item.outcome)
            pending.running -= 1
            if pending.first_done is None:
                pending.first_done = time.monotonic()
            return
        body = item.WhichOneof("body")
        try:
            if body == "create":
                self._create(item.lease_id, item.create)
            elif body == "call":
                self._call(item.lease_id, item.call)
            elif body == "release":
                self._release(item.lease_id, item.release)
            else:
                logger.warning("ignored an empty LeaseCommand for lease %d", item.lease_id)
        except Exception as exc:  # a bug must answer the learner, not hang it
            logger.exception("lease command %s of lease %d failed", body, item.lease_id)
            if body == "call":
                self._reply_error(item.lease_id, item.call, list(item.call.env_ids), exc)

    def _create(self, lease_id: int, create: leases_pb2.LeaseCreate) -> None:
        reply = leases_pb2.LeaseReply(lease_id=lease_id, op=leases_pb2.LEASE_OP_CREATE)
        reply.env_ids.extend(create.env_ids)
        built: list[_LeasedEnv] = []
        try:
            config = _lease_config(create.env, self._imports)
            for env_id in create.env_ids:
                env = config.make()
                built.append(_LeasedEnv(env, env_id, lost=create.replaces_lost))
                _check_spaces(env, config.id)
            reply.env_spec.CopyFrom(
                encode_env_spec(env_spec_of(built[0].env, config.max_episode_length))
            )
        except Exception as exc:
            for leased in built:
                _close_quietly(leased.env)
            reply.error.CopyFrom(self._detail(exc, None))
        else:
            for leased in built:
                old = self._envs.pop((lease_id, leased.env_id), None)
                if old is not None:
                    _close_quietly(old.env)
                self._envs[(lease_id, leased.env_id)] = leased
        self._send(worker_pb2.WorkerMessage(lease_reply=reply))

    def _release(self, lease_id: int, release: leases_pb2.LeaseRelease) -> None:
        ids = set(release.env_ids)
        for key in [k for k in self._envs if k[0] == lease_id and (not ids or k[1] in ids)]:
            _close_quietly(self._envs.pop(key).env)

    def _call(self, lease_id: int, call: leases_pb2.LeaseCall) -> None:
        envs = []
        for env_id in call.env_ids:
            leased = self._envs.get((lease_id, env_id))
            if leased is None:
                raise ConfigError(f"env {env_id} of lease {lease_id} is not hosted here")
            envs.append(leased)
        args = _call_args(call)
        if call.op == leases_pb2.LEASE_OP_STEP and envs:
            _check_actions(args, envs[0].env.action_space, lease_id)
        pooled = len(envs) > 1 and any(e.step_seconds > POOL_STEP_SECONDS for e in envs)
        if not pooled:
            prefetch = call.prefetch_reset
            outcomes = [_run_env(e, call.op, a, prefetch) for e, a in zip(envs, args, strict=True)]
            self._send_outcomes(lease_id, call, outcomes)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="rlfleet-lease-env")
        self._pending[(lease_id, call.call_id)] = _PendingCall(call, running=len(envs))
        for leased, arg in zip(envs, args, strict=True):
            future = self._pool.submit(_run_env, leased, call.op, arg, call.prefetch_reset)
            future.add_done_callback(self._on_done(lease_id, call))

    def _on_done(
        self, lease_id: int, call: leases_pb2.LeaseCall
    ) -> Callable[[Future[_Outcome]], None]:
        def done(future: Future[_Outcome]) -> None:
            if not future.cancelled():
                self._inbox.put(_Done(lease_id, call, future.result()))

        return done

    def _flush_pooled(self) -> None:
        """Answers pooled calls whose envs all finished, or whose first finished
        env waited :data:`COALESCE_SECONDS` (the rest follow in later replies)."""
        now = time.monotonic()
        for key, pending in list(self._pending.items()):
            if pending.first_done is None:
                continue
            if pending.running and now - pending.first_done < COALESCE_SECONDS:
                continue
            self._send_outcomes(key[0], pending.call, pending.outcomes)
            if pending.running:
                pending.outcomes, pending.first_done = [], None
            else:
                del self._pending[key]

    def _next_flush(self) -> float | None:
        """Seconds until a pooled call's partial answer is due; None: none is."""
        firsts = [p.first_done for p in self._pending.values() if p.first_done is not None]
        if not firsts:
            return None
        return max(min(firsts) + COALESCE_SECONDS - time.monotonic(), 0.0)

    # --- replies --------------------------------------------------------------

    def _send_outcomes(
        self, lease_id: int, call: leases_pb2.LeaseCall, outcomes: list[_Outcome]
    ) -> None:
        ok = []
        for outcome in outcomes:
            if outcome.error is None:
                ok.append(outcome)
            else:
                self._reply_error(lease_id, call, [outcome.env_id], outcome.error)
        if not ok:
            return
        try:
            reply = _reply(lease_id, call, ok)
        except Exception as exc:  # e.g. an info value that cannot travel
            self._reply_error(lease_id, call, [o.env_id for o in ok], exc)
            return
        self._send(worker_pb2.WorkerMessage(lease_reply=reply))

    def _reply_error(
        self, lease_id: int, call: leases_pb2.LeaseCall, env_ids: list[int], exc: BaseException
    ) -> None:
        reply = leases_pb2.LeaseReply(lease_id=lease_id, call_id=call.call_id, op=call.op)
        reply.env_ids.extend(env_ids)
        reply.error.CopyFrom(self._detail(exc, env_ids[0] if len(env_ids) == 1 else None))
        self._send(worker_pb2.WorkerMessage(lease_reply=reply))

    def _detail(self, exc: BaseException, env_id: int | None) -> updates_pb2.ErrorDetail:
        detail = _rpc.detail_from_exception(exc, worker=self._name)
        if env_id is not None:
            detail.env_index = env_id
        return detail


# --- helpers -------------------------------------------------------------------


def _lease_config(update: updates_pb2.EnvUpdate, imports: tuple[str, ...]) -> EnvConfig:
    """The EnvConfig of a lease; refuses what must not come from the network."""
    if update.pickled_env_factory:
        raise ConfigError("leased envs are built from an env id, never from a pickled factory")
    if ":" in update.env_id:
        raise ConfigError(
            f"env id {update.env_id!r} names a module to import, which this worker refuses "
            "from the network; start the worker with --import MODULE and lease the plain id"
        )
    kwargs = json.loads(update.kwargs_json) if update.kwargs_json else {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"env kwargs must be a JSON object, got {update.kwargs_json[:200]!r}")
    length = update.max_episode_length if update.HasField("max_episode_length") else None
    return EnvConfig(update.env_id, kwargs, length, imports)


def _check_spaces(env: gym.Env, env_id: str) -> None:
    for name in ("observation_space", "action_space"):
        space = getattr(env, name)
        if not isinstance(space, _ARRAY_SPACES):
            raise ConfigError(
                f"env {env_id!r}: leases carry Box, Discrete, MultiDiscrete and MultiBinary "
                f"spaces; its {name} is a {type(space).__name__}. Flatten it with a "
                "gymnasium wrapper (FlattenObservation) in a registered env"
            )


def _call_args(call: leases_pb2.LeaseCall) -> list[Any]:
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
    if call.op in _COMMANDS:
        return [{}] * count if call.op == leases_pb2.LEASE_OP_RENDER else [None] * count
    raise ConfigError(f"LeaseCall.op {call.op} is not an op a learner may call")


def _check_actions(rows: list[Any], space: gym.Space, lease_id: int) -> None:
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


def _run_env(leased: _LeasedEnv, op: int, arg: Any, prefetch: bool = False) -> _Outcome:
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
            outcome = _Outcome(leased.env_id, obs, info=_lost_info(leased, info))
        elif op != leases_pb2.LEASE_OP_STEP:
            outcome = _Outcome(leased.env_id, value=run_command(env, _COMMANDS[op], arg))
        elif leased.lost:
            # The env's episode died with its old worker: answer the step with a
            # fresh episode's first observation, cut (truncated), and say why.
            obs, info = env.reset()
            outcome = _Outcome(leased.env_id, obs, truncated=True, info=_lost_info(leased, info))
        else:
            obs, reward, terminated, truncated, info = env.step(arg)
            outcome = _Outcome(
                leased.env_id, obs, float(reward), bool(terminated), bool(truncated), info
            )
    except Exception as exc:
        error = EnvError(
            f"env {leased.env_id} raised {type(exc).__name__} in "
            f"{leases_pb2.LeaseOp.Name(op).removeprefix('LEASE_OP_').lower()}: {exc}",
            env_index=leased.env_id,
            remote_traceback="".join(traceback.format_exception(exc)),
        )
        return _Outcome(leased.env_id, error=error)
    if op == leases_pb2.LEASE_OP_STEP:
        elapsed = time.perf_counter() - started
        leased.step_seconds = 0.8 * leased.step_seconds + 0.2 * elapsed
        if prefetch and (outcome.terminated or outcome.truncated):
            try:
                outcome.reset = env.reset()
            except Exception:  # the learner's own reset will meet (and report) it
                logger.debug("prefetched reset of leased env %d failed", leased.env_id)
    return outcome


def _lost_info(leased: _LeasedEnv, info: Mapping[str, Any]) -> Mapping[str, Any]:
    if not leased.lost:
        return info
    leased.lost = False
    return {**info, ENV_LOST_KEY: True}


def _reply(
    lease_id: int, call: leases_pb2.LeaseCall, outcomes: list[_Outcome]
) -> leases_pb2.LeaseReply:
    reply = leases_pb2.LeaseReply(lease_id=lease_id, call_id=call.call_id, op=call.op)
    reply.env_ids.extend(o.env_id for o in outcomes)
    if call.op in (leases_pb2.LEASE_OP_RENDER, leases_pb2.LEASE_OP_SET_ATTR):
        frames = [o.value for o in outcomes]
        if call.op == leases_pb2.LEASE_OP_RENDER and all(f is not None for f in frames):
            reply.frames.CopyFrom(encode_tensor(np.stack([np.asarray(f) for f in frames])))
        return reply
    if call.op in _COMMANDS:
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


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:  # closing a broken env must not stop the others from closing
        logger.warning("closing a leased env failed", exc_info=True)
