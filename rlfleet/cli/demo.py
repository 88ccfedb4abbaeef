"""``rlfleet demo``: train a policy on CartPole-v1 through an embedded fleet.

The whole system in one command: an embedded coordinator with local worker
processes (``Fleet.local``), the numpy :class:`~rlfleet.learners.VPG`
learner pushing its parameters with every request, one line per iteration,
and a PNG of the learning curve at the end. ``--local`` samples in-process
with ``LocalSampler`` instead, to compare or when gRPC is not wanted.
Exit code 0 when the target average return is reached, 1 when the budget
runs out first.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlfleet.cli._parser import add_command
from rlfleet.cli._settings import CommandSettings, PositiveInt, option
from rlfleet.envs.config import EnvConfig
from rlfleet.learners import VPG, IterationRecord, TrainingResult, train

#: The demo's environment: solved at an average return of 475 (gymnasium's
#: reward threshold for CartPole-v1).
ENV_ID = "CartPole-v1"
#: Where run folders go by default (relative to the working directory).
RUNS_DIR = "rlfleet-runs"

_HEADER = f"{'itr':>4}  {'avg return':>10}  {'episodes':>8}  {'env steps':>10}  "
_HEADER += f"{'steps/s':>9}  {'agent':>6}  {'time':>7}"


class DemoSettings(CommandSettings):
    """The options of ``rlfleet demo``."""

    workers: PositiveInt = option(2, "worker processes")
    envs_per_worker: PositiveInt = option(4, "envs per worker")
    steps_per_iteration: PositiveInt = option(
        4000, "env steps sampled per iteration, in complete episodes"
    )
    target_return: float = option(475.0, "average return to reach")
    max_steps: PositiveInt = option(1_000_000, "env step budget")
    max_iterations: PositiveInt | None = option(None, "iteration budget")
    seed: int = option(0, "seeds the learner and sampling")
    out: Path | None = option(
        None,
        "run folder for the demo's files",
        metavar="DIR",
        shown=f"{RUNS_DIR}/demo-<UTC time>",
    )
    plot: Path | None = option(
        None, "where to write the learning curve", metavar="PNG", shown="DIR/learning_curve.png"
    )
    no_plot: bool = option(False, "do not write the plot")
    local: bool = option(False, "sample in this process with LocalSampler instead of the fleet")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``demo`` subcommand."""
    add_command(
        subparsers,
        "demo",
        DemoSettings,
        run,
        help=f"train a policy on {ENV_ID} through an embedded local fleet",
        description=(
            f"Start an embedded coordinator with local worker processes and train the numpy "
            f"VPG learner on {ENV_ID} until the average return reaches the target. Prints "
            "one line per iteration and writes a PNG of the learning curve. Exits 1 if the "
            "step budget runs out first."
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Runs the demo; returns 0 if the target was reached, else 1."""
    env = EnvConfig(ENV_ID)
    vpg = VPG(env.env_spec(), seed=args.seed)
    where = "in this process (LocalSampler)" if args.local else "on an embedded local fleet"
    print(
        f"rlfleet demo: VPG on {ENV_ID} {where}, {args.workers} workers x "
        f"{args.envs_per_worker} envs, {args.steps_per_iteration:,} steps/iteration, "
        f"target average return {args.target_return:g}",
        flush=True,
    )
    with _quiet_logs(getattr(args, "log_level", "INFO")), _open_sampler(args, env, vpg) as sampler:
        print(_HEADER, flush=True)
        result = train(
            sampler,
            vpg,
            steps_per_iteration=args.steps_per_iteration,
            target_return=args.target_return,
            max_steps=args.max_steps,
            max_iterations=args.max_iterations,
            on_iteration=_print_record,
        )
    _print_outcome(result, args)
    if not args.no_plot:
        with _quiet_logs(getattr(args, "log_level", "INFO")):
            _plot(
                result,
                args.plot or _run_folder(args.out) / "learning_curve.png",
                f"VPG on {ENV_ID}, {args.workers} workers x {args.envs_per_worker} envs",
            )
    return 0 if result.reached else 1


def _run_folder(out: Path | None) -> Path:
    """``--out``, or a new folder under :data:`RUNS_DIR` named after the time."""
    if out is not None:
        return out
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(RUNS_DIR) / f"demo-{stamp}"


@contextlib.contextmanager
def _quiet_logs(log_level: str) -> Iterator[None]:
    """Keeps rlfleet's INFO lines (workers joining, each request) out of the table.

    The per-iteration table is the demo's output; ``--log-level DEBUG``
    still shows everything.
    """
    # matplotlib logs "building the font cache" at INFO on its first run.
    loggers = [logging.getLogger(name) for name in ("rlfleet", "matplotlib")]
    previous = [logger.level for logger in loggers]
    if log_level != "DEBUG":
        for logger in loggers:
            logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def _open_sampler(args: argparse.Namespace, env: EnvConfig, vpg: VPG) -> Iterator[Any]:
    if args.local:
        from rlfleet.sampling.local import LocalSampler

        with LocalSampler(
            env,
            vpg.policy_spec,
            n_workers=args.workers,
            envs_per_worker=args.envs_per_worker,
            seed=args.seed,
        ) as sampler:
            yield sampler
        return
    # Imported here: the client pulls in gRPC, which --local does not need.
    from rlfleet.client import Fleet

    with Fleet.local(
        workers=args.workers,
        envs_per_worker=args.envs_per_worker,
        env=env,
        policy=vpg.policy_spec,
        seed=args.seed,
    ) as sampler:
        yield sampler


def _print_record(record: IterationRecord) -> None:
    version = "-" if record.agent_version is None else f"v{record.agent_version}"
    print(
        f"{record.iteration:>4}  {record.average_return:>10.1f}  {record.n_episodes:>8}  "
        f"{record.total_steps:>10,}  {record.steps_per_second:>9,.0f}  {version:>6}  "
        f"{record.elapsed_seconds:>6.1f}s",
        flush=True,
    )


def _print_outcome(result: TrainingResult, args: argparse.Namespace) -> None:
    last = result.history[-1]
    if result.reached:
        print(
            f"reached average return {last.average_return:.1f} >= {args.target_return:g} at "
            f"iteration {last.iteration} after {last.total_steps:,} env steps in "
            f"{result.elapsed_seconds:.1f} s",
            flush=True,
        )
        return
    best = result.best
    assert best is not None  # train() ran at least one iteration
    budget = f"--max-steps {args.max_steps:,}"
    if args.max_iterations is not None:
        budget += f" / --max-iterations {args.max_iterations}"
    print(
        f"rlfleet demo: target average return {args.target_return:g} not reached within "
        f"{budget} ({len(result.history)} iterations, {last.total_steps:,} env steps, "
        f"{result.elapsed_seconds:.1f} s); best average return {best.average_return:.1f} at "
        f"iteration {best.iteration}. Raise the budget or try another --seed",
        file=sys.stderr,
        flush=True,
    )


def _plot(result: TrainingResult, path: Path, title: str) -> None:
    """Writes the learning curve, or says why not; never fails the demo."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(
            "matplotlib is not installed, so no plot was written "
            "(pip install 'rlfleet[plot]' to get it)",
            flush=True,
        )
        return
    # The object API with the Agg canvas: no pyplot global state, no display.
    figure = Figure(figsize=(7.0, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    steps = [record.total_steps for record in result.history]
    returns = [record.average_return for record in result.history]
    axes.plot(steps, returns, marker="o", markersize=3, label="average return")
    if result.target_return is not None:
        axes.axhline(result.target_return, color="grey", linestyle="--", label="target")
    axes.set(xlabel="env steps", ylabel="average return", title=title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100)
    except OSError as exc:
        print(f"could not write the plot to {path}: {exc}", file=sys.stderr, flush=True)
        return
    print(f"learning curve written to {path.resolve()}", flush=True)
