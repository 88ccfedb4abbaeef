"""VecWorker: n env copies stepped together with one batched policy call.

This is everything a worker does on one machine. The remote worker runs
exactly this class and drives it between network messages through the
incremental API (:meth:`VecWorker.submit`, :meth:`VecWorker.step`,
:meth:`VecWorker.take_finished`, :meth:`VecWorker.cancel`); samplers on one
machine use :meth:`VecWorker.run` and :meth:`VecWorker.collect_fragments`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Literal

import gymnasium as gym

from rlfleet._util.values import check_int
from rlfleet.core._pieces import EpisodePieces
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError, InvalidValueError, UsageError, WrongTypeError
from rlfleet.policies.base import Policy
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._engine import SlotEngine
from rlfleet.worker._episode_buffer import (
    EPISODE_INFO_KEYS,
    FRAGMENT_INFO_KEYS,
    Segment,
    build_batch,
    build_pieces,
)
from rlfleet.worker._installs import WorkerInstalls
from rlfleet.worker._native_columns import RowsPart, build_rows_batch, build_rows_pieces
from rlfleet.worker._restarts import EnvRestartBudget, RestartLedger
from rlfleet.worker._streams import FragmentStreams
from rlfleet.worker._unit_queue import UnitQueue
from rlfleet.worker._updates import (
    AgentUpdate,
    EnvUpdate,
)
from rlfleet.worker.units import EpisodeUnit, UnitRow

NanMode = Literal["error", "flag", "ignore"]
_NAN_MODES = ("error", "flag", "ignore")


class VecWorker:
    """Runs ``n_envs`` env copies, stepping all busy ones with one policy call.

    **Episodes and determinism.** Work arrives as :class:`EpisodeUnit` s,
    each carrying its episode index and seeds. A slot starting a unit calls
    ``env.reset(seed=unit.env_seed)`` and gives the episode its own
    generator in the state of ``numpy.random.default_rng(unit.policy_seed)``
    (the slot's generator, reseeded), passed as that row's generator to
    ``policy.get_actions``. So an episode depends only on its
    unit and the agent, never on which worker or slot ran it. Finished
    episodes come out of :meth:`take_finished` ordered by (request, episode
    index), concatenated into one :class:`~rlfleet.core.EpisodeBatch`.

    **Agent and env updates abort in-flight episodes.** An update applied
    while episodes run aborts them and re-queues their units (same seeds) at
    the front of the queue. Every episode is therefore produced by exactly
    one agent version and one env: an on-policy learner can trust the
    ``agent_version`` of each episode, and an episode re-run after the
    update is the same episode the new agent would have produced from the
    start. Before any policy is given, the worker acts with
    :class:`~rlfleet.policies.RandomPolicy`.

    **Step types.** gymnasium ``terminated`` gives TERMINAL; ``truncated``
    or reaching ``max_episode_length`` gives TIMEOUT
    (:func:`~rlfleet.core.step_type_from_gym`); ``last_observations`` hold
    the observation returned by the last step.

    **episode_infos** (int64): ``agent_version``, ``env_seed``,
    ``policy_seed``, ``episode_index``, ``worker`` (the worker number);
    fragments add ``stream`` and ``fragment_index`` (see
    :meth:`collect_fragments`). env_infos hold the gymnasium info keys
    present at every step of an episode.

    **Crashing envs.** An env that raises in ``reset`` or ``step`` is closed,
    rebuilt, and its episode re-run from the unit's seeds, within
    ``max_env_restarts``. Past the budget the unit is dropped and
    :class:`~rlfleet.errors.EnvError` is raised once the current step has
    finished for every other slot, so the worker stays usable. An env given
    as an instance cannot be rebuilt, so its crashes always raise. With
    ``EnvConfig(..., vectorization="subprocess")`` each slot's env runs in a
    child process; a child that dies is such a crash (the slot gets a new
    child).

    **Non-finite observations** (``nan_observations``): ``"error"`` drops the
    episode and raises EnvError naming the env index and the step that
    returned it (checked in one vectorised call when the episode ends; on a
    native env, each vector step's observations in a few whole-batch calls
    and the episode exactly when they found something; at once if the
    policy fails on it); ``"flag"`` adds a bool env_info
    ``nonfinite_obs``, True for steps whose observation or next observation
    holds NaN or inf (present in every batch in this mode); ``"ignore"``.

    **Bad actions** (``check_actions``): actions of the wrong shape or dtype
    kind, outside a Discrete / MultiDiscrete / MultiBinary space, or NaN
    raise :class:`~rlfleet.errors.PolicyError` naming the env index and the
    action. Box bounds are not enforced (garage does not clip; gymnasium Box
    envs clip themselves). When the policy fails, in-flight episodes are
    aborted and re-queued, so an agent update that fixes the policy re-runs
    them from their seeds.

    Args:
        n_envs: Number of env copies (slots).
        seed: Base seed of policies built from specs (initial weights) and of
            the default RandomPolicy; episode seeds come with the units.
        max_episode_length: Cut episodes off after this many steps (TIMEOUT);
            None uses the env update's ``max_episode_length``, else the
            env's registered limit.
        worker_number: This worker's number, recorded in episode_infos.
        env: Initial env update (EnvConfig, env factory or gymnasium Env).
        policy: Initial policy (Policy, PolicySpec or spec name); None acts
            randomly.
        max_env_restarts: An :class:`EnvRestartBudget` (default: at most 5
            restarts a minute, 50 in the worker's lifetime), or an int n for
            at most n restarts in the worker's lifetime.
        nan_observations: ``"error"``, ``"flag"`` or ``"ignore"``.
        check_actions: Validate each action batch (a few vectorised numpy
            calls per step).
        name: Names the worker in errors; defaults to ``str(worker_number)``.

    Raises:
        ConfigError: If an argument is invalid.
    """

    def __init__(
        self,
        *,
        n_envs: int,
        seed: int = 0,
        max_episode_length: int | None = None,
        worker_number: int = 0,
        env: EnvUpdate = None,
        policy: AgentUpdate = None,
        max_env_restarts: int | EnvRestartBudget = EnvRestartBudget(),  # noqa: B008 (frozen)
        nan_observations: NanMode = "error",
        check_actions: bool = True,
        name: str | None = None,
    ) -> None:
        check_int("n_envs", n_envs, minimum=1)
        check_int("seed", seed, minimum=0)
        check_int("worker_number", worker_number, minimum=0)
        if max_episode_length is not None:
            check_int("max_episode_length", max_episode_length, minimum=1)
        if nan_observations not in _NAN_MODES:
            raise ConfigError(
                f"nan_observations must be one of {_NAN_MODES}, got {nan_observations!r}"
            )
        self.n_envs = n_envs
        self.worker_number = worker_number
        self.name = name if name is not None else str(worker_number)
        self._engine = SlotEngine(
            n_envs,
            name=self.name,
            nan_mode=nan_observations,
            check_actions=check_actions,
            ledger=RestartLedger(EnvRestartBudget.coerce(max_env_restarts)),
        )
        self._closed = False
        self._units = UnitQueue(
            self._engine, worker_number=worker_number, agent_version=self._agent_version
        )
        self._streams = FragmentStreams(
            self._engine, worker_number=worker_number, agent_version=self._agent_version
        )
        self._installs = WorkerInstalls(
            self._engine,
            seed=seed,
            max_episode_length=max_episode_length,
            abort=self._abort_in_flight,
            abandon_streams=self._streams.abandon,
        )
        self.update_env(env)
        self.update_agent(policy, version=0)

    def __repr__(self) -> str:
        env = self._engine.source_name
        return (
            f"VecWorker(name={self.name!r}, n_envs={self.n_envs}, env={env}, "
            f"agent_version={self._installs.agent_version}, queued={len(self._units.queue)}, "
            f"active={self._engine.n_live}, finished={self._units.finished_count})"
        )

    # ------------------------------------------------------------ properties

    @property
    def env_spec(self) -> EnvSpec:
        """The current env's spec, including the effective max_episode_length.

        Raises:
            ConfigError: If the worker has no env yet.
        """
        spec = self._engine.spec
        if spec is None:
            raise self._no_env()
        return spec

    @property
    def policy(self) -> Policy | None:
        """The policy the worker acts with (None until it has an env or a Policy)."""
        return self._engine.policy

    @property
    def agent_version(self) -> int:
        """Version of the current agent (0 initially, +1 per agent update)."""
        return self._installs.agent_version

    @property
    def envs(self) -> list[gym.Env | None]:
        """The env of each slot (None while a crashed env awaits rebuilding).

        None too for envs that live elsewhere (a subprocess or native backend).
        """
        return self._engine.envs

    @property
    def native(self) -> bool:
        """Whether the env is a native vector env (one object stepping every slot)."""
        return self._engine.native is not None

    @property
    def restarts(self) -> int:
        """Envs rebuilt after a crash, over the worker's lifetime."""
        return self._engine.failures.ledger.total

    # The two reads a remote worker makes after every vector step: one call
    # each, not a property of the UnitQueue's behind it.
    @property
    def finished_count(self) -> int:
        """Finished episodes not yet taken."""
        units = self._units
        return len(units.finished) + units.table.count

    @property
    def finished_steps(self) -> int:
        """Total steps of the finished episodes not yet taken."""
        units = self._units
        return units.segment_steps + units.table.steps

    @property
    def active_count(self) -> int:
        """Episodes in flight (one per busy slot)."""
        return self._engine.n_live

    def unit_counts(self) -> tuple[int, int]:
        """``(active_count, queued_count)``: what a TaskBook reads before each vector step."""
        return self._engine.n_live, len(self._units.queue)

    @property
    def active_steps(self) -> int:
        """Steps taken so far by the episodes in flight."""
        now = self._engine.step_count
        return sum(now - start for start in self._engine.running_starts())

    @property
    def queued_count(self) -> int:
        """Units waiting for a free slot."""
        return len(self._units.queue)

    @property
    def idle(self) -> bool:
        """True when nothing is queued or in flight (finished ones may wait)."""
        return not self._units.queue and not self._engine.n_live

    # --------------------------------------------------------------- updates

    def update_agent(self, agent_update: AgentUpdate, version: int | None = None) -> int:
        """Applies an agent update; aborts and re-queues in-flight episodes.

        Args:
            agent_update: A dict of parameter arrays (``set_param_values`` on
                the current policy), a Policy (replaces it), a PolicySpec or
                its name (built with ``make_policy``, seeded with the worker's
                seed), or None (no change).
            version: The agent version to record; None bumps it by one.

        Returns:
            The agent version now in force.

        Raises:
            PolicyError: If the parameters do not fit the policy (nothing
                changes then).
            ConfigError: If a spec cannot be built.
            WrongTypeError: If the update is of another type.
        """
        self._require_open()
        return self._installs.update_agent(agent_update, version)

    def update_env(self, env_update: EnvUpdate) -> None:
        """Replaces the envs; aborts and re-queues in-flight episodes.

        Args:
            env_update: An EnvConfig or env factory (called once per slot,
                and again to rebuild a crashed env), a gymnasium Env (slot 0
                uses it, the others get deep copies), or None (no change).

        Raises:
            ConfigError: If the env cannot be built or its observations have
                no array shape (Dict, Tuple: flatten them).
            WrongTypeError: If the update is of another type.
        """
        self._require_open()
        self._installs.update_env(env_update)

    # ------------------------------------------------------ incremental API

    def submit(self, units: Iterable[EpisodeUnit]) -> None:
        """Queues units (FIFO); idle slots take them at the start of a step.

        Units reuse the envs of fragment streams; a stream's episode left
        between windows is rebuilt by replay on the next
        :meth:`collect_fragments`, so episode requests between fragment
        requests change no stream.

        Raises:
            WrongTypeError: If an item is not an EpisodeUnit.
        """
        self._require_open()
        units = list(units)
        # The check's loop in C (a session submits a few units every few
        # vector steps); the first unit that fails it is found only then.
        if not all(map(isinstance, units, repeat(EpisodeUnit))):
            wrong = next(unit for unit in units if not isinstance(unit, EpisodeUnit))
            raise WrongTypeError(f"submit() takes EpisodeUnit objects, got {type(wrong).__name__}")
        self.submit_rows(units)

    def submit_rows(self, units: list[UnitRow] | list[EpisodeUnit]) -> None:
        """:meth:`submit` of units checked already: rows of checked columns.

        Args:
            units: Rows of columns checked once (a TaskBook's tasks', the
                in-process sampler's: :meth:`UnitRow.of_columns`,
                :meth:`UnitRow.many`), or checked EpisodeUnits.
        """
        if units:
            self._streams.release_envs()
        self._units.queue.extend(units)

    def drop_queued(self) -> list[EpisodeUnit]:
        """Removes the units not started yet; returns them in queue order."""
        units = [u if isinstance(u, EpisodeUnit) else u.unit() for u in self._units.queue]
        self._units.queue.clear()
        return units

    def prepare(self, units: Iterable[EpisodeUnit] | UnitColumns) -> None:
        """Computes the action generators' states of units to submit later.

        A unit's episode samples with a generator in the state of
        ``default_rng(unit.policy_seed)``; computing that state for many
        units in one vectorised call (:func:`rlfleet.core.seeding.generator_states`)
        costs a fraction of building each generator. A worker that submits
        units a few at a time (the remote worker) prepares each task's units
        when the task arrives; units submitted unprepared are prepared with
        the next queued ones when the first of them starts.

        Args:
            units: The units, or their columns (a task's, as they arrived).
        """
        self._units.prepare(units)

    def start_queued(self) -> int:
        """Starts queued units on idle slots now (``step`` does this itself).

        Returns:
            The number of episodes started.

        Raises:
            EnvError: If an env failed past the restart budget.
        """
        self._require_open()
        started = self._start_queued()
        self._engine.raise_deferred()
        return started

    def step(self) -> int:
        """Takes one vector step over the busy slots.

        Idle slots first take queued units (resetting their envs). Finished
        episodes are kept until :meth:`take_finished`.

        Returns:
            The number of env steps taken (0 when idle).

        Raises:
            EnvError: If an env failed past the restart budget, or returned a
                non-finite observation in ``"error"`` mode; the other slots
                have completed the step.
            PolicyError: If the policy's actions are invalid (in-flight
                episodes are aborted and re-queued).
        """
        if self._closed:
            self._require_open()
        if self._units.queue and self._engine.n_live < self.n_envs:
            self._start_queued()
        try:
            taken = self._engine.advance(self._units)
        except Exception:
            self._abort_in_flight()
            raise
        if self._engine.failures.errors:
            self._engine.raise_deferred()
        return taken

    def take_finished(
        self, max_episodes: int | None = None, *, request: int | None = None
    ) -> EpisodeBatch | None:
        """Removes and returns finished episodes as one batch.

        Args:
            max_episodes: Take at most this many (the lowest-ordered ones).
            request: Take only this request's episodes.

        Returns:
            The episodes ordered by (request, episode index), or None if
            there are none. A batch never mixes envs: after an env update,
            the old env's episodes come out first.
        """
        taken = self._take(max_episodes, request)
        return None if taken is None else self._build_batch(*taken, EPISODE_INFO_KEYS)

    def take_finished_pieces(self, *, request: int | None = None) -> EpisodePieces | None:
        """:meth:`take_finished`, the step data left in the ring (for a remote worker).

        The serializer copies the pieces once, straight into the outgoing
        messages (:func:`rlfleet.wire.serialize_batch_messages`); the bytes
        are those of :meth:`take_finished`'s batch.

        Args:
            request: Take only this request's episodes.

        Returns:
            As :meth:`take_finished`, as an ``EpisodePieces`` (rlfleet/core/_pieces.py).
        """
        taken = self._take(None, request)
        if taken is None:
            return None
        spec, chosen = taken
        checked = self._checked(spec)
        if isinstance(chosen[0], tuple):  # a native backend's rows: gathered in one go
            return build_rows_pieces(spec, chosen, EPISODE_INFO_KEYS, actions_checked=checked)
        return build_pieces(spec, chosen, EPISODE_INFO_KEYS, actions_checked=checked)

    def _take(
        self, max_episodes: int | None, request: int | None
    ) -> tuple[EnvSpec, list[Segment] | list[RowsPart]] | None:
        """Removes the finished segments :meth:`take_finished` returns, in order."""
        return self._units.take(max_episodes, request)

    def cancel(
        self, episode_indices: Iterable[int] | None = None, request: int | None = None
    ) -> list[int]:
        """Drops queued, in-flight and finished-but-untaken episodes.

        In-flight episodes' partial data is discarded and their slots become
        idle.

        Args:
            episode_indices: Which episodes; None for all.
            request: Only this request's episodes; None for any request.

        Returns:
            The cancelled episode indices, sorted.
        """
        return self._units.cancel(episode_indices, request)

    def run(self, units: Iterable[EpisodeUnit]) -> EpisodeBatch:
        """Runs units to completion: submit, step until idle, take.

        Returns:
            Every finished episode (these and any left from before).

        Raises:
            InvalidValueError: If there is nothing to return.
        """
        self.submit(units)
        while not self.idle:
            self.step()
        batch = self.take_finished()
        if batch is None:
            raise InvalidValueError("VecWorker.run: no units were given and none had finished")
        return batch

    # -------------------------------------------------------------- fragments

    def collect_fragments(
        self,
        fragment_length: int,
        *,
        base_seed: int,
        first_stream: int = 0,
        streams: Sequence[int] | None = None,
        replays: Sequence[StreamReplay] = (),
        tick: Callable[[], object] | None = None,
    ) -> EpisodeBatch:
        """Collects exactly ``fragment_length`` steps from every slot.

        RLlib's ``truncate_episodes`` (garage's FragmentWorker): slot i runs
        the continuous stream ``first_stream + i``, whose episodes continue
        across calls. The k-th episode of a stream gets its seeds from
        :func:`rlfleet.core.seeding.stream_seeds` ``(base_seed, stream, k)``.

        Each call returns, per slot, ``fragment_length`` steps split at
        episode boundaries: every returned "episode" is a contiguous piece
        of one episode, never spanning two. A piece's first step is FIRST if
        it starts its episode, else MID. A piece cut by the window ends with
        MID (not TIMEOUT) and its last observation is the observation the
        next piece starts from, so a learner can bootstrap; a piece that ends
        its episode ends with TERMINAL or TIMEOUT.

        episode_infos: ``stream``, ``episode_index`` (the episode's index
        within its stream), ``fragment_index`` (the piece's index within its
        episode), ``agent_version`` (the agent that produced the piece),
        ``env_seed``, ``policy_seed``, ``worker``. Pieces are ordered by
        (stream, episode_index, fragment_index). A stream's pieces depend
        only on its id, the seed, and the agents and fragment lengths of the
        calls, not on which worker or slot runs it.

        ``streams`` runs other streams than ``first_stream + i``: slot i
        runs ``streams[i]``, slots past them idle. A stream's episode left
        cut by a window waits for the next call naming it, on whichever
        slot; if that slot's env ran another stream meanwhile, the env is
        rebuilt by replaying ``reset(seed)`` and the episode's actions.
        ``replays`` hands over streams another worker ran
        (:class:`StreamReplay`): their episodes are rebuilt the same way,
        and each one's policy generator is drawn as the policy draws on the
        replayed observations, so the stream goes on exactly as it would
        have there (for envs deterministic given seed and actions, and
        stateless policies whose draws depend only on the generator and
        the observation).

        An agent update between calls applies from the next call: episodes
        continue with the new policy; so does running episode units between
        calls (the envs they used are rebuilt by replay). An env update,
        calling with another ``base_seed``, or an error raised by this
        method abandons each stream's current episode (its pieces already returned
        stand); the stream continues with its next episode.
        An env that crashes mid-episode is rebuilt (within the restart
        budget), the piece so far is returned cut, and the stream moves on
        to its next episode.

        Args:
            fragment_length: Steps per slot per call (>= 1).
            base_seed: The sampler's seed.
            first_stream: Global stream id of slot 0 (without ``streams``).
            streams: The stream each slot runs (at most ``n_envs``, distinct).
            replays: Streams taken over from another worker, to rebuild
                before their first step here.
            tick: Called after every vector step (a remote worker
                heartbeats from it during long windows).

        Returns:
            ``n_envs * fragment_length`` steps.

        Raises:
            RuntimeError: If episode units are queued or in flight.
            EnvError: As :meth:`step`, or if a replayed episode does not
                lead back to its delivered observation (the env is not
                replayable).
            PolicyError: As :meth:`step`, or if a replay needs the draws
                of a stateful policy.
            ConfigError: If ``streams`` are too many, repeated or negative,
                or a replay names a stream not in ``streams``.
        """
        self._require_open()
        check_int("fragment_length", fragment_length, minimum=1)
        check_int("base_seed", base_seed, minimum=0)
        check_int("first_stream", first_stream, minimum=0)
        slots = (
            list(range(first_stream, first_stream + self.n_envs))
            if streams is None
            else self._check_streams(streams, replays)
        )
        if not self.idle:
            raise UsageError(
                f"collect_fragments needs a worker without episode units, but "
                f"{len(self._units.queue)} are queued and {self._engine.n_live} running; take or "
                "cancel them first"
            )
        if self._engine.spec is None:
            raise self._no_env()
        if self._engine.native is not None:
            raise ConfigError(
                f"worker {self.name!r} runs the native vector env {self._engine.source_name}, "
                "which resets finished envs itself and cannot keep fragment streams; sample "
                "episodes from it, or use an EnvConfig without vectorization for fragments"
            )
        pieces = self._streams.collect(fragment_length, base_seed, slots, tick, replays)
        return self._build_batch(self.env_spec, pieces, FRAGMENT_INFO_KEYS)

    def _check_streams(self, streams: Sequence[int], replays: Sequence[StreamReplay]) -> list[int]:
        slots = [int(stream) for stream in streams]
        if not 1 <= len(slots) <= self.n_envs or len(set(slots)) != len(slots):
            raise ConfigError(
                f"streams must name 1 to n_envs={self.n_envs} distinct streams, got {slots[:8]}"
            )
        if min(slots) < 0:
            raise ConfigError(f"streams must be >= 0, got {slots[:8]}")
        foreign = [r.stream for r in replays if r.stream not in slots]
        if foreign:
            raise ConfigError(f"replays name streams {foreign[:8]} that are not in streams")
        return slots

    # --------------------------------------------------------------- closing

    def shutdown(self) -> None:
        """Closes every env and drops all work. Safe to call twice."""
        if self._closed:
            return
        self._engine.drop_all()
        self._units.clear()
        self._streams.abandon()
        self._engine.close_envs()
        self._closed = True

    # ------------------------------------------------------------ internals

    def _require_open(self) -> None:
        if self._closed:
            raise UsageError(f"worker {self.name!r} was shut down")

    def _build_batch(
        self,
        spec: EnvSpec,
        segments: Sequence[Segment] | Sequence[RowsPart],
        info_keys: Sequence[str],
    ) -> EpisodeBatch:
        """The segments' batch, re-checking only what stepping did not guarantee.

        The engine checked every action's shape if ``check_actions`` is on and
        the action space has an array shape (the checker's rule); else the
        batch checks the actions.
        """
        checked = self._checked(spec)
        if isinstance(segments[0], tuple):  # a native backend's rows: gathered in one go
            return build_rows_batch(spec, segments, info_keys, actions_checked=checked)  # type: ignore[arg-type]
        return build_batch(spec, segments, info_keys, from_ring=True, actions_checked=checked)  # type: ignore[arg-type]

    def _checked(self, spec: EnvSpec) -> bool:
        """Whether stepping checked every action's shape (the ActionChecker's rule)."""
        return self._engine.check_actions and spec.action_space.shape is not None

    def _agent_version(self) -> int:
        return self._installs.agent_version

    def _no_env(self) -> ConfigError:
        return ConfigError(f"worker {self.name!r} has no env: pass env= or call update_env() first")

    def _start_queued(self) -> int:
        """Starts queued units on idle slots; returns how many started."""
        engine = self._engine
        if not self._units.queue or engine.n_live == self.n_envs:
            return 0
        if engine.spec is None:
            raise self._no_env()
        return self._units.start()

    def _abort_in_flight(self) -> None:
        """Re-queues in-flight units at the front of the queue, in order."""
        self._units.abort_in_flight()


__all__ = ["NanMode", "VecWorker"]
