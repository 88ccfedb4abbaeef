"""``rlfleet status``: the fleet's workers and totals, once or live.

Once: a table and a totals line. ``--watch``: a live terminal view (rich)
refreshed every few seconds, with each worker's steps/s, envs, units in
flight, agent lag and last error. ``--json``: the same data for scripts
(one JSON document, or one line per refresh with ``--watch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlfleet.cli._parser import add_command
from rlfleet.cli._security_flags import LearnerSecurityOptions, learner_options_from_args
from rlfleet.cli._settings import PositiveFloat, option
from rlfleet.errors import UnavailableError

if TYPE_CHECKING:
    from rlfleet.client import FleetStatus, RemoteSampler

_COLUMNS = ("NAME", "HOST", "PID", "ENVS", "STATE", "STEPS/S", "AGENT", "HEARTBEAT")
#: Narrowest LAST ERROR column of ``--watch``; on a narrower terminal errors go below.
_MIN_ERROR_WIDTH = 20
_WATCH_COLUMNS = ("NAME", "STATE", "ENVS", "STEPS/S", "STEPS", "UNITS", "LAG", "HEARTBEAT")


class StatusSettings(LearnerSecurityOptions):
    """The options of ``rlfleet status``."""

    coordinator: str | None = option(None, "HOST:PORT of the coordinator")
    timeout: PositiveFloat = option(10.0, "seconds to wait for an answer")
    watch: PositiveFloat | None = option(
        None,
        "refresh every SECONDS (2 if omitted) until Ctrl-C",
        const=2.0,
        metavar="SECONDS",
    )
    as_json: bool = option(False, "print JSON instead of a table", flag="--json")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``status`` subcommand."""
    add_command(
        subparsers,
        "status",
        StatusSettings,
        run,
        help="show a coordinator's workers and totals (--watch: live)",
        description=(
            "Print one line per connected worker (name, host, pid, envs, state, steps/s, "
            "agent version, seconds since its last heartbeat) and the fleet's totals; "
            "--watch refreshes a live view, --json prints JSON for scripts."
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Prints the status; returns the exit code."""
    if not args.coordinator:
        print(
            "rlfleet status: no coordinator: pass --coordinator HOST:PORT or set "
            "RLFLEET_COORDINATOR",
            file=sys.stderr,
        )
        return 2
    from rlfleet.client import RemoteSampler

    options = learner_options_from_args(args)
    with RemoteSampler(args.coordinator, timeout=args.timeout, **options) as sampler:
        if args.watch is not None:
            return _watch(sampler, args)
        try:
            status = sampler.status()
        except UnavailableError as exc:
            print(unreachable(args.coordinator, exc), file=sys.stderr)
            return 1
    print(json.dumps(status_json(status)) if args.as_json else format_status(status))
    return 0


def unreachable(address: str, error: UnavailableError) -> str:
    """What to do when no coordinator answers at ``address`` (for a command line)."""
    from rlfleet.client._errors import RETRY_HINT

    cause = str(error).removesuffix(f": {RETRY_HINT}")
    return (
        f"rlfleet: error: no coordinator answers at {address} ({cause}); check that it "
        "runs, that --coordinator (or RLFLEET_COORDINATOR) is its HOST:PORT, and that the "
        "TLS flags match how it serves"
    )


def format_status(status: FleetStatus) -> str:
    """The table of workers and the totals line."""
    rows = [
        (
            w.name,
            w.host,
            str(w.pid),
            str(w.envs),
            w.state,
            f"{w.steps_per_second:,.0f}",
            f"v{w.agent_version}",
            f"{w.seconds_since_heartbeat:.1f}s",
        )
        for w in sorted(status.workers, key=lambda w: w.name)
    ]
    lines = _table([_COLUMNS, *rows]) if rows else ["no workers connected"]
    lines.append(_totals(status))
    return "\n".join(lines)


def status_json(status: FleetStatus) -> dict[str, Any]:
    """The status as JSON-ready data: every field, plus each worker's agent lag."""
    from rlfleet.core.batch_file import env_spec_to_json

    data = {
        field.name: getattr(status, field.name)
        for field in dataclasses.fields(status)
        if field.name not in ("workers", "env", "env_spec")
    }
    data["workers"] = [
        {**dataclasses.asdict(w), "agent_lag": status.agent_version - w.agent_version}
        for w in status.workers
    ]
    env = status.env
    data["env"] = (
        None
        if env is None
        else {
            "id": env.id,
            "kwargs": dict(env.kwargs),
            "max_episode_length": env.max_episode_length,
        }
    )
    data["env_spec"] = None if status.env_spec is None else env_spec_to_json(status.env_spec)
    data["ready_workers"] = status.ready_workers
    data["total_envs"] = status.total_envs
    return data


def _totals(status: FleetStatus) -> str:
    env = status.env.id if status.env is not None else "?"
    count = len(status.workers)
    return (
        f"fleet: {count} worker{'' if count == 1 else 's'} ({status.ready_workers} ready), "
        f"{status.total_envs} envs, {status.steps_per_second:,.0f} steps/s, "
        f"{status.steps_total:,} steps total, agent v{status.agent_version}, "
        f"env {env} (generation {status.env_generation})"
        + (", draining" if status.draining else "")
    )


def _watch(sampler: RemoteSampler, args: argparse.Namespace) -> int:
    """Refreshes until Ctrl-C; an unreachable coordinator is shown, not fatal."""
    if args.as_json:
        try:
            while True:
                print(json.dumps(_poll_json(sampler, args.coordinator)), flush=True)
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
    from rich.console import Console
    from rich.live import Live

    console = Console()
    try:
        if not console.is_terminal:  # a log or a pipe: one table per refresh
            while True:
                console.print(_view(sampler, args.coordinator, console.width))
                time.sleep(args.watch)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(_view(sampler, args.coordinator, console.width), refresh=True)
                time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _poll_json(sampler: RemoteSampler, address: str) -> dict[str, Any]:
    try:
        return {"time": time.time(), **status_json(sampler.status())}
    except UnavailableError as exc:
        return {"time": time.time(), "error": unreachable(address, exc)}


def _view(sampler: RemoteSampler, address: str, console_width: int) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    try:
        status = sampler.status()
    except UnavailableError as exc:
        return Text(f"{time.strftime('%H:%M:%S')}  {unreachable(address, exc)} (retrying)")
    table = Table(
        title=f"rlfleet {address}  {time.strftime('%H:%M:%S')}",
        caption=_totals(status),
        caption_justify="left",
    )
    rows = [
        (
            w.name,
            w.state,
            str(w.envs),
            f"{w.steps_per_second:,.0f}",
            f"{w.steps_total:,}",
            str(w.units_in_flight),
            str(status.agent_version - w.agent_version),
            f"{w.seconds_since_heartbeat:.1f}s",
        )
        for w in sorted(status.workers, key=lambda w: w.name)
    ]
    errors = [
        w.last_error.splitlines()[0] if w.last_error else ""
        for w in sorted(status.workers, key=lambda w: w.name)
    ]
    widths = [
        max([len(column), *(len(row[i]) for row in rows)])
        for i, column in enumerate(_WATCH_COLUMNS)
    ]
    for column, width in zip(_WATCH_COLUMNS, widths, strict=True):
        table.add_column(
            column,
            justify="left" if column in ("NAME", "STATE") else "right",
            no_wrap=True,
            min_width=width,
        )
    # Rich would squeeze every other column to nothing to fit a long error:
    # the error gets the room left (each column takes its width plus 2 of
    # padding and 1 of border, the table 1 more), cut with an ellipsis; on
    # a terminal too narrow for a useful column, each error gets a line of
    # its own under the table instead.
    room = console_width - sum(width + 3 for width in widths) - 4
    if room < _MIN_ERROR_WIDTH:
        for row in rows:
            table.add_row(*row)
        notes = [
            Text(f"{row[0]}: {error}", no_wrap=True, overflow="ellipsis", style="red")
            for row, error in zip(rows, errors, strict=True)
            if error
        ]
        return Group(table, *notes) if notes else table
    table.add_column("LAST ERROR", overflow="ellipsis", no_wrap=True, max_width=min(room, 50))
    for row, error in zip(rows, errors, strict=True):
        table.add_row(*row, error)
    return table


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
