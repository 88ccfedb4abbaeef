"""The long soak: every sampling mode, updates, and every fault, for ten minutes or more.

Opt-in (marker ``soak_long``; it occupies a core for its whole run)::

    RLFLEET_SOAK_LONG=1 python -m pytest -m soak_long tests/test_soak_long.py -s

``RLFLEET_SOAK_LONG_SECONDS`` sets the duration (default 600). A learner
loops over ``obtain_samples``, ``obtain_episodes``, ``obtain_exact_episodes``
and ``obtain_fragments``, pushes new agent parameters and switches between
two envs (with a new policy) now and then, while a chaos thread SIGKILLs
and restarts workers, SIGSTOPs them past the heartbeat timeout, and, four
times in the first 40% of the run, kills and restarts the coordinator. A call
that fails because the coordinator went away is retried, as the docs say.
At the end:

* every episode answer holds episodes ``0..n-1`` once each, with the seeds
  derived for its request, the agent version the fleet acknowledged, and
  equals, bit for bit, the same episodes run locally (its undisturbed
  twin); STEPS answers are the shortest prefix reaching the steps asked;
* every fragments answer is whole: its pieces are unique by (stream,
  episode, fragment), ordered, at most ``fragment_length`` long, and reach
  the steps asked; it holds every stream the coordinator that answered it
  ever had (a dead worker's streams are taken over, not dropped), and each
  stream's pieces equal, bit for bit, that stream run locally without
  faults through the same agent and env updates (its twin; a coordinator
  restart starts every stream over, and the twins with them);
* a lease of CartPoles (``RemoteVectorEnv`` over the same fleet) is stepped
  beside all this by a second learner thread, every env's trajectory
  compared, step by step, with a local ``gym.make`` given the same seeds and
  actions (the determinism contract of docs/vector_env.md); an env lost
  with its worker says so (``rlfleet_env_lost``) and is reset; a lease that
  the coordinator's restart ended is opened again; no call hangs past its
  deadline;
* the last coordinator's resident memory is flat after its warm-up.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import RemoteVectorEnv
from rlfleet.core import EpisodeBatch
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs import EnvConfig
from rlfleet.errors import NoWorkersError, UnavailableError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import Proc, ProcessFleet
from tests.test_soak import RSS_GROWTH, RSS_SLACK_BYTES, RssProbe

DURATION = float(os.environ.get("RLFLEET_SOAK_LONG_SECONDS", "600"))
pytestmark = [
    pytest.mark.soak_long,
    pytest.mark.skipif(
        os.environ.get("RLFLEET_SOAK_LONG") != "1",
        reason="opt-in long soak: set RLFLEET_SOAK_LONG=1 and run -m soak_long",
    ),
    pytest.mark.timeout(DURATION * 3 + 600),
]

SEED = 1212
ENV_MODULE = "tests.fixtures.fault_envs"
ENVS = (
    EnvConfig("rlfleet-tests/BigObs-v0", {"obs_shape": [16, 16], "length": 40}),
    EnvConfig("rlfleet-tests/BigObs-v0", {"obs_shape": [8, 12], "length": 25}),
)
WORKERS = 3
STEPS = 1500
FRAGMENT_LENGTH = 50
#: When (shares of the run) the coordinator is killed and restarted; memory
#: is measured on the last coordinator from MEMORY_FROM of the run, compared
#: with its size a quarter of the way into that.
COORDINATOR_RESTARTS = (0.1, 0.2, 0.3, 0.4)
MEMORY_FROM = 0.45
#: Seconds a frozen worker stays frozen: past the tests' 3 s heartbeat timeout.
FROZEN_SECONDS = 5.0
VERSION = ("worker", "agent_version")
#: The leased envs: deterministic given seed and actions, so each has a local twin.
LEASE_ENV = "CartPole-v1"
LEASE_ENVS = 2
LOST = "rlfleet_env_lost"
T = TypeVar("T")


@dataclass
class Answer:
    """One episode answer and what it must equal."""

    batch: EpisodeBatch
    request: int
    env: int
    params: dict[str, np.ndarray]
    agent_version: int
    steps: int | None  # STEPS answers: the steps asked


class MixedChaos:
    """Kills, freezes and restarts workers, and (early on) the coordinator."""

    def __init__(self, fleet: ProcessFleet, rng: random.Random, coordinator_flags: list[str]):
        self.fleet = fleet
        self.rng = rng
        self.flags = coordinator_flags
        self.counts = {"kill": 0, "freeze": 0, "coordinator": 0}
        self.start = time.monotonic()
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            restarts = list(COORDINATOR_RESTARTS)
            while not self.stop.wait(self.rng.uniform(1.0, 4.0)):
                elapsed = (time.monotonic() - self.start) / DURATION
                if restarts and elapsed >= restarts[0]:
                    restarts.pop(0)
                    self._restart_coordinator()
                elif self.rng.random() < 0.3:
                    self._freeze_one()
                else:
                    self._kill_one()
                self._replace_missing()
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def _alive(self) -> list[Proc]:
        return [w for w in self.fleet.workers if w.alive]

    def _kill_one(self) -> None:
        alive = self._alive()
        if alive:
            self.fleet.kill(self.rng.choice(alive))
            self.counts["kill"] += 1

    def _freeze_one(self) -> None:
        alive = self._alive()
        if alive:
            worker = self.rng.choice(alive)
            self.fleet.freeze(worker)
            self.counts["freeze"] += 1
            self.stop.wait(FROZEN_SECONDS)
            self.fleet.thaw(worker)

    def _restart_coordinator(self) -> None:
        coordinator = self.fleet.coordinator
        self.fleet.kill(coordinator)
        self.counts["coordinator"] += 1
        self.stop.wait(self.rng.uniform(0.0, 2.0))
        self.fleet.start_coordinator(*self.flags)

    def _replace_missing(self) -> None:
        if self.stop.wait(self.rng.uniform(0.0, 2.0)):
            return
        for _ in range(WORKERS - len(self._alive())):
            self.fleet.start_worker(envs=2, imports=[ENV_MODULE])

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=120)
        for worker in self._alive():
            self.fleet.thaw(worker)


class LeaseDriver:
    """A second learner: steps leased envs, each against a local twin, until stopped.

    Records the first broken promise in ``failure`` (the test raises it).
    """

    def __init__(self, address: str, seed: int) -> None:
        self.address = address
        self.rng = np.random.default_rng(seed)
        self.counts = {"steps": 0, "episodes": 0, "lost": 0, "reopened": 0}
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    with RemoteVectorEnv(
                        self.address, LEASE_ENV, LEASE_ENVS, call_timeout=60, open_timeout=120
                    ) as venv:
                        self._drive(venv)
                except (UnavailableError, NoWorkersError):
                    # The coordinator went away (or had no worker yet): open a new lease.
                    self.counts["reopened"] += 1
                    self.stop.wait(0.5)
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def _reset(self, venv: RemoteVectorEnv, twins: list[gym.Env], i: int) -> np.ndarray:
        seed = int(self.rng.integers(2**31))
        obs, _ = venv.reset([i], seed=[seed])
        want, _ = twins[i].reset(seed=seed)
        np.testing.assert_array_equal(obs[0], want, err_msg=f"leased env {i}: reset({seed})")
        return want

    def _drive(self, venv: RemoteVectorEnv) -> None:
        twins = [gym.make(LEASE_ENV) for _ in range(LEASE_ENVS)]
        for i in range(LEASE_ENVS):
            self._reset(venv, twins, i)
        while not self.stop.is_set():
            actions = self.rng.integers(2, size=LEASE_ENVS)
            obs, rewards, terminated, truncated, infos = venv.step(actions)
            self.counts["steps"] += LEASE_ENVS
            for i in range(LEASE_ENVS):
                if infos[i].get(LOST):  # its worker died: a fresh env elsewhere, flagged
                    assert truncated[i] and not terminated[i], f"leased env {i}: lost, not cut"
                    self.counts["lost"] += 1
                    self._reset(venv, twins, i)
                    continue
                want = twins[i].step(int(actions[i]))
                got = (obs[i], rewards[i], terminated[i], truncated[i])
                for name, a, b in zip(
                    ("obs", "reward", "terminated", "truncated"), got, want, strict=False
                ):
                    np.testing.assert_array_equal(a, b, err_msg=f"leased env {i}: {name}")
                if terminated[i] or truncated[i]:
                    self.counts["episodes"] += 1
                    self._reset(venv, twins, i)

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=180)
        assert not self._thread.is_alive(), "the lease driver hangs"


def retried(call: Callable[[], T], chaos: MixedChaos) -> T:
    """``call``, retried while the coordinator is away (the documented remedy)."""
    deadline = time.monotonic() + 300
    while True:
        if chaos.failure is not None:
            raise chaos.failure
        try:
            return call()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def check_episodes(answer: Answer, env: EnvConfig) -> None:
    """Indices, seeds, version and prefix of one episode answer (cheap)."""
    batch, request = answer.batch, answer.request
    n = batch.n_episodes
    infos = batch.episode_infos
    what = f"request {request}"
    np.testing.assert_array_equal(infos["episode_index"], np.arange(n), err_msg=what)
    seeds = np.array([episode_seeds(SEED, request, k) for k in range(n)], dtype=np.int64)
    np.testing.assert_array_equal(infos["env_seed"], seeds[:, 0], err_msg=what)
    np.testing.assert_array_equal(infos["policy_seed"], seeds[:, 1], err_msg=what)
    assert set(infos["agent_version"].tolist()) == {answer.agent_version}, f"{what}: stale agent"
    assert batch.observations.shape[1:] == tuple(env.kwargs["obs_shape"]), f"{what}: wrong env"
    if answer.steps is not None:
        total = int(batch.lengths.sum())
        assert total >= answer.steps > total - int(batch.lengths[-1]), f"{what}: not the prefix"


def check_fragments(batch: EpisodeBatch, amount: int, what: str) -> None:
    """A fragments answer is whole and ordered, nothing duplicated."""
    infos = batch.episode_infos
    keys = list(
        zip(
            infos["stream"].tolist(),
            infos["episode_index"].tolist(),
            infos["fragment_index"].tolist(),
            strict=True,
        )
    )
    assert len(set(keys)) == len(keys), f"{what}: a fragment came twice"
    assert keys == sorted(keys), f"{what}: fragments out of order"
    assert int(batch.lengths.max()) <= FRAGMENT_LENGTH, what
    assert int(batch.lengths.sum()) >= amount, f"{what}: short"


class FragmentTwins:
    """Every fragment stream of the current coordinator, run locally and undisturbed.

    One single-slot VecWorker per stream (a stream does not depend on its
    slot or batch), fed the learner's agent and env updates in order.
    """

    def __init__(self, env: int, params: dict[str, np.ndarray]) -> None:
        self.env, self.params = env, params
        self.coordinator_id: str | None = None
        self.workers: dict[int, VecWorker] = {}
        self.checked = 0

    def _policy(self) -> MLPCategoricalPolicy:
        spec = env_config(self.env).env_spec()
        policy = MLPCategoricalPolicy(spec, hidden_sizes=[16])
        policy.set_param_values(self.params)
        return policy

    def agent(self, params: dict[str, np.ndarray]) -> None:
        self.params = params
        for worker in self.workers.values():
            worker.update_agent(self._policy())

    def switch(self, env: int, params: dict[str, np.ndarray]) -> None:
        self.env, self.params = env, params
        for worker in self.workers.values():
            worker.update_env(env_config(env))
            worker.update_agent(self._policy())

    def check(self, batch: EpisodeBatch, coordinator_id: str | None, what: str) -> None:
        if coordinator_id != self.coordinator_id:  # a new coordinator: streams start over
            self.close()
            self.coordinator_id = coordinator_id
        streams = sorted(set(batch.episode_infos["stream"].tolist()))
        known = max(self.workers, default=-1) + 1
        assert streams == list(range(max(len(streams), known))), f"{what}: streams {streams}"
        for stream in streams:
            got = batch.take_episodes(np.flatnonzero(batch.episode_infos["stream"] == stream))
            worker = self.workers.get(stream)
            if worker is None:
                worker = self.workers[stream] = VecWorker(
                    n_envs=1, env=env_config(self.env), policy=self._policy()
                )
            windows = got.total_steps // FRAGMENT_LENGTH
            want = EpisodeBatch.concatenate(
                *(
                    worker.collect_fragments(FRAGMENT_LENGTH, base_seed=SEED, streams=[stream])
                    for _ in range(windows)
                )
            )
            assert_same_batch(got, want, skip_infos=VERSION)
        self.checked += 1

    def close(self) -> None:
        for worker in self.workers.values():
            worker.shutdown()
        self.workers = {}


def env_config(env: int) -> EnvConfig:
    return EnvConfig(ENVS[env].id, dict(ENVS[env].kwargs), imports=(ENV_MODULE,))


def twin(answer: Answer) -> EpisodeBatch:
    """The same episodes run locally, undisturbed."""
    env = EnvConfig(ENVS[answer.env].id, dict(ENVS[answer.env].kwargs), imports=(ENV_MODULE,))
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=[16])
    policy.set_param_values(answer.params)
    vec = VecWorker(n_envs=4, env=env, policy=policy)
    try:
        return vec.run(make_units(SEED, answer.request, range(answer.batch.n_episodes)))
    finally:
        vec.shutdown()


def test_ten_minutes_of_every_mode_and_every_fault(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    specs = [EnvConfig(e.id, dict(e.kwargs), imports=(ENV_MODULE,)).env_spec() for e in ENVS]
    answers: list[Answer] = []
    fragments = updates = 0
    flags = ["--env", ENVS[0].id, "--env-kwargs", '{"obs_shape": [16, 16], "length": 40}']
    with ProcessFleet(tmp_path) as fleet:
        fleet.start_coordinator(*flags)
        for _ in range(WORKERS):
            fleet.start_worker(envs=2, imports=[ENV_MODULE])
        fleet.wait_for_workers(WORKERS)
        sampler = fleet.sampler(seed=SEED, timeout=300, wait_for_workers=120)
        env = 0
        policy = MLPCategoricalPolicy(specs[env], hidden_sizes=[16], seed=0)
        sampler.update_agent(policy)
        twins = FragmentTwins(env, policy.get_param_values())

        def acked() -> int:
            # The version the answer's header named (versions count per
            # coordinator, so a restart renumbers them).
            version = sampler.agent_version
            assert version is not None
            return version

        chaos = MixedChaos(fleet, rng, flags)
        leases = LeaseDriver(fleet.address, SEED)
        rss: RssProbe | None = None
        start = time.monotonic()
        try:
            while (elapsed := time.monotonic() - start) < DURATION:
                restarted = chaos.counts["coordinator"] == len(COORDINATOR_RESTARTS)
                if rss is None and restarted and elapsed > DURATION * MEMORY_FROM:
                    coordinator = fleet.coordinator
                    rss = RssProbe(coordinator.pid)
                roll = rng.random()
                params = policy.get_param_values()
                request = sampler.requests_made
                if roll < 0.05:  # a new env and a policy for it, in one request
                    env = 1 - env
                    policy = MLPCategoricalPolicy(specs[env], hidden_sizes=[16], seed=request)
                    params = policy.get_param_values()
                    batch = retried(
                        partial(
                            sampler.obtain_samples,
                            request,
                            STEPS,
                            agent_update=policy,
                            env_update=ENVS[env],
                        ),
                        chaos,
                    )
                    answers.append(Answer(batch, request, env, params, acked(), STEPS))
                    twins.switch(env, params)
                    updates += 1
                elif roll < 0.15:  # new parameters, as a training loop pushes them
                    policy = MLPCategoricalPolicy(specs[env], hidden_sizes=[16], seed=request)
                    retried(partial(sampler.update_agent, policy), chaos)
                    twins.agent(policy.get_param_values())
                    updates += 1
                elif roll < 0.30:
                    batch = retried(lambda: sampler.obtain_fragments(STEPS, FRAGMENT_LENGTH), chaos)
                    what = f"fragments request {request}"
                    check_fragments(batch, STEPS, what)
                    twins.check(batch, sampler.coordinator_id, what)
                    fragments += 1
                elif roll < 0.45:
                    batch = retried(lambda: sampler.obtain_episodes(24), chaos)
                    answers.append(Answer(batch, request, env, params, acked(), None))
                elif roll < 0.55:
                    batch = retried(lambda: sampler.obtain_exact_episodes(4), chaos)
                    answers.append(Answer(batch, request, env, params, acked(), None))
                else:
                    batch = retried(partial(sampler.obtain_samples, request, STEPS), chaos)
                    answers.append(Answer(batch, request, env, params, acked(), STEPS))
                if chaos.failure is not None:
                    raise chaos.failure
                if leases.failure is not None:
                    raise leases.failure
        finally:
            twins.close()
            leases.join()
            chaos.join()
            if rss is not None:
                rss.join()
        assert fleet.coordinator.alive

    counts = chaos.counts
    assert counts["kill"] + counts["freeze"] >= DURATION / 12, f"only {counts}: no soak"
    assert counts["freeze"] >= 1 and counts["coordinator"] >= 1, counts
    assert updates >= 2 and fragments >= 2, (updates, fragments)
    if leases.failure is not None:
        raise leases.failure
    assert leases.counts["episodes"] >= 2 and leases.counts["lost"] >= 1, leases.counts
    for answer in answers:
        check_episodes(answer, ENVS[answer.env])
        # Versions count per coordinator: compare everything else with the twin.
        assert_same_batch(answer.batch, twin(answer), skip_infos=VERSION)

    assert rss is not None
    probed = rss.samples[-1][0]
    warm, final = rss.after(probed * 0.25), rss.final()
    limit = warm * (1 + RSS_GROWTH) + RSS_SLACK_BYTES
    print(
        f"long soak: {DURATION:.0f} s, {len(answers)} episode answers and {twins.checked} "
        f"fragment answers (all equal to their twins), {updates} updates, faults {counts}; "
        f"leased envs {leases.counts}; last "
        f"coordinator RSS {warm / 2**20:.1f} MiB after warm-up, {final / 2**20:.1f} MiB at "
        f"the end ({probed:.0f} s measured)"
    )
    assert final <= limit, (
        f"coordinator RSS grew from {warm / 2**20:.1f} to {final / 2**20:.1f} MiB "
        f"(limit {limit / 2**20:.1f} MiB)"
    )
