"""``rlfleet coordinator``: run the coordinator workers join and learners call.

SIGTERM or SIGINT drains it (Kubernetes preemption): health turns
NOT_SERVING, new requests are refused with UNAVAILABLE, the requests in
flight get ``--drain-grace`` seconds to finish, then the workers are sent
Drain (they reconnect with backoff to its replacement) and it exits 0. A
second signal stops it at once. Flags take defaults from ``RLFLEET_*``
environment variables, named in ``--help``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from rlfleet._util.values import json_object
from rlfleet.cli._args import byte_size, non_negative_int, positive_float, positive_int
from rlfleet.cli._config import add_config_flags
from rlfleet.cli._env import env_option
from rlfleet.cli._security_flags import add_server_flags, server_security_from_args
from rlfleet.errors import ConfigError

logger = logging.getLogger("rlfleet.coordinator")

#: Seconds calls in progress get to finish when the coordinator stops.
STOP_GRACE_SECONDS = 2.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``coordinator`` subcommand."""
    parser = subparsers.add_parser(
        "coordinator",
        help="run a coordinator: workers join it, learners sample from it",
        description=(
            "Serve the worker face (Join) and the learner face (Sample, Subscribe, updates, "
            "status) on one gRPC port, with standard grpc.health.v1 health checking."
        ),
    )
    option = parser.add_argument
    option(
        "--listen",
        **env_option(
            "RLFLEET_LISTEN",
            default="127.0.0.1:50051",
            help="HOST:PORT to listen on; port 0 picks a free port ([::]:PORT for every interface)",
        ),
    )
    option(
        "--env",
        **env_option(
            "RLFLEET_ENV", default="CartPole-v1", help="gymnasium id of the env workers build"
        ),
    )
    option(
        "--env-kwargs",
        **env_option(
            "RLFLEET_ENV_KWARGS",
            default={},
            type=_json_object,
            help="JSON object of keyword arguments for gymnasium.make",
        ),
    )
    option(
        "--max-episode-length",
        **env_option(
            "RLFLEET_MAX_EPISODE_LENGTH",
            default=None,
            type=positive_int,
            help="cut episodes after N steps (TIMEOUT); unset: the env's own limit",
        ),
    )
    option(
        "--env-vectorization",
        **env_option(
            "RLFLEET_ENV_VECTORIZATION",
            default=None,
            help="how workers run their envs: subprocess (one child process per slot), or "
            "one native vector env, vector_entry_point (gymnasium's) or envpool; unset: one "
            "gymnasium.make env per slot in the worker (docs/reliability.md section 10 says "
            "what each keeps)",
        ),
    )
    option(
        "--seed",
        **env_option(
            "RLFLEET_SEED",
            default=0,
            type=non_negative_int,
            help="base seed of requests that carry none",
        ),
    )
    option(
        "--heartbeat-interval",
        **env_option(
            "RLFLEET_HEARTBEAT_INTERVAL",
            default=1.0,
            type=positive_float,
            help="seconds between worker heartbeats",
        ),
    )
    option(
        "--heartbeat-timeout",
        **env_option(
            "RLFLEET_HEARTBEAT_TIMEOUT",
            default=10.0,
            type=positive_float,
            help="seconds of silence after which a worker is declared dead",
        ),
    )
    option(
        "--wait-for-workers",
        **env_option(
            "RLFLEET_WAIT_FOR_WORKERS",
            default=60.0,
            type=positive_float,
            help="seconds a request waits for a ready worker before failing (UNAVAILABLE)",
        ),
    )
    option(
        "--update-timeout",
        **env_option(
            "RLFLEET_UPDATE_TIMEOUT",
            default=120.0,
            type=positive_float,
            help="seconds agent and env updates wait for every worker to apply them",
        ),
    )
    option(
        "--handshake-timeout",
        **env_option(
            "RLFLEET_HANDSHAKE_TIMEOUT",
            default=10.0,
            type=positive_float,
            help="seconds a new worker stream may take to send its Hello",
        ),
    )
    option(
        "--keepalive-interval",
        **env_option(
            "RLFLEET_KEEPALIVE_INTERVAL",
            default=10.0,
            type=positive_float,
            help="seconds between keepalive pings to workers and learners",
        ),
    )
    option(
        "--keepalive-timeout",
        **env_option(
            "RLFLEET_KEEPALIVE_TIMEOUT",
            default=5.0,
            type=positive_float,
            help="seconds a ping may go unanswered before the peer's calls are ended",
        ),
    )
    option(
        "--drain-grace",
        **env_option(
            "RLFLEET_DRAIN_GRACE",
            default=30.0,
            type=positive_float,
            help=(
                "on SIGTERM, seconds the requests in flight get to finish before the "
                "coordinator exits (keep below Kubernetes' terminationGracePeriodSeconds)"
            ),
        ),
    )
    option(
        "--max-message-bytes",
        type=byte_size,
        default="64MiB",
        help="largest gRPC message either side sends (bytes, or with a unit: 64MiB)",
    )
    option(
        "--max-workers",
        **env_option(
            "RLFLEET_MAX_WORKERS",
            default=256,
            type=positive_int,
            help="workers admitted at once (more are refused with RESOURCE_EXHAUSTED)",
        ),
    )
    option(
        "--max-queued-requests",
        type=positive_int,
        default=64,
        help="Sample and update requests waiting for their turn",
    )
    option(
        "--max-subscribers",
        type=positive_int,
        default=8,
        help="concurrent subscriptions",
    )
    option(
        "--max-learner-calls",
        type=positive_int,
        default=32,
        help="learner calls (samples, subscriptions, status) served at once",
    )
    option(
        "--max-buffered-steps",
        type=positive_int,
        default=100_000,
        help="default per-subscriber buffer: steps sent by workers, not yet taken",
    )
    option(
        "--prefetch-factor",
        type=non_negative_int,
        default=1,
        help="units a worker holds per env slot beyond the one it runs",
    )
    option(
        "--capacity-steps",
        type=non_negative_int,
        default=16384,
        help=(
            "steps of work a worker holds (running, queued, unreported), converted to units "
            "with the mean episode length; 0: --prefetch-factor alone"
        ),
    )
    option(
        "--max-envs-per-lease",
        type=positive_int,
        default=256,
        help="envs one lease (one learner's RemoteVectorEnv) may hold",
    )
    option(
        "--max-leased-envs",
        type=positive_int,
        default=4096,
        help="envs all leases together may hold",
    )
    option(
        "--max-leases-per-learner",
        type=positive_int,
        default=16,
        help="leases one learner (its LeaseOpen.learner name and host) may hold at once",
    )
    option(
        "--max-envs-per-learner",
        type=positive_int,
        default=1024,
        help="envs the leases of one learner may hold together",
    )
    option(
        "--lease-data-listen",
        default="auto",
        metavar="HOST:PORT|auto|off",
        help=(
            "HOST:PORT of the lease data channel, a framed TCP port that learners and workers "
            "dial for lease calls and replies (much cheaper than gRPC; docs/protocol.md); "
            "auto: the --listen host and port + 2 (50053 beside 50051; + 1 is the usual "
            "--health-listen); off: lease traffic stays on gRPC"
        ),
    )
    option(
        "--health-listen",
        **env_option(
            "RLFLEET_HEALTH_LISTEN",
            default=None,
            help=(
                "HOST:PORT of a plaintext grpc.health.v1 port reporting what the main port's "
                "health service reports (Kubernetes probes cannot speak TLS)"
            ),
        ),
    )
    option(
        "--metrics-listen",
        **env_option(
            "RLFLEET_METRICS_LISTEN",
            default=None,
            help="HOST:PORT of a plaintext HTTP port serving Prometheus /metrics",
        ),
    )
    option(
        "--port-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the bound port to PATH once listening (for scripts and tests)",
    )
    option(
        "--max-result-bytes",
        type=byte_size,
        default="1GiB",
        help=(
            "bytes of an unfinished result one worker may have in flight (a unit is allowed: "
            "1GiB); more drops the worker with RESOURCE_EXHAUSTED"
        ),
    )
    option(
        "--progress-deadline",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help=(
            "seconds a worker holding units may go without delivering a result before it is "
            "dropped and its units run elsewhere (default: 10x the longest wait for a result "
            "seen, at least 60 s; 600 s before the first result)"
        ),
    )
    option(
        "--max-envs-per-worker",
        type=positive_int,
        default=1024,
        help="largest --envs a worker may join with (default: 1024)",
    )
    option(
        "--max-fragment-length",
        type=positive_int,
        default=100_000,
        help=(
            "longest fragment window, in steps per env slot, a request may ask for: a worker "
            "holds a whole window in memory (default: 100000)"
        ),
    )
    add_server_flags(parser)
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the coordinator until SIGINT or SIGTERM; returns the exit code."""
    # Imported here: gRPC and gymnasium load only for the commands that need them.
    from rlfleet.coordinator import CoordinatorConfig, serve
    from rlfleet.envs import EnvConfig

    config = CoordinatorConfig(
        listen=args.listen,
        env=EnvConfig(
            args.env,
            args.env_kwargs,
            args.max_episode_length,
            vectorization=args.env_vectorization,
        ),
        seed=args.seed,
        heartbeat_interval_seconds=args.heartbeat_interval,
        heartbeat_timeout_seconds=args.heartbeat_timeout,
        wait_for_workers_seconds=args.wait_for_workers,
        update_timeout_seconds=args.update_timeout,
        handshake_timeout_seconds=args.handshake_timeout,
        keepalive_seconds=args.keepalive_interval,
        keepalive_timeout_seconds=args.keepalive_timeout,
        max_message_bytes=args.max_message_bytes,
        max_workers=args.max_workers,
        max_queued_requests=args.max_queued_requests,
        max_subscribers=args.max_subscribers,
        max_envs_per_lease=args.max_envs_per_lease,
        max_leased_envs=args.max_leased_envs,
        max_leases_per_learner=args.max_leases_per_learner,
        max_envs_per_learner=args.max_envs_per_learner,
        lease_data_listen=args.lease_data_listen,
        max_result_bytes=args.max_result_bytes,
        max_learner_calls=args.max_learner_calls,
        max_buffered_steps=args.max_buffered_steps,
        prefetch_factor=args.prefetch_factor,
        capacity_steps=args.capacity_steps,
        max_fragment_length=args.max_fragment_length,
        progress_deadline_seconds=args.progress_deadline,
        max_envs_per_worker=args.max_envs_per_worker,
        security=server_security_from_args(args),
    )
    stop = threading.Event()
    _install_signal_handlers(stop)
    server = serve(config)
    health_port = None
    metrics_port = None
    try:
        if args.health_listen:
            from rlfleet.cli._health_port import HealthPort

            health_port = HealthPort(args.health_listen, server.health_servicer)
            logger.info("serving grpc.health.v1 in plaintext on %s", health_port.listen)
        if args.metrics_listen:
            from rlfleet.cli._metrics_port import MetricsPort

            metrics_port = MetricsPort(args.metrics_listen, server.coordinator.metrics.registry)
        if args.port_file is not None:
            _write_atomically(args.port_file, f"{server.port}\n")
        # Waits in slices so that signal handlers run promptly in this thread.
        while not stop.wait(0.5):
            pass
        server.drain(args.drain_grace)
    finally:
        # The main server first: its health turns NOT_SERVING on both ports.
        server.stop(
            grace=STOP_GRACE_SECONDS,
            reason="the coordinator shut down; retry on its replacement",
        )
        if health_port is not None:
            health_port.stop()
        if metrics_port is not None:
            metrics_port.stop()
    return 0


def _install_signal_handlers(stop: threading.Event) -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        name = signal.Signals(signum).name
        if stop.is_set():
            logger.warning("got %s again: stopping now", name)
            raise KeyboardInterrupt  # unwinds the drain; run()'s finally stops
        logger.info("got %s: draining", name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _write_atomically(path: Path, text: str) -> None:
    """Writes a file so that a reader never sees it half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object."""
    try:
        return json_object(text, "the value")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
