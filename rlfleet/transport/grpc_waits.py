"""grpcio's blocking waits without their 0.1 s polls off the main thread.

grpcio's synchronous API waits for a call's events on a condition variable,
never longer than 0.1 s at a time (``grpc._common.wait``): so that a main
thread blocked in a call runs its signal handlers soon
(https://github.com/grpc/grpc/issues/19464). Only the main thread runs
signal handlers, so another thread's polls wake it for nothing. Each
wake-up takes the GIL: in a worker, whose stepping thread holds it almost
all the time and lets go of it for a moment several times a vector step
(numpy's generators draw without it), a waiting thread is woken at each of
those moments and mostly loses the race for it, so one wake-up costs
dozens of context switches, some of them preempting a stepping thread. A
worker's Join stream receiver waits for the coordinator's few messages a
second, so those polls were most of its wake-ups
(``tests/test_grpc_waits.py::test_a_join_streams_receiver_sleeps_while_no_message_comes``).

:func:`install` replaces ``grpc._common.wait``, which grpcio's channel looks
up at every call, with one that waits as grpcio's does on the main thread,
for a bounded wait, and when grpcio passes a spin callback (its fork
support, run between polls); elsewhere it waits
:data:`THREAD_WAIT_SECONDS` at a time. grpcio notifies the condition on
every event of a call and on its cancel, so that bound is only a backstop.
A grpcio whose wait takes other parameters keeps its own.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable

from grpc import _common

#: The longest single wait of a thread other than the main one.
THREAD_WAIT_SECONDS = 5.0

#: The parameters of the grpcio wait :func:`_wait` stands in for.
WAIT_PARAMETERS = ("wait_fn", "wait_complete_fn", "timeout", "spin_cb")

_grpc_wait = _common.wait


def _wait(
    wait_fn: Callable[..., bool],
    wait_complete_fn: Callable[[], bool],
    timeout: float | None = None,
    spin_cb: Callable[[], None] | None = None,
) -> bool:
    """``grpc._common.wait``: the same, without short polls off the main thread."""
    if (
        timeout is not None
        or spin_cb is not None
        or threading.current_thread() is threading.main_thread()
    ):
        return _grpc_wait(wait_fn, wait_complete_fn, timeout, spin_cb)
    while not wait_complete_fn():
        wait_fn(timeout=THREAD_WAIT_SECONDS)
    return False


def install() -> None:
    """Makes grpcio's unbounded waits off the main thread wait
    :data:`THREAD_WAIT_SECONDS` at a time, in this process (idempotent).

    Leaves a grpcio wait whose parameters are not :data:`WAIT_PARAMETERS` alone.
    """
    if _common.wait is _wait:
        return
    if tuple(inspect.signature(_common.wait).parameters) != WAIT_PARAMETERS:
        return
    _common.wait = _wait
