"""Settings of the test run as a whole: the order files start in, torch's threads.

The README's ``python -m pytest`` runs on pytest-xdist's workers (pyproject's
``addopts``): ``-n 0`` runs serially, in this same order.
"""

from __future__ import annotations

import os
import sys

import pytest

#: The longest test files, longest first (``--durations``, 2 cores). They
#: start first, so no worker is left running one alone at the end of the run
#: while the other idles; every other file keeps its place.
LONGEST_FIRST = (
    "test_leases_integrations.py",
    "test_ppo_torch_example.py",
    "test_integration_sb3.py",
    "test_trainer_resume.py",
    "test_faults_fragments.py",
    "test_rllib_multi_agent_fleet.py",
    "test_faults_coordinator.py",
    "test_metrics.py",
    "test_bench_vector_env.py",
    "test_integration_tianshou.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per test process when several share the cores.

    torch's pool has one thread per core by default: two xdist workers
    training at once would spin four threads on two cores (measured on 2
    cores, PPO's first 2048 steps took 16.7 s with 2 threads and 2.0 s with
    1, docs/vector_env.md). The variable reaches the processes tests start;
    one set by the developer wins.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:  # imported before this hook: the variable came too late
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Moves the files of ``LONGEST_FIRST`` to the front, in its order (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
