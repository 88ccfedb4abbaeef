"""Fleet.local: a coordinator (or several) and worker subprocesses, for one machine.

::

    with Fleet.local(workers=2, envs_per_worker=4, env="CartPole-v1") as sampler:
        batch = sampler.obtain_samples(0, 4000)

By default the coordinator runs in this process (a gRPC server on
127.0.0.1, a free port); each worker is ``python -m rlfleet worker`` in its
own process group. ``coordinators=N`` (N > 1) starts N ``python -m rlfleet
coordinator`` processes instead, on 127.0.0.1 with free ports, gives worker
``i`` to coordinator ``i % N`` and yields a :class:`RemoteSampler` over all
of them (docs/sharding.md): past about one core's worth of results, one
coordinator's Python is the bound. With ``authenticate=True`` the fleet
gets fresh worker and learner tokens (a loopback port is open to every
user of the machine); its processes get theirs in their environment,
never on their command line.

Closing the fleet (leaving the ``with`` block, an exception in it, garbage
collection or interpreter exit) asks the workers to leave, kills whatever
is left of their process trees after a grace period, and stops the
coordinators: no process is left behind, also when starting failed. If this
process ends without closing the fleet (SIGKILL, a crash, ``os._exit``),
its workers and coordinator processes notice (a pipe they watch closes; on
Linux also a parent-death signal) and end.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from rlfleet._util.values import check_int
from rlfleet.client._learner_messages import AgentUpdateLike
from rlfleet.client._processes import (
    POLL_SECONDS,
    ChildProcess,
    CpuAffinity,
    spawn_coordinator,
    spawn_worker,
    stop_processes,
    wait_for_port,
    worker_cpu_sets,
)
from rlfleet.client.sampler import RemoteSampler
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.envs import EnvConfig
from rlfleet.envs.config import SUBPROCESS
from rlfleet.errors import ConfigError, RlfleetTimeoutError, UnavailableError, WorkerError
from rlfleet.security import RoleTokens, ServerSecurity, Token

logger = logging.getLogger("rlfleet.client")

#: A worker subprocess (the name its first users imported).
WorkerProcess = ChildProcess

__all__ = ["ChildProcess", "Fleet", "WorkerProcess", "spawn_worker", "stop_processes"]


class Fleet:
    """A coordinator (or several) with local worker processes. Make with :meth:`local`.

    Attributes:
        sampler: A :class:`RemoteSampler` over the fleet's coordinators.
        workers: The worker processes (worker ``i`` joins coordinator
            ``i % N``).
        coordinators: The coordinator processes with ``coordinators=N``
            (N > 1), in address order; empty for the embedded coordinator.
        learner_token: The learner token other clients of this fleet need
            (``authenticate=True``), else None.
    """

    def __init__(
        self,
        server: CoordinatorServer | None,
        sampler: RemoteSampler,
        workers: list[ChildProcess],
        log_dir: Path,
        grace: float,
        *,
        learner_token: Token | None = None,
        coordinators: Sequence[ChildProcess] = (),
    ) -> None:
        self._server = server
        self.sampler = sampler
        self.workers = workers
        self.coordinators = list(coordinators)
        self.log_dir = log_dir
        self.learner_token = learner_token
        self._finalizer = weakref.finalize(
            self,
            _close,
            server,
            sampler,
            workers=workers,
            coordinators=self.coordinators,
            log_dir=log_dir,
            grace=grace,
        )

    @classmethod
    def local(
        cls,
        workers: int = 2,
        envs_per_worker: int = 1,
        env: EnvConfig | str = "CartPole-v1",
        *,
        policy: AgentUpdateLike | None = None,
        seed: int | None = None,
        max_episode_length: int | None = None,
        imports: Sequence[str] = (),
        join_timeout: float = 60.0,
        timeout: float | None = 600.0,
        grace: float = 10.0,
        coordinator_options: Mapping[str, Any] | None = None,
        authenticate: bool = False,
        coordinators: int = 1,
        cpu_affinity: CpuAffinity = None,
    ) -> Fleet:
        """Starts a coordinator in this process (or ``coordinators`` coordinator
        processes) and ``workers`` worker processes.

        Args:
            workers: Worker processes (W).
            envs_per_worker: Env slots per worker (K).
            env: The env: an EnvConfig or a gymnasium id. Its ``imports``
                are imported by the workers (``--import``).
            policy: If given, pushed as the first agent update (any
                ``agent_update`` form of :meth:`RemoteSampler.update_agent`).
            seed: The sampler's seed (see :class:`RemoteSampler`); also the
                workers' ``--seed`` and the coordinators'. None: 0 for the
                processes, and the coordinator's own request numbering (over
                several coordinators, a base seed the sampler draws).
            max_episode_length: Overrides the env's episode limit.
            imports: More modules the workers import.
            join_timeout: Seconds for every worker to join and build the env
                (and before that, for every coordinator process to listen).
            timeout: Deadline of each sampler call.
            grace: Seconds workers (and coordinator processes) get to leave
                when the fleet closes.
            coordinator_options: More CoordinatorConfig fields, for every
                coordinator.
            authenticate: Give the fleet fresh random worker and learner
                tokens, so that other users of this machine cannot join
                it, sample from it or push updates to it (docs/security.md).
                Every coordinator requires them.
            coordinators: 1 (the default): one coordinator, in this process.
                N > 1: N ``rlfleet coordinator`` processes, worker ``i`` on
                coordinator ``i % N``, and a sampler that splits each request
                over them (docs/sharding.md): the same batch for the same
                seed as one coordinator gives. Needs ``workers >= N``.
                ``obtain_fragments`` and ``stream()`` run on every
                coordinator's own streams; ``RemoteVectorEnv`` of code
                factories needs one coordinator.
            cpu_affinity: Where the workers run (Linux; docs/performance.md
                measures it). None or False (the default): not pinned, the
                OS places them. ``"auto"``: worker ``i`` pinned to the
                ``i``-th CPU this process may use (``i`` modulo their
                number), all its threads with it; nothing pinned on other
                platforms or when the env's ``vectorization`` is
                ``"subprocess"`` (its envs' processes would share that one
                CPU). A list: worker ``i`` pinned to item ``i % len``, a CPU
                number (``0``), a taskset-style list (``"0-3"``) or CPU
                numbers (``[0, 2]``). This process and coordinator processes
                are never pinned. Two fleets on one machine both pin to the
                first CPUs with ``"auto"``: give each its own list.

        Returns:
            The running fleet; ``with Fleet.local(...) as sampler:`` yields
            its sampler and closes the fleet after the block.

        Raises:
            ConfigError: If an argument is invalid (``coordinators`` not an
                int >= 1, more coordinators than workers, ``cpu_affinity``
                naming a CPU this process may not use).
            RlfleetTimeoutError: If the workers did not all join in time
                (the message says how many did, with their log tails), or a
                coordinator process was not listening in time.
            WorkerError: If a worker process exited before joining (with
                its exit code and log tail).
            UnavailableError: If a coordinator process exited while the
                fleet started (named, with its exit code and log tail).
        """
        for name, value in (
            ("workers", workers),
            ("envs_per_worker", envs_per_worker),
            ("coordinators", coordinators),
        ):
            check_int(f"Fleet.local {name}", value)
        if workers < coordinators:
            raise ConfigError(
                f"Fleet.local got coordinators={coordinators} but only workers={workers}: each "
                "coordinator needs at least one worker of its own (worker i joins coordinator "
                "i % coordinators); give workers >= coordinators"
            )
        fixed = sorted({"listen", "env", "seed", "security"} & set(coordinator_options or {}))
        if fixed:
            raise ConfigError(
                f"Fleet.local sets {fixed} of the coordinator itself; pass env=, seed= instead "
                "(it always listens on 127.0.0.1 with a free port; authenticate=True for tokens)"
            )
        config = EnvConfig(env) if isinstance(env, str) else env
        if not isinstance(config, EnvConfig):
            raise ConfigError(f"env must be an EnvConfig or a gymnasium id, got {env!r}")
        length = max_episode_length if max_episode_length is not None else config.max_episode_length
        modules = tuple(dict.fromkeys([*config.imports, *imports]))
        cpu_sets = worker_cpu_sets(
            cpu_affinity, workers, subprocess_envs=config.vectorization == SUBPROCESS
        )
        process_seed = seed if seed is not None else 0
        tokens = (
            RoleTokens(_fresh_token("worker"), _fresh_token("learner")) if authenticate else None
        )
        coordinator_config = CoordinatorConfig(
            listen="127.0.0.1:0",
            env=EnvConfig(config.id, config.kwargs, length, vectorization=config.vectorization),
            seed=process_seed,
            security=ServerSecurity(tokens=tokens),
            **dict(coordinator_options or {}),
        )
        learner_token = tokens.learner if tokens else None
        log_dir = Path(tempfile.mkdtemp(prefix="rlfleet-fleet-"))
        server: CoordinatorServer | None = None
        sampler: RemoteSampler | None = None
        started: list[ChildProcess] = []
        processes: list[ChildProcess] = []
        try:
            if coordinators == 1:
                server = serve(coordinator_config)
                addresses = [server.address]
            else:
                addresses = _start_coordinators(
                    coordinator_config,
                    coordinators,
                    tokens=tokens,
                    log_dir=log_dir,
                    grace=grace,
                    join_timeout=join_timeout,
                    started=started,
                )
            sampler = RemoteSampler(
                addresses[0] if server is not None else addresses,
                seed=seed,
                timeout=timeout,
                token=learner_token,
            )
            if server is not None and server.coordinator.lease_data is not None:
                # Its coordinator runs in this process: results need no socket.
                sampler.result_route.attach = server.coordinator.lease_data.attach_in_process
            for i in range(workers):
                name = f"local-{i}"
                processes.append(
                    spawn_worker(
                        addresses[i % coordinators],
                        name=name,
                        envs=envs_per_worker,
                        imports=modules,
                        seed=process_seed,
                        log_path=log_dir / f"{name}.log",
                        extra_args=("--drain-grace", f"{grace:g}"),
                        token=tokens.worker if tokens else None,
                        # The coordinator runs in this process: its factories too.
                        embedded=server is not None,
                        cpus=cpu_sets[i],
                    )
                )
            fleet = cls(
                server,
                sampler,
                processes,
                log_dir,
                grace,
                learner_token=learner_token,
                coordinators=started,
            )
        except BaseException:
            _close(
                server,
                sampler,
                workers=processes,
                coordinators=started,
                log_dir=log_dir,
                grace=grace,
            )
            raise
        try:
            fleet._await_workers(join_timeout)
            if policy is not None:
                sampler.update_agent(policy)
        except BaseException:
            fleet.close()
            raise
        logger.info(
            "local fleet on %s: %d workers x %d envs", fleet.address, workers, envs_per_worker
        )
        return fleet

    @property
    def server(self) -> CoordinatorServer:
        """The embedded coordinator server (one coordinator only).

        Raises:
            ConfigError: If the fleet runs coordinator processes
                (``coordinators`` > 1): none runs in this process.
        """
        if self._server is None:
            raise ConfigError(
                f"this fleet runs {len(self.coordinators)} coordinator processes "
                "(Fleet.local(coordinators=N)), none in this process: what needs the embedded "
                "coordinator (RemoteVectorEnv of code factories, fragment streams) needs "
                "Fleet.local(coordinators=1)"
            )
        return self._server

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every coordinator's ``HOST:PORT``, in the order workers were dealt to them."""
        return self.sampler.addresses

    @property
    def address(self) -> str:
        """The coordinator's ``HOST:PORT``; over several, theirs joined by commas
        (what :class:`RemoteSampler` and ``rlfleet sample --coordinator`` take)."""
        return ",".join(self.addresses)

    def close(self) -> None:
        """Stops the workers (SIGTERM, then SIGKILL after the grace), then the coordinators."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """True once the fleet was closed."""
        return not self._finalizer.alive

    def __enter__(self) -> RemoteSampler:
        return self.sampler

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _await_workers(self, timeout: float) -> None:
        """Waits until every worker is ready (joined, env built, agent applied)."""
        deadline = time.monotonic() + timeout
        expected = len(self.workers)
        ready = 0
        while True:
            gone = [c for c in self.coordinators if c.process.poll() is not None]
            if gone:
                raise UnavailableError(
                    f"{len(gone)} of {len(self.coordinators)} local coordinators exited while "
                    "their workers joined:\n" + "\n".join(c.describe() for c in gone)
                )
            dead = [w for w in self.workers if w.process.poll() is not None]
            if dead:
                raise WorkerError(
                    f"{len(dead)} of {expected} local workers exited before joining:\n"
                    + "\n".join(w.describe() for w in dead)
                )
            with contextlib.suppress(UnavailableError):
                ready = self.sampler.status().ready_workers
                if ready >= expected:
                    return
            if time.monotonic() >= deadline:
                raise RlfleetTimeoutError(
                    f"only {ready} of {expected} local workers joined and built the env within "
                    f"{timeout:g} seconds (join_timeout):\n"
                    + "\n".join(w.describe() for w in self.workers)
                )
            time.sleep(POLL_SECONDS)


def _start_coordinators(
    config: CoordinatorConfig,
    count: int,
    *,
    tokens: RoleTokens | None,
    log_dir: Path,
    grace: float,
    join_timeout: float,
    started: list[ChildProcess],
) -> list[str]:
    """Starts ``count`` coordinator processes with ``config``; returns their addresses.

    Each is appended to ``started`` as soon as it runs, so that the caller
    stops it if a later one fails.
    """
    # On SIGTERM (close()) a coordinator drains: no longer than the workers' grace.
    flags = [*config.command_flags(), "--drain-grace", f"{grace:g}"]
    for i in range(count):
        name = f"coordinator-{i}"
        started.append(
            spawn_coordinator(
                flags,
                name=name,
                log_path=log_dir / f"{name}.log",
                port_file=log_dir / f"{name}.port",
                tokens=tokens,
            )
        )
    deadline = time.monotonic() + join_timeout
    for child in started:
        port = wait_for_port(child, log_dir / f"{child.name}.port", deadline, join_timeout)
        child.address = f"127.0.0.1:{port}"
    return [child.address for child in started]


def _close(
    server: CoordinatorServer | None,
    sampler: RemoteSampler | None,
    *,
    workers: list[ChildProcess],
    coordinators: list[ChildProcess],
    log_dir: Path,
    grace: float,
) -> None:
    """Closes a fleet; a module function so the finalizer holds no reference to it."""
    try:
        if sampler is not None:
            sampler.close()
        stop_processes([w.process for w in workers], grace)
    finally:
        for worker in workers:
            worker.release()
        try:
            if server is not None:
                server.stop(grace=1.0)
            stop_processes([c.process for c in coordinators], grace)
        finally:
            for coordinator in coordinators:
                coordinator.release()
            shutil.rmtree(log_dir, ignore_errors=True)


def _fresh_token(role: str) -> Token:
    return Token(secrets.token_hex(32), source=f"Fleet.local's {role} token")
