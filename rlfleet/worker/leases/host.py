"""Leased envs on a worker: step-level env leases (protos/rlfleet/v1/leases.proto).

A :class:`LeaseHost` owns the envs learners leased on this worker. It runs
beside the session's sampling loop, so a learner's step never waits for a
sampling vector step and the other way round: on its own thread, or for a
call that finds it idle, on the thread that submits it (see
:meth:`LeaseHost.submit`). Commands arrive from the session (in stream
order); replies go straight to the Join stream's outbox.

Envs whose steps are slow (an env behind a socket, a simulator) are
stepped on a thread pool: an env that waits on I/O releases the GIL, so 16
envs that each wait 1 ms take about 1.4 ms per step together instead of 16.
The pool threads answer themselves (no hand-off back to this thread): a
call the learner waits for whole in one reply, sent by the thread that
finishes its last env; otherwise (async stepping, ``wait_num``) each env
as soon as it finishes, with those that finish meanwhile (see
:class:`_PooledCall`). Fast envs (CartPole takes ~10 us) are stepped
inline, where a pool's hand-offs would cost more than the steps. Resets
are timed apart from steps (a simulator's reset may take seconds), and an
env's first reset and first step run on the pool, their cost unknown: slow
envs on one worker never wait for each other, as tianshou's one process per
env would not. A slow env's call goes to the pool even when it is alone
(async stepping sends one call per ready env), so the host is free for the
next call at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlfleet._util.closing import close_quietly
from rlfleet.envs.config import env_spec_of, make_env
from rlfleet.errors import ConfigError
from rlfleet.security.pickle import PickleGate
from rlfleet.security.pickle import dumps as pickle_dumps
from rlfleet.wire.leases import (
    LeaseAnswer,
    LeaseAnswers,
    LeaseCallFailed,
    LeaseCallOrder,
    LeaseCreated,
    LeaseCreateOrder,
    LeaseOrder,
    LeaseReleaseOrder,
    LeaseReport,
)
from rlfleet.worker.leases.leased_env import (
    LeasedEnv,
    build_from_factory,
    call_args,
    check_actions,
    check_spaces,
    lease_config,
    lease_factories,
    run_env,
)

logger = logging.getLogger("rlfleet.worker")

#: Step (reset) seconds (see LeasedEnv.step_seconds) above which an env's
#: steps (resets) run on the pool.
POOL_STEP_SECONDS = 2e-4
#: Pool threads: enough for every leased env of a big worker to wait at once.
POOL_THREADS = 64
#: An async call's env that finishes first waits this share of its step's
#: seconds (at most COALESCE_MAX_SECONDS) for the call's other envs, so that
#: envs finishing close together share a reply: each reply costs the relay
#: and the learner a message (~0.1-0.3 ms of CPU over gRPC), which 16 envs
#: of 1 ms answered one by one cannot afford, while waiting longer delays
#: the learner's next step of the envs already done.
COALESCE_SHARE = 0.25
COALESCE_MAX_SECONDS = 0.001


@dataclass
class _PooledCall:
    """A call whose envs run on the pool: the outcomes not yet sent.

    Its envs' pool threads answer it themselves, without a hand-off back
    to the host thread. A call the learner waits for whole
    (LeaseCall.whole_reply) is sent once, by the thread that finishes its
    last env. Otherwise (async stepping) the thread that finishes an env
    first waits for the others at most COALESCE_SHARE of its step (less if
    they all finish), then sends every outcome ready (and those that land
    while it sends); envs finishing later do the same.
    """

    call: LeaseCallOrder
    running: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: list[LeaseAnswer] = field(default_factory=list)
    sending: bool = False  # a pool thread is sending this call's outcomes
    all_done: threading.Condition = field(init=False)  # on ``lock``

    def __post_init__(self) -> None:
        self.all_done = threading.Condition(self.lock)


@dataclass
class _EnvTask:
    """One env's op for a pool thread."""

    pooled: _PooledCall
    leased: LeasedEnv
    op: str
    arg: Any
    prefetch: bool


class LeaseHost:
    """Hosts leased envs of one Join session.

    Args:
        imports: Modules to import before building envs (the worker's ``--import``).
        send: Sends a report to the coordinator (queues it on the Join
            stream); raises ConfigError, sending nothing, for answers that
            cannot travel. Called from several threads (the host's, the
            one calling :meth:`submit`, the pool's): it must be thread-safe.
    """

    def __init__(
        self,
        imports: tuple[str, ...],
        send: Callable[[LeaseReport], None],
        pickle: PickleGate | None = None,
    ) -> None:
        self._imports = imports
        self._send = send
        # Whether this worker takes pickled env factories (see LeasedEnvSource.pickled).
        self._pickle = PickleGate() if pickle is None else pickle
        self._envs: dict[tuple[int, int], LeasedEnv] = {}
        #: How many leased envs this worker hosts now (read from any thread):
        #: the dict's own ``__len__``, one C call with no Python frame, as a
        #: session's TaskBook reads it before every vector step.
        self.hosted_count: Callable[[], int] = self._envs.__len__
        # Leases whose envs came from pickled factories: their answers may
        # carry pickles (rlfleet.wire.lease_values).
        self._pickle_leases: set[int] = set()
        self._inbox: queue.SimpleQueue[LeaseOrder] = queue.SimpleQueue()
        # The pool: threads that take env ops from one queue and answer them
        # (_PooledCall). Leaner than a ThreadPoolExecutor (no futures, no
        # callbacks): 16 envs that sleep 1 ms answered in 1.37 ms against
        # 1.64 ms (median, this machine).
        self._tasks: queue.SimpleQueue[_EnvTask | None] = queue.SimpleQueue()
        self._pool_threads = 0
        # Orders submitted and not yet handled (see submit), and the lock
        # an order is handled under, on whichever thread.
        self._queued = 0
        self._queued_lock = threading.Lock()
        self._running = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rlfleet-leases", daemon=True)
        self._thread.start()

    def submit(self, order: LeaseCreateOrder | LeaseCallOrder | LeaseReleaseOrder) -> None:
        """Takes an order from the coordinator; orders run in the order submitted.

        A call that finds the host idle runs at once on the caller's thread
        (the stream's receiver): a fast env's step then costs no hand-off to
        the host thread (a thread hand-off costs ~13 us of CPU on the test
        machine, a third of a 16-env call's budget), and a pooled call only
        hands its envs to the pool. Every other order, and any call behind
        one, is queued for the host thread, so that building envs (CREATE,
        which may take seconds) never holds up the caller.
        """
        with self._queued_lock:
            inline = isinstance(order, LeaseCallOrder) and self._queued == 0
            self._queued += 1
        if not inline:
            self._inbox.put(order)
            return
        try:
            with self._running:
                self._handle(order)
        finally:
            self._handled()

    def _handled(self) -> None:
        with self._queued_lock:
            self._queued -= 1

    def shutdown(self, timeout: float = 5.0) -> None:
        """Closes every leased env and stops the thread (waits ``timeout`` seconds)."""
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("leased envs did not close within %g seconds", timeout)

    # --- the host thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            while (order := self._inbox.get()) is not None:
                with self._running:  # after a call running on the caller's thread
                    self._handle(order)
                self._handled()
        finally:
            with self._running:
                for _ in range(self._pool_threads):
                    self._tasks.put(None)
                for leased in self._envs.values():
                    close_quietly(leased.env, "a leased env", logger)
                self._envs.clear()

    def _handle(self, order: LeaseCreateOrder | LeaseCallOrder | LeaseReleaseOrder) -> None:
        try:
            if isinstance(order, LeaseCreateOrder):
                self._create(order)
            elif isinstance(order, LeaseCallOrder):
                self._call(order)
            elif isinstance(order, LeaseReleaseOrder):
                self._release(order)
        except Exception as exc:  # a bug must answer the learner, not hang it
            logger.exception("lease order %r failed", order)
            if isinstance(order, LeaseCallOrder):
                self._reply_error(order, order.env_ids, exc)

    def _create(self, create: LeaseCreateOrder) -> None:
        lease_id = create.lease_id
        built: list[LeasedEnv] = []
        per_env = None
        try:
            if create.env.pickled:
                factories = lease_factories(create.env, self._pickle)
                for env_id in create.env_ids:
                    env = build_from_factory(factories, env_id)
                    check_spaces(env, f"factory {env_id}", pickles=True)
                    built.append(LeasedEnv(env, env_id, lost=create.replaces_lost))
                # Each factory may build another env (tianshou's env_fns): one spec each.
                specs = [env_spec_of(leased.env, None) for leased in built]
                spec = specs[0]
                if any(s != spec for s in specs):
                    per_env = specs
            else:
                config = lease_config(create.env, self._imports)
                for env_id in create.env_ids:
                    # No OrderEnforcing/PassiveEnvChecker: LeasedEnv.needs_reset
                    # and run_env's typed observations do their jobs.
                    env = make_env(config, worker_checked=True)
                    built.append(LeasedEnv(env, env_id, lost=create.replaces_lost))
                    check_spaces(env, config.id)
                spec = env_spec_of(built[0].env, config.max_episode_length)
        except Exception as exc:
            for leased in built:
                close_quietly(leased.env, "a leased env", logger)
            self._send(LeaseCreated(lease_id, create.env_ids, error=exc))
            return
        for leased in built:
            old = self._envs.pop((lease_id, leased.env_id), None)
            if old is not None:
                close_quietly(old.env, "a leased env", logger)
            self._envs[(lease_id, leased.env_id)] = leased
        if create.env.pickled:
            self._pickle_leases.add(lease_id)
        try:
            self._send(LeaseCreated(lease_id, create.env_ids, spec=spec, specs=per_env))
        except Exception as exc:  # a spec that cannot travel: the lease fails, not hangs
            self._send(LeaseCreated(lease_id, create.env_ids, error=exc))

    def _release(self, release: LeaseReleaseOrder) -> None:
        ids = set(release.env_ids)
        lease_id = release.lease_id
        for key in [k for k in self._envs if k[0] == lease_id and (not ids or k[1] in ids)]:
            close_quietly(self._envs.pop(key).env, "a leased env", logger)
        if not ids:
            self._pickle_leases.discard(lease_id)

    def _call(self, call: LeaseCallOrder) -> None:
        lease_id = call.lease_id
        envs = []
        for env_id in call.env_ids:
            leased = self._envs.get((lease_id, env_id))
            if leased is None:
                raise ConfigError(f"env {env_id} of lease {lease_id} is not hosted here")
            envs.append(leased)
        args = call_args(call)
        if call.op == "step" and envs and call.actions is not None:
            check_actions(call.actions, envs[0].env.action_space, lease_id)
        # A slow env runs on the pool even alone: the next call (async
        # stepping sends one per ready env) then never waits behind it.
        pooled = any(e.slow(call.op, POOL_STEP_SECONDS) for e in envs)
        if not pooled:
            prefetch = call.prefetch_reset
            outcomes = [run_env(e, call.op, a, prefetch) for e, a in zip(envs, args, strict=True)]
            self._send_outcomes(call, outcomes)
            return
        self._grow_pool(len(envs))
        pooled_call = _PooledCall(call, running=len(envs))
        for leased, arg in zip(envs, args, strict=True):
            self._tasks.put(_EnvTask(pooled_call, leased, call.op, arg, call.prefetch_reset))

    def _grow_pool(self, wanted: int) -> None:
        """Starts pool threads until ``wanted`` (at most POOL_THREADS) exist."""
        while self._pool_threads < min(wanted, POOL_THREADS):
            self._pool_threads += 1
            threading.Thread(
                target=self._run_envs, name=f"rlfleet-lease-env-{self._pool_threads}", daemon=True
            ).start()

    def _run_envs(self) -> None:
        """A pool thread: env ops until the host stops (run_env never raises)."""
        while (task := self._tasks.get()) is not None:
            outcome = run_env(task.leased, task.op, task.arg, task.prefetch)
            self._finished(task.pooled, outcome, task.leased.step_seconds)

    def _finished(self, pooled: _PooledCall, outcome: LeaseAnswer, seconds: float) -> None:
        """Records an env's outcome (its step took about ``seconds``) and
        sends what is ready (see _PooledCall)."""
        with pooled.lock:
            pooled.outcomes.append(outcome)
            pooled.running -= 1
            if not pooled.running:
                pooled.all_done.notify()
            if pooled.sending or (pooled.call.whole_reply and pooled.running):
                return
            pooled.sending = True
            if pooled.running:
                pooled.all_done.wait(min(COALESCE_SHARE * seconds, COALESCE_MAX_SECONDS))
        while True:
            with pooled.lock:
                outcomes, pooled.outcomes = pooled.outcomes, []
                if not outcomes:
                    pooled.sending = False
                    return
            if len(outcomes) > 1:  # in the call's order, as inline calls answer
                order = {env_id: k for k, env_id in enumerate(pooled.call.env_ids)}
                outcomes.sort(key=lambda o: order[o.env_id])
            self._send_outcomes(pooled.call, outcomes)

    # --- replies --------------------------------------------------------------

    def _send_outcomes(self, call: LeaseCallOrder, outcomes: list[LeaseAnswer]) -> None:
        ok = []
        for outcome in outcomes:
            if outcome.error is None:
                ok.append(outcome)
            else:
                self._reply_error(call, [outcome.env_id], outcome.error)
        if not ok:
            return
        try:
            pickler = pickle_dumps if call.lease_id in self._pickle_leases else None
            self._send(LeaseAnswers(call.lease_id, call.call_id, call.op, ok, pickler))
        except Exception as exc:  # e.g. an info value that cannot travel
            self._reply_error(call, [o.env_id for o in ok], exc)

    def _reply_error(self, call: LeaseCallOrder, env_ids: list[int], exc: BaseException) -> None:
        self._send(LeaseCallFailed(call.lease_id, call.call_id, call.op, env_ids, exc))
