"""Step-level env leases: placement, relay, loss and release (leases.proto).

A lease is K envs one learner steps over one ``Lease`` stream. The
:class:`LeaseManager` places its envs on workers that declared
``rlfleet.leases`` (most free slots first, so they spread), splits each of
the learner's calls by hosting worker, and passes the workers' replies back
as the bytes they came in, with the worker's name added (the messages are
rlfleet.coordinator.leases.translation's). Everything here runs under the
fleet state's lock, which the Join reader threads (replies, losses) and the
lease streams' threads share.

Each env remembers the call it has in flight (op and argument), so when its
worker dies it is re-created elsewhere and that call is sent again: the
learner sees one answer per env and call, never none and never two.
"""

from __future__ import annotations

import itertools
import logging
import queue
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from rlfleet._util.log_limit import LogLimiter, held_back_note
from rlfleet._util.values import json_object
from rlfleet.coordinator.failures import CallError, invalid
from rlfleet.coordinator.leases.data_connections import LeaseConnection
from rlfleet.coordinator.leases.translation import (
    LEARNER_OPS,
    LeasedEnvSpec,
    RelayOpen,
    RelayReply,
    call_command,
    create_command,
    lease_response,
    no_workers,
    release_command,
)
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState
from rlfleet.errors import ConfigError, ProtocolError
from rlfleet.protocol.multi_agent import MULTI_AGENT_CAPABILITY, can_run_env, is_multi_agent_env
from rlfleet.security.pickle import PICKLE_CAPABILITY
from rlfleet.transport import rpc as _rpc
from rlfleet.wire.leases import LeaseCallOrder

logger = logging.getLogger("rlfleet.coordinator")

#: Lease replies for envs it does not host after which a worker is dropped
#: (INVALID_ARGUMENT). An honest worker sends none: its replies name only
#: the envs the coordinator placed on it, and a lost worker's replies are
#: ignored before this check.
FORGED_REPLIES_LIMIT = 16

#: What a lease stream's outbox holds: a serialized LeaseResponse, an error
#: ending the call, or its clean end.
LeaseEvent = bytes | CallError | None


@dataclass
class _CallClock:
    """When a learner's call arrived, and how many of its envs have not answered yet."""

    op: str
    started: float
    unanswered: int
    whole: bool = False  # answer in one response (LeaseCall.whole_reply)
    superseded: bool = False  # the learner gave up on some of its envs: not timed


@dataclass(eq=False)
class Lease:
    """One learner's leased envs.

    Attributes:
        lease_id: Unique for the coordinator's lifetime.
        learner: Who holds it (:func:`learner_identity`).
        env: The env update the envs are built from.
        hosts: Worker id hosting env i (0: none yet).
        outbox: Events for the learner's stream.
        creating: Env ids whose CREATE reply is awaited, by worker id.
        in_flight: The call each busy env has in flight (the learner's whole
            call; the env's row in it is found when it must be sent again).
        clocks: Calls not fully answered yet, by call id (the latency metric).
        held: Replies (serialized, named) of whole-reply calls not fully
            answered yet, by call id.
        spec: The envs' serialized EnvSpec, from the first CREATE reply.
        env_specs: Each env's serialized EnvSpec, by env id (a CREATE reply
            of envs that differ gives one per env, any other one for all).
        failure: Why the lease ended, if it did.
        closed: Released: replies are ignored.
        data: The lease's data connection, once the learner attached it
            (data_peers.py): responses go there, not to ``outbox``.
    """

    lease_id: int
    env: LeasedEnvSpec
    hosts: list[int]
    learner: str = ""
    outbox: queue.SimpleQueue[LeaseEvent] = field(default_factory=queue.SimpleQueue)
    creating: dict[int, set[int]] = field(default_factory=dict)
    in_flight: dict[int, LeaseCallOrder] = field(default_factory=dict)
    clocks: dict[int, _CallClock] = field(default_factory=dict)
    held: dict[int, list[bytes]] = field(default_factory=dict)
    spec: bytes | None = None
    env_specs: dict[int, bytes] = field(default_factory=dict)
    failure: CallError | None = None
    closed: bool = False
    data: LeaseConnection | None = None

    @property
    def num_envs(self) -> int:
        """K: the lease's env ids are 0..K-1."""
        return len(self.hosts)

    def opened_specs(self) -> tuple[bytes, list[bytes]]:
        """Env 0's serialized spec, and every env's if they differ (LeaseOpened.env_specs)."""
        common = self.spec or b""
        specs = [self.env_specs.get(i, common) for i in range(self.num_envs)]
        if all(spec == specs[0] for spec in specs):
            return specs[0] if specs else common, []
        return specs[0], specs

    def post(self, response: bytes) -> None:
        """Sends a serialized LeaseResponse to the learner, on whichever carrier it uses."""
        if self.data is not None:
            self.data.send(response)
        else:
            self.outbox.put(response)


def learner_identity(declared: str, peer: str) -> str:
    """Who holds a lease: the learner's own name (LeaseOpen.learner) on the host
    it calls from (the gRPC peer without its port), so that learners on
    different hosts never share caps; the host alone if it gave no name."""
    host = peer.rpartition(":")[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return f"{declared}@{host}" if declared else host


class LeaseManager:
    """The fleet's leases.

    The caps come from the fleet state's config: ``max_envs_per_lease``,
    ``max_leased_envs`` (all leases), ``max_leases_per_learner`` and
    ``max_envs_per_learner``.

    Args:
        state: The fleet state (its lock guards the leases too).
    """

    def __init__(self, state: FleetState) -> None:
        self._state = state
        config = state.config
        self._max_per_lease = config.max_envs_per_lease
        self._max_total = config.max_leased_envs
        self._max_leases_per_learner = config.max_leases_per_learner
        self._max_envs_per_learner = config.max_envs_per_learner
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._forgeries = LogLimiter()
        # Pickled env factories registered by this process (an embedded
        # fleet's learner), by the env id its leases name them with.
        self._local_factories: dict[str, bytes] = {}

    def register_local_factories(self, data: bytes) -> str:
        """Keeps pickled env factories given in memory by this process; returns their env id.

        The embedded fleet's learner (``RemoteVectorEnv(env_fns, on=fleet)``)
        registers its factories here, never over the network, then leases
        the returned id: the lease's envs are built from them on workers
        that take pickles (an embedded fleet's own children do). The id is
        random, so no other client can name it. :meth:`forget_local_factories`
        drops them.
        """
        env_id = f"rlfleet-local-factories/{secrets.token_hex(16)}"
        with self._state.lock:
            self._local_factories[env_id] = data
        return env_id

    def forget_local_factories(self, env_id: str) -> None:
        """Drops factories of :meth:`register_local_factories` (their leases keep theirs)."""
        with self._state.lock:
            self._local_factories.pop(env_id, None)

    # --- opening ----------------------------------------------------------------

    def open(self, request: RelayOpen, learner: str, cancelled: Callable[[], bool]) -> Lease:
        """Places and builds the envs of a new lease; returns once all are built.

        Args:
            request: The learner's LeaseOpen.
            learner: Who asks (:func:`learner_identity`).
            cancelled: A callable that says whether the learner hung up.

        Raises:
            CallError: INVALID_ARGUMENT (bad request), RESOURCE_EXHAUSTED (a
                cap), UNAVAILABLE (no worker or slots within the timeout, or
                draining), FAILED_PRECONDITION (a worker could not build the env).
        """
        count = request.num_envs
        if count < 1:
            raise invalid(f"LeaseOpen.num_envs must be >= 1, got {count}")
        if count > self._max_per_lease:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a lease may hold at most {self._max_per_lease} envs, {count} were asked; "
                "lease fewer or start the coordinator with a larger --max-envs-per-lease",
            )
        env = request.env
        state = self._state
        with state.lock:
            local = self._local_factories.get(env.env_id)
        if local is not None and not env.pickled:
            env = env.with_factories(local)
        else:
            env.check(state.config.security.pickle)  # raises naming the field
        timeout = request.timeout or state.config.wait_for_workers_seconds
        deadline = time.monotonic() + timeout
        with state.lock:
            leased = sum(lease.num_envs for lease in self._leases.values())
            if leased + count > self._max_total:
                raise CallError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the fleet's leases may hold at most {self._max_total} envs; {leased} are "
                    f"leased and {count} more were asked. Close other leases or start the "
                    "coordinator with a larger --max-leased-envs",
                )
            self._check_learner_caps(learner, count)
            lease = Lease(next(self._ids), env, [0] * count, learner)
            self._leases[lease.lease_id] = lease
            try:
                placement = self._wait_for_slots(env, count, deadline, cancelled, timeout)
                self._create(lease, list(range(count)), placement, replaces_lost=False)
                while lease.creating and lease.failure is None:
                    remaining = deadline - time.monotonic()
                    if cancelled():
                        raise CallError(grpc.StatusCode.CANCELLED, "the learner ended the call")
                    if remaining <= 0:
                        raise CallError(
                            grpc.StatusCode.UNAVAILABLE,
                            f"the workers did not build the leased envs within {timeout:g} seconds",
                        )
                    state.changed.wait(remaining)
                if lease.failure is not None:
                    raise lease.failure
            except CallError:
                self._release(lease)
                raise
        return lease

    def _check_learner_caps(self, learner: str, count: int) -> None:
        """Refuses a lease beyond the learner's caps (lock held)."""
        held = [lease for lease in self._leases.values() if lease.learner == learner]
        envs = sum(lease.num_envs for lease in held)
        where = f"learner {learner!r} holds {len(held)} leases with {envs} envs"
        if len(held) + 1 > self._max_leases_per_learner:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{where}; a learner may hold at most {self._max_leases_per_learner} leases. "
                "Close some (RemoteVectorEnv.close) or start the coordinator with a larger "
                "--max-leases-per-learner",
            )
        if envs + count > self._max_envs_per_learner:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{where} and asked for {count} more; a learner's leases may hold at most "
                f"{self._max_envs_per_learner} envs. Close some leases or start the "
                "coordinator with a larger --max-envs-per-learner",
            )

    def _wait_for_slots(
        self,
        env: LeasedEnvSpec,
        count: int,
        deadline: float,
        cancelled: Callable[[], bool],
        timeout: float,
    ) -> list[int]:
        """Waits (lock held) until workers that may run ``env`` have ``count`` free slots."""
        state = self._state
        env_id, pickled = env.env_id, env.pickled
        while True:
            if state.draining:
                raise CallError(
                    grpc.StatusCode.UNAVAILABLE, "the coordinator is draining; lease elsewhere"
                )
            placement = self._place(env_id, count, pickled)
            if placement is not None:
                return placement
            if cancelled():
                raise CallError(grpc.StatusCode.CANCELLED, "the learner ended the call")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._no_slots(env_id, count, timeout, pickled)
            state.changed.wait(remaining)

    def _no_slots(self, env_id: str, count: int, timeout: float, pickled: bool) -> CallError:
        hosts = self._hosts(env_id, pickled)
        free = sum(self._free(handle) for handle in hosts)
        if pickled:
            unable = len(self._hosts()) - len(hosts)
            return no_workers(
                f"{count} envs from pickled factories could not be leased within {timeout:g} "
                f"seconds: {len(hosts)} workers take pickles (capability {PICKLE_CAPABILITY!r}: "
                f"started with --allow-pickle, or an embedded fleet's own) with {free} free "
                f"slots; {unable} more host leases but take no pickles. Register the env on "
                "the workers instead (rlfleet worker --import mypkg.envs) and lease its id"
            )
        if is_multi_agent_env(env_id):
            unable = len(self._hosts()) - len(hosts)
            message = (
                f"{count} envs of the multi-agent env {env_id!r} could not be leased within "
                f"{timeout:g} seconds: {len(hosts)} workers declare the capability "
                f"{MULTI_AGENT_CAPABILITY!r} and host leases, with {free} free slots ({unable} "
                "more host leases but lack the capability). Start Python workers with --import "
                "of the module that registers the env, or give them more --envs"
            )
            return no_workers(message)
        message = (
            f"{count} envs could not be leased within {timeout:g} seconds: {len(hosts)} "
            f"workers host leases with {free} free slots (a worker hosts up to its "
            "--lease-slots, by default its --envs, leased envs; Fleet.local up to "
            "envs_per_worker; workers without the capability "
            "'rlfleet.leases', such as the "
            "Node worker, host none). Start more workers or give them more --envs"
        )
        return no_workers(message)

    def _hosts(self, env_id: str | None = None, pickled: bool = False) -> list[WorkerHandle]:
        """The workers that host leases and may run ``env_id`` (None: any env; lock held),
        taking pickles if its factories are ``pickled``."""
        return [
            handle
            for handle in self._state.registry
            if handle.alive
            and not handle.leaving
            and _rpc.LEASE_CAPABILITY in handle.hello.capabilities
            and (env_id is None or can_run_env(env_id, handle.hello.capabilities))
            and (not pickled or PICKLE_CAPABILITY in handle.hello.capabilities)
        ]

    def _leased_on(self, worker_id: int) -> int:
        return sum(
            1 for lease in self._leases.values() for host in lease.hosts if host == worker_id
        )

    def _free(self, handle: WorkerHandle) -> int:
        slots = handle.hello.lease_slots or handle.num_envs
        return max(slots - self._leased_on(handle.worker_id), 0)

    def _place(self, env_id: str, count: int, pickled: bool = False) -> list[int] | None:
        """Worker ids for ``count`` envs of ``env_id``, most free slots first; None if they
        do not fit (a multi-agent env goes only to workers with the capability)."""
        free = {handle.worker_id: self._free(handle) for handle in self._hosts(env_id, pickled)}
        placement = []
        for _ in range(count):
            best = max(free, key=lambda w: (free[w], -w), default=None)
            if best is None or free[best] == 0:
                return None
            free[best] -= 1
            placement.append(best)
        return placement

    def _share_slots(self, worker_ids: set[int]) -> None:
        """Tells the scheduler how many slots of these workers leased envs hold
        (lock held), and hands out sampling work to slots a release freed."""
        scheduler = self._state.scheduler
        for worker_id in worker_ids - {0}:
            scheduler.set_leased(worker_id, self._leased_on(worker_id))
        self._state.dispatch()

    def _create(
        self, lease: Lease, env_ids: list[int], placement: list[int], *, replaces_lost: bool
    ) -> None:
        """Sends CREATE commands (lock held); their replies are awaited in ``creating``."""
        by_worker: dict[int, list[int]] = {}
        for env_id, worker_id in zip(env_ids, placement, strict=True):
            lease.hosts[env_id] = worker_id
            by_worker.setdefault(worker_id, []).append(env_id)
        self._share_slots(set(by_worker))
        for worker_id, ids in by_worker.items():
            handle = self._state.registry.get(worker_id)
            if handle is None:
                continue
            lease.creating.setdefault(worker_id, set()).update(ids)
            handle.send_lease(
                create_command(lease.lease_id, lease.env, ids, replaces_lost=replaces_lost)
            )

    # --- calls ------------------------------------------------------------------

    def call(self, lease: Lease, call: LeaseCallOrder) -> None:
        """Sends a learner's reset or step to the workers hosting its envs.

        Raises:
            CallError: INVALID_ARGUMENT for a malformed call (ends the lease).
        """
        ids = call.env_ids
        where = f"lease {lease.lease_id} call {call.call_id}"
        if call.op not in LEARNER_OPS:
            raise invalid(f"{where}: {call.op} is not one a learner may call (leases.proto)")
        if not ids:
            raise invalid(f"{where}: names no env")
        if len(set(ids)) != len(ids) or max(ids) >= lease.num_envs:
            raise invalid(
                f"{where}: env ids {ids} must be distinct and < {lease.num_envs} (the lease size)"
            )
        if call.op == "reset":
            if call.seeds and len(call.seeds) != len(ids):
                raise invalid(f"{where}: {len(call.seeds)} seeds for {len(ids)} envs")
            try:
                json_object(call.options_json, f"{where}: options_json")
            except ConfigError as exc:
                raise invalid(str(exc)) from None
        elif call.op == "step":
            if call.bad_actions is not None:
                raise invalid(str(call.bad_actions))
            actions = call.actions
            if actions is None or actions.ndim < 1 or actions.shape[0] != len(ids):
                shape = None if actions is None else actions.shape
                raise invalid(
                    f"{where}: actions of shape {shape} for {len(ids)} envs; the "
                    "first dimension must be the number of envs"
                )
        with self._state.lock:
            if lease.closed:
                return
            superseded = [i for i in ids if i in lease.in_flight]
            if superseded:
                # The learner gave up on those calls (its deadline passed): their
                # late answers no longer match and are dropped.
                logger.info("%s supersedes the unanswered calls of envs %s", where, superseded)
                for env_id in superseded:
                    old = lease.in_flight[env_id].call_id
                    _answered(lease, old, 1, superseded=True)
                    held = lease.held.pop(old, None)
                    if held:  # no longer whole: what arrived goes now
                        lease.post(lease_response(held))
            lease.clocks[call.call_id] = _CallClock(
                call.op, time.monotonic(), len(ids), call.whole_reply
            )
            in_flight, hosts = lease.in_flight, lease.hosts
            groups: dict[int, list[int]] = {}
            for row, env_id in enumerate(ids):
                in_flight[env_id] = call
                groups.setdefault(hosts[env_id], []).append(row)
            for worker_id, rows in groups.items():
                self._send_call(lease, worker_id, call, rows)

    def _send_call(
        self, lease: Lease, worker_id: int, call: LeaseCallOrder, rows: list[int]
    ) -> None:
        handle = self._state.registry.get(worker_id)
        if handle is None:  # lost and not re-placed: on_worker_lost failed the lease
            return
        handle.send_lease(call_command(lease.lease_id, call, rows))

    def on_reply(self, handle: WorkerHandle, reply: RelayReply) -> None:
        """A worker answered a lease command (its Join reader thread)."""
        state = self._state
        with state.lock:
            lease = self._leases.get(reply.lease_id)
            if lease is None or lease.closed or not handle.alive:
                return  # a lease released meanwhile, or a worker already written off
            if reply.op == "create":
                self._on_created(lease, handle, reply)
                return
            hosts, worker_id, count = lease.hosts, handle.worker_id, len(lease.hosts)
            foreign = [
                env_id for env_id in reply.env_ids if env_id >= count or hosts[env_id] != worker_id
            ]
            if foreign:
                self._forged(handle, lease.lease_id, reply.call_id, foreign)
                return
            in_flight, call_id = lease.in_flight, reply.call_id
            current = [
                env_id
                for env_id in reply.env_ids
                if (flight := in_flight.get(env_id)) is not None and flight.call_id == call_id
            ]
            if not current:
                return  # only answers of superseded calls
            for env_id in current:
                del in_flight[env_id]
            clock = lease.clocks.get(reply.call_id)
            whole = clock is not None and clock.whole and not clock.superseded
            finished = _answered(lease, reply.call_id, len(current))
            if finished is not None and not finished.superseded:
                state.metrics.lease_call(finished.op, time.monotonic() - finished.started)
            # Rows of superseded calls ride along: the learner tells them
            # apart by call id, as it does for calls it gave up on.
            named = reply.named(handle.name)
            if whole and finished is None:
                lease.held.setdefault(reply.call_id, []).append(named)
                return
            lease.post(lease_response([*lease.held.pop(reply.call_id, []), named]))

    def _forged(
        self, handle: WorkerHandle, lease_id: int, call_id: int, foreign: list[int]
    ) -> None:
        """A reply for envs ``handle`` does not host: ignored, logged at most once
        per interval, and past :data:`FORGED_REPLIES_LIMIT` the worker is refused.

        Raises:
            ProtocolError: The worker's forged replies reached the limit (its
                stream or data connection drops it, INVALID_ARGUMENT).
        """
        handle.forged_replies += 1
        if handle.forged_replies >= FORGED_REPLIES_LIMIT:
            raise ProtocolError(
                f"worker {handle.name!r} answered lease calls for envs it does not host "
                f"{handle.forged_replies} times (the last: lease {lease_id} call {call_id}, "
                f"envs {foreign}); a worker answers only for the envs it hosts (leases.proto)"
            )
        held_back = self._forgeries.admit()
        if held_back is not None:
            logger.warning(
                "worker %r answered lease %d call %d for envs %s it does not host; ignored%s",
                handle.name,
                lease_id,
                call_id,
                foreign,
                held_back_note(held_back, "such replies"),
            )

    def _on_created(self, lease: Lease, handle: WorkerHandle, reply: RelayReply) -> None:
        waiting = lease.creating.get(handle.worker_id)
        if waiting is not None:
            waiting.difference_update(reply.env_ids)
            if not waiting:
                del lease.creating[handle.worker_id]
        if reply.error is not None:
            message = (
                f"worker {handle.name!r} could not build env {lease.env.env_id!r} for lease "
                f"{lease.lease_id}: {reply.error_message}"
            )
            self._fail(lease, CallError(grpc.StatusCode.FAILED_PRECONDITION, message, reply.error))
        else:
            if lease.spec is None:
                lease.spec = reply.spec
            # Per env: workers that built differing envs send one spec each.
            specs = reply.specs or [reply.spec] * len(reply.env_ids)
            lease.env_specs.update(zip(reply.env_ids, specs, strict=True))
        self._state.changed.notify_all()

    # --- losses and release ---------------------------------------------------------

    def on_worker_lost(self, handle: WorkerHandle) -> None:
        """Re-creates a lost worker's leased envs elsewhere and resends their calls."""
        with self._state.lock:
            for lease in list(self._leases.values()):
                lost = [i for i, host in enumerate(lease.hosts) if host == handle.worker_id]
                if not lost or lease.closed:
                    continue
                for env_id in lost:
                    lease.hosts[env_id] = 0
                lease.creating.pop(handle.worker_id, None)
                placement = self._place(lease.env.env_id, len(lost), lease.env.pickled)
                if placement is None:
                    message = (
                        f"worker {handle.name!r} died hosting envs {lost} of lease "
                        f"{lease.lease_id} and no other worker has free slots for them; "
                        "start more workers (each hosts up to its --envs leased envs)"
                    )
                    self._fail(lease, no_workers(message))
                    continue
                logger.warning(
                    "worker %r died hosting envs %s of lease %d; re-creating them",
                    handle.name,
                    lost,
                    lease.lease_id,
                )
                self._create(lease, lost, placement, replaces_lost=True)
                for env_id in lost:
                    flight = lease.in_flight.get(env_id)
                    if flight is not None:
                        row = flight.env_ids.index(env_id)
                        self._send_call(lease, lease.hosts[env_id], flight, [row])
            self._state.changed.notify_all()

    def close(self, lease: Lease) -> None:
        """Releases a lease's envs on their workers (idempotent)."""
        with self._state.lock:
            self._release(lease)

    def fail(self, lease: Lease, failure: CallError) -> None:
        """Ends one lease with ``failure`` (a learner that broke the protocol)."""
        with self._state.lock:
            self._fail(lease, failure)

    def worker_names(self, lease: Lease) -> list[str]:
        """Name of the worker hosting each env of the lease."""
        with self._state.lock:
            names = []
            for worker_id in lease.hosts:
                handle = self._state.registry.get(worker_id)
                names.append(handle.name if handle is not None else "")
            return names

    def fail_all(self, failure: CallError) -> None:
        """Ends every lease with ``failure`` (coordinator drain or shutdown)."""
        with self._state.lock:
            for lease in list(self._leases.values()):
                self._fail(lease, failure)

    def _fail(self, lease: Lease, failure: CallError) -> None:
        """Ends a lease's stream with an error and releases its envs (lock held)."""
        if lease.failure is None:
            lease.failure = failure
            lease.outbox.put(failure)
        self._release(lease)

    def _release(self, lease: Lease) -> None:
        """Tells the hosting workers to close the envs (lock held, idempotent)."""
        if lease.closed:
            return
        lease.closed = True
        self._leases.pop(lease.lease_id, None)
        hosts = set(lease.hosts) - {0}
        for worker_id in hosts:
            handle = self._state.registry.get(worker_id)
            if handle is not None:
                handle.send_lease(release_command(lease.lease_id))
        lease.hosts = [0] * lease.num_envs
        self._share_slots(hosts)
        self._state.changed.notify_all()

    def counts(self) -> tuple[int, int, dict[int, int]]:
        """Open leases, the envs they hold, and the leased envs by worker id (GetStatus)."""
        with self._state.lock:
            by_worker: dict[int, int] = {}
            for lease in self._leases.values():
                for worker_id in lease.hosts:
                    by_worker[worker_id] = by_worker.get(worker_id, 0) + 1
            envs = sum(lease.num_envs for lease in self._leases.values())
            return len(self._leases), envs, by_worker


def _answered(
    lease: Lease, call_id: int, count: int, *, superseded: bool = False
) -> _CallClock | None:
    """Counts ``count`` envs of a call as answered (or superseded); returns its
    clock once none is left."""
    clock = lease.clocks.get(call_id)
    if clock is None:
        return None
    clock.superseded |= superseded
    clock.unanswered -= count
    if clock.unanswered > 0:
        return None
    del lease.clocks[call_id]
    return clock
