"""SubprocVectorEnv: one child process per env.

Processes are started with ``spawn`` (or ``forkserver``), never ``fork``:
gRPC does not survive ``fork()`` once a channel or server exists, and a
worker or learner has one. So env factories cross to the child pickled,
with cloudpickle: lambdas and closures work (tianshou's
``SubprocVectorEnv([lambda: gym.make(task) for _ in range(n)])``), as do
:class:`~rlfleet.envs.EnvConfig` objects. This pipe to one's own child is
the only place rlfleet unpickles without an opt-in: nothing crosses a trust
boundary (see docs/security.md). Guard the script's entry point with
``if __name__ == "__main__":`` because ``spawn`` re-imports the main module
in every child.

Each child answers commands on a pipe. A Box observation is written into a
shared-memory buffer owned by the parent (one per env), so only the small
rest of a step's result is pickled; the base class copies it out before
returning it.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import Any, TypeAlias, cast

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlfleet.envs import child_start
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.commands import (
    MAKE,
    RESET,
    STEP,
    EnvFactory,
    EnvFailure,
    FailedCall,
    check_env_fns,
    make_checked,
    run_command,
)
from rlfleet.errors import ConfigError, VectorEnvError

_START_METHODS = ("spawn", "forkserver")
_Context: TypeAlias = SpawnContext | ForkServerContext
_OK, _FAILED, _STARTED = "ok", "failed", "started"
_CLOSE = "close"
#: Longest wait between liveness checks of a child that has not answered.
_POLL_SECONDS = 0.2
#: How long ``close`` lets the children close their envs and exit.
_CLOSE_GRACE_SECONDS = 5.0
#: How long a child gets to exit after SIGTERM before it is killed.
_TERMINATE_GRACE_SECONDS = 1.0
#: How often an orphaned child checks whether its parent is gone.
_ORPHAN_CHECK_SECONDS = 1.0


class SubprocVectorEnv(BaseVectorEnv):
    """Runs each env in its own process (tianshou's name and API).

    The API and its rules are :class:`~rlfleet.envs.BaseVectorEnv`'s,
    including tianshou's async mode (``wait_num``/``timeout``): a step
    returns the envs whose processes answered first. What this class adds
    is failure handling: an env that raises gives a
    :class:`~rlfleet.errors.VectorEnvError` naming the env index and carrying
    the child's traceback text (the env can then be reset); a child that dies
    or does not answer within ``call_timeout`` seconds of being sent a
    command gives a ``VectorEnvError`` naming the env index (and the
    seconds), and that env is unusable until ``rebuild_env`` gives it a new
    child. ``close`` (also at garbage collection and interpreter exit) stops
    every child: it asks them to close their envs, then terminates and kills
    the ones that do not exit within a few seconds.

    Example::

        if __name__ == "__main__":
            venv = SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 4, call_timeout=10.0)

    Args:
        env_fns: One factory per env: any callable cloudpickle can pickle,
            lambdas and closures included (see the module docstring).
        wait_num: tianshou's async mode (see :class:`~rlfleet.envs.BaseVectorEnv`).
        timeout: tianshou's async mode: seconds an async ``step`` waits for
            ``wait_num`` envs before returning the ready ones. Not a deadline.
        call_timeout: Deadline in seconds for each env to answer a
            ``reset``/``step``/``render``/attribute call, counted from when
            it was sent; None waits forever (a dead child is still noticed).
        start_timeout: Seconds to wait for the children to start and build
            their envs (interpreter start-up and imports count); None waits
            forever.
        context: ``"spawn"`` or ``"forkserver"``.
        shared_memory: Pass Box observations through shared memory (False
            sends them through the pipe, like everything else).

    Raises:
        ConfigError: If an argument is invalid, a factory cannot be pickled,
            or a factory raised ConfigError.
        VectorEnvError: If a child failed to build its env, died or timed out.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        wait_num: int | None = None,
        timeout: float | None = None,
        *,
        call_timeout: float | None = 60.0,
        start_timeout: float | None = 120.0,
        context: str = "spawn",
        shared_memory: bool = True,
    ) -> None:
        child_start.refuse_while_bootstrapping("SubprocVectorEnv")
        factories = check_env_fns(env_fns)
        _check_timeout(call_timeout, "call_timeout")
        _check_timeout(start_timeout, "start_timeout")
        if context not in _START_METHODS:
            raise ConfigError(
                f"SubprocVectorEnv(context={context!r}) is not supported; use one of "
                f"{_START_METHODS} (fork breaks gRPC in the children)"
            )
        pickled = [_pickle_factory(factory, index) for index, factory in enumerate(factories)]
        child_start.notes_dir()  # before the children start: they inherit its name
        mp_context = cast(_Context, multiprocessing.get_context(context))
        children: list[_EnvProcess] = []
        try:
            for index, factory_bytes in enumerate(pickled):
                children.append(_EnvProcess(mp_context, index, factory_bytes))
            deadline = _deadline(start_timeout)
            for child in children:
                child.connect(deadline, start_timeout, shared_memory=shared_memory)
            super().__init__(
                len(children),
                functools.partial(_shutdown, children),
                wait_num=wait_num,
                timeout=timeout,
            )
        except BaseException:
            _shutdown(children)
            raise
        #: Deadline in seconds for each env's answer (None: none); may be changed.
        self.call_timeout = call_timeout
        self._children = children
        # What rebuild_env starts a new child with.
        self._factories = pickled
        self._mp_context = mp_context
        self._start_timeout = start_timeout
        self._shared_memory = shared_memory

    @property
    def pids(self) -> list[int]:
        """The process id of each env's child."""
        return [child.pid for child in self._children]

    def rebuild_env(self, id: int) -> None:
        """:meth:`BaseVectorEnv.rebuild_env`: env ``id`` gets a new child process.

        The old child is asked to close its env and exit (it is killed if it
        does not within a few seconds); a dead or lost one is reaped.

        Raises:
            ConfigError: If the factory raised it in the new child.
            VectorEnvError: If the new child failed to build its env, died
                or passed ``start_timeout``.
        """
        self._check_open()
        self._check_idle([id], "rebuild_env")
        old = self._children[id]
        old.request_close()
        old.finish(time.monotonic() + _CLOSE_GRACE_SECONDS)
        # An interrupted call's answer would have come from the old child.
        self._stale.discard(id)
        self._in_flight.discard(id)
        self._needs_reset[id] = True
        child = _EnvProcess(self._mp_context, id, self._factories[id])
        # In the list before it connects: close() reaps it even if that fails.
        self._children[id] = child
        child.connect(
            _deadline(self._start_timeout), self._start_timeout, shared_memory=self._shared_memory
        )

    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        sent: list[_EnvProcess] = []
        try:
            for env_index, arg in zip(ids, args, strict=True):
                child = self._children[env_index]
                child.send(command, arg)
                sent.append(child)
        except BaseException:
            for child in sent:
                child.abandon(f"interrupted while sending its {command}()")
            raise

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        children = [self._children[i] for i in ids]
        # Answers are held by each child until returned, so that an
        # interrupted wait loses none of those already read.
        pending = {child.conn: child for child in children if not child.held}
        end = _deadline(timeout)
        if timeout is None and count >= len(children):
            # Waiting for all (sync mode, the hot path): polling one child at
            # a time avoids registering every handle again for each answer.
            for child in pending.values():
                child.hold(child.wait_answer(self.call_timeout))
            pending = {}
        while pending:
            enough = len(children) - len(pending) >= count
            # After `count` answers, only collect those already there.
            wait = 0.0 if enough else _POLL_SECONDS
            if end is not None:
                wait = min(wait, max(0.0, end - time.monotonic()))
            for child in pending.values():
                wait = min(wait, child.seconds_left(self.call_timeout))
            ready = multiprocessing.connection.wait(list(pending), wait)
            for handle in ready:
                child = pending.pop(cast(Connection, handle))
                child.hold(child.read())
            # A dead child's pipe reads as EOF above; this catches the rest
            # (a grandchild holding the pipe, a deadline) once all is quiet.
            for conn, child in list(pending.items()) if not ready else []:
                lost = child.check_alive(self.call_timeout)
                if lost is not None:
                    child.hold(lost)
                    del pending[conn]
            if (enough and wait == 0.0) or (end is not None and time.monotonic() >= end):
                break
        return {child.index: child.take() for child in children if child.held}


class _InSharedMemory:
    """Stands in a child's answer for the observation it wrote to shared memory."""


class _EnvProcess:
    """The parent's handle on one env's child process."""

    def __init__(self, mp_context: _Context, index: int, factory: bytes) -> None:
        self.index = index
        self.conn, child_conn = mp_context.Pipe(duplex=True)
        self.process: BaseProcess = mp_context.Process(
            target=_child_main,
            args=(factory, child_conn),
            name=f"rlfleet-env-{index}",
            daemon=True,
        )
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            # Only the child may hold its end, so that its death reads as EOF here.
            child_conn.close()
        self.pid = cast(int, self.process.pid)  # start() has set it
        #: Why the child can no longer be used (None while it can).
        self.gone: str | None = None
        #: The answer to the command in flight, once read (at most one).
        self.held: list[Any] = []
        self._command = MAKE
        self._sent_at = 0.0
        self._unanswered = 0
        self._shm: SharedMemory | None = None
        self._obs_view: np.ndarray | None = None
        self._connected = False
        self._close_sent = False
        # Whether rlfleet's code runs in the child (it has said so on the pipe).
        self._started = False

    def connect(
        self, deadline: float | None, start_timeout: float | None, *, shared_memory: bool
    ) -> None:
        """Waits for the child's env and sets up its observation buffer."""
        observation_space = self._receive_started(deadline, start_timeout)
        layout = None
        if shared_memory:
            layout = _shared_layout(observation_space)
        if layout is not None:
            shape, dtype = layout
            self._shm = SharedMemory(create=True, size=_nbytes(shape, dtype))
            self._obs_view = np.ndarray(shape, dtype=dtype, buffer=self._shm.buf)
            self.conn.send((self._shm.name, shape, dtype.str))
        else:
            self.conn.send(None)
        self._connected = True

    def send(self, command: str, arg: Any) -> None:
        """Sends one command; a failure to send is held as its answer."""
        self._command = command
        if self.gone is not None:
            self.hold(
                FailedCall(
                    VectorEnvError(
                        f"its process is gone ({self.gone}); {_lost_advice(self.index)}",
                        env_index=self.index,
                    )
                )
            )
            return
        try:
            self.conn.send((command, arg))
        except OSError:
            self.hold(
                FailedCall(
                    self._lose(f"its process died before {command}() ({self._exit_status()})")
                )
            )
            return
        except Exception as exc:  # pickling failed before anything was written
            error = VectorEnvError(
                f"the argument of {command}() cannot be sent to its process: "
                f"{type(exc).__name__}: {exc}",
                env_index=self.index,
            )
            error.__cause__ = exc
            self.hold(FailedCall(error))
            return
        self._sent_at = time.monotonic()
        self._unanswered += 1

    def hold(self, answer: Any) -> None:
        """Keeps the answer to the command in flight until :meth:`take`."""
        self.held.append(answer)

    def take(self) -> Any:
        """Returns the held answer and forgets it."""
        return self.held.pop()

    def read(self) -> Any:
        """Reads the answer to the command in flight (the pipe has data or EOF)."""
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            return FailedCall(
                self._lose(f"its process died during {self._command}() ({self._exit_status()})")
            )
        self._unanswered -= 1
        if status == _FAILED:
            return FailedCall(payload.error(self.index, self._command))
        return self._resolve(self._command, payload)

    def wait_answer(self, call_timeout: float | None) -> Any:
        """Waits for the answer to the command in flight, or a failure if the child is lost."""
        while True:
            if self.conn.poll(self.seconds_left(call_timeout)):
                return self.read()
            lost = self.check_alive(call_timeout)
            if lost is not None:
                return lost

    def seconds_left(self, call_timeout: float | None) -> float:
        """Seconds to wait before checking the child again (its deadline, at most a poll)."""
        if call_timeout is None:
            return _POLL_SECONDS
        left = self._sent_at + call_timeout - time.monotonic()
        return min(_POLL_SECONDS, max(0.0, left))

    def check_alive(self, call_timeout: float | None) -> FailedCall | None:
        """Returns a failure if the child died, or passed its deadline (then kills it)."""
        # Only the child holds the other end of the pipe, but a grandchild
        # may have inherited it, so EOF alone does not prove death.
        if self.process.exitcode is not None and not self.conn.poll(0):
            return FailedCall(
                self._lose(f"its process died during {self._command}() ({self._exit_status()})")
            )
        if call_timeout is not None and time.monotonic() >= self._sent_at + call_timeout:
            return FailedCall(
                self._lose(
                    f"{self._command}() did not return within {call_timeout:g} s, "
                    "so its process was killed",
                    advice="make a new vector env, with a larger call_timeout if the env is "
                    "that slow",
                )
            )
        return None

    def _receive_started(self, deadline: float | None, timeout: float | None) -> Any:
        """Waits for the observation space the child sends once its env is built."""
        while True:
            wait = _POLL_SECONDS
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            if self.conn.poll(wait):
                try:
                    status, payload = self.conn.recv()
                except (EOFError, OSError):
                    raise self._died_starting() from None
                if status == _STARTED:
                    self._started = True
                    continue
                if status == _FAILED:
                    raise payload.error(self.index, MAKE)
                return payload
            if self.process.exitcode is not None and not self.conn.poll(0):
                raise self._died_starting()
            if deadline is not None and time.monotonic() >= deadline:
                raise self._lose(
                    f"{MAKE}() did not return within {timeout:g} s, so its process was killed",
                    advice="make a new vector env, with a larger start_timeout if the env is "
                    "that slow to start",
                )

    def _died_starting(self) -> VectorEnvError:
        status = self._exit_status()
        if not self._started:  # it died re-importing the main module
            return self._lose(
                child_start.start_failure_text(self.pid, status),
                advice="then make the vector env again",
            )
        return self._lose(f"its process died during {MAKE}() ({status})")

    def abandon(self, reason: str) -> None:
        """Kills the child because its pipe can no longer be trusted."""
        self._lose(reason)

    def request_close(self) -> None:
        """Asks a working child to close its env and exit (no wait)."""
        if self._connected and self.gone is None and not self._close_sent:
            try:
                self.conn.send((_CLOSE, None))
                self._close_sent = True
            except OSError:
                pass  # already dead; finish() reaps it

    def finish(self, deadline: float) -> BaseException | None:
        """Reaps the child and frees its resources.

        A child asked to close gets until ``deadline`` to exit; any other
        (still starting, or already lost) is stopped at once.

        Returns:
            The error the env's ``close`` raised, if any.
        """
        error = None
        grace = 0.0
        if self._close_sent:
            try:
                # Answers to steps still in flight (async mode) come first.
                for left in range(self._unanswered, -1, -1):
                    if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                        break
                    status, payload = self.conn.recv()
                    if left == 0 and status == _FAILED:
                        error = payload.error(self.index, "close")
            except (EOFError, OSError):
                pass  # it died while closing; nothing more to learn
            grace = max(0.0, deadline - time.monotonic())
        _stop(self.process, grace)
        self.conn.close()
        self._release_shared_memory()
        return error

    def _resolve(self, command: str, answer: Any) -> Any:
        if command in (RESET, STEP) and isinstance(answer[0], _InSharedMemory):
            return (self._obs_view, *answer[1:])
        return answer

    def _lose(self, reason: str, advice: str | None = None) -> VectorEnvError:
        self.gone = reason
        _stop(self.process, 0.0)
        if advice is None:
            advice = _lost_advice(self.index)
        return VectorEnvError(f"{reason}; {advice}", env_index=self.index)

    def _exit_status(self) -> str:
        self.process.join(_TERMINATE_GRACE_SECONDS)
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def _release_shared_memory(self) -> None:
        self._obs_view = None
        if self._shm is None:
            return
        # BufferError: something still views the buffer; the mapping dies with the process.
        with contextlib.suppress(BufferError):
            self._shm.close()
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()
        self._shm = None


def _lost_advice(index: int) -> str:
    """What to do about a lost child (a worker's engine does the first by itself)."""
    return f"rebuild_env({index}) starts a new one, or close this vector env and make a new one"


def _shutdown(children: list[_EnvProcess]) -> list[BaseException]:
    """Closes every child's env and reaps every child, within a grace period."""
    deadline = time.monotonic() + _CLOSE_GRACE_SECONDS
    for child in children:
        child.request_close()
    errors = []
    for child in children:
        error = child.finish(deadline)
        if error is not None:
            errors.append(error)
    return errors


def _stop(process: BaseProcess, grace: float) -> None:
    """Waits ``grace`` seconds for a process to exit, then terminates, then kills it."""
    process.join(grace)
    if process.is_alive():
        process.terminate()
        process.join(_TERMINATE_GRACE_SECONDS)
    if process.is_alive():
        process.kill()
        process.join()


# --- in the child process -------------------------------------------------


def _child_main(factory: bytes, conn: Connection) -> None:
    """Entry point of an env's child process."""
    # The parent decides when children stop; Ctrl-C in a terminal must not
    # kill them behind its back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_orphaned()
    # EOFError/OSError: the parent went away; there is no one left to answer.
    with contextlib.suppress(EOFError, OSError):
        conn.send((_STARTED, None))  # the main module's re-import is over
        _serve(factory, conn)


def _serve(factory: bytes, conn: Connection) -> None:
    try:
        env = make_checked(pickle.loads(factory))
    except Exception as exc:
        conn.send((_FAILED, EnvFailure.from_exception(exc)))
        return
    # A duck-typed env may have no observation_space: its observations then
    # go through the pipe.
    conn.send((_OK, getattr(env, "observation_space", None)))
    shm, obs_view = _attach_shared_memory(conn.recv())
    try:
        while True:
            command, arg = conn.recv()
            if command == _CLOSE:
                _answer(conn, getattr(env, "close", _no_close))
                return
            _answer(conn, functools.partial(_execute, env, command, arg, obs_view))
    finally:
        obs_view = None  # the buffer cannot be unmapped while an array views it
        if shm is not None:
            shm.close()


def _no_close() -> None:
    """The close of a duck-typed env that has none."""


def _answer(conn: Connection, call: Callable[[], Any]) -> None:
    """Runs ``call`` and sends its result, or the exception it raised."""
    try:
        conn.send((_OK, call()))
    except OSError:
        raise  # the pipe is broken: let _child_main end the process
    except Exception as exc:
        conn.send((_FAILED, EnvFailure.from_exception(exc)))


def _execute(env: Any, command: str, arg: Any, obs_view: np.ndarray | None) -> Any:
    answer = run_command(env, command, arg)
    if obs_view is not None and command in (RESET, STEP):
        observation = answer[0]
        # Anything that does not fit the buffer exactly goes through the pipe,
        # so the parent sees what a DummyVectorEnv would return.
        if (
            isinstance(observation, np.ndarray)
            and observation.shape == obs_view.shape
            and observation.dtype == obs_view.dtype
        ):
            obs_view[...] = observation
            return (_InSharedMemory(), *answer[1:])
    return answer


def _attach_shared_memory(
    layout: tuple[str, tuple[int, ...], str] | None,
) -> tuple[SharedMemory | None, np.ndarray | None]:
    if layout is None:
        return None, None
    name, shape, dtype = layout
    try:
        shm = SharedMemory(name=name)
    except OSError:
        return None, None  # observations then go through the pipe
    return shm, np.ndarray(shape, dtype=np.dtype(dtype), buffer=shm.buf)


def _exit_when_orphaned() -> None:
    """Ends this process when its parent dies (e.g. SIGKILL): no orphans."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="rlfleet-orphan-watch", daemon=True).start()


# --- helpers -----------------------------------------------------------------


def _shared_layout(space: gym.Space | None) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype of a shared observation buffer, or None if the space has none."""
    if not isinstance(space, spaces.Box) or _nbytes(space.shape, space.dtype) == 0:
        return None
    return space.shape, space.dtype


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _check_timeout(value: float | None, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise ConfigError(f"SubprocVectorEnv({name}={value!r}): give seconds > 0, or None")


def _pickle_factory(factory: EnvFactory, index: int) -> bytes:
    """Pickles an env factory for its child with cloudpickle (lambdas included).

    The bytes only travel over the pipe to a child this process starts, so
    unpickling them crosses no trust boundary (docs/security.md).
    """
    try:
        return cast(bytes, cloudpickle.dumps(factory))
    except Exception as exc:
        raise ConfigError(
            f"env factory {index} ({factory!r}) cannot be pickled for its child process: "
            f"{type(exc).__name__}: {exc}. A factory must not hold open files, locks, "
            "sockets or live processes; build those inside the factory instead"
        ) from exc


__all__ = ["SubprocVectorEnv"]
