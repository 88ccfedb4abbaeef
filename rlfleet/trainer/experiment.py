"""garage's ``wrap_experiment``: a log directory per experiment run.

::

    @wrap_experiment(snapshot_mode="all")
    def vpg_cartpole(ctxt, seed=1):
        trainer = Trainer(ctxt)   # snapshots and diagnostics go to ctxt.snapshot_dir
        ...

    vpg_cartpole(seed=2)          # logs to data/local/experiment/vpg_cartpole

The directory is ``data/local/<prefix>/<name>`` under the working
directory; a taken name gets ``_1``, ``_2``, ... unless ``use_existing_dir``.
The call's arguments are written to ``variant.json`` there.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from rlfleet.errors import ConfigError
from rlfleet.trainer.snapshot import SnapshotConfig

R = TypeVar("R")


@dataclass(frozen=True)
class ExperimentContext:
    """What a wrapped experiment function gets as its first argument.

    Attributes:
        snapshot_dir: The experiment's log directory (snapshots, ``progress.csv``,
            TensorBoard event files, ``variant.json``).
        snapshot_mode: The snapshot mode (see :class:`SnapshotConfig`).
        snapshot_gap: The snapshot gap.
    """

    snapshot_dir: str
    snapshot_mode: str
    snapshot_gap: int

    def snapshot_config(self) -> SnapshotConfig:
        """The context as a :class:`SnapshotConfig` (what the Trainer reads)."""
        return SnapshotConfig(self.snapshot_dir, self.snapshot_mode, self.snapshot_gap)


@overload
def wrap_experiment(function: Callable[..., R]) -> Callable[..., R]: ...


@overload
def wrap_experiment(
    function: None = None,
    *,
    log_dir: str | None = None,
    prefix: str = "experiment",
    name: str | None = None,
    snapshot_mode: str = "last",
    snapshot_gap: int = 1,
    archive_launch_repo: bool = True,
    name_parameters: str | None = None,
    use_existing_dir: bool = False,
    x_axis: str = "TotalEnvSteps",
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def wrap_experiment(
    function: Callable[..., R] | None = None,
    *,
    log_dir: str | None = None,
    prefix: str = "experiment",
    name: str | None = None,
    snapshot_mode: str = "last",
    snapshot_gap: int = 1,
    archive_launch_repo: bool = True,
    name_parameters: str | None = None,
    use_existing_dir: bool = False,
    x_axis: str = "TotalEnvSteps",
) -> Any:
    """Makes ``function(ctxt, **kwargs)`` an experiment called as ``function(**kwargs)``.

    Args:
        function: The experiment; its first parameter receives the
            :class:`ExperimentContext`.
        log_dir: The full log directory; None: ``data/local/<prefix>/<name>``.
        prefix: Directory under ``data/local``.
        name: The experiment's name; None: the function's name.
        snapshot_mode: See :class:`SnapshotConfig`.
        snapshot_gap: See :class:`SnapshotConfig`.
        archive_launch_repo: Accepted for garage compatibility; rlfleet
            archives nothing.
        name_parameters: None, ``"all"`` (every parameter, defaults
            included) or ``"passed"`` (the passed ones), appended to the
            name as ``_key=value`` in definition order.
        use_existing_dir: Reuse the directory even if it holds data,
            instead of taking ``<name>_1``, ``<name>_2``, ...
        x_axis: Accepted for garage compatibility (its plots' x axis);
            the CSV and TensorBoard logs carry every key.

    Returns:
        The wrapped function, or a decorator when ``function`` is None.

    Raises:
        ConfigError: If ``name_parameters`` or the snapshot settings are
            invalid (at decoration), or the wrapped function is called
            with positional arguments (garage's rule).
    """
    del archive_launch_repo, x_axis
    if name_parameters not in (None, "all", "passed"):
        raise ConfigError(
            f"wrap_experiment name_parameters must be None, 'all' or 'passed', "
            f"got {name_parameters!r}"
        )
    SnapshotConfig(".", snapshot_mode, snapshot_gap)  # validates both now

    def decorate(experiment: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(experiment)
        parameters = list(signature.parameters.values())[1:]

        @functools.wraps(experiment)
        def run(*args: Any, **kwargs: Any) -> R:
            if args:
                raise ConfigError(
                    "garage.experiment currently only supports keyword arguments: call "
                    f"{experiment.__name__}(key=value, ...), got {len(args)} positional"
                )
            directory = Path(
                log_dir
                if log_dir is not None
                else _free_dir(
                    Path.cwd() / "data" / "local" / prefix,
                    _named(name or experiment.__name__, parameters, kwargs, name_parameters),
                    use_existing_dir,
                )
            )
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "variant.json").write_text(
                json.dumps(kwargs, indent=1, sort_keys=True, default=repr)
            )
            context = ExperimentContext(str(directory), snapshot_mode, snapshot_gap)
            return experiment(context, **kwargs)

        return run

    return decorate if function is None else decorate(function)


def _named(
    base: str, parameters: list[inspect.Parameter], passed: dict[str, Any], mode: str | None
) -> str:
    if mode is None:
        return base
    values = []
    for parameter in parameters:
        if parameter.name in passed:
            values.append(f"{parameter.name}={passed[parameter.name]}")
        elif mode == "all" and parameter.default is not inspect.Parameter.empty:
            values.append(f"{parameter.name}={parameter.default}")
    return "_".join([base, *values])


def _free_dir(parent: Path, name: str, use_existing: bool) -> Path:
    """``parent/name``, or the first free ``parent/name_<i>`` if that holds data."""
    candidate = parent / name
    if use_existing or not _has_data(candidate):
        return candidate
    index = 1
    while _has_data(parent / f"{name}_{index}"):
        index += 1
    return parent / f"{name}_{index}"


def _has_data(path: Path) -> bool:
    return path.exists() and any(os.scandir(path))
