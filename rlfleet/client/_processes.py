"""The processes a learner starts for ``Fleet.local``: workers and coordinators.

Each is ``python -m rlfleet worker`` or ``python -m rlfleet coordinator``,
the leader of its own process group (signals reach it and its children
alone), with its output in a log file. By default each ends with this
process however it ends (SIGKILL, a crash, ``os._exit``): it watches a pipe
only this process holds open and, on Linux, asks for a parent-death signal
(rlfleet/_util/parent_watch.py). Tokens travel in the child's environment,
never on its command line. A worker may be pinned to CPUs (``--cpus``;
:func:`worker_cpu_sets` deals them out); coordinators never are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

import psutil

import rlfleet
from rlfleet._util.cpus import (
    can_pin,
    check_allowed,
    cpu_list_text,
    one_cpu_each,
    parse_cpu_list,
)
from rlfleet.errors import ConfigError, RlfleetTimeoutError, UnavailableError
from rlfleet.security import RoleTokens, Token
from rlfleet.security.pickle import EMBEDDED_PARENT_ENV
from rlfleet.security.tokens import (
    COORDINATOR_LEARNER_TOKEN,
    COORDINATOR_WORKER_TOKEN,
    WORKER_TOKEN,
)

#: Lines of a dead child's log shown in errors.
LOG_TAIL_LINES = 15
#: How often a start waits for a port file or a join.
POLL_SECONDS = 0.1
#: ``Fleet.local(cpu_affinity=...)``: ``"auto"``, None/False (no pinning), or
#: each worker's CPUs (a CPU number, a taskset-style list, or CPU numbers).
CpuAffinity: TypeAlias = Literal["auto"] | bool | Sequence[int | str | Iterable[int]] | None
#: Variables naming rlfleet options: a coordinator started for a Fleet takes
#: its whole configuration from its flags, none from the learner's environment.
_OPTION_PREFIX = "RLFLEET_"


@dataclass
class ChildProcess:
    """A worker or coordinator subprocess started by :func:`spawn_worker` or
    :func:`spawn_coordinator`.

    Attributes:
        name: Its name (a worker's is the one it joins under).
        process: The process (leader of its own process group).
        log_path: Where its stdout and stderr go.
        parent_pipe: The write end of the pipe the child watches
            (``die_with_parent``); the kernel closes it when this process
            ends, however it ends, and the child then leaves.
        role: ``"worker"`` or ``"coordinator"``.
        address: A worker's coordinator; a coordinator's own ``HOST:PORT``
            once it listens ("" before).
    """

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    parent_pipe: int | None = None
    role: str = "worker"
    address: str = ""

    def release(self) -> None:
        """Closes this process's end of the parent pipe (once the child was stopped)."""
        if self.parent_pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self.parent_pipe)
            self.parent_pipe = None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log ("" if there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        """Its name, state and log tail, for errors."""
        code = self.process.poll()
        state = "running" if code is None else f"exit code {code}"
        tail = self.log_tail().replace("\n", "\n    ")
        log = f"\n  last log lines:\n    {tail}" if tail else " (no log output)"
        where = f", {self.address}" if self.address else ""
        label = self.name if self.name.startswith(self.role) else f"{self.role} {self.name}"
        return f"- {label} (pid {self.process.pid}{where}) {state}{log}"


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
    cpus: Collection[int] | None = None,
) -> ChildProcess:
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
            parent-death signal (rlfleet/_util/parent_watch.py). Call
            :meth:`ChildProcess.release` once it was stopped.
        embedded: The coordinator runs in this process (``Fleet.local``):
            the worker then takes pickled env factories for leases from it
            (``RLFLEET_EMBEDDED_PARENT``; docs/security.md).
        cpus: The CPUs to pin it to (``--cpus``); None leaves it on this
            process's.

    Returns:
        The started process.
    """
    arguments = [
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
        *(() if cpus is None else ("--cpus", cpu_list_text(cpus))),
        *extra_args,
    ]
    environment = _child_environment()
    # A pinning of this process's own is not the worker's (--cpus decides).
    environment.pop("RLFLEET_CPUS", None)
    if token is not None:
        environment[WORKER_TOKEN.env_vars[0]] = token.reveal()
    environment.pop(EMBEDDED_PARENT_ENV, None)
    if embedded:
        environment[EMBEDDED_PARENT_ENV] = str(os.getpid())
    child = _spawn(
        "worker",
        name,
        arguments,
        environment=environment,
        log_path=log_path,
        log_level=log_level,
        die_with_parent=die_with_parent,
    )
    child.address = address
    return child


def spawn_coordinator(
    flags: Sequence[str],
    *,
    name: str,
    log_path: Path,
    port_file: Path,
    log_level: str = "WARNING",
    tokens: RoleTokens | None = None,
    die_with_parent: bool = True,
) -> ChildProcess:
    """Starts ``python -m rlfleet coordinator`` in its own process group.

    Wait for it to listen with :func:`wait_for_port`.

    Args:
        flags: Its flags (``CoordinatorConfig.command_flags()``); its
            environment adds no option: ``RLFLEET_*`` variables of this
            process are left out of it.
        name: Its name, for logs and errors.
        log_path: File for its stdout and stderr.
        port_file: Where it writes its port once listening (``--port-file``).
        log_level: Its log level.
        tokens: The worker and learner tokens it requires, handed over in
            its environment (``RLFLEET_WORKER_TOKEN``,
            ``RLFLEET_LEARNER_TOKEN``), never on its command line.
        die_with_parent: It stops when this process ends, however it ends,
            as :func:`spawn_worker`'s workers leave.

    Returns:
        The started process.
    """
    environment = {
        key: value
        for key, value in _child_environment().items()
        if not key.startswith(_OPTION_PREFIX)
    }
    if tokens is not None:
        environment[COORDINATOR_WORKER_TOKEN.env_vars[0]] = tokens.worker.reveal()
        environment[COORDINATOR_LEARNER_TOKEN.env_vars[0]] = tokens.learner.reveal()
    arguments = ["coordinator", *flags, "--port-file", str(port_file)]
    return _spawn(
        "coordinator",
        name,
        arguments,
        environment=environment,
        log_path=log_path,
        log_level=log_level,
        die_with_parent=die_with_parent,
    )


def worker_cpu_sets(
    cpu_affinity: CpuAffinity, workers: int, *, subprocess_envs: bool = False
) -> list[frozenset[int] | None]:
    """The CPUs each of ``workers`` local workers is pinned to (None: not pinned).

    Args:
        cpu_affinity: ``"auto"``: worker ``i`` on the ``i``-th CPU this
            process may use, round-robin when there are more workers than
            CPUs; nothing where the platform cannot pin, or when
            ``subprocess_envs`` (a worker's envs then run in processes of
            their own, which would all share its one CPU). None or False:
            no pinning. A sequence: worker ``i`` on item ``i % len``, each a
            CPU number, a taskset-style list (``"0-3"``) or CPU numbers.
        workers: How many workers.
        subprocess_envs: The workers run each env slot in a child process.

    Raises:
        ConfigError: If ``cpu_affinity`` is none of those, names a CPU this
            process may not use (naming those it may), or asks for pinning
            where the platform cannot pin.
    """
    if cpu_affinity is None or cpu_affinity is False:
        return [None] * workers
    if cpu_affinity == "auto" or cpu_affinity is True:
        if not can_pin() or subprocess_envs:
            return [None] * workers
        return list(one_cpu_each(workers))
    if isinstance(cpu_affinity, str) or not isinstance(cpu_affinity, Sequence) or not cpu_affinity:
        raise ConfigError(
            f"Fleet.local cpu_affinity={cpu_affinity!r} is not a placement; give 'auto' (each "
            "worker on a CPU of its own), None (no pinning), or a non-empty list of each "
            "worker's CPUs, e.g. [0, 1] or ['0-1', '2-3']"
        )
    sets = [_cpu_set(item, f"Fleet.local cpu_affinity[{i}]") for i, item in enumerate(cpu_affinity)]
    if not can_pin():
        raise ConfigError(
            f"Fleet.local cpu_affinity={cpu_affinity!r}: pinning to CPUs needs Linux "
            f"(os.sched_setaffinity), and this is {sys.platform}; give None or 'auto'"
        )
    return [sets[i % len(sets)] for i in range(workers)]


def _cpu_set(item: object, where: str) -> frozenset[int]:
    """One worker's CPUs from a CPU number, a taskset-style list or CPU numbers."""
    items: list[object]
    if isinstance(item, str):
        try:
            items = list(parse_cpu_list(item))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    else:
        items = list(item) if isinstance(item, Iterable) else [item]
    cpus = [c for c in items if isinstance(c, int) and not isinstance(c, bool)]
    if not cpus or len(cpus) < len(items):
        raise ConfigError(
            f"{where}={item!r} is not a CPU set; give a CPU number (0), a list like '0-3' or "
            "'0,2', or CPU numbers ([0, 2])"
        )
    if min(cpus) < 0:
        raise ConfigError(f"{where}={item!r} has a negative CPU number; CPUs count from 0")
    return check_allowed(cpus, f"{where}={item!r}")


def wait_for_port(child: ChildProcess, port_file: Path, deadline: float, timeout: float) -> int:
    """Waits until a coordinator from :func:`spawn_coordinator` wrote its port file.

    Args:
        child: The coordinator.
        port_file: Its ``--port-file``.
        deadline: ``time.monotonic()`` by which it must listen.
        timeout: The seconds ``deadline`` stands for, for the message.

    Returns:
        Its port.

    Raises:
        UnavailableError: If it exited first (with its exit code and log tail).
        RlfleetTimeoutError: If it wrote no port by the deadline.
    """
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(port_file.read_text().strip())
        if child.process.poll() is not None:
            raise UnavailableError(f"{child.name} exited before listening:\n{child.describe()}")
        if time.monotonic() >= deadline:
            raise RlfleetTimeoutError(
                f"{child.name} was not listening within {timeout:g} seconds "
                f"(join_timeout):\n{child.describe()}"
            )
        time.sleep(POLL_SECONDS)


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


def _spawn(
    role: str,
    name: str,
    arguments: list[str],
    *,
    environment: dict[str, str],
    log_path: Path,
    log_level: str,
    die_with_parent: bool,
) -> ChildProcess:
    command = [sys.executable, "-m", "rlfleet", "--log-level", log_level, *arguments]
    # os.pipe() ends are not inheritable: only the child given the read end
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
    return ChildProcess(name, process, log_path, write_end, role)


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
