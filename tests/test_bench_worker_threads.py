"""benchmarks/worker_threads.py runs end to end (small), so its figures stay readable.

It starts a real fleet and reads its workers' threads from /proc. The
figures themselves are not checked: they are timings of a shared machine.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from benchmarks import worker_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_worker_threads_benchmark_names_each_thread(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workers", "1", "--envs", "8", "--request-steps", "2000", "--requests", "2", "--json"]
    assert worker_threads.main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["steps"] >= 4000
    threads = figures["threads"]
    assert threads["main"]["us_per_step"] > 0
    assert figures["other_threads_us_per_step"] >= 0
    if shutil.which("py-spy") is not None:
        # Named from their Python stacks: the Join stream's receive path.
        assert {"rlfleet-worker-receiver", "gRPC channel spin"} <= set(threads)
