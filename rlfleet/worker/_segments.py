"""Segment recording: a slot's segment in flight, and the record it becomes.

A segment is an episode, or the piece of a fragment stream's episode that
one window runs. :class:`Live` is its state while the engine steps it;
:class:`SegmentRecorder` makes a :class:`~rlfleet.worker._episode_buffer.Segment`
of its steps in the ring when it ends (checking observations as the
worker's ``nan_observations`` mode says), and the caller's :class:`Sink`
decides what becomes of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlfleet.core._arrays import NestedArrays
from rlfleet.core.env_spec import EnvSpec
from rlfleet.worker._checks import SuspectRows, nonfinite_rows, outside_space_error
from rlfleet.worker._episode_buffer import Segment, StepRing, stack_step_infos
from rlfleet.worker._numeric import all_finite
from rlfleet.worker.units import QueuedUnit

if TYPE_CHECKING:
    from rlfleet.worker._slot_failures import SlotFailures

#: ``stop_step`` of a segment that only ends when its episode does.
NEVER = -1


class Live:
    """The in-flight segment (an episode, or a fragment piece) of one slot.

    Attributes:
        unit: The episode unit, or None for a fragment stream's episode.
        rng: The episode's action-sampling generator.
        meta: The episode_infos of the segment (``Segment.infos``).
        key: Sort key of the segment's record.
        stream: ``(base_seed, stream)`` of a fragment stream, else None.
        offset: Steps of the episode taken before this segment.
        first: Whether the segment starts its episode.
        seg_start: Vector step of the segment's first step.
        limit_step: Vector step at which max_episode_length is reached.
        stop_step: Vector step at which the segment ends at the latest.
        infos: ``(vector step, info)`` of the steps whose info was not empty
            (most envs return ``{}``: nothing is stored for them).
        parked_obs: A parked stream episode's next observation.
        rng_state: ``rng``'s state when a segment that may be cut by a
            window started, if its draws come in blocks (to rewind it).
    """

    __slots__ = (
        "first",
        "infos",
        "key",
        "limit_step",
        "meta",
        "offset",
        "parked_obs",
        "rng",
        "rng_state",
        "seg_start",
        "stop_step",
        "stream",
        "unit",
    )

    def __init__(
        self,
        unit: QueuedUnit | None,
        rng: np.random.Generator,
        meta: tuple[int, ...],
        key: tuple[int, ...],
        stream: tuple[int, int] | None = None,
    ) -> None:
        self.unit = unit
        self.rng = rng
        self.meta = meta
        self.key = key
        self.stream = stream
        self.offset = 0
        self.first = True
        self.seg_start = 0
        self.limit_step = NEVER
        self.stop_step = NEVER
        self.infos: list[tuple[int, Any]] = []
        self.parked_obs: np.ndarray | None = None
        self.rng_state: Mapping[str, Any] | None = None

    @property
    def episode_index(self) -> int | None:
        """The unit's episode index (the request's numbering); None for streams."""
        return None if self.unit is None else self.unit.episode_index

    def describe(self) -> str:
        """``episode k`` or ``episode k of stream s``, for messages.

        A unit's ``request`` is not named: on a fleet worker it holds the
        coordinator's task id, which a learner would mistake for its request.
        """
        if self.unit is not None:
            return f"episode {self.unit.episode_index}"
        _, _, _, episode, _, stream, _ = self.meta
        return f"episode {episode} of stream {stream}"


class Sink(Protocol):
    """Receives what the engine produces; implemented per sampling mode."""

    #: Whether a segment interrupted by an env crash is kept (cut) or dropped.
    keeps_partial: bool

    def on_record(self, slot: int, live: Live, record: Segment, continues: bool) -> None:
        """A segment ended; ``continues`` if its episode goes on (window cut)."""

    def on_rows(
        self, ring: StepRing, spec: EnvSpec, rows: list[int], steps: int, first_start: int
    ) -> None:
        """A native backend's episodes ended at one vector step.

        Args:
            ring: The ring their steps are in.
            spec: Spec of the env that produced them.
            rows: A ``FinishedTable`` row (``WIDTH`` ints) per episode.
            steps: Their steps in all.
            first_start: The earliest first step among them.
        """

    def on_env_failure(self, slot: int, live: Live, restarted: bool) -> None:
        """The slot's env raised in ``step``; ``restarted`` if it may be rebuilt."""


class SegmentRecorder:
    """Makes records of the segments that end on one set of envs.

    Args:
        ring: The step ring the segments' steps are in.
        spec: The envs' spec (each record carries it).
        nan_mode: ``"error"``, ``"flag"`` or ``"ignore"`` (see VecWorker).
        failures: Where a rejected segment's EnvError is queued.
        source_name: The env's name, for messages.
    """

    def __init__(
        self,
        ring: StepRing,
        spec: EnvSpec,
        *,
        nan_mode: str,
        failures: SlotFailures,
        source_name: str,
    ) -> None:
        self._ring = ring
        self._spec = spec
        self._nan_mode = nan_mode
        self._failures = failures
        self._source_name = source_name
        # Honest segments pass this in a couple of numpy calls; the exact
        # checks (which name the step and value) run only on the others.
        self._quick = SuspectRows(spec.observation_space, nonfinite=nan_mode == "error")

    def record(self, slot: int, live: Live, length: int, last: int | None) -> Segment | None:
        """Makes a segment of ``length`` steps, viewing them in the ring.

        Returns None (and queues an EnvError) if ``"error"`` mode rejects a
        non-finite observation, or an observation lies outside the env's space.
        """
        ring, spec = self._ring, self._spec
        observations, actions, rewards, agent_infos = ring.segment_steps(
            live.seg_start, length, slot
        )
        env_infos = self._env_infos(live, length) if live.infos else {}
        if self._nan_mode == "flag":
            bad = nonfinite_rows(observations)
            env_infos["nonfinite_obs"] = bad[:-1] | bad[1:]
        if self.rejects(slot, live, observations):
            return None
        record = Segment(
            key=live.key,
            infos=live.meta,
            observations=observations[:-1],
            # Copied: the slot's next episode starts in that very cell.
            last_observation=observations[-1].copy(),
            actions=actions,
            rewards=rewards,
            agent_infos=agent_infos,
            env_infos=env_infos,
            first=live.first,
            last=last,
            env_spec=spec,
        )
        ring.pin(record, live.seg_start)
        return record

    def rejects(self, slot: int, live: Live, observations: np.ndarray) -> bool:
        """Whether the segment's observations fail the checks (its EnvError is queued then).

        ``"error"`` mode rejects a non-finite observation; every mode an
        observation outside the env's space.

        Args:
            slot: The segment's slot.
            live: The segment.
            observations: Its observations, its last one included.
        """
        if self._quick.all_pass(observations):
            return False
        if self._nan_mode == "error" and not all_finite(observations):
            index = int(np.argmax(nonfinite_rows(observations)))
            self._failures.reject_nonfinite(slot, live, live.offset + index, "", self._source_name)
            return True
        outside = outside_space_error(
            observations,
            self._spec.observation_space,
            self._source_name,
            live.describe(),
            live.offset,
        )
        if outside is not None:
            message, step = outside
            self._failures.drop_segment(slot, live, message, step)
            return True
        return False

    def _env_infos(self, live: Live, length: int) -> NestedArrays:
        """Stacks the segment's infos (only its non-empty ones were kept)."""
        per_step: list[Any] = [{}] * length
        for step, info in live.infos:
            index = step - live.seg_start
            if index < length:  # a failed last step's info is not part of the segment
                per_step[index] = info
        return stack_step_infos(per_step, self._source_name)
