"""What it takes to move a fragment stream to another worker mid-episode.

A fragment stream's episode lives in one worker's env. When that worker
dies, another worker can rebuild the episode from what the learner already
received: ``reset(seed)`` with the episode's seed, then every action
delivered since, while the episode's policy generator is drawn as the policy
would draw on the replayed observations. :class:`StreamBook` keeps, per
stream, what the coordinator saw delivered; :class:`StreamReplay` is what a
replacement gets (``Task.replays`` on the wire). Exact only for envs that
are deterministic given their seed and actions, and for stateless policies
whose draws depend only on the generator and the observation
(docs/reliability.md, "Fragments under faults").

The book remembers the fragment streams of the :data:`MAX_STREAM_SEEDS`
base seeds used last (one per fragment sampler, typically). A seed it has
forgotten starts its streams over, as a fresh sampler with that seed would:
every worker is told to start each stream at episode 0, so no worker
resumes a stale count of its own and no stream is labelled with another
worker's episode numbers. Forgetting a seed used within
:data:`RECENT_SEED_SECONDS` logs a WARNING: its sampler may still be running,
and its streams would then repeat episodes it already delivered.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np

from rlfleet.core._arrays import episode_starts
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.episode_order import cut_pieces

logger = logging.getLogger(__name__)

#: Actions a stream's current episode may have delivered and still be
#: rebuilt elsewhere: the coordinator keeps them in memory, per stream.
#: Past it (an env without a time limit) the episode is not kept, and a
#: replacement starts the stream's next episode instead.
MAX_REPLAY_STEPS = 100_000
#: Base seeds whose fragment streams the coordinator remembers, the ones
#: used last: more fragment samplers than this running at once with
#: different seeds would restart each other's streams.
MAX_STREAM_SEEDS = 64
#: A seed forgotten less than this long after its last use may belong to a
#: sampler still running: the book says so in a WARNING.
RECENT_SEED_SECONDS = 600.0


@dataclasses.dataclass(frozen=True)
class StreamReplay:
    """How to rebuild a fragment stream's episode that another worker ran.

    Attributes:
        stream: The stream.
        episode_index: With ``fragment_index`` 0: the stream's next episode,
            not begun yet. Otherwise the episode in progress.
        fragment_index: Pieces of that episode already delivered.
        actions: Every action delivered since the episode's reset, in order
            (leading dimension: steps); None with ``fragment_index`` 0.
        last_observation: The observation the next piece starts from; None
            with ``fragment_index`` 0.
    """

    stream: int
    episode_index: int
    fragment_index: int = 0
    actions: np.ndarray | None = None
    last_observation: np.ndarray | None = None


@dataclasses.dataclass
class _Episode:
    """A stream's episode in progress, as delivered."""

    base_seed: int
    episode_index: int
    fragments: int  # pieces delivered
    actions: list[np.ndarray]
    steps: int
    last_observation: np.ndarray


@dataclasses.dataclass
class _SeedStreams:
    """What the book knows of one base seed's streams."""

    #: The next episode of each stream (past every episode delivered).
    next_episode: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Who ran each stream last: only another worker needs a replay.
    runner: dict[int, int] = dataclasses.field(default_factory=dict)
    #: When the seed was last used (the book's clock).
    used_at: float = 0.0


class StreamBook:
    """Per stream, the episode a replacement would have to rebuild.

    Filled from accepted fragment windows; a window's pieces arrive in
    (stream, episode, fragment) order. Pure numpy: the coordinator calls it
    under its lock.

    Args:
        max_steps: Actions kept per stream's episode (see
            :data:`MAX_REPLAY_STEPS`).
        max_seeds: Base seeds remembered, the ones used last (see
            :data:`MAX_STREAM_SEEDS`).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        max_steps: int = MAX_REPLAY_STEPS,
        max_seeds: int = MAX_STREAM_SEEDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_steps = max_steps
        self._max_seeds = max_seeds
        self._clock = clock
        self._episodes: dict[int, _Episode] = {}
        # Least recently used first.
        self._seeds: OrderedDict[int, _SeedStreams] = OrderedDict()

    @property
    def seeds(self) -> int:
        """Base seeds remembered (at most ``max_seeds``)."""
        return len(self._seeds)

    def record(self, base_seed: int, worker_id: int, batch: EpisodeBatch) -> None:
        """Notes an accepted window (or any accepted fragments result)."""
        infos = batch.episode_infos
        streams, episodes, fragments = (
            np.asarray(infos[key]).tolist() for key in ("stream", "episode_index", "fragment_index")
        )
        starts = episode_starts(batch.lengths)
        ends = starts + batch.lengths
        ended = ~cut_pieces(batch)
        pieces = zip(streams, episodes, fragments, strict=True)
        known = self._touch(base_seed)
        for i, (stream, episode, fragment) in enumerate(pieces):
            known.runner[stream] = worker_id
            known.next_episode[stream] = max(known.next_episode.get(stream, 0), episode + 1)
            current = self._episodes.get(stream)
            if ended[i]:
                if current is not None and current.episode_index <= episode:
                    del self._episodes[stream]
                continue
            actions = batch.actions[starts[i] : ends[i]]
            if fragment == 0:
                current = _Episode(base_seed, episode, 0, [], 0, batch.last_observations[i])
            elif current is None or (
                current.base_seed,
                current.episode_index,
                current.fragments,
            ) != (base_seed, episode, fragment):
                self._episodes.pop(stream, None)  # a gap: this episode cannot be rebuilt
                continue
            current.fragments += 1
            current.steps += len(actions)
            current.actions.append(np.array(actions))
            current.last_observation = np.array(batch.last_observations[i])
            if current.steps > self._max_steps:
                self._episodes.pop(stream, None)
                continue
            self._episodes[stream] = current

    def forget(self, streams: Iterable[int]) -> None:
        """The streams' episodes in progress were abandoned (an error on their worker)."""
        for stream in streams:
            self._episodes.pop(stream, None)

    def end_episodes(self) -> None:
        """Every episode in progress was abandoned (an env update)."""
        self._episodes.clear()

    def replay(self, base_seed: int, stream: int, worker_id: int) -> StreamReplay | None:
        """What ``worker_id`` needs to run ``stream`` next, or None if it holds it already.

        A stream the book does not know under ``base_seed`` (a new seed, or
        one forgotten) starts at episode 0 whatever the worker held. An
        episode in progress that cannot be rebuilt (not delivered whole, or
        too long) is skipped: the replacement starts the stream's next
        episode.
        """
        known = self._touch(base_seed)
        runner = known.runner.get(stream)
        if runner == worker_id:
            return None
        known.runner[stream] = worker_id
        current = self._episodes.get(stream)
        if runner is None or current is None or current.base_seed != base_seed:
            return StreamReplay(stream, known.next_episode.get(stream, 0))
        return StreamReplay(
            stream,
            current.episode_index,
            current.fragments,
            np.concatenate(current.actions),
            current.last_observation,
        )

    def _touch(self, base_seed: int) -> _SeedStreams:
        """The seed's streams, now the most recently used; forgets the least recent."""
        now = self._clock()
        known = self._seeds.get(base_seed)
        if known is not None:
            self._seeds.move_to_end(base_seed)
            known.used_at = now
            return known
        known = self._seeds[base_seed] = _SeedStreams(used_at=now)
        while len(self._seeds) > self._max_seeds:
            forgotten, streams = self._seeds.popitem(last=False)
            for stream in [s for s, e in self._episodes.items() if e.base_seed == forgotten]:
                del self._episodes[stream]
            idle = now - streams.used_at
            if idle < RECENT_SEED_SECONDS:
                # Rare (more fragment samplers than MAX_STREAM_SEEDS at once),
                # and each eviction is one line: no rate limit needed.
                logger.warning(
                    "forgot the fragment streams of base seed %d, last used %.0f s ago, "
                    "to keep the last %d seeds: if its sampler is still running, its "
                    "streams restart at episode 0 and repeat episodes already delivered. "
                    "Run at most %d fragment samplers with different seeds per "
                    "coordinator (one coordinator per group of learners beyond that)",
                    forgotten,
                    idle,
                    self._max_seeds,
                    self._max_seeds,
                )
        return known


__all__ = [
    "MAX_REPLAY_STEPS",
    "MAX_STREAM_SEEDS",
    "RECENT_SEED_SECONDS",
    "StreamBook",
    "StreamReplay",
]
