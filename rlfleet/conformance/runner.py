"""Running the worker under test: processes, and which checks share one.

The worker command is any program (Python, Node, Go, a container run...);
``{address}`` in it is replaced by the test coordinator's ``HOST:PORT``.
It is split like a POSIX shell would (:func:`shlex.split`) and run without
a shell, so the process the kit signals is the worker itself, as the
kubelet signals a container's PID 1. Its stdout and stderr are read by
threads into bounded buffers, so a chatty worker never blocks on a full
pipe and a failing check can show the last lines.

:class:`WorkerHarness` decides which process a check talks to. Checks that
leave the worker as they found it share one process and one Join stream
(:meth:`WorkerHarness.shared`); destructive ones, and those that need a
different Welcome, get a process of their own (:meth:`WorkerHarness.fresh`).
After a failed check the shared process is replaced, since its stream may
be in any state.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO

from rlfleet.conformance.link import WelcomeSettings, WorkerLink
from rlfleet.conformance.scripted_coordinator import ScriptedCoordinator
from rlfleet.errors import ConfigError

#: Placeholder replaced by the test coordinator's address.
ADDRESS_PLACEHOLDER = "{address}"

#: Longest wait for a new worker process to dial the coordinator: starting
#: an interpreter and importing numpy and gymnasium takes seconds on a busy
#: machine, far longer than any answer on an open stream.
STARTUP_SECONDS = 30.0

#: Lines of stdout and of stderr kept per process.
_TAIL_LINES = 200


def worker_argv(command: str, address: str) -> list[str]:
    """Splits a worker command and puts the coordinator's address in.

    Args:
        command: The command line, containing ``{address}``.
        address: ``HOST:PORT`` of the test coordinator.

    Returns:
        The argument vector.

    Raises:
        ConfigError: If the command is empty, does not parse, or has no
            ``{address}``.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"cannot parse the worker command {command!r}: {exc}") from exc
    if not argv:
        raise ConfigError("the worker command is empty")
    if not any(ADDRESS_PLACEHOLDER in arg for arg in argv):
        raise ConfigError(
            f"the worker command {command!r} has no {ADDRESS_PLACEHOLDER}: put it where the "
            "worker takes the coordinator's address, e.g. --coordinator {address}"
        )
    return [arg.replace(ADDRESS_PLACEHOLDER, address) for arg in argv]


class WorkerUnderTest:
    """One run of the worker command.

    Args:
        argv: The command (see :func:`worker_argv`).
        env: Extra environment variables.

    Raises:
        ConfigError: If the program cannot be started.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.started_at = time.monotonic()
        self._stdout: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._stderr: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        # Unbuffered Python output, so the tail shown on failure is current.
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        try:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=environment,
                start_new_session=True,  # its own process group: killed as a whole
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot start the worker command {shlex.join(self.argv)!r}: {exc}"
            ) from exc
        self._readers = [
            threading.Thread(target=_drain, args=(pipe, lines), daemon=True)
            for pipe, lines in (
                (self._popen.stdout, self._stdout),
                (self._popen.stderr, self._stderr),
            )
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        """The worker's process id (also its process group id)."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs (negative: killed by that signal)."""
        return self._popen.poll()

    def wait(self, timeout: float) -> int | None:
        """Waits up to ``timeout`` seconds for the process to exit; returns its code or None."""
        try:
            return self._popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def signal(self, signum: int) -> None:
        """Sends a signal to the worker process (not its children)."""
        if self._popen.poll() is None:
            self._popen.send_signal(signum)

    def kill(self) -> None:
        """Kills the whole process group and reaps the worker. Safe to call twice."""
        # ProcessLookupError: already gone; PermissionError: the group id was reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()
        for reader in self._readers:
            reader.join(timeout=1.0)

    def __enter__(self) -> WorkerUnderTest:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    def stdout(self) -> str:
        """The last lines the worker wrote to stdout."""
        return "".join(self._stdout)

    def stderr(self) -> str:
        """The last lines the worker wrote to stderr."""
        return "".join(self._stderr)

    def describe(self, lines: int = 15) -> str:
        """How the process stands and the tail of its output, for failure messages."""
        code = self.returncode
        if code is not None:
            for reader in self._readers:  # its last words may still be in the pipe
                reader.join(timeout=1.0)
        state = "still running" if code is None else _exit_text(code)
        parts = [f"worker process {self.pid} {state}"]
        for name, buffer in (("stderr", self._stderr), ("stdout", self._stdout)):
            tail = list(buffer)[-lines:]
            if tail:
                text = "".join("  | " + line.rstrip("\n") + "\n" for line in tail)
                parts.append(f"last {len(tail)} lines of its {name}:\n{text.rstrip()}")
        return "\n".join(parts)


class WorkerHarness:
    """Starts worker processes for checks and joins them to the test coordinator.

    Args:
        coordinator: The running test coordinator.
        command: The worker command, with ``{address}``.
        env_id: The env every worker is given (generation 1).
        timeout: Longest wait for any one answer from a worker, in seconds.

    Raises:
        ConfigError: If the command does not parse or has no ``{address}``.
    """

    def __init__(
        self, coordinator: ScriptedCoordinator, command: str, *, env_id: str, timeout: float
    ) -> None:
        self.coordinator = coordinator
        self.argv = worker_argv(command, coordinator.address)
        self.env_id = env_id
        self.timeout = timeout
        self.startup_timeout = max(timeout, STARTUP_SECONDS)
        self._shared: tuple[WorkerUnderTest, WorkerLink] | None = None

    def start(self) -> WorkerUnderTest:
        """Starts a worker process (kill it when done).

        The shared worker is stopped first: one worker at a time is connected,
        so every Join call comes from the process just started.
        """
        self.spoil()
        self.coordinator.discard_pending()  # Join calls of earlier processes
        return WorkerUnderTest(self.argv)

    def join(self, process: WorkerUnderTest, settings: WelcomeSettings | None = None) -> WorkerLink:
        """Joins ``process`` (Hello, Welcome) and gives it the env (EnvReady).

        Raises:
            CheckFailed: If the worker does not get that far.
        """
        link = WorkerLink.join(
            self.coordinator,
            timeout=self.timeout,
            join_timeout=self.startup_timeout,
            process=process,
            settings=settings,
        )
        link.update_env(self.env_id)
        return link

    def shared(self) -> WorkerLink:
        """The link of the shared worker, started and joined if need be."""
        if self._shared is not None:
            process, link = self._shared
            if process.returncode is None and not link.session.ended:
                return link
        process = self.start()
        try:
            link = self.join(process)
        except BaseException:
            process.kill()
            raise
        self._shared = (process, link)
        return link

    def spoil(self) -> None:
        """Kills the shared worker: the next :meth:`shared` starts another."""
        if self._shared is not None:
            self._shared[0].kill()
            self._shared[1].session.abort_quietly()
            self._shared = None

    @contextlib.contextmanager
    def fresh(
        self, settings: WelcomeSettings | None = None
    ) -> Iterator[tuple[WorkerUnderTest, WorkerLink]]:
        """A worker of its own, joined with ``settings``; killed afterwards."""
        with self.start() as process:
            link = self.join(process, settings)
            try:
                yield process, link
            finally:
                link.session.abort_quietly()

    def close(self) -> None:
        """Kills every worker still running."""
        self.spoil()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _drain(pipe: IO[bytes] | None, lines: collections.deque[str]) -> None:
    if pipe is None:
        return
    with pipe:
        for raw in iter(pipe.readline, b""):
            lines.append(raw.decode("utf-8", errors="replace"))


__all__ = [
    "ADDRESS_PLACEHOLDER",
    "STARTUP_SECONDS",
    "WorkerHarness",
    "WorkerUnderTest",
    "worker_argv",
]
