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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from rlfleet.core._arrays import episode_starts
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.episode_order import cut_pieces

#: Actions a stream's current episode may have delivered and still be
#: rebuilt elsewhere: the coordinator keeps them in memory, per stream.
#: Past it (an env without a time limit) the episode is not kept, and a
#: replacement starts the stream's next episode instead.
MAX_REPLAY_STEPS = 100_000


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


class StreamBook:
    """Per stream, the episode a replacement would have to rebuild.

    Filled from accepted fragment windows; a window's pieces arrive in
    (stream, episode, fragment) order. Pure numpy: the coordinator calls it
    under its lock.

    Args:
        max_steps: Actions kept per stream's episode (see
            :data:`MAX_REPLAY_STEPS`).
    """

    def __init__(self, max_steps: int = MAX_REPLAY_STEPS) -> None:
        self._max_steps = max_steps
        self._episodes: dict[int, _Episode] = {}
        self._next_episode: dict[tuple[int, int], int] = {}
        # Who ran each (base seed, stream) last: only another worker needs a replay.
        self._runner: dict[tuple[int, int], int] = {}

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
        for i, (stream, episode, fragment) in enumerate(pieces):
            key = (base_seed, stream)
            self._runner[key] = worker_id
            self._next_episode[key] = max(self._next_episode.get(key, 0), episode + 1)
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

        A stream no worker ran with ``base_seed`` needs nothing. An episode
        in progress that cannot be rebuilt (not delivered whole, or too
        long) is skipped: the replacement starts the stream's next episode.
        """
        key = (base_seed, stream)
        runner = self._runner.get(key)
        if runner is None or runner == worker_id:
            return None
        self._runner[key] = worker_id
        current = self._episodes.get(stream)
        if current is None or current.base_seed != base_seed:
            return StreamReplay(stream, self._next_episode.get(key, 0))
        return StreamReplay(
            stream,
            current.episode_index,
            current.fragments,
            np.concatenate(current.actions),
            current.last_observation,
        )


__all__ = ["MAX_REPLAY_STEPS", "StreamBook", "StreamReplay"]
