"""A worker whose results break the declared spaces or its units' seeds is cut off.

Real processes: a coordinator process and an honest worker process
(``python -m rlfleet``), a hostile worker speaking the Join protocol from the
test over loopback gRPC, and the learner's RemoteSampler. The hostile worker
runs its unit for real, spoils one thing (issue 12, item 5), and sends it.
The coordinator must refuse the result (INVALID_ARGUMENT naming the
problem), drop the worker, re-run its units on the honest one, and the
learner must get exactly the batch it gets undisturbed (LocalSampler's).
A fragment window whose seeds are not its streams' is refused the same way.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from rlfleet.client import RemoteSampler, RemoteVectorEnv
from rlfleet.coordinator.leases.manager import FORGED_REPLIES_LIMIT
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.sampling.local import LocalSampler
from rlfleet.v1 import worker_pb2
from rlfleet.wire import encode_env_spec
from rlfleet.wire.leases import LeaseAnswer, LeaseAnswers, lease_report_message
from rlfleet.worker.units import EpisodeUnit
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import (
    ScriptedWorker,
    assert_same_batch,
    env_config,
    join,
    result_messages,
    rlfleet_process,
    stop_process,
    wait_for_file,
    wait_for_workers,
)
from tests.fleet_processes import ProcessFleet

pytestmark = pytest.mark.timeout(180)

SEED = 21
EPISODES = 4


def replaced(batch: EpisodeBatch, **fields: Any) -> EpisodeBatch:
    return dataclasses.replace(batch, **fields)


def actions(value: float) -> Callable[[EpisodeBatch], EpisodeBatch]:
    def spoil(batch: EpisodeBatch) -> EpisodeBatch:
        spoiled = np.array(batch.actions, dtype=np.float64 if value % 1 else np.int64)
        spoiled[len(spoiled) // 2] = value
        return replaced(batch, actions=spoiled)

    return spoil


def observation_outside_the_box(batch: EpisodeBatch) -> EpisodeBatch:
    observations = np.array(batch.observations)
    observations[1, 0] = 100.0  # CartPole's cart position lies in [-4.8, 4.8]
    return replaced(batch, observations=observations)


def float64_observations(batch: EpisodeBatch) -> EpisodeBatch:
    return replaced(batch, observations=np.asarray(batch.observations, dtype=np.float64))


def another_env_seed(batch: EpisodeBatch) -> EpisodeBatch:
    infos = dict(batch.episode_infos)
    infos["env_seed"] = np.asarray(infos["env_seed"]) + 1
    return replaced(batch, episode_infos=infos)


CASES = {
    "action 7 outside Discrete(2)": (actions(7), "actions[", "holds 7"),
    "action -3 outside Discrete(2)": (actions(-3), "actions[", "holds -3"),
    "action 0.5 in Discrete(2)": (actions(0.5), "actions are float64", "holds integers"),
    "observation outside the Box": (observation_outside_the_box, "observations[1]", "100.0"),
    "float64 observations": (float64_observations, "observations are float64", "float32"),
    "env seed not the unit's": (another_env_seed, "episode_infos['env_seed']", "the unit's"),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A coordinator process with one honest worker process; yields its address."""
    logs = tmp_path_factory.mktemp("hostile")
    port_file = logs / "port"
    coordinator = rlfleet_process(
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
        "--wait-for-workers",
        "30",
        log=logs / "coordinator.log",
    )
    worker = None
    try:
        address = f"127.0.0.1:{int(wait_for_file(port_file, coordinator))}"
        worker = rlfleet_process(
            "worker", "--coordinator", address, "--name", "honest", log=logs / "honest.log"
        )
        wait_for_workers(address, 1)
        yield address
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(coordinator)


@pytest.fixture(scope="module")
def undisturbed() -> EpisodeBatch:
    with LocalSampler(EnvConfig("CartPole-v1"), seed=SEED) as local:
        return local.obtain_episodes(EPISODES)


class Hostile:
    """A scripted worker that runs its units for real and spoils the result."""

    def __init__(self, address: str) -> None:
        self.worker: ScriptedWorker
        self.worker, self.welcome = join(address, name="hostile")
        update = self.worker.expect("env_update")
        self.generation = update.generation
        self.vec = VecWorker(n_envs=1, worker_number=self.welcome.worker_id, env=env_config(update))
        self.worker.send(
            worker_pb2.WorkerMessage(
                env_ready=worker_pb2.EnvReady(
                    generation=update.generation,
                    env_spec=encode_env_spec(self.vec.env_spec),
                )
            )
        )

    def answer_one_task(self, spoil: Callable[[EpisodeBatch], EpisodeBatch]) -> None:
        while True:
            message = self.worker.receive(timeout=60)
            if message.WhichOneof("body") == "task":
                break
        task = message.task
        if task.mode == worker_pb2.SAMPLE_MODE_FRAGMENTS:  # its first window
            batch = self.vec.collect_fragments(
                task.fragment_length,
                base_seed=task.base_seed,
                first_stream=self.welcome.first_stream,
            )
        else:
            units = [EpisodeUnit(u.episode_index, u.env_seed, u.policy_seed) for u in task.units]
            batch = self.vec.run(units)
        batch = spoil(batch)
        for item in result_messages(
            batch,
            task_id=task.task_id,
            env_generation=self.generation,
            batch_id=1,
            max_bytes=1 << 20,
        ):
            self.worker.send(item)

    def close(self) -> None:
        self.vec.shutdown()
        self.worker.close()


@pytest.mark.parametrize("case", list(CASES))
def test_a_result_that_breaks_the_spaces_or_seeds_drops_the_worker_and_is_rerun(
    fleet: str, undisturbed: EpisodeBatch, case: str
) -> None:
    spoil, *phrases = CASES[case]
    hostile = Hostile(fleet)
    try:
        wait_for_workers(fleet, 2)  # the hostile worker is ready: it gets units too
        answer: list[EpisodeBatch] = []

        def learn() -> None:
            with RemoteSampler(fleet, seed=SEED, timeout=120) as remote:
                answer.append(remote.obtain_episodes(EPISODES))

        learner = threading.Thread(target=learn)
        learner.start()
        hostile.answer_one_task(spoil)
        ending = hostile.worker.ended(timeout=60)
        learner.join(timeout=120)
        assert ending is not None and ending.code is grpc.StatusCode.INVALID_ARGUMENT
        for phrase in phrases:
            assert phrase in ending.details, ending.details
        assert answer, "the learner got no answer"
        assert_same_batch(answer[0], undisturbed)
        assert hostile.welcome.worker_id not in answer[0].episode_infos["worker"].tolist()
    finally:
        hostile.close()
    wait_for_workers(fleet, 1)  # only the honest worker is left


def test_a_fragment_window_with_seeds_off_its_streams_drops_the_worker(fleet: str) -> None:
    # Fragment seeds are stream_seeds(base_seed, stream, episode): the window
    # of the hostile worker's stream claims others. The answer is made up by
    # the honest worker's streams (docs/reliability.md: fragments after a loss).
    hostile = Hostile(fleet)
    try:
        wait_for_workers(fleet, 2)
        answer: list[EpisodeBatch] = []

        def learn() -> None:
            with RemoteSampler(fleet, seed=SEED, timeout=120) as remote:
                answer.append(remote.obtain_fragments(40, 10))

        learner = threading.Thread(target=learn)
        learner.start()
        hostile.answer_one_task(another_env_seed)
        ending = hostile.worker.ended(timeout=60)
        learner.join(timeout=120)
        assert ending is not None and ending.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "seeds (env, policy) are" in ending.details and "stream_seeds" in ending.details
        assert answer, "the learner got no answer"
        assert answer[0].total_steps >= 40
        assert hostile.welcome.worker_id not in answer[0].episode_infos["worker"].tolist()
    finally:
        hostile.close()
    wait_for_workers(fleet, 1)


def test_a_worker_forging_lease_replies_is_logged_sparingly_then_dropped(tmp_path: Path) -> None:
    # A worker that answers lease calls for envs it does not host: each reply
    # is ignored, the coordinator's line is rate-limited, and past the limit
    # the worker is dropped; the honest worker's lease goes on undisturbed.
    with ProcessFleet(tmp_path) as processes:
        coordinator = processes.start_coordinator()
        processes.start_worker(envs=2, name="honest")
        processes.wait_for_workers(1)
        venv = RemoteVectorEnv(processes.address, "CartPole-v1", 2, seed=SEED)
        try:
            venv.reset()
            forger, _ = join(processes.address, name="forger")
            try:
                answer = LeaseAnswer(0, np.zeros(4, np.float32), reward=1.0)
                for call_id in range(1, 10 * FORGED_REPLIES_LIMIT):
                    forged = LeaseAnswers(1, call_id, "step", [answer])
                    forger.send(lease_report_message(forged, "forger"))
                ending = forger.ended(timeout=60)
            finally:
                forger.close()
            assert ending is not None and ending.code is grpc.StatusCode.INVALID_ARGUMENT
            assert "envs it does not host" in ending.details, ending.details
            assert f"{FORGED_REPLIES_LIMIT} times" in ending.details, ending.details
            # The honest lease still answers.
            venv.step(np.zeros(2, np.int64))
        finally:
            venv.close()
        lines = [
            line
            for line in coordinator.log_text().splitlines()
            if "WARNING" in line and "it does not host; ignored" in line
        ]
        assert 1 <= len(lines) <= 2, lines


def test_a_spoiled_result_after_an_honest_one_is_refused_as_the_first_would_be(
    fleet: str,
) -> None:
    # The coordinator learns the layout of the worker's first result and
    # checks the next in one pass: a spoiled one of the same layout (and one
    # of another layout) is refused with the general path's text all the same.
    with LocalSampler(EnvConfig("CartPole-v1"), seed=SEED) as local:
        expected = [local.obtain_episodes(EPISODES) for _ in range(3)]
    hostile = Hostile(fleet)
    try:
        wait_for_workers(fleet, 2)
        answers: list[EpisodeBatch] = []

        def learn() -> None:
            with RemoteSampler(fleet, seed=SEED, timeout=120) as remote:
                answers.extend(remote.obtain_episodes(EPISODES) for _ in range(3))

        learner = threading.Thread(target=learn)
        learner.start()
        hostile.answer_one_task(lambda batch: batch)  # honest: its layout is learned
        hostile.answer_one_task(observation_outside_the_box)
        ending = hostile.worker.ended(timeout=60)
        learner.join(timeout=120)
        assert ending is not None and ending.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "observations[1]" in ending.details and "100.0" in ending.details, ending.details
        assert len(answers) == 3, "the learner got no answer"
        for answer, want in zip(answers, expected, strict=True):
            assert_same_batch(answer, want)
    finally:
        hostile.close()
    wait_for_workers(fleet, 1)
