"""A worker's episode units: queued, started on idle slots, finished and not taken.

:class:`UnitQueue` is the bookkeeping under :class:`~rlfleet.worker.vec.VecWorker`'s
incremental API (``submit``, ``step``, ``take_finished``, ``cancel``) and
the engine's :class:`~rlfleet.worker._segments.Sink` while units run: a
finished episode joins the finished list; one whose env crashed and was
rebuilt goes back to the front of the queue, to be re-run from its seeds.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable

import numpy as np

from rlfleet._util.values import check_int
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.seeding import (
    NO_ENV_SEED,
    NO_POLICY_SEED,
    generator_states,
    set_generator_state,
)
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._engine import SlotEngine
from rlfleet.worker._episode_buffer import Segment, StepRing, record_key
from rlfleet.worker._native_columns import FinishedTable, RowsPart
from rlfleet.worker._segments import Live
from rlfleet.worker.units import QueuedUnit

#: Prepared generator states a worker keeps at most (see VecWorker.prepare).
_MAX_PREPARED = 1 << 16
#: Queued units prepared with an unprepared one that starts.
_PREPARE_AHEAD = 255


class UnitQueue:
    """The episode units of one worker, from submission to being taken.

    Args:
        engine: The worker's engine (the units run on its slots).
        worker_number: Recorded in each episode's infos.
        agent_version: The agent version now in force.
    """

    #: A unit interrupted by an env crash is re-run whole, never cut.
    keeps_partial = False

    def __init__(
        self, engine: SlotEngine, *, worker_number: int, agent_version: Callable[[], int]
    ) -> None:
        self._engine = engine
        self._worker_number = worker_number
        self._agent_version = agent_version
        self.queue: collections.deque[QueuedUnit] = collections.deque()
        # One generator per slot, put in each episode's state when it starts:
        # a default_rng per episode cost about 8 us, a third of the episode's
        # bookkeeping. Its states are computed many units at once (prepare).
        self._slot_rngs = [np.random.Generator(np.random.PCG64(0)) for _ in range(engine.n_envs)]
        self._rng_states: dict[int, tuple[int, int]] = {}
        # The finished episodes: Segments, and a native backend's rows.
        self.finished: list[Segment] = []
        #: Steps of the finished segments (a native backend's are the table's).
        self.segment_steps = 0
        self.table = FinishedTable()

    @property
    def finished_count(self) -> int:
        """Finished episodes not taken yet."""
        return len(self.finished) + self.table.count

    @property
    def finished_steps(self) -> int:
        """Steps of the finished episodes not taken yet."""
        return self.segment_steps + self.table.steps

    # ------------------------------------------------------- the engine's Sink

    def on_record(self, slot: int, live: Live, record: Segment, continues: bool) -> None:
        """A unit's episode finished."""
        self.finished.append(record)
        self.segment_steps += record.length

    def on_rows(
        self, ring: StepRing, spec: EnvSpec, rows: list[int], steps: int, first_start: int
    ) -> None:
        """A native backend's episodes finished at one vector step."""
        self.table.add(ring, spec, rows, steps, first_start)

    def on_env_failure(self, slot: int, live: Live, restarted: bool) -> None:
        """A unit's env crashed in ``step``."""
        if restarted and live.unit is not None:
            # Re-run from its seeds: the episode stays the same episode.
            self.queue.appendleft(live.unit)

    # ------------------------------------------------------------------ units

    def prepare(self, units: Iterable[QueuedUnit] | UnitColumns) -> None:
        """Computes the generator states of units (see ``VecWorker.prepare``)."""
        if self._engine.native is not None:
            return  # a native engine samples every row from one generator
        known = self._rng_states
        if isinstance(units, UnitColumns):
            policy_seeds = units.policy_seeds.tolist()
        else:
            policy_seeds = [unit.policy_seed for unit in units]
        seeds = [seed for seed in policy_seeds if seed not in known]
        if len(known) + len(seeds) > _MAX_PREPARED:
            known.clear()  # states of cancelled units, never started
        known.update(zip(seeds, generator_states(seeds), strict=True))

    def start(self) -> int:
        """Starts queued units on the engine's idle slots; returns how many started."""
        engine = self._engine
        if engine.native is not None:
            return self._start_native()
        started = []
        native = False
        for slot in engine.idle_slots:
            if not self.queue:
                break
            unit = self.queue.popleft()
            rng = self._slot_rngs[slot]
            if not native:  # a native engine samples every row from one generator
                state = self._rng_states.pop(unit.policy_seed, None)
                if state is None:
                    # With the next queued units, not all: surplus units are
                    # often cancelled before they start.
                    self.prepare([unit, *itertools.islice(self.queue, _PREPARE_AHEAD)])
                    state = self._rng_states.pop(unit.policy_seed)
                set_generator_state(rng, state)
            live = Live(
                unit=unit,
                rng=rng,
                # EPISODE_INFO_KEYS order.
                meta=(
                    self._agent_version(),
                    NO_ENV_SEED if native else unit.env_seed,
                    NO_POLICY_SEED if native else unit.policy_seed,
                    unit.episode_index,
                    self._worker_number,
                ),
                key=(unit.request, unit.episode_index),
            )
            if engine.begin(slot, live, unit.env_seed):
                started.append(slot)
        engine.reset_policy_rows(started)
        return len(started)

    def _start_native(self) -> int:
        """:meth:`start` on a native engine: a few of these start every vector step.

        The units go to the engine's per-slot lists as they are: no object
        per episode.
        """
        engine, queue = self._engine, self.queue
        slots = engine.idle_slots
        if len(slots) > len(queue):
            del slots[len(queue) :]
        if not slots:
            return 0
        popleft = queue.popleft
        units = [popleft() for _ in slots]
        engine.begin_native(slots, units, self._agent_version(), self._worker_number)
        engine.reset_policy_rows(slots)
        return len(slots)

    def take(
        self, max_episodes: int | None, request: int | None
    ) -> tuple[EnvSpec, list[Segment] | list[RowsPart]] | None:
        """Removes the finished episodes ``VecWorker.take_finished`` returns, in order.

        Returns:
            Their env's spec and the episodes: segments, or a native
            backend's rows (in runs of one ring's arrays). Segments and rows
            (an env update between the two kinds) are taken apart, the
            lowest (request, episode index) first, as one kind's envs are.
        """
        if max_episodes is not None:
            check_int("max_episodes", max_episodes, minimum=1)
        table = self.table
        if not table.count:
            return self._take_segments(max_episodes, request)
        if not self.finished:
            return table.take(max_episodes, request)
        first = table.first_key()
        kinds = [table.take, self._take_segments]
        if first is not None and first > min(record_key(r) for r in self.finished)[:2]:
            kinds.reverse()
        for take in kinds:
            taken = take(max_episodes, request)
            if taken is not None:
                return taken
        return None

    def _take_segments(
        self, max_episodes: int | None, request: int | None
    ) -> tuple[EnvSpec, list[Segment]] | None:
        """:meth:`take` of the finished segments."""
        if request is None:
            chosen = list(self.finished)
        else:
            chosen = [r for r in self.finished if r.key[0] == request]
        if not chosen:
            return None
        chosen.sort(key=record_key)
        spec = chosen[0].env_spec
        everything = max_episodes is None and len(chosen) == len(self.finished)
        if everything and all(r.env_spec is spec for r in chosen):  # the usual case
            self.finished = []
            self.segment_steps = 0
            return spec, chosen
        chosen = [r for r in chosen if r.env_spec is spec][:max_episodes]
        taken = {id(r) for r in chosen}
        self.finished = [r for r in self.finished if id(r) not in taken]
        self.segment_steps -= sum(r.length for r in chosen)
        return spec, chosen

    def cancel(self, episode_indices: Iterable[int] | None, request: int | None) -> list[int]:
        """Drops queued, in-flight and finished units (see ``VecWorker.cancel``)."""
        indices = None if episode_indices is None else set(episode_indices)

        def matches(unit_request: int, index: int) -> bool:
            return (indices is None or index in indices) and (
                request is None or unit_request == request
            )

        cancelled = [u.episode_index for u in self.queue if matches(u.request, u.episode_index)]
        self.queue = collections.deque(
            u for u in self.queue if not matches(u.request, u.episode_index)
        )
        for slot, unit in self._engine.running_units():
            if matches(unit.request, unit.episode_index):
                cancelled.append(unit.episode_index)
                self._engine.drop(slot)
        kept = []
        for record in self.finished:
            record_request, index = record.key
            if matches(record_request, index):
                cancelled.append(index)
                self.segment_steps -= record.length
            else:
                kept.append(record)
        self.finished = kept

        def rows_match(requests: np.ndarray, row_indices: np.ndarray) -> np.ndarray:
            chosen = np.ones(len(requests), dtype=bool) if request is None else requests == request
            if indices is not None:
                chosen &= np.isin(row_indices, np.fromiter(indices, np.int64, len(indices)))
            return chosen

        cancelled += self.table.drop(rows_match)
        return sorted(cancelled)

    def abort_in_flight(self) -> None:
        """Re-queues in-flight units at the front of the queue, in order."""
        units = [live.unit for live in self._engine.drop_all() if live.unit is not None]
        for unit in sorted(units, key=lambda u: (u.request, u.episode_index), reverse=True):
            self.queue.appendleft(unit)

    def clear(self) -> None:
        """Forgets every queued and finished unit (the engine drops the running ones)."""
        self.queue.clear()
        self.finished = []
        self.segment_steps = 0
        self.table.clear()
