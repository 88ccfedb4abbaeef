"""``rlfleet worker``: join a coordinator and sample with K envs.

SIGTERM or Ctrl-C makes the worker leave gracefully (it finishes the
episodes it is running, within ``--drain-grace`` seconds); a second Ctrl-C
exits at once. Each option is a field of :class:`WorkerSettings`: a flag, an
``RLFLEET_*`` variable (Kubernetes ConfigMaps; named in ``--help``) and a
config-file key.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Literal

from rlfleet._util.cpus import CPU_LIST_EXAMPLES, parse_cpu_list, pin_process
from rlfleet.cli._logging import tag_process
from rlfleet.cli._parser import SOURCES, add_command
from rlfleet.cli._security_flags import WorkerSecurityOptions, worker_security_from_args
from rlfleet.cli._settings import (
    ByteSize,
    ConfigOptions,
    CpuList,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StringList,
    option,
)
from rlfleet.worker._restarts import EnvRestartBudget

if TYPE_CHECKING:
    from rlfleet.cli._health_port import HealthPort
    from rlfleet.worker.remote import RemoteWorker


_BUDGET = EnvRestartBudget()


class WorkerSettings(WorkerSecurityOptions, ConfigOptions):
    """The options of ``rlfleet worker``."""

    coordinator: str | None = option(None, "HOST:PORT of the coordinator to join")
    envs: PositiveInt = option(1, "env slots stepped together (K)", env="RLFLEET_ENVS_PER_WORKER")
    lease_slots: NonNegativeInt | None = option(
        None,
        "leased envs (RemoteVectorEnv) this worker hosts at most; they take its --envs slots "
        "from sampling while leased (0: none)",
        shown="--envs",
    )
    imports: StringList = option(
        [],
        "import MODULE first (custom envs register on import; policy classes 'MODULE:Class' "
        "are allowed only from these modules); repeatable",
        flag="--import",
        metavar="MODULE",
    )
    name: str | None = option(
        None,
        "the worker's name in the fleet",
        env="RLFLEET_WORKER_NAME",
        shown="$POD_NAME or the host name",
    )
    seed: NonNegativeInt = option(
        0, "seed of policies built from specs (episode seeds come with the work)"
    )
    cpus: CpuList | None = option(
        None,
        "pin the worker, every thread it runs and its env processes to these CPUs (Linux): "
        f"a list like {CPU_LIST_EXAMPLES} of CPUs the worker may use (in a pod: of the "
        "cpuset the kubelet gave it)",
        metavar="LIST",
        shown="not pinned",
    )
    heartbeat_interval: PositiveFloat | None = option(
        None, "seconds between heartbeats", shown="the coordinator's setting"
    )
    reconnect_max_seconds: PositiveFloat = option(10.0, "cap of the reconnect backoff")
    connect_timeout: PositiveFloat | None = option(
        None,
        "seconds to keep trying to join (from the start, and from each lost connection) "
        "before exiting 1",
        shown="keep trying",
    )
    keepalive_interval: PositiveFloat = option(
        10.0, "seconds between keepalive pings to the coordinator"
    )
    keepalive_timeout: PositiveFloat = option(
        5.0, "seconds a ping may go unanswered before reconnecting"
    )
    env_restarts: NonNegativeInt = option(
        _BUDGET.max_restarts, "crashed envs rebuilt per --env-restart-window"
    )
    env_restart_window: PositiveFloat = option(
        _BUDGET.window_seconds, "seconds of the restart rate window"
    )
    env_restarts_total: NonNegativeInt = option(
        _BUDGET.max_total, "crashed envs rebuilt over the worker's life"
    )
    nonfinite: Literal["error", "flag", "ignore"] = option(
        "error",
        "a NaN/inf observation fails the request, is flagged in env_infos (nonfinite_obs), "
        "or is ignored",
    )
    drain_grace: PositiveFloat = option(30.0, "seconds to finish in-flight episodes when leaving")
    health_listen: str | None = option(
        None,
        "HOST:PORT of a plaintext grpc.health.v1 port, SERVING while the worker is joined "
        "and its loop is alive",
    )
    metrics_listen: str | None = option(
        None, "HOST:PORT of a plaintext HTTP port serving Prometheus /metrics"
    )
    flush_steps: PositiveInt | None = option(
        None,
        "send finished episodes once they hold this many steps (the coordinator queues "
        "5 such results' worth of units)",
        shown="8192; 16384 for a native vector env",
    )
    flush_bytes: ByteSize = option(
        4 << 20, "or once they hold about this many bytes (a unit is allowed: 4MiB)"
    )
    flush_seconds: PositiveFloat = option(0.1, "or once the oldest has waited this long")
    parent_pipe: NonNegativeInt | None = option(
        None,
        "FD of an inherited pipe's read end: leave when its write end closes, i.e. when the "
        "process that started this worker ends, however it ends (Fleet.local passes it; on "
        "Linux a parent-death signal is asked for too)",
        metavar="FD",
        internal=True,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``worker`` subcommand."""
    add_command(
        subparsers,
        "worker",
        WorkerSettings,
        run,
        help="join a coordinator and sample with K envs",
        description=(
            "Dial a coordinator, join its fleet and run the episodes it hands out with K "
            "envs stepped together. Reconnects with backoff when the coordinator goes "
            "away; leaves gracefully on SIGTERM."
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Runs the worker until it leaves; returns the exit code."""
    # First: threads started from here on (gRPC's, the receiver, the parent
    # watch) inherit the pinned set.
    _pin(args)
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
    if args.parent_pipe is not None:
        from rlfleet._util.parent_watch import watch_parent

        watch_parent(args.parent_pipe, worker.request_leave)
    try:
        return worker.run()
    finally:
        if health is not None:
            health.stop()
        if metrics is not None:
            metrics.stop()


def _pin(args: argparse.Namespace) -> None:
    """Pins the process to ``--cpus`` (if given), naming where the value came from in errors."""
    if args.cpus is None:
        return
    source = getattr(args, SOURCES, {}).get("cpus", "flag")
    where = f"--cpus {args.cpus!r}" if source == "flag" else f"{source}={args.cpus!r} (--cpus)"
    pin_process(parse_cpu_list(args.cpus), where)
    logging.getLogger("rlfleet.worker").info("pinned to CPUs %s (%s)", args.cpus, source)


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
