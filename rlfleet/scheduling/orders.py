"""What the scheduler is told and what it answers: requests, orders, rulings.

The coordinator and the local sampler build a :class:`RequestSpec` for each
learner request, send the :class:`TaskOrder` and :class:`CancelOrder` values
the scheduler returns, and act on the :class:`ResultRuling` of each result.
Plain values: nothing here changes the scheduler's state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import EMPTY_UNITS, Unit, UnitColumns

__all__ = [
    "CancelOrder",
    "RequestSpec",
    "ResultRuling",
    "TaskOrder",
    "Unit",
    "Verdict",
]


class Verdict(enum.Enum):
    """What to do with an arriving result."""

    #: It completes outstanding units of a live request: forward it.
    ACCEPT = "accept"
    #: It is late (request finished, units cancelled): drop it quietly.
    IGNORE = "ignore"
    #: The worker broke the protocol (units it never got, twice the same).
    REJECT = "reject"


@dataclass(frozen=True)
class TaskOrder:
    """Work to send to one worker (becomes a ``Task`` message).

    Attributes:
        task_id: Unique per scheduler.
        worker_id: The worker that runs it.
        request_id: The request it serves.
        mode: The request's mode.
        agent_version: Version every episode must be produced with (-1:
            the latest the worker has, for subscriptions).
        env_generation: Env generation every episode must run in.
        units: Episodes to run (STEPS, EPISODES), ascending by index.
        fragment_length: Steps per window (FRAGMENTS).
        rounds: Windows to run (FRAGMENTS).
        base_seed: Seed of the episodes fragment streams start (FRAGMENTS).
        streams: The stream each slot runs (FRAGMENTS, to workers that can
            take streams over; empty: the worker's own, from its first).
    """

    task_id: int
    worker_id: int
    request_id: int
    mode: Mode
    agent_version: int
    env_generation: int
    units: UnitColumns = field(default_factory=lambda: EMPTY_UNITS)
    fragment_length: int = 0
    rounds: int = 0
    base_seed: int = 0
    streams: tuple[int, ...] = ()


@dataclass(frozen=True)
class CancelOrder:
    """Units a worker should drop (becomes a ``Cancel`` message).

    Attributes:
        worker_id: The worker holding them.
        task_id: Their task.
        episode_indices: The units; empty means the whole task.
    """

    worker_id: int
    task_id: int
    episode_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class RequestSpec:
    """What a learner asked for, with the state it must be served in.

    Attributes:
        mode: STEPS, EPISODES or FRAGMENTS.
        amount: Steps (STEPS, FRAGMENTS) or episodes (EPISODES); ignored
            for subscriptions, which run until cancelled.
        seed: Base seed of the episode seeds (FRAGMENTS: the stream seed).
        request_index: Second component of the episode seeds.
        agent_version: Version the episodes must be produced with; -1 for
            "the latest" (subscriptions).
        env_generation: Env generation the episodes must run in.
        fragment_length: Window length (FRAGMENTS).
        max_buffered_steps: Subscriptions only: steps accepted but not yet
            sent to the subscriber beyond which no new work is handed out.
        first_episode: EPISODES only: the request runs episode indices
            ``first_episode .. first_episode + amount - 1`` (one range of a
            request cut over several coordinators).
    """

    mode: Mode
    amount: int
    seed: int
    request_index: int
    agent_version: int
    env_generation: int
    fragment_length: int = 0
    max_buffered_steps: int = 0
    first_episode: int = 0


@dataclass(frozen=True)
class ResultRuling:
    """The scheduler's answer to a result.

    Attributes:
        verdict: Forward, drop or reject the result.
        request_id: The request it belongs to (0 if unknown).
        reason: Why it was rejected or ignored, for logs and the error.
        done: The request is complete now (call
            :meth:`~rlfleet.scheduling.scheduler.Scheduler.finish`).
        subscription: The request is a subscription.
        requeued: Units of an ignored result's task that went back to their
            request (the result also named units moved to another worker, so
            none of it is booked): call ``dispatch`` to hand them out.
    """

    verdict: Verdict
    request_id: int = 0
    reason: str = ""
    done: bool = False
    subscription: bool = False
    requeued: int = 0
