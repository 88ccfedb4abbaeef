"""Sampling through the coordinator over real gRPC, with in-process workers.

The workers here (tests._coordinator_fakes.AutoWorker) speak the protocol
over real channels and run real VecWorkers; the answers are compared bit
for bit with episodes run locally from the same seeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers rlfleet/Crashing-v0)
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.core import EnvSpec
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError, EnvNotFoundError, PolicyError
from rlfleet.policies import MLPCategoricalPolicy, PolicySpec
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, updates_pb2, worker_pb2
from rlfleet.wire import decode_env_spec, decode_task, encode_tensor_map
from tests._coordinator_fakes import (
    CAPABILITIES,
    Answer,
    AutoWorker,
    assert_same_batch,
    env_ready,
    expect_failure,
    join,
    reference_episodes,
    reference_fragments,
    reference_steps,
    sample,
    status,
    subscribe_stream,
    unary,
    wait_for_workers,
)
from tests.waiting import PATIENCE, wait_until

pytestmark = pytest.mark.timeout(120)

CARTPOLE = EnvConfig("CartPole-v1").env_spec()


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    config = CoordinatorConfig(listen="127.0.0.1:0", wait_for_workers_seconds=10.0)
    with serve(config) as running:
        yield running


@pytest.fixture
def workers(server: CoordinatorServer) -> Iterator[list[AutoWorker]]:
    started: list[AutoWorker] = []
    yield started
    for worker in started:
        worker.close()


def add_workers(
    server: CoordinatorServer, workers: list[AutoWorker], *num_envs: int, **kw: object
) -> None:
    for n in num_envs:
        workers.append(AutoWorker(server.address, num_envs=n, **kw))  # type: ignore[arg-type]
    wait_for_workers(server.address, len(workers))


def agent_update(
    params: dict[str, np.ndarray], spec: PolicySpec | None = None
) -> updates_pb2.AgentUpdate:
    update = updates_pb2.AgentUpdate(params=encode_tensor_map(params))
    if spec is not None:
        update.policy.name = spec.name
        update.policy.kwargs_json = spec.to_json().split('"kwargs":', 1)[1][:-1]
    return update


def update_agent(server: CoordinatorServer, update: object) -> learner_pb2.UpdateAck:
    return unary(server.address, _rpc.UPDATE_AGENT, update, learner_pb2.UpdateAck)


def update_env(server: CoordinatorServer, update: object) -> learner_pb2.UpdateAck:
    return unary(server.address, _rpc.UPDATE_ENV, update, learner_pb2.UpdateAck)


@pytest.mark.parametrize("layout", [(2,), (1, 1, 1)])
def test_steps_equal_the_episodes_run_locally(
    server: CoordinatorServer, workers: list[AutoWorker], layout: tuple[int, ...]
) -> None:
    add_workers(server, workers, *layout)
    answer = sample(server.address, mode=1, amount=150, seed=11, request_index=4)
    expected = reference_steps(150, seed=11, request_index=4)
    assert_same_batch(answer.batch, expected)
    assert answer.footer.num_episodes == len(expected.lengths)
    assert answer.footer.total_steps == int(expected.lengths.sum()) >= 150
    assert answer.header.agent_version == 0 and answer.header.env_generation == 1


def test_episodes_in_many_chunks_equal_the_episodes_run_locally(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 2, 1, chunk_bytes=1024)
    answer = sample(server.address, mode=2, amount=7, seed=3, request_index=0)
    assert_same_batch(answer.batch, reference_episodes(range(7), seed=3, request_index=0))
    assert answer.footer.num_episodes == 7 and answer.footer.workers_used == 2


def test_unseeded_requests_use_the_coordinators_seed_and_counter(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    first = sample(server.address, mode=2, amount=2)
    second = sample(server.address, mode=2, amount=2)
    assert_same_batch(first.batch, reference_episodes(range(2), seed=0, request_index=0))
    assert_same_batch(second.batch, reference_episodes(range(2), seed=0, request_index=1))


@pytest.mark.parametrize("layout", [(3,), (1, 1, 1)])
def test_fragment_streams_continue_across_requests(
    server: CoordinatorServer, workers: list[AutoWorker], layout: tuple[int, ...]
) -> None:
    add_workers(server, workers, *layout)
    # 3 streams x 4 steps = 12 steps per round: 30 steps take 3 rounds, 10 take 1.
    first = sample(server.address, mode=3, amount=30, fragment_length=4, seed=9)
    second = sample(server.address, mode=3, amount=10, fragment_length=4, seed=9)
    expected = reference_fragments(3, 4, [3, 1], seed=9)
    assert_same_batch(first.batch, expected[0])
    assert_same_batch(second.batch, expected[1])
    assert first.footer.total_steps == 36 and second.footer.total_steps == 12


def test_units_of_a_lost_worker_are_rerun_elsewhere_without_duplicates(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    doomed, _ = join(server.address, num_envs=2, name="doomed")
    env_ready(doomed, doomed.expect("env_update"))
    wait_for_workers(server.address, 1)
    answers: list[Answer] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            sample(server.address, mode=2, amount=6, seed=2, request_index=1)
        )
    )
    thread.start()
    task = doomed.expect("task")  # the doomed worker holds units...
    assert len(task.units) == 4
    # ...a worker joining mid-request is used at once, and the doomed one
    # dies with its units.
    workers.append(AutoWorker(server.address, num_envs=1))
    doomed.close()
    thread.join(timeout=60)
    (answer,) = answers
    assert isinstance(answer, Answer)
    assert_same_batch(answer.batch, reference_episodes(range(6), seed=2, request_index=1))
    assert answer.footer.reassigned_units == 4
    assert {r.worker_id for r in answer.results} == {workers[0].welcome.worker_id}


def test_units_come_as_columns_only_to_workers_that_declared_them(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    plain, _ = join(server.address, num_envs=2, name="plain")
    columns, welcome = join(
        server.address,
        num_envs=2,
        name="columns",
        capabilities=(*CAPABILITIES, _rpc.UNIT_COLUMNS_CAPABILITY),
    )
    assert _rpc.UNIT_COLUMNS_CAPABILITY in welcome.capabilities  # agreed
    for scripted in (plain, columns):
        env_ready(scripted, scripted.expect("env_update"))
    wait_for_workers(server.address, 2)
    answers: list[Answer] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            sample(server.address, mode=2, amount=8, seed=4, request_index=2)
        )
    )
    thread.start()
    old, new = plain.expect("task"), columns.expect("task")
    # A worker without the capability (a third-party one) gets one
    # EpisodeUnit message per unit; the other the columns.
    assert len(old.units) == 4 and not old.HasField("unit_columns")
    assert not new.units and new.HasField("unit_columns")
    held = {u.episode_index: (u.env_seed, u.policy_seed) for u in old.units}
    for unit in decode_task(new).units:
        held[unit.episode_index] = (unit.env_seed, unit.policy_seed)
    assert held == {i: episode_seeds(4, 2, i) for i in range(8)}
    # Both die with their units: a plain worker runs them all once.
    workers.append(AutoWorker(server.address, num_envs=1))
    plain.close()
    columns.close()
    thread.join(timeout=60)
    (answer,) = answers
    assert_same_batch(answer.batch, reference_episodes(range(8), seed=4, request_index=2))
    assert answer.footer.reassigned_units == 8


def test_refused_agent_update_fails_and_the_fleet_returns_to_the_last_good_agent(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1, 1)
    spec = PolicySpec("mlp-categorical", {"hidden_sizes": [8]})
    good = MLPCategoricalPolicy(CARTPOLE, hidden_sizes=[8], seed=1).get_param_values()
    assert update_agent(server, agent_update(good, spec)).agent_version == 1
    bad = {name: np.zeros((3, 3), np.float32) for name in good}
    error = expect_failure(lambda: update_agent(server, agent_update(bad)))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "refused agent version 2" in error.details and "now version 3" in error.details
    assert isinstance(_rpc.error_from_rpc(error.error, what="UpdateAgent"), PolicyError)
    wait_for_workers(server.address, 2)
    assert {w.agent_version for w in status(server.address).workers} == {3}
    answer = sample(server.address, mode=2, amount=4, seed=5)
    policy = MLPCategoricalPolicy(CARTPOLE, hidden_sizes=[8])
    policy.set_param_values(good)
    expected = reference_episodes(range(4), seed=5, request_index=0, policy=policy)
    assert_same_batch(answer.batch, expected, skip_infos=("worker", "agent_version"))
    assert set(answer.batch.episode_infos["agent_version"].tolist()) == {3}


def test_malformed_parameters_are_refused_naming_them_in_updates_and_samples(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    update = agent_update({"w": np.zeros(3, np.float32)})
    update.params.entries[0].tensor.data = bytes(8)  # 8 bytes for 3 float32: malformed
    error = expect_failure(lambda: update_agent(server, update))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details.startswith("AgentUpdate.params['w']"), error.details
    error = expect_failure(lambda: sample(server.address, mode=2, amount=1, agent_update=update))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details.startswith("AgentUpdate.params['w']"), error.details
    assert {w.agent_version for w in status(server.address).workers} == {0}


def test_a_sample_request_applies_its_updates_first(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 2)
    env = updates_pb2.EnvUpdate(env_id="CartPole-v1", max_episode_length=9)
    spec = PolicySpec("mlp-categorical", {"hidden_sizes": [4]})
    params = MLPCategoricalPolicy(CARTPOLE, hidden_sizes=[4], seed=2).get_param_values()
    answer = sample(
        server.address,
        mode=2,
        amount=3,
        seed=1,
        env_update=env,
        agent_update=agent_update(params, spec),
    )
    assert (answer.header.env_generation, answer.header.agent_version) == (2, 1)
    assert answer.header.env_spec.max_episode_length == 9
    assert answer.batch.lengths.max() <= 9
    assert set(answer.batch.episode_infos["agent_version"].tolist()) == {1}


def test_an_env_no_worker_can_build_fails_and_the_fleet_keeps_its_env(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    error = expect_failure(lambda: update_env(server, updates_pb2.EnvUpdate(env_id="NoSuchEnv-v0")))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "NoSuchEnv-v0" in error.details
    assert isinstance(_rpc.error_from_rpc(error.error, what="UpdateEnv"), EnvNotFoundError)
    wait_for_workers(server.address, 1)
    answer = sample(server.address, mode=2, amount=2, seed=4)
    assert answer.header.env_generation == 3  # the old env, renumbered
    assert_same_batch(answer.batch, reference_episodes(range(2), seed=4, request_index=0))


def test_an_env_id_that_names_a_module_is_refused_before_any_worker(
    server: CoordinatorServer,
) -> None:
    error = expect_failure(lambda: update_env(server, updates_pb2.EnvUpdate(env_id="os:Env-v0")))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "--import" in error.details


def test_an_env_crashing_past_its_budget_fails_the_request_naming_where(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    crashing = updates_pb2.EnvUpdate(
        env_id="rlfleet/Crashing-v0", kwargs_json='{"crash_at_step": 3}'
    )
    error = expect_failure(
        lambda: sample(server.address, mode=2, amount=2, seed=1, env_update=crashing)
    )
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    typed = _rpc.error_from_rpc(error.error, what="Sample")
    assert isinstance(typed, EnvError)
    assert typed.env_index == 0 and typed.step == 3
    assert typed.worker == workers[0].welcome.name
    assert typed.remote_traceback and "RuntimeError" in typed.remote_traceback


def test_subscription_streams_tagged_results_and_yields_to_sample_requests(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 2)
    request = learner_pb2.SubscribeRequest(
        mode=worker_pb2.SAMPLE_MODE_EPISODES, seed=8, max_buffered_steps=50
    )
    call, responses = subscribe_stream(server.address, request)
    try:
        header = next(responses).message
        assert header.WhichOneof("body") == "header" and header.header.agent_version == -1
        seen: set[int] = set()
        while len(seen) < 5:
            result = next(responses).message.result
            if result.episode_indices:
                assert result.agent_version == 0
                assert not seen & set(result.episode_indices)
                seen |= set(result.episode_indices)
        # A Sample request still completes while the subscription runs.
        answer = sample(server.address, mode=2, amount=3, seed=6)
        assert_same_batch(answer.batch, reference_episodes(range(3), seed=6, request_index=0))
        assert status(server.address).subscribers == 1
    finally:
        call.cancel()
    wait_until(lambda: not status(server.address).subscribers, "the subscription ending")


def test_env_spec_of_header_matches_the_env(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    answer = sample(server.address, mode=2, amount=1, seed=0)
    spec: EnvSpec = decode_env_spec(answer.header.env_spec)
    assert spec == CARTPOLE


def test_a_learner_that_gives_up_frees_its_turn_and_the_workers_units(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    stuck, _ = join(server.address, name="stuck")
    env_ready(stuck, stuck.expect("env_update"))
    wait_for_workers(server.address, 1)
    failure = expect_failure(lambda: sample(server.address, mode=2, amount=3, seed=1, timeout=0.5))
    assert failure.code is grpc.StatusCode.DEADLINE_EXCEEDED
    task = stuck.expect("task")
    cancel = stuck.expect("cancel")
    assert cancel.task_id == task.task_id
    assert sorted(cancel.episode_indices) == [u.episode_index for u in task.units]
    stuck.close()
    add_workers(server, workers, 1)
    answer = sample(server.address, mode=2, amount=3, seed=1)  # the next request runs
    assert_same_batch(answer.batch, reference_episodes(range(3), seed=1, request_index=0))


def test_fragment_subscription_streams_windows_of_the_workers_streams(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 2)
    request = learner_pb2.SubscribeRequest(
        mode=worker_pb2.SAMPLE_MODE_FRAGMENTS, fragment_length=5, seed=4, max_buffered_steps=100
    )
    call, responses = subscribe_stream(server.address, request)
    try:
        assert next(responses).message.WhichOneof("body") == "header"
        windows = [next(responses).message.result for _ in range(3)]
    finally:
        call.cancel()
    for window in windows:
        assert sum(window.lengths) == 2 * 5  # 2 streams x 5 steps
        assert window.worker_id == workers[0].welcome.worker_id
        assert window.agent_version == 0 and window.env_generation == 1


def test_a_subscriber_that_stops_reading_stops_the_work_for_it(
    server: CoordinatorServer, workers: list[AutoWorker]
) -> None:
    add_workers(server, workers, 1)
    request = learner_pb2.SubscribeRequest(
        mode=worker_pb2.SAMPLE_MODE_EPISODES, seed=3, max_buffered_steps=40
    )
    # No BDP probing: the stream's flow-control window stays at 64 KiB.
    no_bdp = [("grpc.http2.bdp_probe", 0)]
    call, responses = subscribe_stream(server.address, request, options=no_bdp)

    def units_given() -> int:
        return sum(len(task.units) for task in list(workers[0].tasks))

    try:
        next(responses)  # the header; then nothing is read for a while
        # The transport's window fills, then the coordinator's buffer, then
        # the worker gets no more work.
        deadline = time.monotonic() + PATIENCE
        before = -1
        while units_given() != before:
            assert time.monotonic() < deadline, "work for the subscriber never stopped"
            before = units_given()
            # What is awaited is a count that stops changing: only a pause shows it.
            time.sleep(0.5)
        assert before > 0
        while units_given() == before:  # reading again resumes the work
            assert time.monotonic() < deadline, "work did not resume"
            next(responses)
    finally:
        call.cancel()
