"""Soak: workers killed and restarted at random while a learner samples.

Guarantee 8 of docs/reliability.md. For about two minutes
(``RLFLEET_SOAK_SECONDS``) a learner calls ``obtain_samples`` in a loop with
a seed while a chaos thread SIGKILLs random workers (mid-episode, mid-send,
whatever they were doing) and starts replacements. At the end:

* every answer holds episodes 0..n-1 once each, with exactly the seeds the
  contract derives for its request, and is the shortest prefix reaching the
  asked steps: nothing lost, nothing duplicated, nothing stale;
* a sample of the answers equals, bit for bit, the episodes run locally
  from the same seeds (what LocalSampler returns);
* the coordinator's memory is flat (see :data:`RSS_SLACK_BYTES`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import ProcessFleet

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

SEED = 233
DURATION = float(os.environ.get("RLFLEET_SOAK_SECONDS", "120"))
#: Steps per request; with 16x16 observations each answer carries ~2.6 MB,
#: so a coordinator that kept even a tenth of what it forwarded would fail
#: the memory check (see RSS_SLACK_BYTES).
STEPS = 2000
ENV = EnvConfig("rlfleet-tests/BigObs-v0", {"obs_shape": [16, 16], "length": 40})
ENV_MODULE = "tests.fixtures.fault_envs"
WORKERS = 3
#: RSS after warm-up may grow by this fraction plus RSS_SLACK_BYTES. Python's
#: allocator and glibc's arenas grow in steps (pool threads touching their
#: arenas for the first time, free lists filling, gRPC's per-call buffers), so
#: a flat process still moves by a few MB and a few percent; a leak of
#: anything per request or per worker grows with the run instead and crosses
#: this line, since the soak moves several GB through the coordinator.
RSS_GROWTH, RSS_SLACK_BYTES = 0.20, 20 * 2**20
#: Memory is compared from this point on (imports, first calls and the
#: first worker churn are done by then).
WARM_UP = DURATION / 4
#: Answers compared with local runs of the same seeds, besides the first and last.
CHECKED = 6


class Chaos:
    """SIGKILLs a random worker every 1-4 s and starts a replacement 0-2 s later."""

    def __init__(self, fleet: ProcessFleet, rng: random.Random) -> None:
        self.fleet = fleet
        self.rng = rng
        self.kills = 0
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(1.0, 4.0)):
                alive = [w for w in self.fleet.workers if w.alive]
                if alive:
                    self.fleet.kill(self.rng.choice(alive))
                    self.kills += 1
                if self.stop.wait(self.rng.uniform(0.0, 2.0)):
                    return
                missing = WORKERS - sum(w.alive for w in self.fleet.workers)
                for _ in range(missing):
                    self.fleet.start_worker(envs=2, imports=[ENV_MODULE])
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=60)


class RssProbe:
    """Samples a process's resident memory twice a second."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append((time.monotonic() - self._start, self._process.memory_info().rss))

    def join(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def after(self, seconds: float) -> int:
        """The first sample taken ``seconds`` or more after the start."""
        return next(rss for at, rss in self.samples if at >= seconds)

    def final(self) -> int:
        """The median of the last five samples (one slow GC cycle is not a leak)."""
        return int(np.median([rss for _, rss in self.samples[-5:]]))


def check_answer(batch: EpisodeBatch, request: int) -> None:
    """The contract's invariants of one answer, for every request (cheap, vectorised)."""
    n = batch.n_episodes
    infos = batch.episode_infos
    np.testing.assert_array_equal(
        infos["episode_index"], np.arange(n), err_msg=f"request {request}"
    )
    seeds = np.array([episode_seeds(SEED, request, k) for k in range(n)], dtype=np.int64)
    np.testing.assert_array_equal(infos["env_seed"], seeds[:, 0], err_msg=f"request {request}")
    np.testing.assert_array_equal(infos["policy_seed"], seeds[:, 1], err_msg=f"request {request}")
    assert set(infos["agent_version"].tolist()) == {1}, f"request {request}: stale agent"
    total = int(batch.lengths.sum())
    assert total >= STEPS > total - int(batch.lengths[-1]), f"request {request}: not the prefix"


def local_answer(policy: MLPCategoricalPolicy, request: int, episodes: int) -> EpisodeBatch:
    """Episodes 0..episodes-1 of a request run locally from the same seeds."""
    vec = VecWorker(n_envs=4, env=ENV, policy=policy)
    try:
        return vec.run(make_units(SEED, request, range(episodes)))
    finally:
        vec.shutdown()


def test_random_worker_kills_lose_nothing_and_leak_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    env = EnvConfig(ENV.id, dict(ENV.kwargs), imports=(ENV_MODULE,))
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=[16], seed=5)
    answers: list[EpisodeBatch] = []
    with ProcessFleet(tmp_path) as fleet:
        fleet.start_coordinator(
            "--env", ENV.id, "--env-kwargs", '{"obs_shape": [16, 16], "length": 40}'
        )
        for _ in range(WORKERS):
            fleet.start_worker(envs=2, imports=[ENV_MODULE])
        fleet.wait_for_workers(WORKERS)
        sampler = fleet.sampler(seed=SEED, timeout=300)
        sampler.update_agent(policy)
        assert fleet.coordinator is not None
        rss = RssProbe(fleet.coordinator.pid)
        chaos = Chaos(fleet, rng)
        start = time.monotonic()
        try:
            while time.monotonic() - start < DURATION:
                answers.append(sampler.obtain_samples(len(answers), STEPS))
                if chaos.failure is not None:
                    raise chaos.failure
        finally:
            chaos.join()
            rss.join()
        assert fleet.coordinator.alive

    assert chaos.kills >= DURATION / 8, f"only {chaos.kills} kills: the soak did not soak"
    for request, batch in enumerate(answers):
        check_answer(batch, request)
    checked = {0, len(answers) - 1, *rng.sample(range(len(answers)), min(CHECKED, len(answers)))}
    for request in sorted(checked):
        expected = local_answer(policy, request, answers[request].n_episodes)
        assert_same_batch(answers[request], expected, skip_infos=("worker", "agent_version"))

    moved = sum(_nbytes(batch) for batch in answers)
    warm, final = rss.after(WARM_UP), rss.final()
    limit = warm * (1 + RSS_GROWTH) + RSS_SLACK_BYTES
    trend = ", ".join(f"{rss.after(DURATION * q) / 2**20:.1f}" for q in (0.25, 0.5, 0.75, 0.95))
    print(
        f"soak: {len(answers)} answers, {chaos.kills} kills, {moved / 2**20:.0f} MiB moved, "
        f"coordinator RSS (MiB) at 25/50/75/95% of the run: {trend}; final {final / 2**20:.1f}"
    )
    assert final <= limit, (
        f"coordinator RSS grew from {warm / 2**20:.1f} MiB after warm-up to "
        f"{final / 2**20:.1f} MiB (limit {limit / 2**20:.1f} MiB) while forwarding "
        f"{moved / 2**20:.0f} MiB in {len(answers)} answers with {chaos.kills} worker kills"
    )
    # The check must be able to see a leak of what flows through.
    assert moved > 4 * limit, f"only {moved / 2**20:.0f} MiB moved: too little to see a leak"


def _nbytes(batch: EpisodeBatch) -> int:
    arrays = [batch.observations, batch.actions, batch.rewards, batch.last_observations]
    return sum(int(a.nbytes) for a in arrays)
