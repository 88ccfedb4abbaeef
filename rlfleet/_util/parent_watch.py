"""A process started by a learner (``Fleet.local``) ends when that learner ends.

``Fleet.local`` starts its workers, and with several coordinators the
coordinators too, as children of the learner's process. Once that process
is gone (SIGKILL, a crash, ``os._exit``), they serve nobody: workers have
nothing to join, coordinators no learner, and none may linger as an
orphan. Two mechanisms, either enough:

- a pipe: the parent keeps the write end open (``--parent-pipe FD`` names
  the read end the child inherited); the kernel closes it when the parent
  dies however it ends, and a thread here reads end-of-file. Works on every
  POSIX system.
- on Linux, ``prctl(PR_SET_PDEATHSIG)``: the kernel signals this process
  when its parent dies. The kernel sends it when the parent *thread* that
  forked ends, too (a Fleet started from a thread that finishes first):
  the handler acts only once ``getppid()`` changed, and the pipe still
  covers the real death.

Either way the process leaves through its ordinary path (a worker's env
subprocesses close with it, a coordinator stops serving); a backstop ends
the process if leaving hangs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("rlfleet")

#: Seconds the process gets to leave once its parent is gone, before it exits
#: at once (the learner died: there is nothing to drain to).
EXIT_BACKSTOP_SECONDS = 10.0
#: The signal the kernel sends when the parent dies (Linux).
PARENT_DEATH_SIGNAL = signal.SIGUSR2
_PR_SET_PDEATHSIG = 1


def watch_parent(
    pipe_fd: int,
    on_parent_gone: Callable[[str], None],
    *,
    backstop_seconds: float = EXIT_BACKSTOP_SECONDS,
) -> None:
    """Calls ``on_parent_gone(reason)`` once when the parent process ends.

    Call it from the main thread (it installs a signal handler), early in
    the process's life. If the parent is already gone, ``on_parent_gone``
    runs at once.

    Args:
        pipe_fd: The read end of a pipe whose write end only the parent holds.
        on_parent_gone: Makes the process leave; must be safe to call from a
            signal handler and from another thread.
        backstop_seconds: After ``on_parent_gone``, the process exits with
            code 1 if it still runs this many seconds later.
    """
    parent = os.getppid()
    fired = threading.Lock()

    def gone(how: str) -> None:
        if not fired.acquire(blocking=False):
            return  # the other mechanism got there first
        reason = f"its parent process (pid {parent}) ended ({how})"
        logger.warning("%s; leaving", reason)
        on_parent_gone(reason)
        backstop = threading.Timer(backstop_seconds, _exit_now, args=(reason, backstop_seconds))
        backstop.daemon = True
        backstop.start()

    def read_until_closed() -> None:
        with contextlib.suppress(OSError):
            while os.read(pipe_fd, 4096):
                pass  # the parent never writes; anything it did is ignored
        gone("its pipe closed")

    threading.Thread(target=read_until_closed, name="rlfleet-parent-watch", daemon=True).start()

    if _set_parent_death_signal():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del signum, frame
            if os.getppid() != parent:  # else: the forking thread ended, not the parent
                gone("parent-death signal")

        signal.signal(PARENT_DEATH_SIGNAL, on_signal)
        if os.getppid() != parent:  # died between getppid() and prctl()
            gone("before the parent-death signal was set")


def _set_parent_death_signal() -> bool:
    """Asks Linux to signal this process when its parent dies; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        result = libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return bool(result == 0)


def _exit_now(reason: str, seconds: float) -> None:
    logger.error("%s and the process did not leave within %g seconds; exiting", reason, seconds)
    logging.shutdown()
    os._exit(1)
