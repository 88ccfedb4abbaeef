"""The coordinator's worker face and status, over real gRPC with scripted workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.core import EpisodeBatch
from rlfleet.errors import NoWorkersError
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, updates_pb2, worker_pb2
from tests._coordinator_fakes import (
    AutoWorker,
    ScriptedWorker,
    channel,
    env_ready,
    expect_failure,
    join,
    result_messages,
    sample,
    sample_stream,
    status,
    unary,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def start(**overrides: object) -> CoordinatorServer:
    settings: dict[str, object] = {"listen": "127.0.0.1:0", "wait_for_workers_seconds": 5.0}
    settings.update(overrides)
    return serve(CoordinatorConfig(**settings))  # type: ignore[arg-type]


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    with start() as running:
        yield running


def test_handshake_sends_welcome_then_the_current_env(server: CoordinatorServer) -> None:
    worker, welcome = join(server.address, num_envs=3, name="alpha")
    try:
        assert welcome.protocol_version == 1
        assert welcome.worker_id >= 1 and welcome.name == "alpha"
        assert welcome.first_stream == 0
        assert (welcome.heartbeat_interval_seconds, welcome.heartbeat_timeout_seconds) == (1, 10)
        assert list(welcome.capabilities) == ["rlfleet.episodes", "rlfleet.fragments"]
        assert welcome.coordinator_id == server.coordinator.coordinator_id
        update = worker.expect("env_update")
        assert (update.generation, update.env_id, update.kwargs_json) == (1, "CartPole-v1", "{}")
        # No agent update at version 0: the worker keeps its random policy.
        env_ready(worker, update)
        wait_until(lambda: status(server.address).workers[0].state == "idle", "an idle worker")
    finally:
        worker.close()


def test_protocol_version_mismatch_names_both_versions(server: CoordinatorServer) -> None:
    worker = ScriptedWorker(server.address)
    worker.hello(version=2)
    error = worker.ended()
    assert error is not None and error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "version 2" in error.details and "version 1" in error.details
    assert error.detail is not None and error.detail.kind == updates_pb2.ERROR_KIND_VERSION


def test_first_message_must_be_hello(server: CoordinatorServer) -> None:
    worker = ScriptedWorker(server.address)
    worker.send(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
    error = worker.ended()
    assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "must be Hello" in error.details


def test_an_empty_worker_message_is_named_first_or_later(server: CoordinatorServer) -> None:
    first = ScriptedWorker(server.address)
    first.send(worker_pb2.WorkerMessage())
    error = first.ended()
    first.close()
    assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "must be Hello, got an empty WorkerMessage" in error.details, error.details
    later, _ = join(server.address, name="later")
    later.send(worker_pb2.WorkerMessage())
    error = later.ended()
    later.close()
    assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "sent an empty WorkerMessage" in error.details, error.details


def test_a_silent_stream_is_refused_after_the_handshake_timeout() -> None:
    with start(handshake_timeout_seconds=0.3) as running:
        worker = ScriptedWorker(running.address)
        error = worker.ended()
        assert error is not None and error.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "0.3 seconds" in error.details


def test_duplicate_names_are_made_unique_and_streams_numbered(server: CoordinatorServer) -> None:
    joined = [join(server.address, num_envs=2, name="w") for _ in range(3)]
    try:
        assert [w.name for _, w in joined] == ["w", "w-2", "w-3"]
        assert [w.first_stream for _, w in joined] == [0, 2, 4]
        assert len({w.worker_id for _, w in joined}) == 3
    finally:
        for worker, _ in joined:
            worker.close()


def test_workers_beyond_the_limit_are_refused() -> None:
    with start(max_workers=1) as running:
        first, _ = join(running.address)
        try:
            second = ScriptedWorker(running.address)
            second.hello()
            error = second.ended()
            assert error is not None and error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1 workers" in error.details
        finally:
            first.close()


def test_a_malformed_message_ends_only_that_workers_call(server: CoordinatorServer) -> None:
    good = AutoWorker(server.address, name="good")
    bad, _ = join(server.address, name="bad")
    try:
        env_ready(bad, bad.expect("env_update"))
        bad.send(b"\xff\xff\xff")  # not a WorkerMessage
        error = bad.ended()
        assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed" in error.details
        answer = sample(server.address, mode=2, amount=3, seed=1)
        assert answer.footer.num_episodes == 3
        assert [w.name for w in status(server.address).workers] == ["good"]
    finally:
        good.close()
        bad.close()


def test_a_result_that_contradicts_its_metadata_drops_the_worker_not_the_request(
    server: CoordinatorServer,
) -> None:
    liar, _ = join(server.address, name="liar")
    env_ready(liar, liar.expect("env_update"))
    wait_until(lambda: status(server.address).workers[0].state == "idle", "an idle worker")
    request = learner_pb2.SampleRequest(mode=worker_pb2.SAMPLE_MODE_EPISODES, amount=1, seed=5)
    responses = sample_stream(server.address, request, timeout=30)
    header = next(responses)
    assert header.message.WhichOneof("body") == "header"
    task = liar.expect("task")
    honest = AutoWorker(server.address, name="honest")
    try:
        # A real episode, but the metadata claims another length.
        batch = honest_batch(task)
        for message in result_messages(
            batch, task_id=task.task_id, env_generation=1, batch_id=1, max_bytes=1 << 20
        ):
            if message.chunk is not None and message.chunk.index == 0:
                message.message.result.lengths[:] = [999]
            liar.send(message)
        error = liar.ended()
        assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "disagree" in error.details
        rest = list(responses)
        footer = rest[-1].message.footer
        assert (footer.num_episodes, footer.reassigned_units) == (1, 1)
        assert {r.message.result.worker_id for r in rest[:-1]} == {honest.welcome.worker_id}
    finally:
        honest.close()
        liar.close()


def honest_batch(task: worker_pb2.Task) -> EpisodeBatch:
    from rlfleet.envs import EnvConfig
    from rlfleet.worker.units import EpisodeUnit
    from rlfleet.worker.vec import VecWorker

    vec = VecWorker(n_envs=1, env=EnvConfig("CartPole-v1"))
    try:
        (unit,) = task.units
        return vec.run([EpisodeUnit(unit.episode_index, unit.env_seed, unit.policy_seed)])
    finally:
        vec.shutdown()


def test_a_silent_worker_is_declared_dead_after_the_heartbeat_timeout() -> None:
    with start(heartbeat_interval_seconds=0.1, heartbeat_timeout_seconds=0.5) as running:
        worker, _ = join(running.address)
        error = worker.ended()
        assert error is not None and error.code is grpc.StatusCode.UNAVAILABLE
        assert "0.5 seconds" in error.details
        assert list(status(running.address).workers) == []


def test_no_workers_fails_with_unavailable_after_the_wait(server: CoordinatorServer) -> None:
    began = time.monotonic()
    error = expect_failure(
        lambda: sample(server.address, mode=2, amount=1, wait_for_workers_seconds=0.3)
    )
    assert time.monotonic() - began >= 0.3
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert "0.3 seconds" in error.details
    assert "rlfleet worker --coordinator" in error.details
    typed = _rpc.error_from_rpc(error.error, what="Sample")
    assert isinstance(typed, NoWorkersError)


def test_status_lists_the_workers_and_the_fleet_state(server: CoordinatorServer) -> None:
    workers = [AutoWorker(server.address, num_envs=n, name=f"w{n}") for n in (1, 2)]
    try:
        wait_until(
            lambda: all(w.state == "idle" for w in status(server.address).workers),
            "every worker idle",
        )
        fleet = status(server.address)
        assert [(w.name, w.num_envs, w.env_generation) for w in fleet.workers] == [
            ("w1", 1, 1),
            ("w2", 2, 1),
        ]
        assert fleet.protocol_version == 1 and fleet.agent_version == 0
        assert fleet.env.env_id == "CartPole-v1"
        assert fleet.env_spec.action_space.discrete.n == 2
        assert fleet.workers[0].host == "testhost" and fleet.workers[0].peer.startswith("ipv4:")
    finally:
        for worker in workers:
            worker.close()


def test_health_reports_serving_then_not_serving_when_draining() -> None:
    with start() as running:
        ch = channel(running.address)
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", _rpc.WORKER_SERVICE, _rpc.LEARNER_SERVICE):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        running.drain(grace=1.0)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        failure = expect_failure(lambda: sample(running.address, mode=2, amount=1))
        assert failure.code is grpc.StatusCode.UNAVAILABLE
        ch.close()


def test_a_worker_that_leaves_gets_no_more_work(server: CoordinatorServer) -> None:
    worker, _ = join(server.address)
    env_ready(worker, worker.expect("env_update"))
    wait_until(lambda: status(server.address).workers[0].state == "idle", "an idle worker")
    worker.send(worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason="SIGTERM")))
    wait_until(lambda: status(server.address).workers[0].state == "leaving", "a leaving worker")
    worker.finish()
    assert worker.ended() is None  # the coordinator ends the call with OK
    wait_until(lambda: not status(server.address).workers, "no worker left")


def test_a_worker_whose_env_spec_differs_from_the_fleets_is_dropped(
    server: CoordinatorServer,
) -> None:
    first, _ = join(server.address, name="first")
    env_ready(first, first.expect("env_update"))
    odd, _ = join(server.address, name="odd")
    update = odd.expect("env_update")
    other = updates_pb2.EnvUpdate(generation=update.generation, env_id="Acrobot-v1")
    env_ready(odd, other)  # claims generation 1 with another env's spaces
    error = odd.ended()
    assert error is not None and error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "'odd'" in error.details and "differ" in error.details
    assert [w.name for w in status(server.address).workers] == ["first"]
    first.close()


def test_an_agent_version_never_sent_breaks_the_protocol(server: CoordinatorServer) -> None:
    worker, _ = join(server.address)
    worker.send(worker_pb2.WorkerMessage(agent_ready=worker_pb2.AgentReady(version=7)))
    error = worker.ended()
    assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "agent version 7" in error.details


def test_calls_naming_another_coordinator_are_refused_before_anything_happens(
    server: CoordinatorServer,
) -> None:
    # Issue 12.1, the contract any client can use: a call naming the
    # coordinator it pushed its state to is refused by any other one.
    own = status(server.address).coordinator_id
    calls: dict[str, Callable[[str], Any]] = {
        "Sample": lambda cid: sample(server.address, mode=2, amount=1, coordinator_id=cid),
        "UpdateAgent": lambda cid: unary(
            server.address,
            _rpc.UPDATE_AGENT,
            updates_pb2.AgentUpdate(coordinator_id=cid),
            learner_pb2.UpdateAck,
        ),
        "UpdateEnv": lambda cid: unary(
            server.address,
            _rpc.UPDATE_ENV,
            # Other kwargs than the fleet's: the same env would be a no-op.
            updates_pb2.EnvUpdate(
                env_id="CartPole-v1",
                kwargs_json='{"sutton_barto_reward": true}',
                coordinator_id=cid,
            ),
            learner_pb2.UpdateAck,
        ),
    }
    for name, call in calls.items():
        failure = expect_failure(partial(call, "0123456789abcdef"))
        assert failure.code is grpc.StatusCode.ABORTED, (name, failure)
        assert failure.detail is not None, name
        assert failure.detail.kind == updates_pb2.ERROR_KIND_COORDINATOR_RESTARTED, name
        assert f"this is coordinator {own}" in failure.details, failure.details
    after = status(server.address)
    assert (after.agent_version, after.env.generation) == (0, 1)  # nothing was applied
    ack = calls["UpdateEnv"](own)  # its own id is accepted, and answered with it
    assert ack.coordinator_id == own and ack.env_generation == 2


def test_a_learner_agent_version_past_the_limit_is_refused(server: CoordinatorServer) -> None:
    # A learner names a version only to restore its agent; one near the int64
    # limit would make the versions after it overflow.
    update = updates_pb2.AgentUpdate(
        version=1 << 62, policy=updates_pb2.PolicySpec(name="mlp-categorical")
    )
    failure = expect_failure(
        lambda: unary(server.address, _rpc.UPDATE_AGENT, update, learner_pb2.UpdateAck)
    )
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT, failure
    assert "AgentUpdate.version" in failure.details, failure.details
    assert status(server.address).agent_version == 0
