"""RemoteVectorEnv: tianshou's vector-env API over env leases on a real local fleet.

One embedded coordinator and two real worker processes (``Fleet.local``)
serve every test here; fault tests with killed processes live in
tests/test_leases_faults.py.
"""

from __future__ import annotations

import gc
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from grpc import _common

import rlfleet.envs.testing  # noqa: F401  (registers the test envs here too)
from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.client.leases.lease_stream import LeaseEnvFailure, LeaseStream
from rlfleet.coordinator.leases.manager import Lease
from rlfleet.envs import EnvConfig
from rlfleet.errors import (
    AuthenticationError,
    ConfigError,
    EnvError,
    InvalidArgumentError,
    NoWorkersError,
    PolicyError,
    ResourceExhaustedError,
    UsageError,
    VectorEnvError,
)
from rlfleet.transport import rpc
from tests.test_grpc_waits import wake_ups_in_a_second
from tests.waiting import wait_until

TESTING = "rlfleet.envs.testing"
#: Per-lease cap of the fixture's coordinator (its fleet has 2 x 4 slots).
MAX_PER_LEASE = 6
#: Per-learner caps of the fixture's coordinator.
MAX_LEASES_PER_LEARNER = 2
MAX_ENVS_PER_LEARNER = 7


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(
        workers=2,
        envs_per_worker=4,
        imports=(TESTING,),
        coordinator_options={
            "max_envs_per_lease": MAX_PER_LEASE,
            "max_leases_per_learner": MAX_LEASES_PER_LEARNER,
            "max_envs_per_learner": MAX_ENVS_PER_LEARNER,
        },
    )
    try:
        yield fleet
    finally:
        fleet.close()


def test_envs_follow_gym_make_whichever_worker_hosts_them(fleet: Fleet) -> None:
    """Env i reset with seed s and given the same actions matches gym.make locally."""
    seeds = [10, 11, 12, 13]
    rng = np.random.default_rng(0)
    with RemoteVectorEnv(fleet, "CartPole-v1", 4) as venv:
        assert sorted(set(venv.env_workers)) == ["local-0", "local-1"]  # spread by capacity
        local = [gym.make("CartPole-v1") for _ in seeds]
        obs, infos = venv.reset(seed=seeds)
        want = np.stack([env.reset(seed=s)[0] for env, s in zip(local, seeds, strict=True)])
        np.testing.assert_array_equal(obs, want)
        assert [info["env_id"] for info in infos] == [0, 1, 2, 3]
        episodes = seedless = 0
        for _ in range(80):
            actions = rng.integers(0, 2, size=4)
            obs, rewards, terminated, truncated, _ = venv.step(actions)
            for i, env in enumerate(local):
                o, r, term, trunc, _ = env.step(int(actions[i]))
                np.testing.assert_array_equal(obs[i], o)
                assert (rewards[i], terminated[i], truncated[i]) == (r, term, trunc)
            done = np.flatnonzero(terminated | truncated)
            if len(done) and episodes % 2:
                # Seedless: answered by the reset the worker made when the
                # episode ended (prefetch_resets), the env's RNG going on.
                obs_done, _ = venv.reset(done)
                seedless += len(done)
                for row, ended in enumerate(done):
                    np.testing.assert_array_equal(obs_done[row], local[ended].reset()[0])
            elif len(done):
                new_seeds = [100 + episodes + k for k in range(len(done))]
                obs_done, _ = venv.reset(done, seed=new_seeds)
                for row, ended in enumerate(done):
                    np.testing.assert_array_equal(
                        obs_done[row], local[ended].reset(seed=new_seeds[row])[0]
                    )
            episodes += len(done)
        assert seedless and episodes > seedless  # both kinds of resets, mid-run


def test_tianshou_api(fleet: Fleet) -> None:
    config = EnvConfig("rlfleet/Counter-v0", {"length": 3, "render_mode": "rgb_array"})
    with RemoteVectorEnv(fleet.sampler, config, 3, seed=[1, 2, None]) as venv:
        assert len(venv) == 3
        assert venv.observation_space == [gym.spaces.Box(0.0, 3.0, (1,), np.float32)] * 3
        _, infos = venv.reset()
        assert [info.get("seed") for info in infos] == [1, 2, None]
        # seed() reseeds now (a reset with the seeds): the envs step right after.
        assert venv.seed([5, None, 7]) == [[5], [None], [7]]
        assert venv.get_env_attr("episode_step") == [0, 0, 0]
        _, infos = venv.reset(seed=[5, None, 7])
        assert [info.get("seed") for info in infos] == [5, None, 7]
        obs, rewards, _, _, infos = venv.step([0, 1], id=[2, 0])
        assert obs.tolist() == [[1.0], [1.0]] and rewards.tolist() == [1.0, 1.0]
        assert [info["env_id"] for info in infos] == [2, 0]
        frames = venv.render()
        assert [int(f[0, 0, 0]) for f in frames] == [1, 0, 1]
        assert venv.get_env_attr("length") == [3, 3, 3]
        venv.set_env_attr("length", 9, id=[1])
        assert venv.get_env_attr("length") == [3, 9, 3]
        assert venv.call_env_method("get_wrapper_attr", ("length",), id=1) == [9]
        assert "rlfleet.envs.testing.CounterEnv" in venv.class_names(0)[0]
        _, _, terminated, _, _ = venv.step([0, 0], id=[0, 0 + 2])
        assert not terminated.any()
        _, _, terminated, _, _ = venv.step([0, 0], id=[0, 2])
        assert terminated.all()  # length 3
        with pytest.raises(VectorEnvError, match="reset"):
            venv.step([0], id=[0])
    assert venv.closed
    with pytest.raises(UsageError):
        venv.reset()


def test_async_wait_num_returns_ready_envs_and_loses_none(fleet: Fleet) -> None:
    """wait_num: step returns the first ready envs; every step sent comes back once."""
    config = EnvConfig(
        "rlfleet/Slow-v0", {"step_seconds": 0.0005, "max_seconds": 0.005, "length": 1000}
    )
    with RemoteVectorEnv(fleet, config, 4, wait_num=2) as venv:
        assert venv.is_async
        venv.reset(seed=[1, 2, 3, 4])
        sent = {i: 0 for i in range(4)}
        returned = {i: 0 for i in range(4)}
        steps_of = {i: 0 for i in range(4)}
        ready = [0, 1, 2, 3]
        for _ in range(30):
            for i in ready:
                sent[i] += 1
            obs, _, _, _, infos = venv.step(np.zeros(len(ready), np.int64), id=ready)
            ready = [int(info["env_id"]) for info in infos]
            assert 1 <= len(ready) <= 4
            for row, i in enumerate(ready):
                returned[i] += 1
                steps_of[i] += 1
                assert obs[row, 0] == steps_of[i]  # each env's own step count, in order
        while sum(sent.values()) > sum(returned.values()):
            _, _, _, _, infos = venv.step([], id=[])
            for info in infos:
                returned[int(info["env_id"])] += 1
        assert sent == returned


def test_env_errors_name_worker_and_env(fleet: Fleet) -> None:
    config = EnvConfig("rlfleet/Crashing-v0", {"crash_at_step": 2})
    with RemoteVectorEnv(fleet, config, 2) as venv:
        venv.reset()
        venv.step([0, 0])
        with pytest.raises(EnvError) as caught:
            venv.step([0, 0])
        assert caught.value.worker in ("local-0", "local-1")
        assert caught.value.env_index in (0, 1)
        assert "RuntimeError" in str(caught.value)
        venv.reset()  # the envs work again after a reset
        venv.step([0, 0])


def test_leases_and_sampling_share_the_fleet(fleet: Fleet) -> None:
    with RemoteVectorEnv(fleet, "CartPole-v1", 4) as venv:
        venv.reset(seed=0)
        batch = fleet.sampler.obtain_exact_episodes(4)
        venv.step(np.zeros(4, np.int64))
    assert len(batch.lengths) == 8  # garage's contract: 4 episodes per worker


def test_a_fully_leased_fleet_samples_once_slots_are_released(fleet: Fleet) -> None:
    """Leased envs take sampling slots: with all 8 leased, sampling waits for a release."""
    events: list[str] = []
    leases = [
        RemoteVectorEnv(fleet, "CartPole-v1", MAX_PER_LEASE, learner="a"),
        RemoteVectorEnv(fleet, "CartPole-v1", 8 - MAX_PER_LEASE, learner="b"),
    ]
    assert fleet.sampler.status().leased_envs == 8

    def sample() -> None:
        fleet.sampler.obtain_exact_episodes(1)
        events.append("sampled")

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        sampler.join(2.0)  # time enough to sample 2 short episodes, had it slots
        events.append("released")
    finally:
        for venv in leases:
            venv.close()
    sampler.join(60)
    assert events == ["released", "sampled"]


@pytest.mark.parametrize(
    ("num_envs", "message"),
    [(0, "must be an int >= 1, got 0"), (2**32, "must be an int <= 4294967295, got 4294967296")],
)
def test_a_num_envs_the_protocol_cannot_carry_is_a_config_error(
    fleet: Fleet, num_envs: int, message: str
) -> None:
    # 2**32 once reached protobuf and came back as its raw "Value out of range".
    with pytest.raises(ConfigError, match=f"RemoteVectorEnv num_envs {message}"):
        RemoteVectorEnv(fleet, "CartPole-v1", num_envs)


def test_caps_and_capacity_give_clear_errors(fleet: Fleet) -> None:
    with pytest.raises(ResourceExhaustedError, match=f"at most {MAX_PER_LEASE} envs"):
        RemoteVectorEnv(fleet, "CartPole-v1", MAX_PER_LEASE + 1)
    with RemoteVectorEnv(fleet, "CartPole-v1", MAX_PER_LEASE) as venv:
        # 8 slots, 6 leased: 3 more (another learner's) do not fit, and the error says why.
        with pytest.raises(NoWorkersError, match="2 free slots"):
            RemoteVectorEnv(fleet, "CartPole-v1", 3, open_timeout=1.0, learner="other")
        venv.reset()
    # Released on close: the slots are free again.
    with RemoteVectorEnv(fleet, "CartPole-v1", MAX_PER_LEASE, open_timeout=10.0) as venv:
        venv.reset()


def test_one_learner_cannot_take_the_fleet_with_many_leases(fleet: Fleet) -> None:
    with RemoteVectorEnv(fleet, "CartPole-v1", 1), RemoteVectorEnv(fleet, "CartPole-v1", 1):
        with pytest.raises(
            ResourceExhaustedError, match=f"at most {MAX_LEASES_PER_LEARNER} leases"
        ) as refused:
            RemoteVectorEnv(fleet, "CartPole-v1", 1)
        assert f"{socket.gethostname()}:{os.getpid()}" in str(refused.value)  # who
        # Another learner is not held back by this one's leases.
        with RemoteVectorEnv(fleet, "CartPole-v1", 1, learner="other") as other:
            other.reset(seed=0)
    with RemoteVectorEnv(fleet, "CartPole-v1", 5, learner="big"):
        # 8 slots and 5 leased: 3 more would fit the fleet, not the learner's cap.
        with pytest.raises(ResourceExhaustedError, match=f"at most {MAX_ENVS_PER_LEARNER} envs"):
            RemoteVectorEnv(fleet, "CartPole-v1", 3, learner="big")
        with RemoteVectorEnv(fleet, "CartPole-v1", 2, learner="big") as more:
            more.reset(seed=0)
    # Released leases no longer count.
    with RemoteVectorEnv(fleet, "CartPole-v1", MAX_ENVS_PER_LEARNER - 1, learner="big") as venv:
        venv.reset(seed=0)


def test_bad_env_is_refused_with_the_workers_error(fleet: Fleet) -> None:
    with pytest.raises(Exception, match="RlfleetMissing-v0"):
        RemoteVectorEnv(fleet, "RlfleetMissing-v0", 1)


def test_readme_example_runs() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Remote vector envs", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's remote vector env section has no python example"
    exec(compile(match.group(1), "README.md", "exec"), {})


def test_bad_actions_are_refused_with_a_policy_error(fleet: Fleet) -> None:
    with RemoteVectorEnv(fleet, "CartPole-v1", 2) as venv:
        venv.reset(seed=0)
        with pytest.raises(PolicyError, match="do not fit the action space"):
            venv.step(np.zeros((2, 3)))
        venv.reset()
        venv.step([0, 1])


def test_an_authenticated_fleet_leases_only_to_its_learner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLFLEET_TOKEN", raising=False)
    monkeypatch.delenv("RLFLEET_LEARNER_TOKEN", raising=False)
    with Fleet.local(workers=1, envs_per_worker=1, authenticate=True) as sampler:
        with pytest.raises(AuthenticationError):
            RemoteVectorEnv(sampler.address, "CartPole-v1", 1, open_timeout=5)
        with RemoteVectorEnv(sampler, "CartPole-v1", 1) as venv:  # the sampler's token
            venv.reset(seed=0)
            venv.step([1])


def test_the_coordinator_refuses_a_call_that_breaks_the_protocol(fleet: Fleet) -> None:
    """A raw lease stream: a call naming an env the lease does not have ends the lease."""
    channel = fleet.sampler.open_channel()
    try:
        stream = LeaseStream(channel, EnvConfig("CartPole-v1"), 2, open_timeout=30, call_timeout=30)
        stream.send("reset", [0, 1], [{"seed": 1}, {"seed": 2}])
        assert set(stream.receive([0, 1], 2, None)) == {0, 1}
        stream.send("step", [0, 5], [np.int64(0), np.int64(1)])  # the lease has envs 0 and 1
        answers = stream.receive([0, 5], 2, None)
        errors = [a.error for a in answers.values() if isinstance(a, LeaseEnvFailure)]
        assert len(errors) == 2 and all(isinstance(e, InvalidArgumentError) for e in errors)
        assert "must be distinct and < 2" in str(errors[0])
        stream.close()
    finally:
        channel.close()


def test_leases_show_in_the_coordinators_metrics(fleet: Fleet) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    watched = ("rlfleet_leases", "rlfleet_leased_envs", "rlfleet_lease_call_duration_seconds_count")

    def scrape() -> dict[tuple[str, str], float]:
        text = generate_latest(fleet.server.coordinator.metrics.registry).decode()
        return {
            (sample.name, sample.labels.get("op", "")): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in watched
        }

    before = scrape()
    with RemoteVectorEnv(fleet.sampler, "CartPole-v1", 3) as venv:
        venv.reset(seed=0)
        for _ in range(5):
            venv.step(np.zeros(3, np.int64))  # 3 envs on 2 workers: one call, one answer
        during = scrape()
    count = "rlfleet_lease_call_duration_seconds_count"
    assert during[("rlfleet_leases", "")] == before[("rlfleet_leases", "")] + 1
    assert during[("rlfleet_leased_envs", "")] == before[("rlfleet_leased_envs", "")] + 3
    # One observation per learner call once all its envs answered, labelled by op.
    assert during[(count, "step")] == before.get((count, "step"), 0) + 5
    assert during[(count, "reset")] == before.get((count, "reset"), 0) + 1


def test_closed_leases_leave_no_bookkeeping_behind(fleet: Fleet) -> None:
    """After many leases opened, stepped and closed, the coordinator holds none
    of them: no Lease object, call clock or reader thread survives its lease
    (docs/reliability.md, "Memory with leases")."""
    rng = np.random.default_rng(3)
    for cycle in range(12):
        with RemoteVectorEnv(fleet, "CartPole-v1", 2) as venv:
            venv.reset(seed=[cycle, cycle + 100])
            for _ in range(int(rng.integers(3, 30))):
                _, _, terminated, truncated, _ = venv.step(rng.integers(0, 2, size=2))
                done = [i for i in range(2) if terminated[i] or truncated[i]]
                if done:
                    venv.reset(done, seed=done)

    def leftovers() -> tuple[object, ...]:
        gc.collect()
        leases = [o for o in gc.get_objects() if isinstance(o, Lease)]
        threads = [t.name for t in threading.enumerate() if t.name.startswith("rlfleet-lease")]
        return fleet.server.coordinator.leases.counts(), len(leases), threads

    # The streams' threads end once the calls have.
    wait_until(
        lambda: leftovers() == ((0, 0, {}), 0, []),
        "no lease, Lease object or lease thread left",
        describe=lambda: repr(leftovers()),
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_lease_streams_reader_sleeps_while_no_reply_comes(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # grpcio's own wait wakes a reader ten times a second to look for
    # signals, which only the main thread runs; each wake-up takes the GIL
    # from the learner. This process's workers may have replaced it already.
    monkeypatch.setattr(_common, "wait", rpc._grpc_wait)
    channel = fleet.sampler.open_channel()
    try:
        stream = LeaseStream(channel, EnvConfig("CartPole-v1"), 1, open_timeout=30, call_timeout=30)
        reader = stream._reader
        assert reader.name == "rlfleet-lease"
        woke = wake_ups_in_a_second(reader)
        assert woke <= 2, f"the lease's reader woke {woke} times in a second of silence"
        stream.send("reset", [0], [{"seed": 1}])  # and a reply still comes
        assert set(stream.receive([0], 1, None)) == {0}
        stream.close()
    finally:
        channel.close()
