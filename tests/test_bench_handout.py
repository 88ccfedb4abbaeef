"""benchmarks/handout.py runs end to end (small), so its figures stay readable.

The figures themselves are not checked: they are timings of a shared
machine (its instruction counts, under callgrind, are docs/performance.md's).
"""

from __future__ import annotations

import re

import pytest

from benchmarks import handout


def test_a_first_hand_out_gives_every_worker_units() -> None:
    scheduler = handout.fleet(2, 8)
    request_id = scheduler.start_sample(handout._spec(handout.Mode.EPISODES, 40, 1))
    orders = scheduler.dispatch()
    assert {order.worker_id for order in orders} == {1, 2}
    scheduler.finish(request_id)
    assert handout.first_handouts(scheduler, 3, 40) > 0


def test_the_refills_hand_out_between_results(capsys: pytest.CaptureFixture[str]) -> None:
    handout.main(["--what", "refill", "--count", "40"])
    out = capsys.readouterr().out
    match = re.search(r"40 results booked, (\d+) refills handing out", out)
    assert match is not None, out
    assert 0 < int(match[1]) < 40
    handout.main(["--count", "3", "--episodes", "400"])
    assert "first hand-out of 400-episode requests" in capsys.readouterr().out
