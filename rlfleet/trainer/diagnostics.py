"""Per-epoch diagnostics: a CSV file, TensorBoard event files and a text table.

The algorithm records key/value pairs during an epoch in the trainer's
:class:`Tabular` (garage's ``tabular``); at the end of the epoch the
trainer adds its own keys (``TotalEnvSteps``, ``Epoch``, ...) and
:class:`DiagnosticsLog` writes the row: one line of ``progress.csv``, one
TensorBoard scalar per key (tensorboardX) at step = epoch, and a table on
stdout.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.errors import ConfigError

if TYPE_CHECKING:
    from tensorboardX import SummaryWriter

#: File name of the CSV log in the log directory.
CSV_NAME = "progress.csv"


class Tabular:
    """The key/value pairs of one epoch, in the order they were recorded."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def record(self, key: str, value: float) -> None:
        """Records ``key = value`` (a number) for the current epoch.

        Raises:
            ConfigError: If the value is not a real number.
        """
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"tabular value of {key!r} must be a number, got {type(value).__name__}"
                ) from None
        self._values[key] = float(value)

    def record_many(self, values: Mapping[str, float], prefix: str = "") -> None:
        """Records every pair of ``values``, keys as ``{prefix}/{key}`` if a prefix is given."""
        for key, value in values.items():
            self.record(f"{prefix}/{key}" if prefix else key, value)

    def as_dict(self) -> dict[str, float]:
        """The recorded pairs."""
        return dict(self._values)

    def clear(self) -> None:
        """Forgets every pair (at the start of an epoch)."""
        self._values.clear()


class DiagnosticsLog:
    """Writes epoch rows to ``progress.csv``, TensorBoard and a text stream.

    Args:
        log_dir: Directory of ``progress.csv`` and the event files; None
            writes only the text table.
        print_table: Print each row as a table on stdout.
    """

    def __init__(self, log_dir: Path | None, *, print_table: bool = True) -> None:
        self.log_dir = log_dir
        self._print_table = print_table
        self._writer: SummaryWriter | None = None
        self._purge_step: int | None = None

    @property
    def csv_path(self) -> Path | None:
        """Where the CSV rows go (None without a log directory)."""
        return None if self.log_dir is None else self.log_dir / CSV_NAME

    def dump(self, step: int, row: Mapping[str, float]) -> None:
        """Writes one epoch's row everywhere.

        Args:
            step: The epoch, TensorBoard's step.
            row: The values.
        """
        if self._print_table:
            sys.stdout.write(format_table(row))
            sys.stdout.flush()
        if self.log_dir is None:
            return
        self._append_csv(row)
        if self._writer is None:
            # Imported on first use: tensorboardX loads protobuf, which
            # `import rlfleet` (and its numpy-only core types) must not.
            from tensorboardX import SummaryWriter

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step)
        for key, value in row.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def rewind(self, last_epoch: int) -> None:
        """Forgets rows of epochs after ``last_epoch`` (a run resumed from a snapshot).

        The CSV keeps only rows whose ``Epoch`` is <= ``last_epoch``, and
        TensorBoard is told to discard the events of later steps (its
        ``purge_step``), so the resumed epochs are not shown twice.
        """
        self._purge_step = last_epoch + 1
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        path = self.csv_path
        if path is None or not path.exists():
            return
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [row for row in reader if _epoch_of(row) <= last_epoch]
        _write_csv(path, header, rows)

    def close(self) -> None:
        """Closes the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _append_csv(self, row: Mapping[str, float]) -> None:
        path = self.csv_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        values = {key: repr(value) for key, value in row.items()}
        if path.exists() and path.stat().st_size > 0:
            with path.open(newline="") as handle:
                reader = csv.DictReader(handle)
                header = list(reader.fieldnames or [])
                # A key no earlier epoch had: garage warns and drops it;
                # rlfleet widens the header instead, so nothing is lost.
                rows = None if all(key in header for key in row) else list(reader)
            if rows is None:
                with path.open("a", newline="") as handle:
                    csv.DictWriter(handle, header).writerow(values)
                return
            header += [key for key in row if key not in header]
            _write_csv(path, header, [*rows, values])
            return
        _write_csv(path, list(row), [values])


def format_table(row: Mapping[str, float]) -> str:
    """A two-column text table of the row, as garage prints its tabular."""
    if not row:
        return ""
    width = max(len(key) for key in row)
    cells = {key: _cell(value) for key, value in row.items()}
    value_width = max(len(cell) for cell in cells.values())
    rule = f"{'-' * width}  {'-' * value_width}\n"
    body = "".join(f"{key:<{width}}  {cell:>{value_width}}\n" for key, cell in cells.items())
    return rule + body + rule


def _cell(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _epoch_of(row: Mapping[str, str]) -> float:
    """A row's epoch; rows without one sort before every epoch (they are kept)."""
    try:
        return float(row.get("Epoch") or "-inf")
    except ValueError:
        return float("-inf")


def _write_csv(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    staging = path.with_name(path.name + ".tmp")
    with staging.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, header)
        writer.writeheader()
        writer.writerows(rows)
    staging.replace(path)
