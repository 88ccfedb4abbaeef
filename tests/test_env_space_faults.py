"""Values outside the declared spaces: an honest env's are an EnvError, a forger's end the request.

An honest env that leaves its observation space (``rlfleet/OffSpace-v0``:
50.0 in a ``Box(-1, 1, (3,))`` at every 5th step) fails the same way in
``LocalSampler`` and in ``Fleet.local``'s real worker processes: the worker
checks its own env's output and reports an ``EnvError`` naming the env,
the step, the value and the space; it stays in the fleet. A worker that
forges such values is refused by the coordinator; when its results keep
being refused (it rejoins and forges again), the request ends with a
typed error instead of re-queueing its episodes forever.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError, ProtocolError, RlfleetError
from rlfleet.sampling.local import LocalSampler
from tests.fleet_processes import ProcessFleet
from tests.test_hostile_worker import Hostile, observation_outside_the_box

pytestmark = pytest.mark.timeout(180)

OFF_SPACE = EnvConfig("rlfleet/OffSpace-v0", imports=("rlfleet.envs.testing",))
SEED = 3


def local_error() -> EnvError:
    with LocalSampler(OFF_SPACE, seed=SEED) as local, pytest.raises(EnvError) as caught:
        local.obtain_episodes(2)
    return caught.value


def test_an_env_leaving_its_space_is_the_same_env_error_locally_and_in_a_fleet() -> None:
    expected = local_error()
    text = expected.bare_message
    for phrase in ("'rlfleet/OffSpace-v0'", "step 5", "50.0", "Box(-1.0, 1.0, (3,), float32)"):
        assert phrase in text, text
    assert (expected.env_index, expected.step, expected.episode_index) == (0, 5, 0)

    with Fleet.local(1, 1, OFF_SPACE, seed=SEED, timeout=60) as sampler:
        with pytest.raises(EnvError) as caught:
            sampler.obtain_episodes(2)
        remote = caught.value
        assert remote.bare_message == text
        assert (remote.env_index, remote.step, remote.episode_index) == (0, 5, 0)
        assert remote.worker == "local-0"
        # The honest worker reported an error; it was not dropped as hostile.
        status = sampler.status()
        assert [w.name for w in status.workers] == ["local-0"] and status.ready_workers == 1


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    """A coordinator process with no worker; yields its address."""
    with ProcessFleet(tmp_path) as processes:
        processes.start_coordinator("--wait-for-workers", "60")
        yield processes.address


def test_a_worker_that_keeps_forging_ends_the_request_with_a_typed_error(coordinator: str) -> None:
    failures: list[BaseException] = []

    def learn() -> None:
        # 60 s: far more than the two refusals take; a re-queue loop runs into it.
        with RemoteSampler(coordinator, seed=SEED, timeout=60) as remote:
            try:
                remote.obtain_episodes(2)
            except RlfleetError as exc:
                failures.append(exc)

    learner = threading.Thread(target=learn)
    learner.start()
    # The forger joins, is refused and dropped, rejoins as a new worker and forges again.
    for _ in range(2):
        forger = Hostile(coordinator)
        try:
            forger.answer_one_task(observation_outside_the_box)
            assert forger.worker.ended(timeout=60) is not None, "the forger was not dropped"
        finally:
            forger.close()
    learner.join(timeout=90)
    assert not learner.is_alive(), "the request did not end"
    assert failures and isinstance(failures[0], ProtocolError), failures
    message = str(failures[0])
    for phrase in ("refused 2 results", "worker 'hostile'", "observations[1] holds 100.0"):
        assert phrase in message, message
