"""benchmarks.data_loop: the loop step it measures reads and hands over every frame."""

from __future__ import annotations

import pytest

from benchmarks.data_loop import run

pytestmark = pytest.mark.timeout(120)


def test_the_data_loop_bench_reads_each_large_frame_found_whole_once() -> None:
    # The connection's first large frame sizes the landing: two reads; each later one, one.
    _, reads = run(frames=20, size=395_000, burst=1)
    assert reads == pytest.approx(21 / 20)


def test_the_data_loop_bench_reads_a_bursts_small_frames_together() -> None:
    _, reads = run(frames=50, size=12_000, burst=5)
    assert reads == pytest.approx(1 / 5)
