"""``rlfleet status``: the fleet's workers and totals, as a table."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlfleet.cli._args import positive_float
from rlfleet.cli._env import env_option
from rlfleet.cli._security_flags import add_client_flags, learner_options_from_args

if TYPE_CHECKING:
    from rlfleet.client import FleetStatus

_COLUMNS = ("NAME", "HOST", "PID", "ENVS", "STATE", "STEPS/S", "AGENT", "HEARTBEAT")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``status`` subcommand."""
    parser = subparsers.add_parser(
        "status",
        help="show a coordinator's workers and totals",
        description=(
            "Print one line per connected worker (name, host, pid, envs, state, steps/s, "
            "agent version, seconds since its last heartbeat) and the fleet's totals."
        ),
    )
    parser.add_argument(
        "--coordinator",
        **env_option("RLFLEET_COORDINATOR", default=None, help="HOST:PORT of the coordinator"),
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=10.0, help="seconds to wait for an answer (10)"
    )
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
        status = sampler.status()
    print(format_status(status))
    return 0


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
    env = status.env.id if status.env is not None else "?"
    lines.append(
        f"fleet: {len(status.workers)} workers ({status.ready_workers} ready), "
        f"{status.total_envs} envs, {status.steps_per_second:,.0f} steps/s, "
        f"{status.steps_total:,} steps total, agent v{status.agent_version}, "
        f"env {env} (generation {status.env_generation})"
        + (", draining" if status.draining else "")
    )
    return "\n".join(lines)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
