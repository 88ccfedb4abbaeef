"""What a worker's result must be, per task, kept across the batches of its results.

A result is checked (:mod:`rlfleet.wire.result_layout`) against a
:class:`~rlfleet.wire.result_checks.ResultExpectation`: its task's units or
fragment window, the env's spec, the agent versions. That depends on the task
alone, so it is made once and kept while nothing it is made of changed (a
refill gives the task new units, an agent update a new latest version, an
env update a new spec), not made again for every batch of results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.core import EnvSpec
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.scheduling.scheduler import RequestSpec
from rlfleet.wire.result_checks import FragmentWindow, ResultExpectation

if TYPE_CHECKING:
    from rlfleet.coordinator.registry import WorkerHandle
    from rlfleet.coordinator.state import FleetState

#: Expectations kept past which those of retired tasks are dropped (besides
#: a request's, dropped when it ends): each holds its task's units.
_KEPT = 64

#: What a task's expectation is made of: its request's spec, its units, the
#: env spec (each compared by identity), and its request, worker, streams,
#: the latest agent version and whether the env is native (by value).
_MadeOf = tuple[RequestSpec, UnitColumns, EnvSpec, tuple[int, int, tuple[int, ...], int, bool]]


class ResultExpectations:
    """Each live task's expectation and what it was made of (the fleet's lock held).

    Args:
        state: The fleet, whose scheduler knows each task's request, units
            and streams.
    """

    def __init__(self, state: FleetState) -> None:
        self._state = state
        self._kept: dict[int, tuple[_MadeOf, ResultExpectation]] = {}
        self._prune_at = _KEPT

    def get(
        self,
        handle: WorkerHandle,
        task_id: int,
        request_id: int,
        env_spec: EnvSpec,
        latest: int,
        *,
        native: bool,
    ) -> ResultExpectation:
        """What a result of ``handle``'s live episode or fragment task must be:
        the one made for an earlier batch while nothing it was made of changed."""
        scheduler = self._state.scheduler
        # The units: the same object until the task is refilled.
        spec, seeds, streams = scheduler.expectation_inputs(request_id, task_id)
        values = (request_id, handle.worker_id, streams, latest, native)
        cached = self._kept.get(task_id)
        # The objects by identity: a new one is a change (an EnvSpec's == is no cheap test).
        if cached is not None:
            made_of, expectation = cached
            if (
                made_of[0] is spec
                and made_of[1] is seeds
                and made_of[2] is env_spec
                and made_of[3] == values
            ):
                return expectation
        if len(self._kept) >= self._prune_at:
            self._kept = {
                task: entry
                for task, entry in self._kept.items()
                if scheduler.request_of_task(task) is not None
            }
            self._prune_at = max(_KEPT, 2 * len(self._kept))
        expectation = expectation_of(
            handle, spec, seeds, env_spec, latest, streams=streams, native=native
        )
        self._kept[task_id] = ((spec, seeds, env_spec, values), expectation)
        return expectation

    def forget(self, request_id: int) -> None:
        """Drops the expectations of an ended request's tasks."""
        ended = [t for t, (made_of, _) in self._kept.items() if made_of[3][0] == request_id]
        for task_id in ended:
            del self._kept[task_id]


def expectation_of(
    handle: WorkerHandle,
    spec: RequestSpec,
    seeds: UnitColumns,
    env_spec: EnvSpec,
    latest_agent_version: int,
    *,
    streams: tuple[int, ...],
    native: bool,
) -> ResultExpectation:
    """What a result of ``handle`` for a request of ``spec`` must be."""
    units = window = None
    if spec.mode is Mode.FRAGMENTS:
        window = FragmentWindow(
            base_seed=spec.seed, streams=streams, fragment_length=spec.fragment_length
        )
    else:
        units = seeds  # classify() vouched that the indices are the task's units
    return ResultExpectation(
        env_spec=env_spec,
        worker_id=handle.worker_id,
        agent_version=spec.agent_version,
        env_generation=spec.env_generation,
        latest_agent_version=latest_agent_version,
        units=units,
        window=window,
        native=native,
    )
