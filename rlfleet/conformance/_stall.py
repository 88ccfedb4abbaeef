"""How long the kit's own threads were kept from running (machine load).

Timing checks (heartbeats) allow a worker the same scheduling delay the kit
itself suffered in the same seconds: on a machine loaded far past its core
count every process wakes late, and that is not the worker's fault.
"""

from __future__ import annotations

import threading
import time

#: How often the meter wakes up.
_TICK_SECONDS = 0.02


class StallMeter:
    """Measures the longest wake-up delay of a sleeping thread while active.

    Use as a context manager; :attr:`worst` is the delay in seconds.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-meter", daemon=True)

    def __enter__(self) -> StallMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            before = time.monotonic()
            if self._stop.wait(_TICK_SECONDS):
                return
            self.worst = max(self.worst, time.monotonic() - before - _TICK_SECONDS)


__all__ = ["StallMeter"]
