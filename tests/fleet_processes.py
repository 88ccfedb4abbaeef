"""Real rlfleet processes for fault tests: start, signal, wait, tear down.

A :class:`ProcessFleet` runs ``python -m rlfleet coordinator`` and ``python
-m rlfleet worker`` processes, each the leader of its own process group (so
a SIGKILL or SIGSTOP reaches the env processes it may have started), each
optionally inside a network namespace (``tests/netns_support.py``). Every
process carries a per-fleet mark in its environment; :meth:`close` kills
every group and then proves with psutil that no process with the mark is
left: a failed test leaves no orphan behind, and a leaked one fails it.

The one-call helpers of ``tests/_coordinator_fakes.py`` (GetStatus, raw
Sample, batch comparison) are reused, not repeated; what is new here is
process lifetime: restarts on the same port, freezes, kills, namespaces,
and waits that fail fast with the processes' log tails.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.client import RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.policies import Policy, PolicySpec
from rlfleet.sampling.local import LocalSampler
from rlfleet.v1 import learner_pb2
from tests._coordinator_fakes import ROOT, status
from tests.waiting import PATIENCE, wait_until

T = TypeVar("T")

#: Environment variable marking every process a fleet starts (orphan checks).
RUN_MARK = "RLFLEET_TEST_RUN"

#: Coordinator flags of fault tests: short liveness timeouts (a dead worker is
#: noticed in 3 s), long enough not to fire on a loaded 2-core machine.
TEST_COORDINATOR_FLAGS = (
    "--heartbeat-interval",
    "0.5",
    "--heartbeat-timeout",
    "3",
    "--wait-for-workers",
    "30",
)
#: Worker flags of fault tests: reconnect quickly after a coordinator restart.
TEST_WORKER_FLAGS = ("--reconnect-max-seconds", "1")
TEST_ENVS_MODULE = "rlfleet.envs.testing"
#: A Counter (rlfleet.envs.testing) whose episodes each sleep 0.2 s at their
#: first step: requests last long enough for a fault to land mid-request,
#: and every episode equals the same Counter's without the sleep.
SLOW_ENV = EnvConfig("rlfleet/Hanging-v0", {"hang_seconds": 0.2, "length": 5})
#: The no-fault twin of SLOW_ENV: what LocalSampler runs for the expected batch.
SLOW_ENV_TWIN = EnvConfig("rlfleet/Counter-v0", {"length": 5}, imports=(TEST_ENVS_MODULE,))
_LOG_TAIL_LINES = 30


@dataclass
class Proc:
    """One process of the fleet.

    Attributes:
        role: ``"coordinator"`` or ``"worker"``.
        name: Its name (the worker's ``--name``).
        popen: The process (leader of its own group).
        log: File holding its stdout and stderr.
    """

    role: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    #: Set when the test stops it on purpose; otherwise an exit fails waits.
    stopped: bool = False

    @property
    def pid(self) -> int:
        """Its pid (also its process group id)."""
        return self.popen.pid

    @property
    def alive(self) -> bool:
        """False once it exited (and was reaped)."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything it logged so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        """Its state and the tail of its log, for failure messages."""
        code = self.popen.poll()
        state = "running" if code is None else f"exited with {code}"
        tail = "\n    ".join(self.log_text().splitlines()[-_LOG_TAIL_LINES:])
        return f"- {self.role} {self.name} (pid {self.pid}) {state}:\n    {tail}"


@dataclass
class ProcessFleet:
    """A coordinator process and worker processes (a context manager).

    Args:
        directory: Where logs and port files go (a test's ``tmp_path``).

    Attributes:
        workers: Every worker process started, in order (dead ones too).
        port: The coordinator's port; kept across restarts.
        address: ``HOST:PORT`` the test (the learner) dials.
    """

    directory: Path
    workers: list[Proc] = field(default_factory=list)
    port: int = 0
    address: str = ""
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    _coordinator: Proc | None = None
    _started: list[Proc] = field(default_factory=list)
    _samplers: list[RemoteSampler] = field(default_factory=list)
    _coordinators: int = 0

    # --- starting ----------------------------------------------------------------------

    def start_coordinator(
        self,
        *flags: str,
        listen_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        prefix: Sequence[str] = (),
        defaults: Sequence[str] = TEST_COORDINATOR_FLAGS,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Starts a coordinator and waits until it listens.

        A restart (the previous coordinator dead) listens on the same port,
        so workers and samplers find it again.

        Args:
            flags: More ``rlfleet coordinator`` flags (they win over ``defaults``).
            listen_host: The host it binds.
            advertise_host: The host the test dials (default: ``listen_host``).
            prefix: Command prefix (e.g. ``ip netns exec NS``).
            defaults: Flags given before ``flags``.
            env: More environment variables.
        """
        self._coordinators += 1
        port_file = self.directory / f"coordinator-{self._coordinators}.port"
        if self.port == 0 and not prefix and listen_host == "127.0.0.1":
            # A restart binds this port again and the data channel's (port + 2):
            # below the ephemeral range no outgoing connection can hold them
            # meanwhile (one did: "cannot listen ... Address already in use").
            self.port = restartable_port()
        proc = self._spawn(
            "coordinator",
            f"coordinator-{self._coordinators}",
            [
                "coordinator",
                "--listen",
                f"{listen_host}:{self.port}",
                "--port-file",
                str(port_file),
                *defaults,
                *flags,
            ],
            prefix,
            env,
        )
        self._coordinator = proc
        self.port = int(self.wait_until(lambda: _read_port(port_file, proc), what="a port file"))
        self.address = f"{advertise_host or listen_host}:{self.port}"
        return proc

    def start_worker(
        self,
        *flags: str,
        name: str | None = None,
        envs: int = 1,
        imports: Iterable[str] = (),
        coordinator: str | None = None,
        prefix: Sequence[str] = (),
        defaults: Sequence[str] = TEST_WORKER_FLAGS,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Starts a worker (it joins on its own; see :meth:`wait_for_workers`).

        Args:
            flags: More ``rlfleet worker`` flags.
            name: Its ``--name`` (default ``w<N>``).
            envs: Its ``--envs``.
            imports: Modules for ``--import``.
            coordinator: The address it dials (default: :attr:`address`).
            prefix: Command prefix (e.g. ``ip netns exec NS``).
            defaults: Flags given before ``flags``.
            env: More environment variables.
        """
        name = name or f"w{len(self.workers)}"
        argv = [
            "worker",
            "--coordinator",
            coordinator or self.address,
            "--envs",
            str(envs),
            "--name",
            name,
            *(arg for module in imports for arg in ("--import", module)),
            *defaults,
            *flags,
        ]
        proc = self._spawn("worker", name, argv, prefix, env)
        self.workers.append(proc)
        return proc

    def _spawn(
        self,
        role: str,
        name: str,
        argv: list[str],
        prefix: Sequence[str],
        env: dict[str, str] | None,
    ) -> Proc:
        log = self.directory / f"{name}.log"
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
            RUN_MARK: self.mark,
            **(env or {}),
        }
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*prefix, sys.executable, "-m", "rlfleet", "--log-level", "INFO", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
                cwd=ROOT,
            )
        proc = Proc(role, name, popen, log)
        self._started.append(proc)
        return proc

    @property
    def coordinator(self) -> Proc:
        """The coordinator process started last."""
        if self._coordinator is None:
            raise AssertionError("no coordinator was started")
        return self._coordinator

    def sampler(self, **options: Any) -> RemoteSampler:
        """A RemoteSampler on :attr:`address` (``options``: its keywords), closed with the fleet."""
        sampler = RemoteSampler(self.address, **options)
        self._samplers.append(sampler)
        return sampler

    # --- faults ------------------------------------------------------------------------

    def kill(self, proc: Proc) -> int:
        """SIGKILLs the process group (a preempted machine); returns the exit code."""
        proc.stopped = True
        _signal_group(proc, signal.SIGKILL)
        return proc.popen.wait(timeout=PATIENCE)

    def freeze(self, proc: Proc) -> None:
        """SIGSTOPs the process group: connected, but silent (a hung host)."""
        _signal_group(proc, signal.SIGSTOP)

    def thaw(self, proc: Proc) -> None:
        """SIGCONTs the process group."""
        _signal_group(proc, signal.SIGCONT)

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        """Sends a signal to the process itself (its exit is then expected)."""
        proc.stopped = True
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(sig)

    def terminate(self, proc: Proc, timeout: float = PATIENCE) -> int:
        """SIGTERMs the process itself (not its env processes) and waits for its exit code.

        Raises:
            AssertionError: If it does not exit within ``timeout`` (it is then killed).
        """
        self.signal(proc, signal.SIGTERM)
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            raise AssertionError(
                f"{proc.role} {proc.name} did not exit within {timeout:g} s of SIGTERM:\n"
                + proc.describe()
            ) from None

    # --- waiting -----------------------------------------------------------------------

    def wait_until(
        self, probe: Callable[[], T | None], *, what: str, timeout: float = PATIENCE
    ) -> T:
        """:func:`tests.waiting.wait_until`, failing fast, with every process's
        log tail, if a process the test did not stop exited."""

        def alive_probe() -> T | None:
            value = probe()
            if value:
                return value
            dead = [p.name for p in self._started if not p.stopped and not p.alive]
            if dead:
                raise AssertionError(f"{dead} exited while waiting for {what}:\n{self}")
            return None

        return wait_until(alive_probe, what, timeout=timeout, describe=self.__str__)

    def status(self) -> learner_pb2.FleetStatus:
        """The coordinator's GetStatus answer."""
        return status(self.address)

    def wait_for_workers(
        self, count: int, *, timeout: float = PATIENCE, coordinator_id: str | None = None
    ) -> learner_pb2.FleetStatus:
        """Waits until exactly ``count`` workers are connected and idle (ready).

        Args:
            count: Workers expected.
            timeout: Seconds to wait.
            coordinator_id: If given, the coordinator must have another id
                (it restarted) before the count counts.
        """

        def ready() -> learner_pb2.FleetStatus | None:
            try:
                fleet = self.status()
            except grpc.RpcError:
                return None  # not listening (yet, or any more)
            if coordinator_id is not None and fleet.coordinator_id == coordinator_id:
                return None
            idle = [w for w in fleet.workers if w.state == "idle"]
            return fleet if len(fleet.workers) == count == len(idle) else None

        return self.wait_until(ready, what=f"{count} ready workers", timeout=timeout)

    def wait_for_log(self, proc: Proc, text: str, *, timeout: float = PATIENCE) -> str:
        """Waits until ``text`` appears in a process's log; returns the log."""
        return self.wait_until(
            lambda: log if text in (log := proc.log_text()) else None,
            what=f"{text!r} in the log of {proc.name}",
            timeout=timeout,
        )

    def units_on(self, name: str) -> int | None:
        """Units the named worker holds now, or None if it holds none."""
        for worker in self.status().workers:
            if worker.name == name and worker.units_in_flight:
                return int(worker.units_in_flight)
        return None

    def busy(self) -> bool:
        """Whether any worker holds units (a request is running on the fleet)."""
        return any(w.units_in_flight for w in self.status().workers)

    def health(self, service: str = "") -> int:
        """The coordinator's grpc.health.v1 status (``HealthCheckResponse.ServingStatus``)."""
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(answer.status)

    # --- teardown ----------------------------------------------------------------------

    def leftovers(self) -> list[psutil.Process]:
        """Live processes carrying this fleet's mark (its processes and their children)."""
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                marked = process.environ().get(RUN_MARK) == self.mark
                if marked and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
        return found

    def close(self) -> None:
        """Kills every process group, then fails if any marked process survives."""
        for sampler in self._samplers:
            sampler.close()
        for proc in self._started:
            if proc.alive:
                _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=PATIENCE)
        _, alive = psutil.wait_procs(self.leftovers(), timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if alive:
            raise AssertionError(f"processes outlived their fleet: {alive}")

    def __str__(self) -> str:
        return "\n".join(proc.describe() for proc in self._started) or "(no processes)"

    def __enter__(self) -> ProcessFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def local_episodes(
    env: EnvConfig, *counts: int, seed: int, policy: Policy | PolicySpec | str | None = None
) -> list[EpisodeBatch]:
    """LocalSampler's answers to successive ``obtain_episodes(n)`` calls: the expected batches."""
    with LocalSampler(env, policy, seed=seed) as local:
        return [local.obtain_episodes(n) for n in counts]


def env_flags(config: EnvConfig) -> list[str]:
    """``rlfleet coordinator`` flags that make every worker build ``config``."""
    flags = ["--env", config.id, "--env-kwargs", json.dumps(dict(config.kwargs))]
    if config.max_episode_length is not None:
        flags += ["--max-episode-length", str(config.max_episode_length)]
    return flags


def _signal_group(proc: Proc, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _read_port(path: Path, proc: Proc) -> int | None:
    if not proc.alive:
        raise AssertionError(f"{proc.name} exited before listening:\n{proc.describe()}")
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a coordinator that must restart on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def restartable_port(span: int = 3) -> int:
    """A port of 127.0.0.1 below the kernel's ephemeral range whose ``span``
    ports from it are free now: a coordinator restarted on it finds its port
    and its data channel's (``--lease-data-listen auto``: port + 2) free,
    where a port the kernel handed out could meanwhile be an outgoing
    connection's."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()  # no such file: keep to what the kernel hands out
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(10_000, max(10_001, low - span))
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + span):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {span} free ports in a row below {low} on 127.0.0.1")


def run_in_thread(call: Callable[[], T]) -> Callable[[float], T]:
    """Starts ``call`` on a thread; returns ``result(timeout)``, which re-raises its error.

    ``result`` fails the test if the call has not returned within
    ``timeout`` seconds: a guard against hangs, not a speed check.
    """
    outcome: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def result(timeout: float) -> T:
        thread.join(timeout)
        if not outcome:
            raise AssertionError(f"the call hung: no answer within {timeout:g} s")
        ok, value = outcome[0]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value  # type: ignore[return-value]

    return result
