"""benchmarks/result_booking.py books what it says it books.

Its lane level with ``--episode-steps`` must book the results
``benchmarks.capacity``'s synthetic workers send (episodes of exactly that
many steps), each accepted as a result lane accepts them: else its figure
per result is not the capacity bench's lane work (docs/performance.md,
"Coordinator capacity: where a result's CPU goes").
"""

from __future__ import annotations

import sys

import pytest

from benchmarks import result_booking
from rlfleet.coordinator.calls import Forward
from rlfleet.coordinator.leases.result_lane import join_frame
from rlfleet.wire.results import JoinedResult


def test_template_frames_are_the_capacity_benchs_results_and_each_is_booked() -> None:
    episodes, results = 4, 3
    frames = result_booking.template_frames(episodes, results, 100)
    fleet = result_booking.EventsFleet(episodes * results + 1)
    handle, events = fleet.handle, fleet.events
    budget = handle.inflight.carrier()
    forwarded = []
    for frame in frames:
        joined = join_frame(events, handle, budget, frame)
        assert isinstance(joined, JoinedResult)
        assert list(joined.header.lengths) == [100] * episodes
        # A refused result raises; an accepted one reaches the learner's queue.
        events.on_results(handle, [joined], send_here=True)
        while not fleet.outbox._queue.empty():
            event = fleet.outbox.get()
            if isinstance(event, Forward):
                forwarded.append(event.steps)
    assert forwarded == [episodes * 100] * results


def test_the_lane_level_runs_with_episode_steps(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["result_booking", "--level", "lane", "--episodes", "2", "--results", "3"]
    argv += ["--batch", "1", "--rounds", "1", "--episode-steps", "50"]
    monkeypatch.setattr(sys, "argv", argv)
    result_booking.main()
    assert "3 results of 2 episodes of 50 steps, 1 per batch" in capsys.readouterr().out
