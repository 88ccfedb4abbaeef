"""The remote worker: a VecWorker driven by a coordinator over one Join stream.

``rlfleet worker --coordinator HOST:PORT`` runs :class:`RemoteWorker`. It
dials the coordinator, says Hello, and then, on the main thread, applies the
coordinator's messages in order and steps its VecWorker while there is work.
Network work happens only between steps and never blocks them: a receiver
thread queues incoming messages, gRPC's own thread drains the outgoing
ones. Finished episodes are sent in groups (see :class:`WorkerConfig`), each
group serialized once and cut into chunks that the coordinator forwards to
the learner untouched.

The main loop of one joined stream is :class:`~rlfleet.worker._session.Session`.

When the stream breaks, the worker reconnects with exponential backoff and
full jitter and joins again as a new worker, with fresh envs and policy (a
restarted coordinator may be at another agent version). SIGTERM makes it
leave gracefully: it says Leaving, finishes the episodes it is running,
sends them and exits 0; units it never started are re-assigned by the
coordinator.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field

import grpc

from rlfleet._util.log_limit import LogLimiter, held_back_note
from rlfleet._util.values import check_int
from rlfleet._version import __version__
from rlfleet.errors import ConfigError
from rlfleet.protocol.join import WorkerHello, WorkerWelcome
from rlfleet.protocol.multi_agent import MULTI_AGENT_CAPABILITY
from rlfleet.security import ClientSecurity, PickleGate
from rlfleet.security.pickle import check_prerequisites as check_pickle_prerequisites
from rlfleet.security.pickle import embedded_child
from rlfleet.security.tls_probe import describe_tls_failure, tls_failure
from rlfleet.transport import rpc as _rpc
from rlfleet.worker._connection import Incoming, JoinStream, StreamEnded, Wakeup
from rlfleet.worker._join_messages import body_name
from rlfleet.worker._restarts import EnvRestartBudget
from rlfleet.worker._session import Outcome, Session
from rlfleet.worker.metrics import WorkerMetrics
from rlfleet.worker.vec import NanMode

logger = logging.getLogger("rlfleet.worker")

#: Capabilities of this worker (worker.proto Hello).
CAPABILITIES = ("rlfleet.episodes", "rlfleet.fragments", MULTI_AGENT_CAPABILITY)
IMPLEMENTATION = f"rlfleet-python/{__version__}"

#: Attempts of an outage that each log their "reconnecting" line (the
#: backoff's start, for the operator); later ones log at most one line per
#: :data:`_RETRY_LOG_SECONDS`, with the count held back.
_RETRY_LINES = 5
_RETRY_LOG_SECONDS = 30.0

# Statuses at the handshake that retrying cannot fix: the worker exits.
_FATAL_AT_HANDSHAKE = {
    grpc.StatusCode.FAILED_PRECONDITION: "protocol version mismatch",
    grpc.StatusCode.INVALID_ARGUMENT: "the coordinator refused this worker's Hello",
    grpc.StatusCode.UNAUTHENTICATED: "not authenticated",
    grpc.StatusCode.PERMISSION_DENIED: "permission denied",
    grpc.StatusCode.UNIMPLEMENTED: "the address is not an rlfleet coordinator",
}


def default_worker_name() -> str:
    """``$RLFLEET_WORKER_NAME``, else ``$POD_NAME`` (Kubernetes), else the host name."""
    return (
        os.environ.get("RLFLEET_WORKER_NAME") or os.environ.get("POD_NAME") or socket.gethostname()
    )


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of a remote worker.

    Args:
        coordinator: ``HOST:PORT`` of the coordinator.
        envs: Env slots stepped together (K).
        lease_slots: Leased envs (step-level env leases) the worker hosts at
            most; while leased they take its ``envs`` slots from sampling.
            None: ``envs``; 0: none (it does not declare the capability
            "rlfleet.leases").
        imports: Modules imported before envs are built (custom envs
            register on import) and the only modules whose policy classes
            (``"module:Class"`` specs) the worker may import.
        name: The worker's name in the fleet (made unique by the coordinator).
        seed: Seed of policies built from specs (initial weights); episode
            seeds come with the units.
        heartbeat_interval: Seconds between heartbeats; None: the
            coordinator's (Welcome).
        reconnect_base_seconds: First backoff step after a lost connection.
        reconnect_max_seconds: Backoff cap.
        handshake_timeout: Seconds to wait for the Welcome.
        connect_timeout: Seconds the worker keeps trying to join (from its
            start, and again from each lost connection) before it exits 1;
            None: it keeps trying for ever.
        flush_steps: Send finished episodes once they hold this many steps
            (None: 8,192, or 16,384 while the env is a native vector env,
            whose results are full: ``rlfleet.worker._flush.flush_steps_for``),
        flush_bytes: or about this many bytes,
        flush_seconds: or the oldest has waited this long, or no unit is
            left to start. Grouping episodes saves per-message costs (about
            a millisecond of CPU per result between the coordinator and the
            learner); reporting as the queue runs out gets the next units,
            or the request's answer, without waiting. The coordinator
            queues five of the worker's largest results' worth of units
            (more with its ``capacity_steps``), so a larger ``flush_steps``
            means a longer queue.
        max_message_bytes: Largest message this side accepts or sends
            (the coordinator's Welcome may lower the sending limit).
        drain_grace_seconds: When leaving, how long in-flight episodes may
            take to finish; past it they are abandoned (the coordinator
            re-assigns them).
        close_timeout: After the last result, how long to wait for the
            coordinator to end the stream.
        keepalive_interval: Seconds between keepalive pings on the channel.
        keepalive_timeout: Seconds a ping may go unanswered before the
            connection counts as dead (and the worker reconnects).
        env_restarts: How many crashed envs may be rebuilt (the rest is an
            EnvError for the request).
        nonfinite: What a NaN or inf observation is: ``"error"`` (the
            episode is dropped and the request fails), ``"flag"`` (env_info
            ``nonfinite_obs``) or ``"ignore"``.
        security: TLS and the worker token to dial with (docs/security.md).
        allow_pickle: Accept pickled policies and env factories from a
            coordinator that allows them too; needs TLS and a token.
    """

    coordinator: str
    envs: int = 1
    lease_slots: int | None = None
    imports: tuple[str, ...] = ()
    name: str = field(default_factory=default_worker_name)
    seed: int = 0
    heartbeat_interval: float | None = None
    reconnect_base_seconds: float = 0.1
    reconnect_max_seconds: float = 10.0
    handshake_timeout: float = 30.0
    connect_timeout: float | None = None
    flush_steps: int | None = None
    flush_bytes: int = 4 << 20
    flush_seconds: float = 0.1
    max_message_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES
    drain_grace_seconds: float = 30.0
    close_timeout: float = 5.0
    keepalive_interval: float = 10.0
    keepalive_timeout: float = 5.0
    env_restarts: EnvRestartBudget = field(default_factory=EnvRestartBudget)
    nonfinite: NanMode = "error"
    security: ClientSecurity = field(default_factory=ClientSecurity)
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        host, _, port = self.coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"coordinator address {self.coordinator!r} must be HOST:PORT, e.g. 127.0.0.1:50051"
            )
        check_int("--envs", self.envs)
        check_int("--seed", self.seed, minimum=0)
        if self.lease_slots is not None:
            check_int("--lease-slots", self.lease_slots, minimum=0)
        for name in (
            "reconnect_base_seconds",
            "reconnect_max_seconds",
            "handshake_timeout",
            "drain_grace_seconds",
            "close_timeout",
            "keepalive_interval",
            "keepalive_timeout",
            "flush_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.flush_steps is not None:
            check_int("flush_steps", self.flush_steps)
        check_int("flush_bytes", self.flush_bytes)
        if self.nonfinite not in ("error", "flag", "ignore"):
            raise ConfigError(
                f"--nonfinite must be 'error', 'flag' or 'ignore', got {self.nonfinite!r}"
            )
        if self.connect_timeout is not None and not self.connect_timeout > 0:
            raise ConfigError(
                f"--connect-timeout must be > 0 seconds, got {self.connect_timeout!r}"
            )
        if self.heartbeat_interval is not None and not self.heartbeat_interval > 0:
            raise ConfigError(
                f"--heartbeat-interval must be > 0 seconds, got {self.heartbeat_interval!r}"
            )
        check_pickle_prerequisites(
            self.allow_pickle,
            tls=self.security.tls is not None,
            authenticated=self.security.token is not None,
            process="worker",
        )


class _HandshakeError(Exception):
    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


class RemoteWorker:
    """A worker process's life: connect, work, reconnect, leave.

    Args:
        config: The worker's settings.

    Attributes:
        metrics: Its Prometheus metrics (``rlfleet worker --metrics-listen``).
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._leave = threading.Event()
        self._leave_asked = False
        self._leave_reason = ""
        self._inbox: queue.SimpleQueue[Incoming] = queue.SimpleQueue()
        # Written by the main loop, read by health probes (floats: atomic).
        self._joined = False
        self._last_beat = 0.0
        self._beat_interval = 1.0
        self._last_progress = time.monotonic()
        self._unjoined_since = time.monotonic()
        self._retries = LogLimiter(_RETRY_LOG_SECONDS)
        self.metrics = WorkerMetrics()
        self._name = config.name

    @property
    def name(self) -> str:
        """Its name in the fleet: the one its last Welcome gave (the coordinator
        makes names unique, e.g. ``vm-2``), ``config.name`` before any join."""
        return self._name

    def request_leave(self, reason: str = "asked to leave") -> None:
        """Makes the worker leave gracefully. Safe to call from a signal handler."""
        self._leave_reason = reason
        self._leave_asked = True
        self._leave.set()
        self._inbox.put(Wakeup())

    @property
    def leave_requested(self) -> bool:
        """True once :meth:`request_leave` was called."""
        # A plain flag, not the event's is_set(): a session reads it at every vector step.
        return self._leave_asked

    @property
    def leave_reason(self) -> str:
        """Why the worker was asked to leave ("" if it was not)."""
        return self._leave_reason

    def healthy(self) -> bool:
        """True while joined to a coordinator with a main loop that keeps beating.

        Thread-safe; meant for health probes.
        """
        silence = time.monotonic() - self._last_beat
        return self._joined and silence < 3 * self._beat_interval + 5.0

    def alive(self) -> bool:
        """True while the main loop makes progress, joined or reconnecting.

        For liveness probes: a worker waiting for its coordinator to come
        back is alive (restarting it would not help); a stuck one is not.
        Thread-safe.
        """
        config = self.config
        # Joined, the loop beats; reconnecting, it passes the top of the
        # reconnect loop once per handshake plus backoff sleep.
        budget = max(
            3 * self._beat_interval, config.handshake_timeout + config.reconnect_max_seconds
        )
        return time.monotonic() - self._last_progress < budget + 5.0

    def beat(self, now: float, interval: float) -> None:
        """Records that the main loop sent a heartbeat (for :meth:`healthy`)."""
        self._last_beat, self._beat_interval = now, interval
        self._last_progress = now

    def run(self) -> int:
        """Works until asked to leave; returns the process exit code.

        Returns:
            0 after leaving gracefully, 1 if the coordinator refused the
            worker for a reason retrying cannot fix (e.g. protocol version)
            or no join succeeded within ``connect_timeout``.

        Raises:
            ConfigError: If a module of ``imports`` cannot be imported
                (checked before joining: a worker that cannot build its
                envs should fail at once, not join and refuse every env).
        """
        config = self.config
        import_modules(config.imports)
        channel = _rpc.open_channel(
            config.coordinator,
            max_message_bytes=config.max_message_bytes,
            reconnect_max_seconds=config.reconnect_max_seconds,
            keepalive_seconds=config.keepalive_interval,
            ping_timeout_seconds=config.keepalive_timeout,
            security=config.security,
        )
        attempt = 0
        self._unjoined_since = time.monotonic()
        try:
            while not self._leave.is_set():
                self._last_progress = time.monotonic()  # for alive()
                # A fresh inbox per stream: nothing of an old stream leaks in.
                self._inbox = queue.SimpleQueue()
                if self._leave.is_set():  # a signal between the check and the swap
                    break
                try:
                    session = self._connect(channel)
                except _HandshakeError as exc:
                    if exc.fatal:
                        logger.error(
                            "coordinator %s refused this worker: %s", config.coordinator, exc
                        )
                        return 1
                    attempt += 1
                    if self._gave_up(attempt, str(exc)):
                        return 1
                    self._backoff(attempt, str(exc))
                    continue
                attempt = 0
                self._retries = LogLimiter(_RETRY_LOG_SECONDS)  # a new outage logs at once
                self._joined = True
                try:
                    outcome = session.run()
                finally:
                    self._joined = False
                    self._unjoined_since = time.monotonic()
                if outcome is Outcome.LEFT:
                    break
                attempt += 1
                self._backoff(attempt, session.end_reason)
        finally:
            channel.close()
        logger.info("worker %r left: %s", self._name, self._leave_reason or "done")
        return 0

    def _gave_up(self, attempt: int, why: str) -> bool:
        """Whether ``--connect-timeout`` ran out without a join (then says so, once)."""
        timeout = self.config.connect_timeout
        waited = time.monotonic() - self._unjoined_since
        if timeout is None or waited < timeout:
            return False
        logger.error(
            "could not join coordinator %s within --connect-timeout %g s (%d attempts; the "
            "last: %s); check the address and that the coordinator runs",
            self.config.coordinator,
            timeout,
            attempt,
            why,
        )
        return True

    def _backoff(self, attempt: int, why: str) -> None:
        """Sleeps before reconnecting: exponential backoff with full jitter.

        The first :data:`_RETRY_LINES` attempts of an outage log their line;
        later ones at most once per :data:`_RETRY_LOG_SECONDS`, with the
        count of attempts held back: a wrong address must not fill the log
        with one warning per retry.
        """
        config = self.config
        cap = min(config.reconnect_max_seconds, config.reconnect_base_seconds * 2 ** (attempt - 1))
        delay = random.uniform(0, cap)
        if config.connect_timeout is not None:  # wake up in time to give up on time
            left = config.connect_timeout - (time.monotonic() - self._unjoined_since)
            delay = min(delay, max(left, 0.0))
        held_back = 0 if attempt <= _RETRY_LINES else self._retries.admit()
        if held_back is not None:
            logger.warning(
                "connection to coordinator %s: %s; reconnecting in %.2f s (attempt %d)%s",
                config.coordinator,
                why,
                delay,
                attempt,
                held_back_note(held_back, "failed attempts"),
            )
        self._leave.wait(delay)

    def _connect(self, channel: grpc.Channel) -> Session:
        """Opens a Join stream and completes the handshake.

        Raises:
            _HandshakeError: If the stream ends or no Welcome arrives in time.
        """
        config = self.config
        stream = JoinStream(channel, self._inbox)
        stream.send(
            WorkerHello(
                protocol_version=_rpc.PROTOCOL_VERSION,
                capabilities=(
                    *CAPABILITIES,
                    _rpc.TAKEOVER_CAPABILITY,
                    _rpc.UNIT_COLUMNS_CAPABILITY,
                    *(
                        (
                            _rpc.LEASE_CAPABILITY,
                            _rpc.DATA_RESULTS_CAPABILITY,
                            _rpc.RESULTS_SWITCH_CAPABILITY,
                            _rpc.DATA_TASKS_CAPABILITY,
                            _rpc.DATA_HEARTBEATS_CAPABILITY,
                        )
                        if config.lease_slots != 0
                        else ()
                    ),
                    *PickleGate(
                        config.allow_pickle or embedded_child(config.coordinator)
                    ).capabilities,
                ),
                num_envs=config.envs,
                lease_slots=config.lease_slots or 0,
                name=config.name,
                host=socket.gethostname(),
                pid=os.getpid(),
                implementation=IMPLEMENTATION,
            )
        )
        deadline = time.monotonic() + config.handshake_timeout
        while True:
            try:
                message = self._inbox.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                stream.cancel()
                raise _HandshakeError(
                    f"no Welcome within {config.handshake_timeout:g} seconds of Hello",
                    fatal=False,
                ) from None
            if isinstance(message, StreamEnded):
                stream.cancel()  # frees gRPC's thread waiting on the request generator
                refused = self._refused_tls(message)
                if refused is not None:
                    raise _HandshakeError(refused, fatal=True)
                reason = _FATAL_AT_HANDSHAKE.get(message.code)
                raise _HandshakeError(
                    f"{reason}: {message.describe()}" if reason else message.describe(),
                    fatal=reason is not None,
                )
            if isinstance(message, Wakeup):
                if self._leave.is_set():
                    stream.cancel()
                    raise _HandshakeError("left before joining", fatal=False)
                continue
            if not isinstance(message, WorkerWelcome):
                stream.cancel()
                raise _HandshakeError(
                    f"the coordinator sent {body_name(message)} before Welcome", fatal=False
                )
            self._name = message.name or config.name  # before the session logs its join
            return Session(self, stream, message)

    def _refused_tls(self, ended: StreamEnded) -> str | None:
        """Why TLS refused this worker, if it did (gRPC says UNAVAILABLE, as for an outage)."""
        tls = self.config.security.tls
        if tls is None or ended.code is not grpc.StatusCode.UNAVAILABLE:
            return None
        reason = tls_failure(self.config.coordinator, tls)
        return (
            None if reason is None else describe_tls_failure(self.config.coordinator, reason, tls)
        )


def import_modules(modules: tuple[str, ...]) -> None:
    """Imports the worker's ``--import`` modules (custom envs register on import).

    Raises:
        ConfigError: Naming the module and the import error.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a module's own code may raise anything at import
            raise ConfigError(
                f"--import {module}: {type(exc).__name__}: {exc}. Install the package on this "
                "machine or fix the module name"
            ) from exc
