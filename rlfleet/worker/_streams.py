"""Fragment streams: each env slot runs episodes that continue across calls."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlfleet.seeding import stream_seeds
from rlfleet.worker._engine import Live, SlotEngine
from rlfleet.worker._episode_buffer import Segment, record_key


class FragmentStreams:
    """The fragment streams of a worker's slots (``VecWorker.collect_fragments``).

    Implements the engine's Sink during a :meth:`collect` call: a piece cut
    by the window parks its episode on the slot (with the observation it
    continues from), and the next call resumes it. Episode numbers are kept
    per (base seed, stream), so a stream whose episode was abandoned goes on
    with its next episode, never repeating seeds.

    Args:
        engine: The worker's engine.
        worker_number: Recorded in episode_infos.
        agent_version: Returns the agent version in force.
    """

    keeps_partial = True

    def __init__(
        self, engine: SlotEngine, *, worker_number: int, agent_version: Callable[[], int]
    ) -> None:
        self._engine = engine
        self._worker_number = worker_number
        self._agent_version = agent_version
        self._parked: list[Live | None] = [None] * engine.n_envs
        self._next_episode: dict[tuple[int, int], int] = {}
        self._quota = [0] * engine.n_envs
        self._pieces: list[Segment] = []

    def abandon(self) -> None:
        """Ends every stream's current episode; streams go on with the next one."""
        self._parked = [None] * len(self._parked)

    def collect(
        self,
        length: int,
        base_seed: int,
        first_stream: int,
        tick: Callable[[], object] | None = None,
    ) -> list[Segment]:
        """Steps every slot ``length`` times; returns the pieces in order.

        ``tick`` runs after every vector step: a window may last longer
        than the coordinator's heartbeat timeout, and the worker must go on
        beating during it.
        """
        for slot, parked in enumerate(self._parked):
            if parked is not None and parked.stream != (base_seed, first_stream + slot):
                self._parked[slot] = None
        self._quota = [length] * len(self._quota)
        self._pieces = []
        try:
            while any(self._quota):
                self._fill(base_seed, first_stream)
                self._engine.advance(self)
                self._engine.raise_deferred()
                if tick is not None:
                    tick()
            return sorted(self._pieces, key=record_key)
        except BaseException:
            self._engine.drop_all()
            self.abandon()
            raise
        finally:
            self._pieces = []
            self._quota = [0] * len(self._quota)

    def _fill(self, base_seed: int, first_stream: int) -> None:
        """Gives idle slots with quota left their stream's current or next episode."""
        engine = self._engine
        started = []
        for slot in engine.idle_slots:
            if not self._quota[slot]:
                continue
            window_end = engine.step_count + self._quota[slot] - 1
            parked = self._parked[slot]
            if parked is not None:
                self._parked[slot] = None
                self._continue(parked)
                engine.resume(slot, parked, window_end)
                continue
            stream = first_stream + slot
            index = self._next_episode.get((base_seed, stream), 0)
            self._next_episode[(base_seed, stream)] = index + 1
            env_seed, policy_seed = stream_seeds(base_seed, stream, index)
            # FRAGMENT_INFO_KEYS order.
            meta = (
                self._agent_version(),
                env_seed,
                policy_seed,
                index,
                self._worker_number,
                stream,
                0,
            )
            live = Live(
                unit=None,
                rng=np.random.default_rng(policy_seed),
                meta=meta,
                key=(stream, index, 0),
                stream=(base_seed, stream),
            )
            if engine.begin(slot, live, env_seed, window_end):
                started.append(slot)
        engine.reset_policy_rows(started)

    def _continue(self, live: Live) -> None:
        """Turns a parked episode's state into its next piece's."""
        _, env_seed, policy_seed, episode, worker, stream, fragment = live.meta
        fragment += 1
        live.meta = (
            self._agent_version(),
            env_seed,
            policy_seed,
            episode,
            worker,
            stream,
            fragment,
        )
        live.key = (*live.key[:2], fragment)
        live.first = False

    def on_record(self, slot: int, live: Live, record: Segment, continues: bool) -> None:
        self._pieces.append(record)
        self._quota[slot] -= record.length
        if continues:
            live.offset += record.length
            live.parked_obs = record.last_observation
            self._parked[slot] = live

    def on_env_failure(self, slot: int, live: Live, restarted: bool) -> None:
        # The stream moves on to its next episode; past the budget the
        # engine's EnvError ends the call.
        if not restarted:
            self._quota[slot] = 0
