"""``rlfleet sample``: collect a batch from a fleet and save it as ``.npz``.

The file layout is :mod:`rlfleet.core.batch_file`'s; :func:`rlfleet.load_batch`
reads it back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet.cli._args import non_negative_int, positive_float, positive_int
from rlfleet.cli._env import env_option
from rlfleet.cli._progress import Progress
from rlfleet.cli._security_flags import add_client_flags, learner_options_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``sample`` subcommand."""
    parser = subparsers.add_parser(
        "sample",
        help="collect a batch from a fleet and save it as .npz",
        description=(
            "Ask a coordinator for a batch (complete episodes totalling --steps steps, "
            "exactly --episodes episodes, or fragments) and save it with numpy.savez. "
            "Shows a progress bar on stderr (a line every 10 s when stderr is not a terminal)."
        ),
        epilog=(
            "File layout: observations, last_observations, actions, rewards, step_types, "
            "lengths; episode_infos.KEY, env_infos.KEY, agent_infos.KEY (nested keys joined "
            "with dots); env_spec (JSON: gymnasium spaces); format. Read it back with "
            "rlfleet.load_batch (docs/operations.md)."
        ),
    )
    parser.add_argument(
        "--coordinator",
        **env_option("RLFLEET_COORDINATOR", default=None, help="HOST:PORT of the coordinator"),
    )
    parser.add_argument(
        "--env",
        default=None,
        help="switch the fleet to this gymnasium id first (default: the fleet's current env)",
    )
    parser.add_argument(
        "--mode",
        choices=("steps", "episodes", "fragments"),
        default="steps",
        help="complete episodes of >= --steps steps, exactly --episodes episodes, or "
        "fragments of --fragment-length steps totalling >= --steps (default: steps)",
    )
    parser.add_argument("--steps", type=positive_int, default=None, help="steps to collect")
    parser.add_argument("--episodes", type=positive_int, default=None, help="episodes to collect")
    parser.add_argument(
        "--fragment-length", type=positive_int, default=None, help="steps per fragment"
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=None, help="base seed (default: the fleet's)"
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds to wait for the batch (600)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    add_client_flags(parser, worker=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Collects the batch and writes the file; returns the exit code."""
    problem = _check_args(args)
    if problem:
        print(f"rlfleet sample: {problem}", file=sys.stderr)
        return 2
    from rlfleet.client import RemoteSampler
    from rlfleet.core.batch_file import save_batch

    unit = "episodes" if args.mode == "episodes" else "steps"
    target = args.episodes if args.mode == "episodes" else args.steps
    with (
        RemoteSampler(
            args.coordinator,
            seed=args.seed,
            timeout=args.timeout,
            **learner_options_from_args(args),
        ) as sampler,
        Progress("sample", target, unit) as progress,
    ):
        batch = _collect(sampler, args, lambda done, _target: progress.update(done))
    save_batch(args.out, batch)
    print(
        f"wrote {batch.n_episodes} {'fragments' if args.mode == 'fragments' else 'episodes'} "
        f"({batch.total_steps} steps) to {args.out}"
    )
    return 0


def _collect(sampler: Any, args: argparse.Namespace, progress: Callable[[int, int], None]) -> Any:
    update = args.env
    if args.mode == "episodes":
        return sampler.obtain_episodes(args.episodes, env_update=update, progress=progress)
    if args.mode == "fragments":
        return sampler.obtain_fragments(
            args.steps, args.fragment_length, env_update=update, progress=progress
        )
    return sampler.obtain_samples(0, args.steps, env_update=update, progress=progress)


def _check_args(args: argparse.Namespace) -> str | None:
    if not args.coordinator:
        return "no coordinator: pass --coordinator HOST:PORT or set RLFLEET_COORDINATOR"
    if args.mode == "episodes" and args.episodes is None:
        return "--mode episodes needs --episodes N"
    if args.mode != "episodes" and args.steps is None:
        return f"--mode {args.mode} needs --steps N"
    if args.mode == "fragments" and args.fragment_length is None:
        return "--mode fragments needs --fragment-length T"
    return None
