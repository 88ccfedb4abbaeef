"""garage's ``Trainer`` on rlfleet's samplers, with snapshots and exact resume.

::

    trainer = Trainer(SnapshotConfig("runs/vpg"))
    algo = VPG(EnvConfig("CartPole-v1").env_spec(), seed=0)
    trainer.setup(algo, EnvConfig("CartPole-v1"), sampler_cls=Fleet.local, n_workers=2)
    trainer.train(n_epochs=20, batch_size=4000)

The algorithm drives the loop, as in garage: ``algo.train(trainer)``
iterates :meth:`Trainer.step_epochs`, samples with
:meth:`Trainer.obtain_episodes` and sets ``step_itr`` / ``step_episode``.
After each epoch the trainer writes the diagnostics, then a snapshot.

**Snapshots hold no code and no pickle** (see :mod:`rlfleet.trainer.snapshot`):
the algorithm's named tensors and JSON state (``snapshot_state()`` /
``restore_state()``), the trainer's counters and training arguments, and
the sampler's position (seed and next request index). Restoring therefore
needs the algorithm and env rebuilt by the same code first:
``setup(...)``, then ``restore(dir)``, then ``resume()``.

**Exact resume.** Every batch's seeds are a function of (seed, request
index, episode index) (``rlfleet.core.seeding``), so a run restored from epoch k
requests the batches the uninterrupted run requested after epoch k, and an
algorithm whose state is fully in its snapshot (parameters, optimizer
moments, random generator) computes the same updates from them.
``tests/test_trainer_resume.py`` kills a training process on the fleet
between epochs and proves batches and final parameters bit-identical.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import psutil

from rlfleet._util.closing import ClosesOnExit
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, NotSetupError
from rlfleet.sampling import recording_to
from rlfleet.trainer._restore_checks import (
    ALGO_PREFIX,
    check_algo_state,
    check_trainer_metadata,
    restore_or_undo,
)
from rlfleet.trainer.diagnostics import DiagnosticsLog, Tabular
from rlfleet.trainer.experiment import ExperimentContext
from rlfleet.trainer.samplers import build_sampler
from rlfleet.trainer.snapshot import Snapshot, SnapshotConfig, Snapshotter, episode_tensors

logger = logging.getLogger("rlfleet.trainer")

#: What the `trainer` extra installs, imported when first used.
_EXTRA_MODULES = ("safetensors", "tensorboardX")


@runtime_checkable
class SnapshotAlgorithm(Protocol):
    """What an algorithm gives the trainer to snapshot and restore it."""

    def snapshot_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Its complete training state: named arrays and JSON data."""
        ...

    def restore_state(self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> None:
        """Takes back a state :meth:`snapshot_state` returned."""
        ...


@dataclass
class TrainArgs:
    """The arguments of the last :meth:`Trainer.train` (garage's ``TrainArgs``)."""

    n_epochs: int
    batch_size: int | None
    plot: bool
    store_episodes: bool
    pause_for_plot: bool
    start_epoch: int


@dataclass
class TrainerStats:
    """The trainer's counters (garage's ``ExperimentStats``).

    Attributes:
        total_epoch: The last finished epoch.
        total_itr: ``step_itr`` after the last finished epoch.
        total_env_steps: Env steps sampled so far.
        next_request: The sampler's next request index.
    """

    total_epoch: int = 0
    total_itr: int = 0
    total_env_steps: int = 0
    next_request: int = 0


class Trainer(ClosesOnExit):
    """Runs an algorithm's epochs on a sampler; snapshots, restores and resumes.

    Args:
        snapshot_config: Where and how often to snapshot; the diagnostics
            (``progress.csv``, TensorBoard event files) go to the same
            directory. An :class:`ExperimentContext` (``wrap_experiment``)
            stands for its directory and snapshot settings. None: garage's
            default, ``./data/local/experiment``, mode ``"last"``.
        print_table: Print each epoch's diagnostics as a table on stdout.
    """

    def __init__(
        self,
        snapshot_config: SnapshotConfig | ExperimentContext | None = None,
        *,
        print_table: bool = True,
    ) -> None:
        missing = [name for name in _EXTRA_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(
                f"rlfleet.Trainer needs {missing} for snapshots and TensorBoard files: "
                'pip install "rlfleet[trainer]"'
            )
        if isinstance(snapshot_config, ExperimentContext):
            snapshot_config = snapshot_config.snapshot_config()
        config = snapshot_config or SnapshotConfig(
            os.path.join(os.getcwd(), "data", "local", "experiment")
        )
        self._snapshotter = Snapshotter(config)
        self._diagnostics = DiagnosticsLog(Path(config.snapshot_dir), print_table=print_table)
        self.tabular = Tabular()
        self._algo: Any = None
        self._env: Any = None
        self._seed = 0
        self._make: Callable[[], Any] | None = None
        self._sampler: Any = None
        self._closer: Callable[[], None] | None = None
        self._train_args: TrainArgs | None = None
        self._stats = TrainerStats()
        self._has_setup = False
        self._start_time = 0.0
        self._itr_start_time = 0.0
        self.step_itr = 0
        self.step_episode: Any = None

    # ------------------------------------------------------------- set-up

    def make_sampler(
        self,
        sampler_cls: Any,
        *,
        seed: int | None = None,
        n_workers: int = psutil.cpu_count(logical=False) or 1,
        max_episode_length: int | None = None,
        worker_class: type | None = None,
        sampler_args: Mapping[str, Any] | None = None,
        worker_args: Mapping[str, Any] | None = None,
    ) -> Any:
        """Builds a sampler for the set-up algorithm and env (garage's ``make_sampler``).

        Args:
            sampler_cls: :class:`~rlfleet.LocalSampler`,
                :class:`~rlfleet.client.RemoteSampler` (``sampler_args``
                must hold its ``address``) or ``Fleet.local`` (the trainer
                then owns the fleet and stops it with the sampler).
            seed: Base seed of every request; None: the seed of :meth:`setup`.
            n_workers: Workers (LocalSampler, Fleet.local; a RemoteSampler
                uses whatever workers its coordinator has).
            max_episode_length: None: ``algo.max_episode_length``.
            worker_class: None, ``DefaultWorker`` (one env per worker) or
                ``VecWorker`` (``worker_args={"n_envs": k}``).
            sampler_args: More keyword arguments of the sampler.
            worker_args: ``{"n_envs": k}``: env slots per worker.

        Returns:
            The sampler.

        Raises:
            ConfigError: (a ValueError) with garage's messages if the
                algorithm has no ``policy`` or no max episode length, or if
                an argument is not one of the forms above.
        """
        sampler, closer = build_sampler(
            sampler_cls,
            algo=self._algo,
            env=self._env,
            seed=self._seed if seed is None else seed,
            n_workers=n_workers,
            max_episode_length=max_episode_length,
            worker_class=worker_class,
            sampler_args=sampler_args,
            worker_args=worker_args,
        )
        if closer is not None:
            self._closer = closer
        return sampler

    def setup(  # noqa: PLR0917 -- garage's positional signature
        self,
        algo: Any,
        env: Any,
        sampler_cls: Any = None,
        sampler_args: Mapping[str, Any] | None = None,
        n_workers: int = psutil.cpu_count(logical=False) or 1,
        worker_class: type | None = None,
        worker_args: Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
    ) -> None:
        """Sets up the algorithm, the env and the sampler (garage's ``setup``).

        Args:
            algo: The algorithm: ``algo.train(trainer)``, ``algo.policy``,
                ``algo.max_episode_length`` and, for snapshots,
                ``snapshot_state()`` / ``restore_state()``.
            env: An :class:`~rlfleet.EnvConfig` or gymnasium id (any
                sampler), or an env or env factory (LocalSampler only).
            sampler_cls: See :meth:`make_sampler`; None: ``algo.sampler_cls``
                if it has one, else no sampler (the algorithm samples itself).
            sampler_args: See :meth:`make_sampler`.
            n_workers: See :meth:`make_sampler`.
            worker_class: See :meth:`make_sampler`.
            worker_args: See :meth:`make_sampler`.
            seed: The run's seed (garage reads a global one; rlfleet takes it
                here). It seeds every request, so it is part of the snapshot.

        Raises:
            ConfigError: See :meth:`make_sampler`.
        """
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"Trainer.setup seed must be an int >= 0, got {seed!r}")
        self._shutdown_worker()
        self._algo = algo
        self._env = env
        self._seed = seed
        self._stats = TrainerStats()
        self._train_args = None
        self._make = None
        if sampler_cls is None:
            sampler_cls = getattr(algo, "sampler_cls", None)
        if sampler_cls is not None:

            def make() -> Any:
                return self.make_sampler(
                    sampler_cls,
                    seed=self._seed,
                    n_workers=n_workers,
                    worker_class=worker_class,
                    sampler_args=sampler_args,
                    worker_args=worker_args,
                )

            self._make = make
            self._sampler = make()
        self._has_setup = True

    # ------------------------------------------------------------ training

    def train(
        self,
        n_epochs: int,
        batch_size: int | None = None,
        plot: bool = False,
        store_episodes: bool = False,
        pause_for_plot: bool = False,
    ) -> float:
        """Trains for ``n_epochs`` epochs (garage's ``train``).

        Args:
            n_epochs: Epochs to run.
            batch_size: Env steps per epoch (``obtain_samples``' ``num_samples``).
            plot: Must be False: rlfleet draws no live plots (chart the
                TensorBoard event files instead).
            store_episodes: Keep each epoch's batch in the snapshot.
            pause_for_plot: Only meaningful with ``plot``; ignored otherwise.

        Returns:
            What ``algo.train`` returns: the last epoch's average return.

        Raises:
            NotSetupError: If :meth:`setup` was not called.
        """
        if not self._has_setup:
            raise NotSetupError("Use setup() to setup trainer before training.")
        _check_train_args(n_epochs, batch_size, plot)
        self._train_args = TrainArgs(
            n_epochs=n_epochs,
            batch_size=batch_size,
            plot=plot,
            store_episodes=store_episodes,
            pause_for_plot=pause_for_plot,
            start_epoch=0,
        )
        return self._run()

    def resume(
        self,
        n_epochs: int | None = None,
        batch_size: int | None = None,
        plot: bool | None = None,
        store_episodes: bool | None = None,
        pause_for_plot: bool | None = None,
    ) -> float:
        """Continues a restored run; arguments default to the last ``train``'s.

        Raises:
            NotSetupError: If :meth:`restore` was not called.
        """
        if self._train_args is None:
            raise NotSetupError("You must call restore() before resume().")
        args = self._train_args
        args.n_epochs = n_epochs if n_epochs is not None else args.n_epochs
        args.batch_size = batch_size if batch_size is not None else args.batch_size
        args.plot = plot if plot is not None else args.plot
        args.store_episodes = store_episodes if store_episodes is not None else args.store_episodes
        args.pause_for_plot = pause_for_plot if pause_for_plot is not None else args.pause_for_plot
        _check_train_args(args.n_epochs, args.batch_size, args.plot)
        return self._run()

    def step_epochs(self) -> Iterator[int]:
        """Yields the epochs to run; after each, logs diagnostics and snapshots.

        The algorithm sets :attr:`step_episode` (the epoch's batch) and
        advances :attr:`step_itr` in each epoch::

            for epoch in trainer.step_epochs():
                trainer.step_episode = trainer.obtain_episodes(trainer.step_itr)
                self.train_once(trainer.step_itr, trainer.step_episode)
                trainer.step_itr += 1

        Yields:
            The epoch number.
        """
        args = self._require_train_args()
        self._start_worker()
        self._start_time = time.time()
        self.step_itr = self._stats.total_itr
        self.step_episode = None
        for epoch in range(args.start_epoch, args.n_epochs):
            self._itr_start_time = time.time()
            self.tabular.clear()
            with recording_to(self.tabular.record):
                yield epoch
            self._stats.total_epoch = epoch
            self._stats.total_itr = self.step_itr
            self.tabular.record("Epoch", epoch)
            self.log_diagnostics(args.pause_for_plot)
            # Diagnostics first, snapshot second: a kill between the two
            # repeats this epoch on resume, and restore() drops its CSV row.
            self.save(epoch)

    def obtain_episodes(
        self,
        itr: int,
        batch_size: int | None = None,
        agent_update: Any = None,
        env_update: Any = None,
    ) -> EpisodeBatch:
        """One batch of complete episodes of at least ``batch_size`` steps.

        Args:
            itr: The epoch's iteration.
            batch_size: None: the ``batch_size`` given to :meth:`train`.
            agent_update: None: the parameters of ``algo.exploration_policy``
                or ``algo.policy`` (``get_param_values()``), as garage does
                (nothing is pushed for a policy given as a spec or name).
            env_update: Any ``env_update`` form of the sampler.

        Returns:
            The batch; :attr:`total_env_steps` grows by its steps.

        Raises:
            ConfigError: (a ValueError) with garage's message if there is no
                sampler or no batch size.
        """
        if self._sampler is None and self._make is not None:
            self._start_worker()  # train() shut it down; sample on from where it stopped
        if self._sampler is None:
            raise ConfigError(
                "trainer was not initialized with `sampler_cls`. Either provide `sampler_cls` "
                "to trainer.setup,  or set `algo.sampler_cls`."
            )
        size = (
            batch_size if batch_size is not None else getattr(self._train_args, "batch_size", None)
        )
        if size is None:
            raise ConfigError(
                "trainer was not initialized with `batch_size`. Either provide `batch_size` to "
                "trainer.train,  or pass `batch_size` to trainer.obtain_samples."
            )
        if agent_update is None:
            policy = getattr(self._algo, "exploration_policy", None) or self._algo.policy
            # A policy given as a spec or name has no parameters to push:
            # the workers keep the one make_sampler gave them.
            get_params = getattr(policy, "get_param_values", None)
            agent_update = get_params() if get_params is not None else None
        episodes: EpisodeBatch = self._sampler.obtain_samples(
            itr, size, agent_update=agent_update, env_update=env_update
        )
        self._stats.total_env_steps += int(np.sum(episodes.lengths))
        self._stats.next_request = self._sampler.requests_made
        return episodes

    def obtain_samples(
        self,
        itr: int,
        batch_size: int | None = None,
        agent_update: Any = None,
        env_update: Any = None,
    ) -> list[dict[str, Any]]:
        """:meth:`obtain_episodes` as garage's list of episode dicts (``to_list``)."""
        return self.obtain_episodes(itr, batch_size, agent_update, env_update).to_list()

    # ---------------------------------------------------- snapshots, logs

    def save(self, epoch: int) -> None:
        """Snapshots the run after ``epoch`` (if the snapshot mode keeps it).

        Raises:
            NotSetupError: If :meth:`setup` was not called.
            ConfigError: If the algorithm cannot be snapshotted.
        """
        if not self._has_setup:
            raise NotSetupError("Use setup() to setup trainer before saving.")
        if not self._snapshotter.wants(epoch):
            return
        if not isinstance(self._algo, SnapshotAlgorithm):
            raise ConfigError(
                f"cannot snapshot {type(self._algo).__name__}: snapshots hold no pickle, so the "
                "algorithm must give its state as snapshot_state() -> (tensors, json) and take "
                "it back with restore_state(); or use snapshot_mode='none'"
            )
        if self._sampler is not None:
            self._stats.next_request = self._sampler.requests_made
        algo_tensors, algo_metadata = self._algo.snapshot_state()
        tensors = {ALGO_PREFIX + name: value for name, value in algo_tensors.items()}
        if self._train_args is not None and self._train_args.store_episodes:
            tensors.update(episode_tensors(self.step_episode))
        metadata = {
            "seed": self._seed,
            "env": _env_description(self._env),
            "algorithm": type(self._algo).__qualname__,
            "stats": asdict(self._stats),
            "train_args": None if self._train_args is None else asdict(self._train_args),
            "algo": algo_metadata,
        }
        path = self._snapshotter.save(Snapshot(epoch, tensors, metadata))
        logger.info("saved the snapshot of epoch %d to %s", epoch, path)

    def restore(
        self, from_dir: str | os.PathLike[str], from_epoch: int | str = "last"
    ) -> TrainArgs:
        """Restores a run from a snapshot into the set-up algorithm.

        Snapshots hold no code: build the algorithm and env as the saved
        run did and call :meth:`setup` first; ``restore`` then loads the
        algorithm's state, the counters, the training arguments and the
        sampler's seed and position, and :meth:`resume` continues with the
        epoch after the snapshot's.

        Args:
            from_dir: The snapshot directory.
            from_epoch: An epoch number, or ``"last"``.

        Returns:
            The restored training arguments (``start_epoch`` is the next epoch).

        Raises:
            NotSetupError: If :meth:`setup` was not called.
            ConfigError: If there is no such snapshot, or it was taken of
                another algorithm class or env.
            SnapshotError: If a file of the snapshot is unreadable, or a key
                or tensor is missing, of the wrong type, dtype or shape, out
                of range or not finite (a ConfigError naming the file and
                the key). Nothing was changed then.
        """
        if not self._has_setup:
            raise NotSetupError(
                "Use setup() to setup trainer before restore(): snapshots hold no code, so "
                "build the algorithm and env as the saved run did, setup(), then restore()"
            )
        snapshot = Snapshotter.load(from_dir, from_epoch)
        meta = snapshot.metadata
        for key, now in (
            ("algorithm", type(self._algo).__qualname__),
            ("env", _env_description(self._env)),
        ):
            if meta.get(key) != now:
                raise ConfigError(
                    f"snapshot of epoch {snapshot.epoch} in {str(from_dir)!r} was taken of {key} "
                    f"{meta.get(key)!r}, but the trainer is set up with {now!r}; set up the "
                    "trainer as the saved run was"
                )
        if not isinstance(self._algo, SnapshotAlgorithm):
            raise ConfigError(
                f"cannot restore {type(self._algo).__name__}: it has no restore_state()"
            )
        # Everything is checked before anything changes: a refused restore
        # leaves the algorithm, the counters and the sampler as they were.
        directory = snapshot.path or Path(from_dir)
        check_trainer_metadata(
            meta,
            directory,
            stats_keys=tuple(f.name for f in fields(TrainerStats)),
            train_args_keys=tuple(f.name for f in fields(TrainArgs)),
        )
        algo_tensors = {
            name[len(ALGO_PREFIX) :]: value
            for name, value in snapshot.tensors.items()
            if name.startswith(ALGO_PREFIX)
        }
        check_algo_state(algo_tensors, meta["algo"], self._algo.snapshot_state(), directory)
        restore_or_undo(self._algo, algo_tensors, meta["algo"], directory)
        self._stats = TrainerStats(**meta["stats"])
        self._train_args = TrainArgs(**{**meta["train_args"], "start_epoch": snapshot.epoch + 1})
        if meta["seed"] != self._seed:
            self._seed = int(meta["seed"])
            self._shutdown_worker()  # rebuilt with the saved seed by the next epoch
        elif self._sampler is not None:
            self._sampler.set_next_request(self._stats.next_request)
        self._diagnostics.rewind(snapshot.epoch)
        logger.info(
            "restored epoch %d from %s (seed %d, next request %d, %d env steps)",
            snapshot.epoch,
            from_dir,
            self._seed,
            self._stats.next_request,
            self._stats.total_env_steps,
        )
        return copy.copy(self._train_args)

    def log_diagnostics(self, pause_for_plot: bool = False) -> None:
        """Writes the epoch's tabular (CSV, TensorBoard, text table).

        Adds ``TotalEnvSteps``, ``Time`` (seconds since training started)
        and ``ItrTime`` (seconds of this epoch) to what the algorithm recorded.

        Args:
            pause_for_plot: Ignored: rlfleet draws no live plots.
        """
        del pause_for_plot
        now = time.time()
        self.tabular.record("TotalEnvSteps", self._stats.total_env_steps)
        self.tabular.record("Time", now - self._start_time)
        self.tabular.record("ItrTime", now - self._itr_start_time)
        self._diagnostics.dump(self._stats.total_epoch, self.tabular.as_dict())

    def get_env_copy(self) -> Any:
        """A copy of the set-up env (None before :meth:`setup`)."""
        return copy.deepcopy(self._env) if self._env is not None else None

    @property
    def total_env_steps(self) -> int:
        """Env steps sampled so far."""
        return self._stats.total_env_steps

    @total_env_steps.setter
    def total_env_steps(self, value: int) -> None:
        self._stats.total_env_steps = value

    @property
    def sampler(self) -> Any:
        """The sampler (None before set-up or after training shut it down)."""
        return self._sampler

    def close(self) -> None:
        """Stops the sampler (and a fleet the trainer started) and closes the logs."""
        self._shutdown_worker()
        self._diagnostics.close()

    # ------------------------------------------------------------ internals

    def _run(self) -> float:
        try:
            return float(self._algo.train(self))
        finally:
            self._shutdown_worker()
            self._diagnostics.close()

    def _require_train_args(self) -> TrainArgs:
        if self._train_args is None:
            raise NotSetupError("step_epochs() runs inside train() or resume()")
        return self._train_args

    def _start_worker(self) -> None:
        if self._sampler is None and self._make is not None:
            self._sampler = self._make()
        if self._sampler is not None:
            self._sampler.set_next_request(self._stats.next_request)

    def _shutdown_worker(self) -> None:
        if self._sampler is not None:
            self._stats.next_request = self._sampler.requests_made
        closer, self._closer = self._closer, None
        sampler, self._sampler = self._sampler, None
        if closer is not None:
            closer()
        elif sampler is not None:
            sampler.close()


def _check_train_args(n_epochs: int, batch_size: int | None, plot: bool) -> None:
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or n_epochs < 0:
        raise ConfigError(f"n_epochs must be an int >= 0, got {n_epochs!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ConfigError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
    if plot:
        raise ConfigError(
            "plot=True is not supported: rlfleet's Trainer draws no live plots; chart the "
            "TensorBoard event files in the snapshot directory instead"
        )


def _env_description(env: Any) -> Any:
    if isinstance(env, str):
        env = EnvConfig(env)
    if isinstance(env, EnvConfig):
        return env.to_dict()
    return type(env).__qualname__
