"""Fleet.local: an embedded coordinator and worker subprocesses, for one machine.

::

    with Fleet.local(workers=2, envs_per_worker=4, env="CartPole-v1") as sampler:
        batch = sampler.obtain_samples(0, 4000)

The coordinator runs in this process (a gRPC server on 127.0.0.1, a free
port); each worker is ``python -m rlfleet worker`` in its own process
group. With ``authenticate=True`` the fleet gets fresh worker and learner
tokens (a loopback port is open to every user of the machine); workers get
theirs in their environment, never on their command line.

Closing the fleet (leaving the ``with`` block, an exception in it, garbage
collection or interpreter exit) asks the workers to leave, kills whatever
is left of their process trees after a grace period, and stops the
server: no process is left behind. If this process ends without closing
the fleet (SIGKILL, a crash, ``os._exit``), its workers notice (a pipe
they watch closes; on Linux also a parent-death signal) and leave.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

import rlfleet
from rlfleet._util.values import check_int
from rlfleet.client._learner_messages import AgentUpdateLike
from rlfleet.client.sampler import RemoteSampler
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, RlfleetTimeoutError, UnavailableError, WorkerError
from rlfleet.security import RoleTokens, ServerSecurity, Token
from rlfleet.security.pickle import EMBEDDED_PARENT_ENV

logger = logging.getLogger("rlfleet.client")

#: How often Fleet.local checks whether the workers have joined.
_JOIN_POLL_SECONDS = 0.1
#: Lines of a dead worker's log shown in errors.
_LOG_TAIL_LINES = 15


@dataclass
class WorkerProcess:
    """A worker subprocess started by :func:`spawn_worker`.

    Attributes:
        name: The name it joins under.
        process: The process (leader of its own process group).
        log_path: Where its stdout and stderr go.
        parent_pipe: The write end of the pipe the worker watches
            (``die_with_parent``); the kernel closes it when this process
            ends, however it ends, and the worker then leaves.
    """

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    parent_pipe: int | None = None

    def release(self) -> None:
        """Closes this process's end of the parent pipe (once the worker was stopped)."""
        if self.parent_pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self.parent_pipe)
            self.parent_pipe = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of its log ("" if there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def spawn_worker(
    address: str,
    *,
    name: str,
    envs: int = 1,
    imports: Sequence[str] = (),
    seed: int = 0,
    log_path: Path,
    log_level: str = "WARNING",
    extra_args: Sequence[str] = (),
    token: Token | None = None,
    embedded: bool = False,
    die_with_parent: bool = True,
) -> WorkerProcess:
    """Starts ``python -m rlfleet worker`` in its own process group.

    Args:
        address: The coordinator's ``HOST:PORT``.
        name: The worker's name.
        envs: Its env slots.
        imports: Modules it imports (``--import``).
        seed: Its ``--seed``.
        log_path: File for its stdout and stderr.
        log_level: Its log level.
        extra_args: More ``rlfleet worker`` flags.
        token: The worker token, handed over in the child's environment
            (``RLFLEET_WORKER_TOKEN``), never on its command line.
        die_with_parent: The worker leaves when this process ends, however
            it ends (SIGKILL, a crash, ``os._exit``): it watches a pipe only
            this process holds open, and on Linux also asks for a
            parent-death signal (rlfleet/worker/_parent_watch.py). Call
            :meth:`WorkerProcess.release` once it was stopped.
        embedded: The coordinator runs in this process (``Fleet.local``):
            the worker then takes pickled env factories for leases from it
            (``RLFLEET_EMBEDDED_PARENT``; docs/security.md).

    Returns:
        The started process.
    """
    command = [
        sys.executable,
        "-m",
        "rlfleet",
        "--log-level",
        log_level,
        "worker",
        "--coordinator",
        address,
        "--envs",
        str(envs),
        "--name",
        name,
        "--seed",
        str(seed),
        *(arg for module in imports for arg in ("--import", module)),
        *extra_args,
    ]
    environment = _child_environment()
    if token is not None:
        environment["RLFLEET_WORKER_TOKEN"] = token.reveal()
    environment.pop(EMBEDDED_PARENT_ENV, None)
    if embedded:
        environment[EMBEDDED_PARENT_ENV] = str(os.getpid())
    # os.pipe() ends are not inheritable: only the worker given the read end
    # gets it (pass_fds), and no other child keeps the write end open.
    read_end, write_end = os.pipe() if die_with_parent and os.name == "posix" else (None, None)
    if read_end is not None:
        command.extend(["--parent-pipe", str(read_end)])
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # its own process group: signals reach it alone
                pass_fds=() if read_end is None else (read_end,),
            )
    except BaseException:
        if write_end is not None:
            os.close(write_end)
        raise
    finally:
        if read_end is not None:
            os.close(read_end)  # the child's copy is the only one left
    return WorkerProcess(name, process, log_path, write_end)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERMs processes, waits up to ``grace`` seconds, then SIGKILLs their trees.

    Children the processes started are killed too (collected before the
    signal, while their parents still exist).
    """
    trees: list[psutil.Process] = []
    for process in processes:
        if process.poll() is not None:
            continue
        try:
            parent = psutil.Process(process.pid)
            trees.extend([parent, *parent.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(trees, timeout=grace)
    for leftover in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    psutil.wait_procs(alive, timeout=5.0)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1.0)  # reaps the zombie


class Fleet:
    """An embedded coordinator with local worker processes. Make with :meth:`local`.

    Attributes:
        sampler: A :class:`RemoteSampler` connected to the coordinator.
        server: The embedded coordinator server.
        workers: The worker processes.
        learner_token: The learner token other clients of this fleet need
            (``authenticate=True``), else None.
    """

    def __init__(
        self,
        server: CoordinatorServer,
        sampler: RemoteSampler,
        workers: list[WorkerProcess],
        log_dir: Path,
        grace: float,
        *,
        learner_token: Token | None = None,
    ) -> None:
        self.server = server
        self.sampler = sampler
        self.workers = workers
        self.log_dir = log_dir
        self.learner_token = learner_token
        self._finalizer = weakref.finalize(self, _close, server, sampler, workers, log_dir, grace)

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
    ) -> Fleet:
        """Starts a coordinator in this process and ``workers`` worker processes.

        Args:
            workers: Worker processes (W).
            envs_per_worker: Env slots per worker (K).
            env: The env: an EnvConfig or a gymnasium id. Its ``imports``
                are imported by the workers (``--import``).
            policy: If given, pushed as the first agent update (any
                ``agent_update`` form of :meth:`RemoteSampler.update_agent`).
            seed: The sampler's seed (see :class:`RemoteSampler`); also the
                workers' ``--seed`` and the coordinator's. None: 0 for the
                processes, and the coordinator's own request numbering.
            max_episode_length: Overrides the env's episode limit.
            imports: More modules the workers import.
            join_timeout: Seconds for every worker to join and build the env.
            timeout: Deadline of each sampler call.
            grace: Seconds workers get to leave when the fleet closes.
            coordinator_options: More CoordinatorConfig fields.
            authenticate: Give the fleet fresh random worker and learner
                tokens, so that other users of this machine cannot join
                it, sample from it or push updates to it (docs/security.md).

        Returns:
            The running fleet; ``with Fleet.local(...) as sampler:`` yields
            its sampler and closes the fleet after the block.

        Raises:
            ConfigError: If an argument is invalid.
            RlfleetTimeoutError: If the workers did not all join in time
                (the message says how many did, with their log tails).
            WorkerError: If a worker process exited before joining (with
                its exit code and log tail).
        """
        for name, value in (("workers", workers), ("envs_per_worker", envs_per_worker)):
            check_int(f"Fleet.local {name}", value)
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
        process_seed = seed if seed is not None else 0
        tokens = (
            RoleTokens(_fresh_token("worker"), _fresh_token("learner")) if authenticate else None
        )
        server = serve(
            CoordinatorConfig(
                listen="127.0.0.1:0",
                env=EnvConfig(config.id, config.kwargs, length, vectorization=config.vectorization),
                seed=process_seed,
                security=ServerSecurity(tokens=tokens),
                **dict(coordinator_options or {}),
            )
        )
        log_dir = Path(tempfile.mkdtemp(prefix="rlfleet-fleet-"))
        learner_token = tokens.learner if tokens else None
        sampler = RemoteSampler(server.address, seed=seed, timeout=timeout, token=learner_token)
        processes: list[WorkerProcess] = []
        try:
            for i in range(workers):
                name = f"local-{i}"
                processes.append(
                    spawn_worker(
                        server.address,
                        name=name,
                        envs=envs_per_worker,
                        imports=modules,
                        seed=process_seed,
                        log_path=log_dir / f"{name}.log",
                        extra_args=("--drain-grace", f"{grace:g}"),
                        token=tokens.worker if tokens else None,
                        embedded=True,
                    )
                )
            fleet = cls(server, sampler, processes, log_dir, grace, learner_token=learner_token)
        except BaseException:
            _close(server, sampler, processes, log_dir, grace)
            raise
        try:
            fleet._await_workers(join_timeout)
            if policy is not None:
                sampler.update_agent(policy)
        except BaseException:
            fleet.close()
            raise
        logger.info(
            "local fleet on %s: %d workers x %d envs", server.address, workers, envs_per_worker
        )
        return fleet

    @property
    def address(self) -> str:
        """The coordinator's ``HOST:PORT``."""
        return self.server.address

    def close(self) -> None:
        """Stops the workers (SIGTERM, then SIGKILL after the grace) and the server."""
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
            dead = [w for w in self.workers if w.process.poll() is not None]
            if dead:
                raise WorkerError(
                    f"{len(dead)} of {expected} local workers exited before joining:\n"
                    + "\n".join(_describe(w) for w in dead)
                )
            with contextlib.suppress(UnavailableError):
                ready = self.sampler.status().ready_workers
                if ready >= expected:
                    return
            if time.monotonic() >= deadline:
                raise RlfleetTimeoutError(
                    f"only {ready} of {expected} local workers joined and built the env within "
                    f"{timeout:g} seconds (join_timeout):\n"
                    + "\n".join(_describe(w) for w in self.workers)
                )
            time.sleep(_JOIN_POLL_SECONDS)


def _close(
    server: CoordinatorServer,
    sampler: RemoteSampler,
    workers: list[WorkerProcess],
    log_dir: Path,
    grace: float,
) -> None:
    """Closes a fleet; a module function so the finalizer holds no reference to it."""
    try:
        sampler.close()
        stop_processes([w.process for w in workers], grace)
    finally:
        for worker in workers:
            worker.release()
        server.stop(grace=1.0)
        shutil.rmtree(log_dir, ignore_errors=True)


def _fresh_token(role: str) -> Token:
    return Token(secrets.token_hex(32), source=f"Fleet.local's {role} token")


def _describe(worker: WorkerProcess) -> str:
    """One worker's state and log tail, for errors."""
    code = worker.process.poll()
    state = "running" if code is None else f"exit code {code}"
    tail = worker.log_tail().replace("\n", "\n    ")
    log = f"\n  last log lines:\n    {tail}" if tail else " (no log output)"
    return f"- {worker.name} (pid {worker.process.pid}) {state}{log}"


def _child_environment() -> dict[str, str]:
    """This process's environment, with rlfleet importable in the child.

    A source checkout is not necessarily installed: put the directory this
    rlfleet was imported from first on the child's PYTHONPATH.
    """
    environment = dict(os.environ)
    root = str(Path(rlfleet.__file__).resolve().parent.parent)
    paths = [root, *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return environment
