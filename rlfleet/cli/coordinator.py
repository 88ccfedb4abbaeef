"""``rlfleet coordinator``: run the coordinator workers join and learners call.

SIGTERM or SIGINT drains it (Kubernetes preemption): health turns
NOT_SERVING, new requests are refused with UNAVAILABLE, the requests in
flight get ``--drain-grace`` seconds to finish, then the workers are sent
Drain (they reconnect with backoff to its replacement) and it exits 0. A
second signal stops it at once. Each option is a field of
:class:`CoordinatorSettings`: a flag, an ``RLFLEET_*`` variable (named in
``--help``) and a config-file key.
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
from typing import Literal

from rlfleet.cli._parser import add_command
from rlfleet.cli._security_flags import ServerSecurityOptions, server_security_from_args
from rlfleet.cli._settings import (
    ByteSize,
    ConfigOptions,
    JsonObject,
    MessageSize,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    option,
)

logger = logging.getLogger("rlfleet.coordinator")

#: Seconds calls in progress get to finish when the coordinator stops.
STOP_GRACE_SECONDS = 2.0


class CoordinatorSettings(ServerSecurityOptions, ConfigOptions):
    """The options of ``rlfleet coordinator``."""

    listen: str = option(
        "127.0.0.1:50051",
        "HOST:PORT to listen on; port 0 picks a free port ([::]:PORT for every interface)",
    )
    env: str = option("CartPole-v1", "gymnasium id of the env workers build")
    env_kwargs: JsonObject = option({}, "JSON object of keyword arguments for gymnasium.make")
    max_episode_length: PositiveInt | None = option(
        None, "cut episodes after N steps (TIMEOUT); unset: the env's own limit"
    )
    env_vectorization: str | None = option(
        None,
        "how workers run their envs: subprocess (one child process per slot), or one native "
        "vector env, vector_entry_point (gymnasium's) or envpool; unset: one gymnasium.make "
        "env per slot in the worker (docs/reliability.md section 10 says what each keeps)",
    )
    seed: NonNegativeInt = option(0, "base seed of requests that carry none")
    heartbeat_interval: PositiveFloat = option(1.0, "seconds between worker heartbeats")
    heartbeat_timeout: PositiveFloat = option(
        10.0, "seconds of silence after which a worker is declared dead"
    )
    wait_for_workers: PositiveFloat = option(
        60.0, "seconds a request waits for a ready worker before failing (UNAVAILABLE)"
    )
    update_timeout: PositiveFloat = option(
        120.0, "seconds agent and env updates wait for every worker to apply them"
    )
    handshake_timeout: PositiveFloat = option(
        10.0, "seconds a new worker stream may take to send its Hello"
    )
    keepalive_interval: PositiveFloat = option(
        10.0, "seconds between keepalive pings to workers and learners"
    )
    keepalive_timeout: PositiveFloat = option(
        5.0, "seconds a ping may go unanswered before the peer's calls are ended"
    )
    drain_grace: PositiveFloat = option(
        30.0,
        "on SIGTERM, seconds the requests in flight get to finish before the coordinator "
        "exits (keep below Kubernetes' terminationGracePeriodSeconds)",
    )
    max_message_bytes: MessageSize = option(
        64 << 20,
        "largest gRPC message either side sends (bytes, or with a unit: 64MiB; 64KiB to "
        "2GiB - 1 byte, gRPC's limit)",
    )
    max_workers: PositiveInt = option(
        256, "workers admitted at once (more are refused with RESOURCE_EXHAUSTED)"
    )
    max_queued_requests: PositiveInt = option(
        64, "Sample and update requests waiting for their turn"
    )
    max_subscribers: PositiveInt = option(8, "concurrent subscriptions")
    max_learner_calls: PositiveInt = option(
        32,
        "learner calls (samples, subscriptions, status) served at once, and learners' "
        "results connections open at once",
    )
    max_buffered_steps: PositiveInt = option(
        100_000, "default per-subscriber buffer: steps sent by workers, not yet taken"
    )
    prefetch_factor: NonNegativeInt = option(
        1, "units a worker holds per env slot beyond the one it runs"
    )
    capacity_steps: NonNegativeInt = option(
        16384,
        "steps of work a worker holds (running, queued, unreported), converted to units with "
        "the mean episode length, and at least 3 of its results; 0: --prefetch-factor alone",
    )
    tail_moves: Literal["on", "off"] = option(
        "on",
        "at a Sample request's tail, move a busy worker's unstarted units to a worker that ran "
        'out (docs/data_plane.md, "A request\'s tail"); off: each worker runs the units it was '
        "dealt (workers of equal speed whose env resets are costly)",
    )
    max_envs_per_lease: PositiveInt = option(
        256, "envs one lease (one learner's RemoteVectorEnv) may hold"
    )
    max_leased_envs: PositiveInt = option(4096, "envs all leases together may hold")
    max_leases_per_learner: PositiveInt = option(
        16, "leases one learner (its LeaseOpen.learner name and host) may hold at once"
    )
    max_envs_per_learner: PositiveInt = option(
        1024, "envs the leases of one learner may hold together"
    )
    lease_data_listen: str = option(
        "auto",
        "HOST:PORT of the lease data channel, a framed TCP port that learners and workers "
        "dial for lease calls and replies, workers' results and samplers' answers (much "
        "cheaper than gRPC; docs/protocol.md); auto: the --listen host and port + 2 (50053 "
        "beside 50051; + 1 is the usual --health-listen); off: that traffic stays on gRPC",
        metavar="HOST:PORT|auto|off",
    )
    health_listen: str | None = option(
        None,
        "HOST:PORT of a plaintext grpc.health.v1 port reporting what the main port's health "
        "service reports (Kubernetes probes cannot speak TLS)",
    )
    metrics_listen: str | None = option(
        None, "HOST:PORT of a plaintext HTTP port serving Prometheus /metrics"
    )
    port_file: Path | None = option(
        None,
        "write the bound port to PATH once listening (for scripts and tests)",
        metavar="PATH",
    )
    max_result_bytes: ByteSize = option(
        1 << 30,
        "bytes of an unfinished result one worker may have in flight (a unit is allowed: "
        "1GiB); more drops the worker with RESOURCE_EXHAUSTED",
    )
    progress_deadline: PositiveFloat | None = option(
        None,
        "seconds a worker holding units may go without delivering a result before it is "
        "dropped and its units run elsewhere",
        metavar="SECONDS",
        shown="10x the longest wait for a result seen, at least 60 s; 600 s before the "
        "first result",
    )
    max_envs_per_worker: PositiveInt = option(1024, "largest --envs a worker may join with")
    max_fragment_length: PositiveInt = option(
        100_000,
        "longest fragment window, in steps per env slot, a request may ask for: a worker "
        "holds a whole window in memory",
    )
    parent_pipe: NonNegativeInt | None = option(
        None,
        "FD of an inherited pipe's read end: stop at once when its write end closes, i.e. "
        "when the process that started this coordinator ends, however it ends (Fleet.local "
        "with several coordinators passes it; on Linux a parent-death signal is asked for too)",
        metavar="FD",
        internal=True,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``coordinator`` subcommand."""
    add_command(
        subparsers,
        "coordinator",
        CoordinatorSettings,
        run,
        help="run a coordinator: workers join it, learners sample from it",
        description=(
            "Serve the worker face (Join) and the learner face (Sample, Subscribe, updates, "
            "status) on one gRPC port, with standard grpc.health.v1 health checking."
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Runs the coordinator until SIGINT or SIGTERM; returns the exit code."""
    # Imported here: gRPC and gymnasium load only for the commands that need them.
    from rlfleet.coordinator import CoordinatorConfig, serve
    from rlfleet.coordinator.allocator import keep_freed_memory
    from rlfleet.coordinator.config import SETTING_NAMES
    from rlfleet.envs import EnvConfig

    keep_freed_memory()  # this process is the coordinator's own

    config = CoordinatorConfig(
        listen=args.listen,
        env=EnvConfig(
            args.env,
            args.env_kwargs,
            args.max_episode_length,
            vectorization=args.env_vectorization,
        ),
        seed=args.seed,
        tail_moves=args.tail_moves == "on",
        security=server_security_from_args(args),
        **{field: getattr(args, setting) for field, setting in SETTING_NAMES.items()},
    )
    stop = threading.Event()
    _install_signal_handlers(stop)
    # Set when the learner that started this coordinator died: nobody is left
    # to finish requests for, so it stops without draining.
    orphaned = threading.Event()
    if args.parent_pipe is not None:
        from rlfleet._util.parent_watch import watch_parent

        def on_parent_gone(reason: str) -> None:
            del reason  # watch_parent logged it
            orphaned.set()
            stop.set()

        watch_parent(args.parent_pipe, on_parent_gone)
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
        if not orphaned.is_set():
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
