"""benchmarks/request_tail.py: a native worker's requests, their tails counted apart.

The timings are a shared machine's and not checked; what is checked is what
they are read against: every request's steps are delivered, and its tail is
the vector steps once its queue ran dry, with fewer rows than envs each.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import request_tail


def test_each_requests_tail_is_counted_apart_from_its_full_vector_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--units", "40", "160", "--requests", "2", "--envs", "8", "--json"]
    assert request_tail.main(argv) == 0
    small, large = json.loads(capsys.readouterr().out)
    assert (small["units"], large["units"], small["requests"]) == (40, 160, 2)
    for figures in (small, large):
        # CartPole's episodes last 8 steps at least: a unit is several vector steps.
        assert figures["steps"] >= 8 * figures["units"]
        assert 0 < figures["tail_vector_steps"] < figures["vector_steps"]
        # In the tail some slot is idle at every vector step.
        assert figures["tail_rows"] < 8 * figures["tail_vector_steps"]
        assert figures["us_per_step"] > 0 and 0 < figures["tail_share"] < 1
    # Four times the units take more than twice the vector steps.
    assert large["vector_steps"] > 2 * small["vector_steps"]


def test_the_text_report_names_each_request_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert request_tail.main(["--units", "30", "--requests", "1", "--envs", "8"]) == 0
    out = capsys.readouterr().out
    assert "30 units" in out and "of them the tail" in out
