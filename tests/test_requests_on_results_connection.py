"""Sample requests sent on the learner's results connection (learner.proto,
"Requests on a learner's results connection").

A sampler whose coordinator says ``ResultChannelOpened.requests_on_data``
sends its SampleRequest as a frame on its results connection and reads the
whole answer there: no gRPC Sample call is made (the coordinator's metrics
count none), the batch equals LocalSampler's bit for bit, an error is the
one the Sample call's status gave (same type, same text), the learner's
timeout fires with its seconds and frees the request's turn, a learner
that closes the connection cancels its request, a second request while
one runs is refused, a frame that is no request closes the connection,
and a coordinator that does not offer it keeps today's Sample call.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.client._coordinator_calls import CoordinatorCalls
from rlfleet.client._errors import failure_error
from rlfleet.client._learner_messages import (
    CallFailed,
    LearnerStubs,
    parse_result_frame,
    sample_request,
)
from rlfleet.coordinator import learner_messages
from rlfleet.coordinator.calls import CallOutbox
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.result_channels import ResultSender
from rlfleet.envs import EnvConfig
from rlfleet.errors import InvalidArgumentError, ResourceExhaustedError, RlfleetTimeoutError
from rlfleet.protocol.error_reports import ErrorKind, ErrorReport
from rlfleet.protocol.learner_calls import CallHeader, SampleAsk
from rlfleet.protocol.updates import AgentChange
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.lease_channel import LeaseDataLink
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    free_port,
    local_episodes,
)
from tests.test_learner_results import Calls, older_learner
from tests.test_metrics import scrape, value
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

SEED = 41
CARTPOLE = EnvConfig("CartPole-v1")
SLOW = EnvConfig(SLOW_ENV.id, SLOW_ENV.kwargs, imports=(TEST_ENVS_MODULE,))
LATENCY = "rlfleet_learner_request_duration_seconds_count"


class SampleCalls:
    """Counts the gRPC Sample calls this process's samplers make."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        sample = LearnerStubs.sample

        def counted(stubs: LearnerStubs, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return sample(stubs, *args, **kwargs)

        monkeypatch.setattr(LearnerStubs, "sample", counted)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as fleet:
        yield fleet


def test_a_request_and_its_whole_answer_travel_on_the_connection(
    processes: ProcessFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_port = free_port()
    processes.start_coordinator("--metrics-listen", f"127.0.0.1:{metrics_port}")
    for _ in range(2):
        processes.start_worker(envs=2)
    processes.wait_for_workers(2)
    sampler = processes.sampler(seed=SEED)
    calls = Calls(sampler.result_route, monkeypatch)
    grpc_calls = SampleCalls(monkeypatch)
    expected = local_episodes(CARTPOLE, 10, 7, seed=SEED)

    assert_same_batch(sampler.obtain_episodes(10), expected[0])
    assert_same_batch(sampler.obtain_episodes(7), expected[1])
    assert sampler.obtain_samples(0, 300).lengths.sum() >= 300

    # Every request went on the connection, and its footer came there.
    assert calls.all_on_data() and len(calls.reads) == 3
    assert all(data is not None and data.requests and data.footer for data in calls.reads)
    assert isinstance(sampler.result_route._link, LeaseDataLink)  # one TCP connection
    # No Sample call, on either side: the coordinator counts three requests
    # on the connection and no Sample call.
    assert grpc_calls.count == 0
    samples = scrape(metrics_port)
    assert value(samples, LATENCY, method="SampleOnData", outcome="ok") == 3
    assert (LATENCY, (("method", "Sample"), ("outcome", "ok"))) not in samples


def test_a_coordinator_that_does_not_offer_it_gets_sample_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An older coordinator: its ResultChannelOpened has no requests_on_data.
    serialize = learner_messages.serialize_result_channel

    def older(opened: Any) -> bytes:
        message = _rpc.plain_deserializer(learner_messages.learner_pb2.ResultChannelOpened)(
            serialize(opened)
        )
        message.ClearField("requests_on_data")
        return message.SerializeToString()

    monkeypatch.setattr(learner_messages, "serialize_result_channel", older)
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        calls = Calls(sampler.result_route, monkeypatch)
        grpc_calls = SampleCalls(monkeypatch)
        expected = local_episodes(CARTPOLE, 6, 5, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(6), expected[0])
        assert_same_batch(sampler.obtain_episodes(5), expected[1])
        # Results (and footers) on the connection, requests as Sample calls.
        assert calls.all_on_data()
        assert all(data is not None and not data.requests for data in calls.reads)
        assert grpc_calls.count == 2


def test_an_older_learner_keeps_its_sample_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    older_learner(monkeypatch)
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        calls = Calls(sampler.result_route, monkeypatch)
        grpc_calls = SampleCalls(monkeypatch)
        assert_same_batch(sampler.obtain_episodes(6), local_episodes(CARTPOLE, 6, seed=SEED)[0])
        assert calls.all_on_data() and grpc_calls.count == 1


def test_a_bad_request_fails_with_the_code_and_text_of_its_sample_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = SampleAsk(mode=2, amount=0)  # EPISODES, none: the coordinator refuses it
    with Fleet.local(workers=1, envs_per_worker=2, seed=SEED) as fleet:
        errors = []
        for older in (False, True):
            if older:
                older_learner(monkeypatch)
            calls = CoordinatorCalls(
                fleet.address,
                timeout=30,
                max_message_bytes=_rpc.DEFAULT_MAX_MESSAGE_BYTES,
                security=ClientSecurity.from_options(),
            )
            try:
                recorded = Calls(calls.result_route, monkeypatch)
                with pytest.raises(InvalidArgumentError) as raised:
                    calls.sample(bad, None)
                errors.append(str(raised.value))
                (data,) = recorded.reads
                assert data is not None and data.requests is not older
                # The failure ended the call's frames there: the connection is kept.
                assert older or calls.result_route.carrier == "data"
                good = SampleAsk(mode=2, amount=2, seed=SEED)
                assert len(calls.sample(good, None).results) > 0
            finally:
                calls.close()
        on_data, on_grpc = errors
        assert on_data == on_grpc and "amount" in on_data


def test_a_failure_frame_raises_what_the_status_raised() -> None:
    # With a detail (its kind picks the exception) and without.
    report = ErrorReport(ErrorKind.ENV_CRASHED, "the env crashed at step 3", worker="w1")
    for error in (
        CallError(grpc.StatusCode.FAILED_PRECONDITION, "worker w1 failed", report),
        CallError(grpc.StatusCode.UNAVAILABLE, "no workers joined"),
        CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "3 requests are already queued"),
    ):
        call, failed = parse_result_frame(learner_messages.failure_bytes(error, 7))
        assert call == 7 and isinstance(failed, CallFailed)
        raised = failure_error(
            failed.code, failed.message, failed.detail, what="Sample", timeout=None
        )
        status = _rpc.error_from_status(
            error.code, error.message, report if error.detail else None, what="Sample"
        )
        assert type(raised) is type(status)
        assert str(raised).startswith(str(status))


def test_a_request_above_a_message_bound_fails_as_its_sample_call_does(
    processes: ProcessFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator reads 64 KiB at most: a request of some 100 KB is refused
    # by its bound (a sampler sending up to 1 MiB), or by the sampler's own.
    processes.start_coordinator("--max-message-bytes", str(64 << 10))
    processes.start_worker(envs=1)
    processes.wait_for_workers(1)
    update = AgentChange(params={"w": np.zeros(25_000, np.float32)})
    ask = SampleAsk(mode=2, amount=1, seed=SEED, agent_update=update)
    grpc_calls = SampleCalls(monkeypatch)
    for bound, words in ((1 << 20, "SERVER: Received"), (70_000, "CLIENT: Sent")):
        errors = []
        for older in (False, True):
            with pytest.MonkeyPatch.context() as patch:
                if older:
                    older_learner(patch)
                calls = CoordinatorCalls(
                    processes.address,
                    timeout=60,
                    max_message_bytes=bound,
                    security=ClientSecurity.from_options(),
                )
                try:
                    made = grpc_calls.count
                    with pytest.raises(ResourceExhaustedError) as raised:
                        calls.sample(ask, None)
                    errors.append(str(raised.value))
                    if not older:
                        # Nothing went: the connection serves the next request.
                        assert calls.result_route.carrier == "data"
                        good = SampleAsk(mode=2, amount=1, seed=SEED)
                        assert len(calls.sample(good, None).results) > 0
                        assert grpc_calls.count == made
                finally:
                    calls.close()
        # The same words and bound; the sizes are each request's own, and the
        # one sent on the connection also carries its call's numbers.
        on_data, on_grpc = (re.sub(r"\(\d+ vs\. ", "(N vs. ", text) for text in errors)
        assert on_data == on_grpc and f"{words} message larger than max (N vs. " in on_data


def test_results_connections_are_bounded_as_learner_calls_are(
    processes: ProcessFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each connection may hold a thread for its requests: as many may be
    # open as learner calls may run at once, and a learner past that makes
    # Sample calls until one closes.
    processes.start_coordinator("--max-learner-calls", "2")
    processes.start_worker(envs=1)
    processes.wait_for_workers(1)
    first, second, third = (processes.sampler(seed=SEED) for _ in range(3))
    for sampler in (first, second):
        sampler.obtain_episodes(1)
        assert sampler.result_route.carrier == "data"
    with pytest.raises(ResourceExhaustedError, match="2 results connections are open") as raised:
        third.result_route._stubs.open_result_channel(timeout=60)
    assert "--max-learner-calls" in str(raised.value)
    grpc_calls = SampleCalls(monkeypatch)
    expected = local_episodes(CARTPOLE, 2, seed=SEED)[0]
    assert_same_batch(third.obtain_episodes(2), expected)
    assert third.result_route.carrier == "grpc" and grpc_calls.count == 1
    first.close()  # its connection's slot is free once the coordinator saw it close

    def on_data() -> bool:
        third.obtain_episodes(1)
        return third.result_route.carrier == "data"

    wait_until(on_data, what="the third learner's results connection")


def test_the_timeout_fires_and_frees_the_requests_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        Fleet.local(workers=1, envs_per_worker=1, env=SLOW, seed=SEED) as fleet,
        RemoteSampler(fleet.address, seed=SEED, timeout=1.5) as sampler,
    ):
        grpc_calls = SampleCalls(monkeypatch)
        started = time.monotonic()
        with pytest.raises(RlfleetTimeoutError, match=r"no answer within 1.5 seconds"):
            sampler.obtain_episodes(500)  # some 500 s of episodes
        assert time.monotonic() - started < 30
        assert sampler.result_route.carrier == "grpc"  # the connection was dropped
        # The coordinator cancelled the request: the next one gets its turn at once.
        expected = local_episodes(SLOW_ENV_TWIN, 2, seed=SEED)
        sampler.timeout = 60
        assert_same_batch(sampler.obtain_episodes(2), expected[0])
        assert grpc_calls.count == 0


def test_a_learner_that_closes_the_connection_cancels_its_request() -> None:
    # B's request waits for its turn behind A's (no result of it flows, so only
    # the cancellation can end it): B closing its connection frees the turn.
    with (
        Fleet.local(workers=1, envs_per_worker=1, env=SLOW, seed=SEED) as fleet,
        RemoteSampler(fleet.address, seed=SEED, timeout=120) as first,
        RemoteSampler(fleet.address, seed=SEED, timeout=120) as second,
    ):
        first.obtain_episodes(1)  # both connections open
        second.obtain_episodes(1)
        failed: dict[str, BaseException] = {}

        def request(name: str, sampler: RemoteSampler, episodes: int) -> threading.Thread:
            def run() -> None:
                try:
                    sampler.obtain_episodes(episodes)
                except Exception as exc:
                    failed[name] = exc

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        running = request("first", first, 500)
        wait_until(lambda: fleet.status().requests_in_flight == 1, what="A's request to run")
        waiting = request("second", second, 2)
        wait_until(lambda: fleet.status().requests_in_flight == 2, what="B's request to wait")
        link = second.result_route._link
        assert isinstance(link, LeaseDataLink)
        link.close()
        # The coordinator hears the close and drops B's request; A's runs on.
        wait_until(lambda: fleet.status().requests_in_flight == 1, what="B's request to end")
        waiting.join(30)
        assert "results connection ended" in str(failed["second"])
        assert running.is_alive()
        first_link = first.result_route._link
        assert isinstance(first_link, LeaseDataLink)
        first_link.close()
        wait_until(lambda: fleet.status().requests_in_flight == 0, what="A's request to end")
        running.join(30)


def _dialled(fleet: RemoteSampler) -> tuple[CoordinatorCalls, LeaseDataLink]:
    calls = CoordinatorCalls(
        fleet.address,
        timeout=60,
        max_message_bytes=_rpc.DEFAULT_MAX_MESSAGE_BYTES,
        security=ClientSecurity.from_options(),
    )
    _, data = calls.result_route.prepare(SampleAsk(mode=2, amount=1), 60)
    assert data is not None and data.requests
    link = calls.result_route._link
    assert isinstance(link, LeaseDataLink)
    return calls, link


def test_a_second_request_while_one_runs_is_refused() -> None:
    with Fleet.local(workers=1, envs_per_worker=1, env=SLOW, seed=SEED) as fleet:
        calls, link = _dialled(fleet)
        try:
            link.send(sample_request(SampleAsk(mode=2, amount=500, seed=SEED, result_call=1)))
            wait_until(lambda: fleet.status().requests_in_flight == 1, what="the request to run")
            link.send(sample_request(SampleAsk(mode=2, amount=1, seed=SEED, result_call=2)))
            part = _frame_of_call(link, 2)  # after the first call's header and results
            assert isinstance(part, CallFailed)
            assert part.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            assert "while another runs on it; a connection runs one request at a" in part.message
            # The first request goes on until the learner ends it.
            assert fleet.status().requests_in_flight == 1
        finally:
            calls.close()
        wait_until(lambda: fleet.status().requests_in_flight == 0, what="the request to end")


def test_a_request_on_a_connection_a_sample_call_uses_is_refused() -> None:
    with Fleet.local(workers=1, envs_per_worker=1, env=SLOW, seed=SEED) as fleet:
        calls, link = _dialled(fleet)
        channel = calls.result_route._channel
        try:
            # A Sample call naming the connection, as an older learner makes it.
            ask = SampleAsk(mode=2, amount=500, seed=SEED, result_channel=channel, result_call=1)
            running = calls.result_route._stubs.sample(ask, timeout=60)
            wait_until(lambda: fleet.status().requests_in_flight == 1, what="the call to run")
            link.send(sample_request(SampleAsk(mode=2, amount=1, seed=SEED, result_call=2)))
            part = _frame_of_call(link, 2)
            assert isinstance(part, CallFailed)
            assert part.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            assert part.message == (
                "a Sample request (call 2) came on a results connection a Sample call uses; "
                "a connection runs one request at a time"
            )
            running.cancel()
        finally:
            calls.close()
        wait_until(lambda: fleet.status().requests_in_flight == 0, what="the call to end")


def _frame_of_call(link: LeaseDataLink, call: int) -> Any:
    """What the first frame of ``call`` on ``link`` holds (other calls' frames skipped)."""
    while True:
        payload = link.receive_within(30)
        assert payload is not None
        got, part = parse_result_frame(payload)
        if got == call:
            return part


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\xff\xff\xff", "no SampleRequest"),
        (sample_request(SampleAsk(mode=2, amount=1)), "names no call"),
    ],
)
def test_a_frame_that_is_no_request_closes_the_connection(
    frame: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="rlfleet.coordinator")
    with Fleet.local(workers=1, envs_per_worker=1, seed=SEED) as fleet:
        calls, link = _dialled(fleet)
        try:
            link.send(frame)
            assert link.receive_within(30) is None  # closed by the coordinator
            wait_until(
                lambda: any(
                    "results connection" in r.getMessage() and reason in r.getMessage()
                    for r in caplog.records
                ),
                what="the close's reason in the log",
            )
            # The sampler's next request opens a new connection and is served.
            calls.result_route.drop()
            assert len(calls.sample(SampleAsk(mode=2, amount=2, seed=SEED), None).results) > 0
        finally:
            calls.close()


class _Frames:
    """A results connection that records the frames sent on it."""

    closed = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send_frames(self, frames: Any, wait_seconds: float) -> None:
        self.frames += [b"".join(parts) for parts in frames]

    def send_parts(self, parts: Any, wait_seconds: float) -> None:
        self.frames.append(b"".join(parts))


def test_no_result_lane_sends_before_the_requests_header() -> None:
    # A worker's result booked before the request's thread sent the header goes
    # through that thread (after the header); the lanes send themselves after it.
    channels: Any = types.SimpleNamespace(give_back=lambda sender: None)
    connection = _Frames()
    sender = ResultSender(channels, 1, cast(Any, connection), 3, header_first=True)
    outbox = CallOutbox(0, subscription=False, sender=sender)
    assert outbox.reserve() is None  # the lane puts it in the outbox instead
    header = CallHeader(9, 1, 1, "c", None)
    sender.send_header(learner_messages.header_bytes(header, results_on_data=True))
    assert outbox.reserve() is sender
    call, part = parse_result_frame(connection.frames[0])
    assert call == 3 and isinstance(part, CallHeader) and part.request_id == 9
    assert sender.sent == 0  # the header is no result
