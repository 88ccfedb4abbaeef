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

from rlfleet.cli._args import positive_float
from rlfleet.cli._env import env_option
from rlfleet.cli._security_flags import add_client_flags, learner_options_from_args
from rlfleet.errors import UnavailableError

if TYPE_CHECKING:
    from rlfleet.client import FleetStatus, RemoteSampler

_COLUMNS = ("NAME", "HOST", "PID", "ENVS", "STATE", "STEPS/S", "AGENT", "HEARTBEAT")
_WATCH_COLUMNS = ("NAME", "STATE", "ENVS", "STEPS/S", "STEPS", "UNITS", "LAG", "HEARTBEAT")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``status`` subcommand."""
    parser = subparsers.add_parser(
        "status",
        help="show a coordinator's workers and totals (--watch: live)",
        description=(
            "Print one line per connected worker (name, host, pid, envs, state, steps/s, "
            "agent version, seconds since its last heartbeat) and the fleet's totals; "
            "--watch refreshes a live view, --json prints JSON for scripts."
        ),
    )
    parser.add_argument(
        "--coordinator",
        **env_option("RLFLEET_COORDINATOR", default=None, help="HOST:PORT of the coordinator"),
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=10.0, help="seconds to wait for an answer"
    )
    parser.add_argument(
        "--watch",
        type=positive_float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (2 if omitted) until Ctrl-C",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_client_flags(parser, worker=False)
    parser.set_defaults(func=run)


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
    print(json.dumps(status_json(status)) if args.json else format_status(status))
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
    if args.json:
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
                console.print(_view(sampler, args.coordinator))
                time.sleep(args.watch)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(_view(sampler, args.coordinator), refresh=True)
                time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _poll_json(sampler: RemoteSampler, address: str) -> dict[str, Any]:
    try:
        return {"time": time.time(), **status_json(sampler.status())}
    except UnavailableError as exc:
        return {"time": time.time(), "error": unreachable(address, exc)}


def _view(sampler: RemoteSampler, address: str) -> Any:
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
    for column in _WATCH_COLUMNS:
        table.add_column(column, justify="left" if column in ("NAME", "STATE") else "right")
    table.add_column("LAST ERROR", overflow="ellipsis", no_wrap=True, max_width=50)
    for w in sorted(status.workers, key=lambda w: w.name):
        table.add_row(
            w.name,
            w.state,
            str(w.envs),
            f"{w.steps_per_second:,.0f}",
            f"{w.steps_total:,}",
            str(w.units_in_flight),
            str(status.agent_version - w.agent_version),
            f"{w.seconds_since_heartbeat:.1f}s",
            (w.last_error or "").splitlines()[0] if w.last_error else "",
        )
    return table


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
