"""Progress of long commands: a bar on a terminal, plain lines in logs.

On a TTY, tqdm's bar. Elsewhere (a container's log, CI, a pipe) a bar's
carriage returns make one unreadable line, so a line is printed every
:data:`LINE_SECONDS` and at the end instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rlfleet._util.closing import ClosesOnExit

#: Seconds between progress lines when not on a terminal.
LINE_SECONDS = 10.0


class Progress(ClosesOnExit):
    """Reports ``done`` out of ``total`` for a command.

    Args:
        what: The command, first word of each line (``"sample"``).
        total: The target.
        unit: What is counted (``"steps"``).
        stream: Where to report (default: stderr).
        clock: Seconds (tests pass their own).
    """

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what, self._total, self._unit = what, total, unit
        self._stream = stream or sys.stderr
        self._clock = clock
        self._started = self._next_line = clock()
        self._next_line += LINE_SECONDS
        self._done = 0
        self._reported = -1
        self._bar: Any = None
        if self._stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=unit, file=self._stream)

    def update(self, done: int) -> None:
        """Sets the progress to ``done`` (a running total)."""
        self._done = done
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif self._clock() >= self._next_line:
            self._next_line = self._clock() + LINE_SECONDS
            self._line()

    def close(self) -> None:
        """Ends the bar, or prints the last line."""
        if self._bar is not None:
            self._bar.close()
        elif self._done != self._reported:
            self._line()

    def _line(self) -> None:
        self._reported = self._done
        elapsed = max(self._clock() - self._started, 1e-9)
        share = f" ({100 * self._done / self._total:.0f}%)" if self._total else ""
        print(
            f"{self._what}: {self._done:,}/{self._total:,} {self._unit}{share}, "
            f"{self._done / elapsed:,.0f} {self._unit}/s, {elapsed:.1f} s",
            file=self._stream,
            flush=True,
        )
