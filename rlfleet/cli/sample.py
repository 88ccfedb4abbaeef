"""``rlfleet sample``: collect a batch from a fleet and save it as ``.npz``.

The file layout is :mod:`rlfleet.core.batch_file`'s; :func:`rlfleet.load_batch`
reads it back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from rlfleet.cli._parser import add_command
from rlfleet.cli._progress import Progress
from rlfleet.cli._security_flags import LearnerSecurityOptions, learner_options_from_args
from rlfleet.cli._settings import NonNegativeInt, PositiveFloat, PositiveInt, option


class SampleSettings(LearnerSecurityOptions):
    """The options of ``rlfleet sample``."""

    coordinator: str | None = option(None, "HOST:PORT of the coordinator")
    env: str | None = option(
        None, "switch the fleet to this gymnasium id first", shown="the fleet's current env"
    )
    mode: Literal["steps", "episodes", "fragments"] = option(
        "steps",
        "complete episodes of >= --steps steps, exactly --episodes episodes, or fragments of "
        "--fragment-length steps totalling >= --steps",
    )
    steps: PositiveInt | None = option(None, "steps to collect")
    episodes: PositiveInt | None = option(None, "episodes to collect")
    fragment_length: PositiveInt | None = option(None, "steps per fragment")
    seed: NonNegativeInt | None = option(None, "base seed", shown="the fleet's")
    timeout: PositiveFloat = option(600.0, "seconds to wait for the batch")
    out: Path | None = option(None, "the .npz file to write", required=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``sample`` subcommand."""
    add_command(
        subparsers,
        "sample",
        SampleSettings,
        run,
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


def run(args: argparse.Namespace) -> int:
    """Collects the batch and writes the file; returns the exit code."""
    problem = _check_args(args)
    if problem:
        print(f"rlfleet sample: {problem}", file=sys.stderr)
        return 2
    problem = _prepare_out(args.out)
    if problem:
        print(f"rlfleet sample: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    from rlfleet.client import RemoteSampler

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
    written, failure = _save(args.out, batch)
    if written is None:
        print(f"rlfleet sample: {failure}", file=sys.stderr)
        return 1
    print(
        f"wrote {batch.n_episodes} {'fragments' if args.mode == 'fragments' else 'episodes'} "
        f"({batch.total_steps} steps) to {written}"
    )
    if failure:
        print(f"rlfleet sample: {failure}", file=sys.stderr)
        return 1
    return 0


def _prepare_out(out: Path) -> str | None:
    """Makes sure ``out`` can be written before anything is collected; None if it can.

    Creates its missing folders; refuses a folder, and a folder (or file)
    this process may not write.
    """
    if out.is_dir():
        return "is a folder; give the path of the .npz file to write"
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create its folder {folder}: {exc.strerror or exc}"
    if out.exists() and not os.access(out, os.W_OK):
        return "exists and this user may not overwrite it"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"this user may not write in its folder {folder}"
    return None


def _save(out: Path, batch: Any) -> tuple[Path | None, str]:
    """Writes the batch to ``out``, else to a fallback file: collected data is never lost.

    Returns:
        The path written (None if nothing could be) and what went wrong
        ("" if nothing did).
    """
    from rlfleet.core.batch_file import save_batch

    existed = out.exists()
    try:
        save_batch(out, batch)
        return out, ""
    except OSError as exc:
        error = f"writing {out} failed after sampling ({exc.strerror or exc})"
        if not existed and out.is_file():
            with contextlib.suppress(OSError):
                out.unlink()  # a partial file of ours, not a valid batch
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        try:
            descriptor, name = tempfile.mkstemp(prefix="rlfleet-sample-", suffix=".npz", dir=folder)
            os.close(descriptor)
            save_batch(name, batch)
        except OSError:
            continue
        return Path(name), f"{error}; the batch was saved to {name} instead"
    return None, f"{error}, and no fallback file could be written either; the batch is lost"


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
