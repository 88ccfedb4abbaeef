"""``rlfleet worker``: join a coordinator and sample with K envs.

SIGTERM or Ctrl-C makes the worker leave gracefully (it finishes the
episodes it is running, within ``--drain-grace`` seconds); a second Ctrl-C
exits at once. Flags take defaults from ``RLFLEET_*`` environment variables
(Kubernetes ConfigMaps), named in ``--help``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from rlfleet.cli._args import byte_size, non_negative_int, positive_float, positive_int
from rlfleet.cli._config import add_config_flags
from rlfleet.cli._env import env_option
from rlfleet.cli._logging import tag_process
from rlfleet.cli._security_flags import add_client_flags, worker_security_from_args
from rlfleet.worker._restarts import EnvRestartBudget

if TYPE_CHECKING:
    from rlfleet.cli._health_port import HealthPort
    from rlfleet.worker.remote import RemoteWorker


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``worker`` subcommand."""
    parser = subparsers.add_parser(
        "worker",
        help="join a coordinator and sample with K envs",
        description=(
            "Dial a coordinator, join its fleet and run the episodes it hands out with K "
            "envs stepped together. Reconnects with backoff when the coordinator goes "
            "away; leaves gracefully on SIGTERM."
        ),
    )
    parser.add_argument(
        "--coordinator",
        **env_option(
            "RLFLEET_COORDINATOR",
            default=None,
            help="HOST:PORT of the coordinator to join",
        ),
    )
    parser.add_argument(
        "--envs",
        **env_option(
            "RLFLEET_ENVS_PER_WORKER",
            default=1,
            type=positive_int,
            help="env slots stepped together (K)",
        ),
    )
    parser.add_argument(
        "--lease-slots",
        **env_option(
            "RLFLEET_LEASE_SLOTS",
            default=None,
            type=non_negative_int,
            help=(
                "leased envs (RemoteVectorEnv) this worker hosts at most; they take its --envs "
                "slots from sampling while leased (default: --envs; 0: none)"
            ),
        ),
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=(
            "import MODULE first (custom envs register on import; policy classes "
            "'MODULE:Class' are allowed only from these modules); repeatable"
        ),
    )
    parser.add_argument(
        "--name",
        **env_option(
            "RLFLEET_WORKER_NAME",
            default=None,
            help="the worker's name in the fleet ($POD_NAME or the host name if unset)",
        ),
    )
    parser.add_argument(
        "--seed",
        **env_option(
            "RLFLEET_SEED",
            default=0,
            type=non_negative_int,
            help="seed of policies built from specs (episode seeds come with the work)",
        ),
    )
    parser.add_argument(
        "--heartbeat-interval",
        **env_option(
            "RLFLEET_HEARTBEAT_INTERVAL",
            default=None,
            type=positive_float,
            help="seconds between heartbeats (the coordinator's setting if unset)",
        ),
    )
    parser.add_argument(
        "--reconnect-max-seconds",
        type=positive_float,
        default=10.0,
        help="cap of the reconnect backoff (default: 10)",
    )
    parser.add_argument(
        "--connect-timeout",
        **env_option(
            "RLFLEET_CONNECT_TIMEOUT",
            default=None,
            type=positive_float,
            help=(
                "seconds to keep trying to join (from the start, and from each lost "
                "connection) before exiting 1; unset: keep trying"
            ),
        ),
    )
    parser.add_argument(
        "--keepalive-interval",
        type=positive_float,
        default=10.0,
        help="seconds between keepalive pings to the coordinator (default: 10)",
    )
    parser.add_argument(
        "--keepalive-timeout",
        type=positive_float,
        default=5.0,
        help="seconds a ping may go unanswered before reconnecting (default: 5)",
    )
    budget = EnvRestartBudget()
    parser.add_argument(
        "--env-restarts",
        type=non_negative_int,
        default=budget.max_restarts,
        help=f"crashed envs rebuilt per --env-restart-window (default: {budget.max_restarts})",
    )
    parser.add_argument(
        "--env-restart-window",
        type=positive_float,
        default=budget.window_seconds,
        help=f"seconds of the restart rate window (default: {budget.window_seconds:g})",
    )
    parser.add_argument(
        "--env-restarts-total",
        type=non_negative_int,
        default=budget.max_total,
        help=f"crashed envs rebuilt over the worker's life (default: {budget.max_total})",
    )
    parser.add_argument(
        "--nonfinite",
        choices=("error", "flag", "ignore"),
        default="error",
        help="a NaN/inf observation fails the request, is flagged in env_infos "
        "(nonfinite_obs), or is ignored (default: error)",
    )
    parser.add_argument(
        "--drain-grace",
        **env_option(
            "RLFLEET_DRAIN_GRACE",
            default=30.0,
            type=positive_float,
            help="seconds to finish in-flight episodes when leaving",
        ),
    )
    parser.add_argument(
        "--health-listen",
        **env_option(
            "RLFLEET_HEALTH_LISTEN",
            default=None,
            help=(
                "HOST:PORT of a plaintext grpc.health.v1 port, SERVING while the worker "
                "is joined and its loop is alive"
            ),
        ),
    )
    parser.add_argument(
        "--metrics-listen",
        **env_option(
            "RLFLEET_METRICS_LISTEN",
            default=None,
            help="HOST:PORT of a plaintext HTTP port serving Prometheus /metrics",
        ),
    )
    parser.add_argument(
        "--flush-steps",
        type=positive_int,
        default=8192,
        help="send finished episodes once they hold this many steps (keep well under the "
        "coordinator's --capacity-steps)",
    )
    parser.add_argument(
        "--flush-bytes",
        type=byte_size,
        default="4MiB",
        help="or once they hold about this many bytes (a unit is allowed: 4MiB)",
    )
    parser.add_argument(
        "--flush-seconds",
        type=positive_float,
        default=0.1,
        help="or once the oldest has waited this long",
    )
    add_client_flags(parser, worker=True)
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the worker until it leaves; returns the exit code."""
    # Imported here: gRPC and gymnasium load only for the commands that need them.
    from rlfleet.worker.remote import RemoteWorker, WorkerConfig, default_worker_name

    if not args.coordinator:
        print(
            "rlfleet worker: no coordinator: pass --coordinator HOST:PORT or set "
            "RLFLEET_COORDINATOR",
            file=sys.stderr,
        )
        return 2
    config = WorkerConfig(
        coordinator=args.coordinator,
        envs=args.envs,
        lease_slots=args.lease_slots,
        imports=tuple(args.imports),
        name=args.name or default_worker_name(),
        seed=args.seed,
        heartbeat_interval=args.heartbeat_interval,
        reconnect_max_seconds=args.reconnect_max_seconds,
        connect_timeout=args.connect_timeout,
        drain_grace_seconds=args.drain_grace,
        keepalive_interval=args.keepalive_interval,
        keepalive_timeout=args.keepalive_timeout,
        flush_steps=args.flush_steps,
        flush_bytes=args.flush_bytes,
        flush_seconds=args.flush_seconds,
        env_restarts=EnvRestartBudget(
            args.env_restarts, args.env_restart_window, args.env_restarts_total
        ),
        nonfinite=args.nonfinite,
        security=worker_security_from_args(args),
        allow_pickle=args.allow_pickle,
    )
    worker = RemoteWorker(config)
    # The name the fleet knows it by (the coordinator may add a suffix).
    tag_process("worker", lambda: worker.name)
    health = _start_health(args.health_listen, worker) if args.health_listen else None
    metrics = None
    if args.metrics_listen:
        from rlfleet.cli._metrics_port import MetricsPort

        metrics = MetricsPort(args.metrics_listen, worker.metrics.registry)
    _install_signal_handlers(worker)
    try:
        return worker.run()
    finally:
        if health is not None:
            health.stop()
        if metrics is not None:
            metrics.stop()


def _start_health(listen: str, worker: RemoteWorker) -> HealthPort:
    from rlfleet.cli._health_port import LIVENESS_SERVICE, HealthPort, ProbedHealthServicer

    # "": joined and beating (readiness); LIVENESS_SERVICE: the loop runs,
    # also while the coordinator is away (liveness must not restart a
    # worker that waits for a coordinator being replaced).
    probes = ProbedHealthServicer(worker.healthy, {LIVENESS_SERVICE: worker.alive})
    return HealthPort(listen, probes)


def _install_signal_handlers(worker: RemoteWorker) -> None:
    interrupts = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        del frame
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            interrupts += 1
            if interrupts > 1:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
        worker.request_leave(f"got {name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
