"""CoordinatorConfig: every knob of the coordinator, checked once."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from rlfleet._util.values import check_int, host_and_port
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.scheduling.scheduler import DEFAULT_CAPACITY_STEPS
from rlfleet.security import Limits, ServerSecurity
from rlfleet.transport import rpc as _rpc

#: Default learner-face address (loopback: exposing it is a deliberate choice).
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_ENV = "CartPole-v1"
#: ``lease_data_listen`` values: beside the gRPC port, or no data channel.
LEASE_DATA_AUTO = "auto"
LEASE_DATA_OFF = "off"
#: ``auto``'s offset from the gRPC port: + 1 is the documented plaintext
#: health port (--health-listen 50052, the image's default), so + 2.
LEASE_DATA_PORT_OFFSET = 2


#: Each plain field of CoordinatorConfig -> its ``rlfleet coordinator`` option
#: (flag ``--name-with-dashes``, config-file key, ``RLFLEET_*`` variable).
#: The command builds its config through this table, and ``Fleet.local``
#: turns a config back into flags for coordinator processes with it.
#: ``listen``, ``env``, ``seed``, ``tail_moves`` (``--tail-moves on|off``) and
#: ``security`` have options of their own shape.
SETTING_NAMES: dict[str, str] = {
    "heartbeat_interval_seconds": "heartbeat_interval",
    "heartbeat_timeout_seconds": "heartbeat_timeout",
    "wait_for_workers_seconds": "wait_for_workers",
    "update_timeout_seconds": "update_timeout",
    "handshake_timeout_seconds": "handshake_timeout",
    "keepalive_seconds": "keepalive_interval",
    "keepalive_timeout_seconds": "keepalive_timeout",
    "max_message_bytes": "max_message_bytes",
    "max_workers": "max_workers",
    "max_queued_requests": "max_queued_requests",
    "max_subscribers": "max_subscribers",
    "max_envs_per_lease": "max_envs_per_lease",
    "max_leased_envs": "max_leased_envs",
    "max_leases_per_learner": "max_leases_per_learner",
    "max_envs_per_learner": "max_envs_per_learner",
    "lease_data_listen": "lease_data_listen",
    "max_result_bytes": "max_result_bytes",
    "max_learner_calls": "max_learner_calls",
    "max_buffered_steps": "max_buffered_steps",
    "prefetch_factor": "prefetch_factor",
    "capacity_steps": "capacity_steps",
    "max_fragment_length": "max_fragment_length",
    "progress_deadline_seconds": "progress_deadline",
    "max_envs_per_worker": "max_envs_per_worker",
}


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of a coordinator.

    Args:
        listen: ``HOST:PORT`` to bind; port 0 picks a free port (see
            :attr:`CoordinatorServer.port`).
        env: The env workers build when they join, until a learner sends
            an env update. ``imports`` must be empty: custom envs are
            imported by each worker's own ``--import`` flag.
        seed: Base seed of requests that carry none.
        heartbeat_interval_seconds: How often workers send a Heartbeat.
        heartbeat_timeout_seconds: Silence after which a worker is declared
            dead and its units are given to others.
        wait_for_workers_seconds: How long a request waits for a ready
            worker (at its start, or after the last one was lost) before
            failing with UNAVAILABLE; a request may ask for another wait.
        handshake_timeout_seconds: How long a new stream may take to send
            its Hello.
        keepalive_seconds: Interval of the server's keepalive pings to its
            clients: with ``keepalive_timeout_seconds``, how soon a vanished
            worker or learner (dead host, partition) is noticed.
        keepalive_timeout_seconds: How long a ping may go unanswered.
        update_timeout_seconds: How long agent and env updates wait for
            every worker to apply them.
        max_message_bytes: Largest gRPC message either side sends.
        max_workers: Workers admitted at once; more are refused with
            RESOURCE_EXHAUSTED.
        max_learner_calls: Learner calls (samples, subscriptions, status)
            served at once; the thread pool holds these plus max_workers
            Join streams. Also the learners' results connections open at
            once (each may hold a thread for the requests sent on it);
            OpenResultChannel past it is refused with RESOURCE_EXHAUSTED.
        max_queued_requests: Sample and update requests waiting for their
            turn beyond which new ones are refused (RESOURCE_EXHAUSTED).
        max_subscribers: Concurrent subscriptions.
        max_buffered_steps: Default per-subscriber buffer (steps sent by
            workers but not yet taken by the subscriber).
        max_result_bytes: Largest serialized result accepted from a worker.
        progress_deadline_seconds: How long a worker holding units may go
            without delivering a result before it is dropped and its units
            run elsewhere; None derives it from the results seen
            (rlfleet.coordinator.progress).
        max_envs_per_worker: Largest ``Hello.num_envs`` admitted.
        max_fragment_length: Longest fragment window (steps per env slot)
            a request may ask for: a worker holds a whole window in memory.
        prefetch_factor: Units a worker holds per env slot beyond the one
            it runs, so the slot never waits for the next unit: the floor
            of its capacity, whatever the episode length.
        capacity_steps: Steps of work a worker holds (running, queued, or
            finished and not yet reported), converted to units with the
            fleet's mean episode length; 0 holds to ``prefetch_factor``.
            Large enough that workers report many episodes per message. A
            worker holds at least five of its largest results' worth of
            units beyond one per slot whatever this is, so that it gets
            its next units before it runs dry
            (:data:`rlfleet.scheduling.units.RESULTS_HELD`).
        tail_moves: At a Sample request's tail, move a busy worker's
            unstarted units to a worker that ran out, so that both finish
            together (docs/data_plane.md, "A request's tail"). False: each
            worker runs the units it was dealt, for workers of equal speed
            whose env resets are costly (a moved unit a busy worker already
            reset or ran is run again).
        max_envs_per_lease: Envs one lease (one learner's remote vector
            env) may hold; more are refused with RESOURCE_EXHAUSTED.
        max_leased_envs: Envs all leases together may hold.
        max_leases_per_learner: Leases one learner (LeaseOpen.learner and
            the host it calls from) may hold at once.
        max_envs_per_learner: Envs one learner's leases may hold together.
        lease_data_listen: ``HOST:PORT`` of the lease data channel (framed
            TCP for lease calls and replies, docs/protocol.md); ``"auto"``:
            the gRPC host and port + 2 (50053 beside 50051; port 0 when
            ``listen`` asks for 0);
            ``"off"``: none, lease traffic stays on gRPC.
        security: TLS, the worker and learner tokens, and the pickle
            opt-in (docs/security.md). The default serves plaintext to
            anyone who can reach ``listen``, which is why that is loopback
            unless told otherwise.
    """

    listen: str = DEFAULT_LISTEN
    env: EnvConfig = field(default_factory=lambda: EnvConfig(DEFAULT_ENV))
    seed: int = 0
    heartbeat_interval_seconds: float = 1.0
    heartbeat_timeout_seconds: float = 10.0
    wait_for_workers_seconds: float = 60.0
    handshake_timeout_seconds: float = 10.0
    keepalive_seconds: float = 10.0
    keepalive_timeout_seconds: float = 5.0
    update_timeout_seconds: float = 120.0
    max_message_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES
    max_workers: int = 256
    max_learner_calls: int = 32
    max_queued_requests: int = 64
    max_subscribers: int = 8
    max_buffered_steps: int = 100_000
    max_result_bytes: int = 1 << 30
    max_fragment_length: int = 100_000
    progress_deadline_seconds: float | None = None
    max_envs_per_worker: int = 1024
    prefetch_factor: int = 1
    capacity_steps: int = DEFAULT_CAPACITY_STEPS
    tail_moves: bool = True
    security: ServerSecurity = field(default_factory=ServerSecurity)
    max_envs_per_lease: int = 256
    max_leased_envs: int = 4096
    max_leases_per_learner: int = 16
    max_envs_per_learner: int = 1024
    lease_data_listen: str = LEASE_DATA_AUTO

    def __post_init__(self) -> None:
        listen = host_and_port(self.listen)
        if listen is None:
            raise ConfigError(
                f"listen address {self.listen!r} must be HOST:PORT, e.g. 127.0.0.1:50051 "
                "(port 0 picks a free port; [::]:PORT listens on every interface)"
            )
        if not isinstance(self.env, EnvConfig):
            raise ConfigError(f"CoordinatorConfig.env must be an EnvConfig, got {self.env!r}")
        if self.env.imports:
            raise ConfigError(
                f"the coordinator cannot make workers import {list(self.env.imports)}: start "
                "each worker with --import MODULE instead"
            )
        if ":" in self.env.id:
            raise ConfigError(
                f"env id {self.env.id!r} names a module; workers refuse such ids from the "
                "network. Start workers with --import MODULE and give the plain id"
            )
        check_int("seed", self.seed, minimum=0)
        for name in (
            "heartbeat_interval_seconds",
            "heartbeat_timeout_seconds",
            "wait_for_workers_seconds",
            "handshake_timeout_seconds",
            "update_timeout_seconds",
            "keepalive_seconds",
            "keepalive_timeout_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        deadline = self.progress_deadline_seconds
        if deadline is not None and (
            isinstance(deadline, bool)
            or not isinstance(deadline, int | float)
            or not math.isfinite(deadline)
            or deadline <= 0
        ):
            raise ConfigError(
                f"progress_deadline_seconds must be a positive number of seconds or None, "
                f"got {deadline!r}"
            )
        if self.heartbeat_timeout_seconds <= self.heartbeat_interval_seconds:
            raise ConfigError(
                f"heartbeat_timeout_seconds ({self.heartbeat_timeout_seconds}) must exceed "
                f"heartbeat_interval_seconds ({self.heartbeat_interval_seconds}), or every "
                "worker is declared dead between two heartbeats"
            )
        for name in (
            "max_message_bytes",
            "max_workers",
            "max_learner_calls",
            "max_queued_requests",
            "max_subscribers",
            "max_buffered_steps",
            "max_result_bytes",
            "max_fragment_length",
            "max_envs_per_worker",
            "max_envs_per_lease",
            "max_leased_envs",
            "max_leases_per_learner",
            "max_envs_per_learner",
        ):
            check_int(name, getattr(self, name))
        if self.max_message_bytes < 64 * 1024:
            raise ConfigError(
                f"max_message_bytes={self.max_message_bytes} is too small to carry a chunk "
                "header and data; use at least 65536"
            )
        data = self.lease_data_listen
        if data not in (LEASE_DATA_AUTO, LEASE_DATA_OFF):
            if host_and_port(data) is None:
                raise ConfigError(
                    f"lease data listen address {data!r} (--lease-data-listen) must be HOST:PORT, "
                    f"{LEASE_DATA_AUTO!r} (the gRPC port + {LEASE_DATA_PORT_OFFSET}) or "
                    f"{LEASE_DATA_OFF!r}"
                )
        elif data == LEASE_DATA_AUTO and listen[1] + LEASE_DATA_PORT_OFFSET > 65535:
            raise ConfigError(
                f"listen port {listen[1]} leaves no port + {LEASE_DATA_PORT_OFFSET} for the lease "
                "data channel: give --lease-data-listen HOST:PORT or --lease-data-listen off"
            )
        check_int("prefetch_factor", self.prefetch_factor, minimum=0)
        check_int("capacity_steps", self.capacity_steps, minimum=0)
        if not isinstance(self.tail_moves, bool):
            raise ConfigError(f"tail_moves must be True or False, got {self.tail_moves!r}")

    def command_flags(self) -> list[str]:
        """The ``rlfleet coordinator`` flags that start a process with this config.

        Every field is given (the command's defaults need not be this
        class's), but ``security``: tokens travel in the process's
        environment (``RLFLEET_WORKER_TOKEN``, ``RLFLEET_LEARNER_TOKEN``),
        never on its command line; TLS and the pickle opt-in are not carried.
        """
        env = self.env
        flags = ["--listen", self.listen, "--env", env.id, "--seed", str(self.seed)]
        if env.kwargs:
            flags += ["--env-kwargs", json.dumps(dict(env.kwargs))]
        if env.max_episode_length is not None:
            flags += ["--max-episode-length", str(env.max_episode_length)]
        if env.vectorization is not None:
            flags += ["--env-vectorization", env.vectorization]
        flags += ["--tail-moves", "on" if self.tail_moves else "off"]
        for name, setting in SETTING_NAMES.items():
            value = getattr(self, name)
            if value is not None:  # None: the command's own (unset) default
                flags += [f"--{setting.replace('_', '-')}", str(value)]
        return flags

    @property
    def lease_data_address(self) -> str | None:
        """Where the lease data channel listens, or None when it is off."""
        if self.lease_data_listen == LEASE_DATA_OFF:
            return None
        if self.lease_data_listen != LEASE_DATA_AUTO:
            return self.lease_data_listen
        host, _, port = self.listen.rpartition(":")
        return f"{host}:{int(port) + LEASE_DATA_PORT_OFFSET if int(port) else 0}"

    @property
    def thread_pool_size(self) -> int:
        """Server threads: every Join stream and learner call holds one while it lasts."""
        # A few more for health checks and calls refused at the door.
        return self.max_workers + self.max_learner_calls + 8

    @property
    def limits(self) -> Limits:
        """What one peer may make the coordinator hold (rlfleet.security.Limits)."""
        return Limits(
            max_message_bytes=self.max_message_bytes,
            max_workers=self.max_workers,
            max_inflight_bytes_per_worker=self.max_result_bytes,
            handshake_timeout_seconds=self.handshake_timeout_seconds,
            max_subscribers=self.max_subscribers,
            max_pending_requests=self.max_queued_requests,
        )
