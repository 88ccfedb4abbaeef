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
import itertools
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


@dataclasses.dataclass(slots=True)
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
        """Notes an accepted window (or any accepted fragments result).

        Array operations over the pieces' columns: a window of 64 streams is
        82-143 pieces, and a Python loop per piece cost about 3 us each on
        the coordinator's path. Python runs once per stream whose last piece
        is cut (its episode in progress changes), with every value worked
        out before. A stream with more than one cut piece, which no accepted
        window holds, takes the per-piece rules in the pieces' order.
        """
        known = self._touch(base_seed)
        infos = batch.episode_infos
        streams, episodes, fragments = (
            np.asarray(infos[key]) for key in ("stream", "episode_index", "fragment_index")
        )
        count = len(streams)
        if not count:
            return
        lengths = np.asarray(batch.lengths)
        cut = cut_pieces(batch)
        # Each stream's pieces together, in the window's order (a stable sort).
        order = np.argsort(streams, kind="stable")
        grouped = streams[order]
        first = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
        last = np.concatenate((first[1:], [count])) - 1
        ids = grouped[first].tolist()
        in_order = episodes[order]
        known.runner.update(dict.fromkeys(ids, worker_id))
        reached = np.maximum.reduceat(in_order, first)
        held = known.next_episode.get
        before = np.fromiter(map(held, ids, itertools.repeat(0)), np.int64, len(ids))
        known.next_episode.update(zip(ids, np.maximum(before, reached + 1).tolist(), strict=True))
        cuts = np.add.reduceat(cut[order].astype(np.int64), first)
        final = order[last]  # each stream's last piece
        # One cut piece, last in its stream: it begins or continues the
        # stream's episode, after the stream's ended pieces (which drop an
        # episode in progress whose index they reach: ``dropped_to``).
        simple = (cuts == 1) & cut[final]
        episodes_map = self._episodes
        if episodes_map:
            for stream, last_episode in zip(
                grouped[first[cuts == 0]].tolist(), reached[cuts == 0].tolist(), strict=True
            ):
                current = episodes_map.get(stream)
                if current is not None and current.episode_index <= last_episode:
                    del episodes_map[stream]
        tangled = ~simple & (cuts > 0)
        if tangled.any():
            mask = np.isin(streams, grouped[first[tangled]])
            self._record_pieces(base_seed, batch, np.flatnonzero(mask), cut)
        if not simple.any():
            return
        pieces = final[simple]
        earlier = in_order.copy()
        earlier[last] = np.iinfo(np.int64).min
        dropped_to = np.maximum.reduceat(earlier, first)[simple]
        steps = lengths[pieces]
        ends = np.cumsum(steps)
        begins = ends - steps
        # The pieces' actions and last observations copied once (the
        # window's arrays may be views of the received bytes). An episode
        # holds views of it: a window's copy (its cut pieces' steps, at most
        # a window) lives while one stream's episode holds a piece of it.
        piece_starts = np.cumsum(lengths) - lengths
        rows = np.repeat(piece_starts[pieces] - begins, steps) + np.arange(int(ends[-1]))
        actions = batch.actions[rows]
        observations = batch.last_observations[pieces]
        limit = self._max_steps
        for k, (stream, episode, fragment, size, begin, end, dropped) in enumerate(
            zip(
                streams[pieces].tolist(),
                episodes[pieces].tolist(),
                fragments[pieces].tolist(),
                steps.tolist(),
                begins.tolist(),
                ends.tolist(),
                dropped_to.tolist(),
                strict=True,
            )
        ):
            if fragment == 0:
                if size > limit:
                    episodes_map.pop(stream, None)
                else:
                    episodes_map[stream] = _Episode(
                        base_seed, episode, 1, [actions[begin:end]], size, observations[k]
                    )
                continue
            current = episodes_map.get(stream)
            if (
                current is None
                or current.episode_index <= dropped  # dropped by an ended piece before
                or current.base_seed != base_seed
                or current.episode_index != episode
                or current.fragments != fragment
            ):
                episodes_map.pop(stream, None)  # a gap: this episode cannot be rebuilt
                continue
            current.fragments += 1
            current.steps += size
            current.actions.append(actions[begin:end])
            current.last_observation = observations[k]
            if current.steps > limit:
                del episodes_map[stream]

    def _record_pieces(
        self, base_seed: int, batch: EpisodeBatch, pieces: np.ndarray, cut: np.ndarray
    ) -> None:
        """The episodes in progress after ``pieces``, one at a time in their order.

        For streams with several cut pieces (the window's checks refuse
        them): the rules :meth:`record` applies at once to the others.
        """
        infos = batch.episode_infos
        streams, episodes, fragments = (
            np.asarray(infos[key])[pieces].tolist()
            for key in ("stream", "episode_index", "fragment_index")
        )
        starts = episode_starts(batch.lengths)
        ends = starts + batch.lengths
        for i, stream, episode, fragment in zip(
            pieces.tolist(), streams, episodes, fragments, strict=True
        ):
            current = self._episodes.get(stream)
            if not cut[i]:
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
