"""RemoteVectorEnv over several coordinators (docs/sharding.md, "Remote vector envs").

Real coordinator and worker processes on 127.0.0.1, real gymnasium envs:
a vector env whose envs are leased on two coordinators (contiguous blocks,
one lease each) answers as one leased on one coordinator, waits on both
coordinators at once in async mode, releases both leases, names the
coordinator in its errors, and fails the envs of a coordinator that died
with the error its lease ended with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs here too)
from rlfleet.client import Fleet, RemoteSampler, RemoteVectorEnv
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, EnvError, NoWorkersError, UnavailableError
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

TESTING = "rlfleet.envs.testing"
SEEDS = [10, 11, 12, 13, 14, 15]
#: Seconds each step of the slow coordinator's envs takes in the async test:
#: far beyond a CartPole-sized round trip, even on a busy machine.
SLOW_STEP_SECONDS = 3.0


@pytest.fixture(scope="module")
def sharded() -> Iterator[Fleet]:
    """Two coordinator processes with one worker of 4 slots each, with tokens."""
    fleet = Fleet.local(
        workers=2, envs_per_worker=4, coordinators=2, imports=(TESTING,), authenticate=True
    )
    try:
        yield fleet
    finally:
        fleet.close()


def leases_on(fleet: Fleet) -> list[tuple[int, int]]:
    """(leases, leased envs) on each coordinator of ``fleet``."""
    counts = []
    for address in fleet.addresses:
        with RemoteSampler(address, token=fleet.learner_token) as one:
            status = one.status()
            counts.append((status.leases, status.leased_envs))
    return counts


def trajectory(venv: RemoteVectorEnv) -> list[Any]:
    """What a fixed script of resets, steps, seeds and attribute calls returns."""
    rng = np.random.default_rng(3)
    seen: list[Any] = list(venv.reset(seed=SEEDS)[0])
    for t in range(60):
        ids = [5, 2, 3] if t % 3 == 0 else list(range(6))  # some steps on a few envs of both
        obs, rewards, terminated, truncated, infos = venv.step(rng.integers(0, 2, len(ids)), ids)
        seen += [obs, rewards, terminated, truncated, [info["env_id"] for info in infos]]
        ended = [i for i, done in zip(ids, terminated | truncated, strict=True) if done]
        if ended:
            seen.append(venv.reset(id=ended)[0])  # seedless: the prefetched resets
        if t == 20:
            seen.append(venv.reset(id=[4, 1], seed=[7, 8])[0])
        if t == 40:
            seen.append(venv.seed(100))
            seen.append(venv.reset()[0])
    seen.append(venv.get_env_attr("_elapsed_steps", id=[5, 0, 3]))
    return seen


def test_envs_over_two_coordinators_step_as_on_one(sharded: Fleet) -> None:
    with RemoteVectorEnv(sharded, "CartPole-v1", 6) as venv:
        # Contiguous blocks in address order; worker i is on coordinator i % 2.
        assert venv.env_workers == ["local-0"] * 3 + ["local-1"] * 3
        assert len(venv.env_specs) == 6
        assert venv._stream.carrier == "data"  # both leases on their data channels
        assert leases_on(sharded) == [(1, 3), (1, 3)]
        assert sharded.sampler.status().leased_envs == 6
        got = trajectory(venv)
    with (
        Fleet.local(workers=2, envs_per_worker=4) as single,
        RemoteVectorEnv(single, "CartPole-v1", 6) as venv,
    ):
        expected = trajectory(venv)
    assert len(got) == len(expected)
    for actual, wanted in zip(got, expected, strict=True):
        np.testing.assert_array_equal(actual, wanted)


def test_async_steps_wait_on_both_coordinators_at_once(sharded: Fleet) -> None:
    config = EnvConfig(
        "rlfleet/Slow-v0", {"step_seconds": 0.0005, "max_seconds": 0.005, "length": 1000}
    )
    with RemoteVectorEnv(sharded, config, 6, wait_num=2) as venv:
        venv.reset(seed=SEEDS)
        sent = dict.fromkeys(range(6), 0)
        returned = dict.fromkeys(range(6), 0)
        ready = list(range(6))
        for _ in range(30):
            for i in ready:
                sent[i] += 1
            obs, _, _, _, infos = venv.step(np.zeros(len(ready), np.int64), id=ready)
            ready = [int(info["env_id"]) for info in infos]
            assert 1 <= len(ready) <= 6
            for row, i in enumerate(ready):
                returned[i] += 1
                assert obs[row, 0] == returned[i]  # each env's own step count, in order
        while venv.waiting_id:
            _, _, _, _, infos = venv.step(None, id=venv.waiting_id)
            for info in infos:
                returned[int(info["env_id"])] += 1
        assert sent == returned

    # The first coordinator's envs turn slow: the second's answers are
    # returned without waiting for them, by wait_num and by timeout.
    fast = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.0, "length": 1000})
    for options, wanted in (({"wait_num": 3}, {3, 4, 5}), ({"timeout": 1.0}, None)):
        with RemoteVectorEnv(sharded, fast, 6, **options) as venv:
            assert venv.is_async
            venv.reset(seed=0)
            venv.set_env_attr("_step_seconds", SLOW_STEP_SECONDS, id=[0, 1, 2])
            _, _, _, _, infos = venv.step(np.zeros(6, np.int64))
            first = {int(info["env_id"]) for info in infos}
            if wanted is not None:
                assert first == wanted
            else:  # the timeout returned some of the fast envs, before the slow ones
                assert first and first <= {3, 4, 5}, first
            rest: list[int] = []
            while venv.waiting_id:
                _, _, _, _, infos = venv.step(None, id=venv.waiting_id)
                rest += [int(info["env_id"]) for info in infos]
            assert sorted([*first, *rest]) == list(range(6))


def test_close_releases_the_lease_on_every_coordinator(sharded: Fleet) -> None:
    # An address list joined by commas works too, with the fleet's token.
    venv = RemoteVectorEnv(sharded.address, "CartPole-v1", 4, token=sharded.learner_token)
    venv.reset(seed=0)
    assert leases_on(sharded) == [(1, 2), (1, 2)]
    venv.close()
    wait_until(lambda: leases_on(sharded) == [(0, 0), (0, 0)], "no lease on either coordinator")
    # Fewer envs than coordinators: one env on each of the first.
    with RemoteVectorEnv(sharded, "CartPole-v1", 1) as venv:
        assert leases_on(sharded) == [(1, 1), (0, 0)]
        assert venv.reset(seed=3)[0].shape == (1, 4)
    wait_until(lambda: leases_on(sharded) == [(0, 0), (0, 0)], "no lease on either coordinator")
    # A lease one coordinator cannot hold (5 envs on 4 slots) fails naming it,
    # and the other coordinator's lease is released.
    with pytest.raises(NoWorkersError, match=re.escape(sharded.addresses[1])):
        RemoteVectorEnv(sharded, "CartPole-v1", 9, open_timeout=0.5)
    wait_until(lambda: leases_on(sharded) == [(0, 0), (0, 0)], "no lease on either coordinator")


def test_errors_name_the_coordinator_and_the_vector_envs_index(sharded: Fleet) -> None:
    config = EnvConfig("rlfleet/Crashing-v0", {"crash_at_step": 2})
    with RemoteVectorEnv(sharded, config, 4) as venv:
        venv.reset()
        venv.step([0, 0, 0, 0])
        with pytest.raises(EnvError) as caught:
            venv.step([0, 0], id=[2, 3])  # the second coordinator's envs 0 and 1
        assert caught.value.env_index in (2, 3)
        assert caught.value.worker == "local-1"
        assert sharded.addresses[1] in str(caught.value)
        assert "RuntimeError" in str(caught.value)
        venv.reset()  # the envs work again after a reset
        venv.step([0, 0, 0, 0])
    # Code travels to no coordinator process of Fleet.local: an env id does.
    with pytest.raises(ConfigError, match="one coordinator"):
        RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 2, on=sharded)


def test_a_dead_coordinators_envs_fail_with_the_error_of_a_lost_lease() -> None:
    fleet = Fleet.local(workers=2, envs_per_worker=2, coordinators=2, grace=2.0)
    try:
        venv = RemoteVectorEnv(fleet, "CartPole-v1", 4)
        venv.reset(seed=0)
        dead = fleet.coordinators[1]
        dead.process.kill()
        dead.process.wait(60)
        # The same error a lease on one coordinator ends with, naming the dead one.
        with pytest.raises(UnavailableError, match=re.escape(dead.address)):
            venv.step(np.zeros(4, np.int64))
        # Its envs are not leased again elsewhere; the other coordinator's work on.
        with pytest.raises(UnavailableError, match=re.escape(dead.address)):
            venv.reset(id=[3])
        venv.reset(id=[0, 1], seed=[5, 6])
        venv.step([1, 1], id=[0, 1])
        venv.close()
        with RemoteSampler(fleet.addresses[0]) as live:
            wait_until(lambda: live.status().leased_envs == 0, "the live coordinator's release")
    finally:
        fleet.close()
