"""Fragment windows for the capacity benchmark's synthetic workers, serialized once per phase.

A synthetic worker's streams run in lockstep: every stream is at the same
step of the same-length episodes, so a window's pieces (how many, how long,
which are cut, their fragment indices) depend only on the window's phase,
the window's start modulo the episodes' length. :class:`WindowTemplate`
serializes one window per phase once, locates its episode_infos columns in
the bytes, and each answer writes only the task's values there (the
streams, their episode indices and seeds, the agent version, the worker),
as :class:`benchmarks.capacity_workers.ResultTemplate` does for episodes. What the
coordinator checks still holds for every window: the streams of the task,
``fragment_length`` steps per stream, each stream's pieces continuing one
another, seeds from :func:`~rlfleet.core.seeding.stream_seeds`, step types.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.capacity_payloads import ZerosPayload
from rlfleet.core import EnvSpec, StepType
from rlfleet.core.seeding import stream_seeds_many
from rlfleet.wire.results import EPISODE_INFO_KEYS, FRAGMENT_INFO_KEYS

#: Columns a window's answer writes (fragment_index is the phase's).
_WRITTEN = ("episode_index", "env_seed", "policy_seed", "agent_version", "worker", "stream")


class _Phase:
    """One window of ``streams`` lockstep streams starting ``offset`` steps into an episode."""

    def __init__(
        self,
        spec: EnvSpec,
        *,
        streams: int,
        episode_steps: int,
        length: int,
        offset: int,
        fragment: int,
    ) -> None:
        # One stream's pieces: (episodes since the window's first, fragment index, steps),
        # and its step types. A piece starts its episode at position 0 and ends it at
        # episode_steps; the episode begun before the window has ``fragment`` pieces out.
        pieces: list[tuple[int, int, int]] = []
        types: list[int] = []
        position, left = offset, length
        while left:
            steps = min(episode_steps - position, left)
            piece = [int(StepType.MID)] * steps
            if position == 0:
                piece[0] = int(StepType.FIRST)
            if position + steps == episode_steps:
                piece[-1] = int(StepType.TERMINAL)
            pieces.append((len(pieces), fragment if position else 0, steps))
            types += piece
            position, left = 0, left - steps
        cut = types[-1] != int(StepType.TERMINAL)
        #: The fragment index the next window's first piece has.
        self.next_fragment = (pieces[-1][1] + 1) if cut else 0
        self.first_episode_offset = np.array([p[0] for p in pieces] * streams, np.int64)
        self.slots = np.repeat(np.arange(streams), len(pieces))
        count = len(pieces) * streams
        infos = {key: np.zeros(count, np.int64) for key in EPISODE_INFO_KEYS + FRAGMENT_INFO_KEYS}
        infos["fragment_index"][:] = [p[1] for p in pieces] * streams
        zeros = ZerosPayload(
            spec,
            infos,
            np.array(types * streams, np.uint8),
            np.array([p[2] for p in pieces] * streams, np.int64),
            _WRITTEN,
        )
        self.lengths = zeros.batch.lengths.tolist()
        self.payload = zeros.payload
        self.columns = zeros.columns


class WindowTemplate:
    """A synthetic worker's fragment windows: ``streams`` lockstep streams of
    ``episode_steps``-step episodes, cut into windows of ``length`` steps."""

    def __init__(self, spec: EnvSpec, *, streams: int, episode_steps: int, length: int) -> None:
        self.spec = spec
        self.streams = streams
        self.episode_steps = episode_steps
        self.length = length
        self._phases: dict[tuple[int, int], _Phase] = {}

    def window(
        self,
        stream_ids: Sequence[int],
        first_episodes: np.ndarray,
        *,
        start: int,
        fragment: int,
        base_seed: int,
        agent_version: int,
        worker_id: int,
    ) -> tuple[bytearray, list[int], list[int], int]:
        """The window whose steps start at ``start`` (the same for every stream).

        Args:
            stream_ids: The streams, one per slot.
            first_episodes: (slots,) each stream's episode index at step 0.
            start: Steps every stream ran before the window.
            fragment: Pieces of the streams' current episodes sent before
                (0 if the window starts an episode).
            base_seed: The task's base seed.
            agent_version: The version to name.
            worker_id: The worker to name.

        Returns:
            The payload (rewritten in place: send it before the next call),
            the header's episode indices and lengths, and the next window's
            ``fragment``.
        """
        offset = start % self.episode_steps
        phase = self._phases.get((offset, fragment))
        if phase is None:
            phase = _Phase(
                self.spec,
                streams=self.streams,
                episode_steps=self.episode_steps,
                length=self.length,
                offset=offset,
                fragment=fragment,
            )
            self._phases[offset, fragment] = phase
        streams = np.asarray(stream_ids, np.int64)[phase.slots]
        episodes = (
            first_episodes[phase.slots] + start // self.episode_steps + phase.first_episode_offset
        )
        env, policy = stream_seeds_many(base_seed, streams, episodes)
        columns = phase.columns
        columns["stream"][:] = streams
        columns["episode_index"][:] = episodes
        columns["env_seed"][:] = env
        columns["policy_seed"][:] = policy
        columns["agent_version"][:] = agent_version
        columns["worker"][:] = worker_id
        return phase.payload, episodes.tolist(), phase.lengths, phase.next_fragment


__all__ = ["WindowTemplate"]
