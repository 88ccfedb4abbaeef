"""The plain loop the benchmark measures against does the work the issue describes."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest

from rlfleet._util.cpus import allowed_cpus, can_pin, cpu_list_text, one_cpu_each
from rlfleet.bench import plain_loop as plain_loop_module
from rlfleet.bench.plain_loop import plain_loop
from rlfleet.bench.report import BenchConfig
from rlfleet.bench.samplers import plain_processes
from rlfleet.errors import WorkerError


def test_plain_loop_steps_every_env_and_reseeds_each_episode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeds: list[int | None] = []
    steps: list[object] = []
    real_make = gym.make

    class Recording(gym.Wrapper):
        def reset(self, **kwargs):
            seeds.append(kwargs.get("seed"))
            return self.env.reset(**kwargs)

        def step(self, action):
            steps.append(action)
            return self.env.step(action)

    monkeypatch.setattr(
        plain_loop_module.gym, "make", lambda *a, **k: Recording(real_make(*a, **k))
    )
    run = plain_loop("CartPole-v1", 3, 300, seed=2)
    assert run.steps == 300 and len(steps) == 300
    assert run.cpu > 0 and run.wall > 0
    # CartPole episodes last tens of steps: many resets, each with a new seed.
    assert len(seeds) > 3 + 5
    assert None not in seeds and len(set(seeds)) == len(seeds)
    assert {int(np.asarray(a)) for a in steps} == {0, 1}


def test_plain_loop_rounds_up_to_whole_vector_steps() -> None:
    assert plain_loop("CartPole-v1", 4, 10).steps == 12


def test_a_failing_plain_process_is_a_worker_error_with_its_traceback() -> None:
    config = BenchConfig(workers=1, envs_per_worker=1, env_id="Pendulum-v1")
    with (
        plain_processes(config) as sample,
        pytest.raises(WorkerError, match="plain-loop process 0 failed on Pendulum-v1") as caught,
    ):
        sample(10)
    assert "needs a Discrete action space" in (caught.value.remote_traceback or "")


def _cpus_allowed(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(
        line.split(":", 1)[1].strip() for line in status.splitlines() if "Cpus_allowed_list" in line
    )


@pytest.mark.skipif(not can_pin(), reason="CPU pinning needs os.sched_setaffinity (Linux)")
@pytest.mark.parametrize("pinned", [True, False])
def test_plain_loops_sit_where_the_fleets_workers_do(pinned: bool) -> None:
    config = BenchConfig(workers=2, envs_per_worker=1, pinned=pinned)
    before = {child.pid for child in psutil.Process().children()}
    with plain_processes(config) as sample:
        sample(10)  # each loop ran: it pinned itself first
        loops = [c.pid for c in psutil.Process().children() if c.pid not in before]
        placed = sorted(_cpus_allowed(pid) for pid in loops)
    everywhere = cpu_list_text(allowed_cpus())
    expected = [cpu_list_text(cpus) for cpus in one_cpu_each(2)] if pinned else [everywhere] * 2
    assert placed == sorted(expected)
    assert ("pinned to the same CPU" in config.describe("CartPole-v1")) == pinned
    if not pinned:
        assert config.placement == "placement: nothing pinned (the OS places every process)"
