"""When a remote worker sends its finished episodes: few, large results.

Every result costs the coordinator and the learner about a millisecond of
CPU whatever its size (three gRPC hops, a validation decode, the learner's
decode): with one result per CartPole episode that cost the fleet 3x its
throughput. So episodes are grouped, up to a size (steps and bytes: large
messages are slow to allocate and stream). They are held back no longer
than a timer, though, and hardly at all once the worker runs out of work:
the coordinator refills a worker only when it hears that its units are
done, and a request's answer waits for its last episodes.

Out of work, with episodes still running (a request's tail), finished
episodes are sent once half of the env slots are idle (the coordinator then
refills them together; once per dry spell), after :data:`TAIL_SECONDS` at
most, and at once when the last episode ended. Sending every episode as it
ended made most of a fleet's results: the bench's CartPole workers sent a
quarter of their results with fewer than 27 steps, and a worker of 64
native envs, whose slots end their last episodes one by one, sent 260 of
its 377 results with 170 steps on average (docs/data_plane.md).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

#: How long finished episodes wait, once a worker has no unit left to start,
#: for more of its running episodes to end and share their result.
TAIL_SECONDS = 0.01

#: Steps a worker's result holds at most unless told otherwise (``flush_steps``).
FLUSH_STEPS = 8192
#: ...and while its env is a native vector env. Such a worker of 64 CartPoles
#: steps 250,000-300,000 steps a second, so its results are full, and each
#: costs the coordinator and the learner about the same CPU whatever its
#: size: with results twice as large, their threads spent 0.154-0.158 us
#: per delivered step against 0.203-0.205 (docs/performance.md, "Native
#: vector envs"). Its flush timer (0.1 s) still binds first on a slower one.
NATIVE_FLUSH_STEPS = 16384


def flush_steps_for(given: int | None, *, native: bool) -> int:
    """The steps a worker's results hold at most: ``given``, or the default for its env.

    Args:
        given: The worker's ``flush_steps`` (None: the default).
        native: Its env is a native vector env.
    """
    if given is not None:
        return given
    return NATIVE_FLUSH_STEPS if native else FLUSH_STEPS


class _SteppedSlots(Protocol):
    """What the flush decision reads of a vector worker after a step, out of work."""

    @property
    def active_count(self) -> int: ...
    @property
    def n_envs(self) -> int: ...


class FlushPolicy:
    """Decides, after each vector step, whether to send the finished episodes.

    Args:
        max_steps: Send once the finished episodes hold this many steps...
        max_bytes: ...or about this many bytes (see :meth:`expect_step_bytes`).
        max_seconds: Send once the oldest has waited this long. Keep it, and
            ``max_steps``, well under what the coordinator's capacity of work
            lasts, or the worker runs dry before its refill.
    """

    def __init__(self, max_steps: int, max_bytes: int, max_seconds: float) -> None:
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self._step_limit = max_steps  # max_steps, or fewer for large steps
        self._oldest: float | None = None  # when the oldest unsent episode was seen
        self._dry_sent = False  # sent at half the slots idle since the queue ran dry

    @property
    def step_limit(self) -> int:
        """Steps at which a result is sent: ``max_steps``, or fewer for large steps."""
        return self._step_limit

    def set_max_steps(self, max_steps: int) -> None:
        """Changes ``max_steps`` (a new env); call :meth:`expect_step_bytes` after it."""
        self.max_steps = max_steps
        self._step_limit = max_steps

    def expect_step_bytes(self, step_bytes: float) -> None:
        """Sets the expected serialized size of one step (bytes).

        From the observation space when an env is built, then from each
        result sent.
        """
        fitting = int(self.max_bytes / max(step_bytes, 1.0))
        self._step_limit = max(1, min(self.max_steps, fitting))

    def after_step(
        self,
        now: float,
        queued_units: int,
        finished_steps: int,
        slots: _SteppedSlots,
        step_seconds: float,
    ) -> bool:
        """Whether to send now; call after every vector step that left finished episodes.

        A busy worker ends episodes at most of its vector steps, with units
        queued: no dry-spell rule applies then, so it decides with the three
        bounds alone, in this call's own body (each Python call nested in
        the check after every vector step costs a native worker about
        0.1 us); ``slots`` is read only once nothing is queued.

        Args:
            now: ``time.monotonic()`` (or a simulated clock).
            queued_units: Units not started yet.
            finished_steps: Steps of the finished, unsent episodes (> 0).
            slots: The vector worker just stepped: its episodes still
                running (``active_count``) and env slots (``n_envs``).
            step_seconds: How long the step took.
        """
        oldest = self._oldest
        if oldest is None:
            self._oldest = oldest = now
        if queued_units:
            self._dry_sent = False  # the next dry spell may send early again
        else:
            # Nothing left to start: slots go idle as their episodes end, so
            # the coordinator must hear soon to refill them (or to see the
            # request's last episodes): once half of them are idle, after
            # TAIL_SECONDS, and at once when the last one ended.
            running, n = slots.active_count, slots.n_envs
            half_idle = not self._dry_sent and 2 * (n - running) >= n
            if running == 0 or half_idle or now - oldest >= TAIL_SECONDS:
                self._dry_sent = True
                return True
        limit = self.max_seconds
        # A slow step gains nothing from waiting: the timer is only seen
        # between steps.
        return finished_steps >= self._step_limit or now - oldest >= limit or step_seconds >= limit

    def sent(self) -> None:
        """Records that every finished episode was sent (restarts the timer)."""
        self._oldest = None


#: Most bytes of message memory a session keeps from flush to flush (a
#: larger flush's messages get memory of their own).
KEPT_BYTES = 16 << 20


class FlushMemory:
    """The memory a session writes the messages of its flushes into, reused.

    A result sent on the data connection is the kernel's once the send
    returns, so the next flush may write where it was: the pages stay the
    process's. A new buffer per result costs page faults whenever the
    allocator gave the last one's memory back to the system (about 30 a
    flush of 8,192 CartPole steps, which took back what writing the columns
    straight into the message saved). Messages queued for gRPC's thread
    (no data connection) are not written here.
    """

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)
        self._used = 0

    def allocate(self, size: int) -> memoryview:
        """A writable byte view of ``size`` bytes, valid until :meth:`reset`."""
        end = self._used + size
        if end > len(self._buffer):
            if size > KEPT_BYTES:
                return memoryview(np.empty(size, np.uint8))  # type: ignore[arg-type]
            # Room for twice this flush so far; views handed out earlier keep
            # the old array alive until sent.
            self._buffer = np.empty(max(size, min(2 * end, KEPT_BYTES)), np.uint8)
            self._used, end = 0, size
        view = memoryview(self._buffer)[self._used : end]  # type: ignore[arg-type]
        self._used = end
        return view

    def reset(self) -> None:
        """The messages written so far were sent: their memory is free again."""
        self._used = 0
