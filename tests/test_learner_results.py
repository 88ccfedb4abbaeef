"""Sample answers' results on the learner's results connection (learner.proto,
"Results on a learner's data connection").

Real coordinator and worker processes on loopback (or a coordinator in this
process, whose learner attaches in memory): the results of every answer
arrive as frames on the sampler's own data connection, up to the footer
(or, for a side that does not agree to that, the end marker), and the
batch equals LocalSampler's bit for bit; a connection cut
mid-answer fails that call with a retryable UnavailableError and the retry
returns the right batch; a data port that cannot be reached, a
coordinator without one, or one that does not know the method keeps the
results on the Sample stream; a sampler
over two coordinators uses one connection to each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import socket
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler, _learner_messages
from rlfleet.client._learner_messages import LearnerStubs
from rlfleet.client._responses import AnswerMemory, collect_answer
from rlfleet.client._result_route import DataResults, ResultRoute
from rlfleet.coordinator import calls, result_channels
from rlfleet.coordinator.calls import CallOutbox
from rlfleet.coordinator.config import LEASE_DATA_OFF
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.learner_messages import results_end
from rlfleet.coordinator.result_channels import ResultChannels, ResultSender
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConnectionClosedError, EnvError, ProtocolError, UnavailableError
from rlfleet.protocol.learner_calls import SampleAsk
from rlfleet.protocol.modes import Footer
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.in_process_link import InProcessLink
from rlfleet.transport.lease_channel import LeaseDataLink, frame
from rlfleet.v1 import learner_pb2
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.results import ResultHeader
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    free_port,
    local_episodes,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

SEED = 33
CARTPOLE = EnvConfig("CartPole-v1")


class Calls:
    """Records the results-connection reads of a sampler's calls (None: a call on gRPC)."""

    def __init__(self, route: ResultRoute, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[DataResults | None] = []
        prepare = route.prepare

        def recorded(*args: Any) -> Any:
            ask, data = prepare(*args)
            self.reads.append(data)
            return ask, data

        monkeypatch.setattr(route, "prepare", recorded)

    def all_on_data(self) -> bool:
        """Every call's results came on the connection, whole (up to the end marker)."""
        return bool(self.reads) and all(
            data is not None and data.ended and data.count > 0 for data in self.reads
        )


def older_learner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes this process's samplers those of before requests on the results
    connection: they ignore ``ResultChannelOpened.requests_on_data`` and make a
    Sample call naming the connection."""
    opened = LearnerStubs.open_result_channel

    def older(self: LearnerStubs, *, timeout: float | None) -> Any:
        channel = opened(self, timeout=timeout)
        return None if channel is None else channel._replace(requests=False)

    monkeypatch.setattr(LearnerStubs, "open_result_channel", older)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as fleet:
        yield fleet


def test_answers_arrive_on_the_results_connection_and_equal_local_sampler(
    processes: ProcessFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    processes.start_coordinator()
    for _ in range(2):
        processes.start_worker(envs=2)
    processes.wait_for_workers(2)
    sampler = processes.sampler(seed=SEED)
    calls = Calls(sampler.result_route, monkeypatch)
    expected = local_episodes(CARTPOLE, 10, 7, seed=SEED)
    # Messages parsed through protobuf objects: only what is not a result.
    general: list[tuple[Any, ...]] = []
    parse = _learner_messages.parse_with_chunk

    def counted(*args: Any) -> Any:
        general.append(args)
        return parse(*args)

    monkeypatch.setattr(_learner_messages, "parse_with_chunk", counted)

    assert_same_batch(sampler.obtain_episodes(10), expected[0])
    assert_same_batch(sampler.obtain_episodes(7), expected[1])
    steps = sampler.obtain_samples(0, 300)
    assert steps.lengths.sum() >= 300

    assert calls.all_on_data()
    assert len(calls.reads) == 3
    # Per call its header (on the stream) and its footer (on the connection, in place of
    # the end marker: one stream message fewer); every result by hand.
    assert all(data is not None and data.footer is not None for data in calls.reads)
    assert len(general) == 3 * 2
    # Each worker's first result decoded by the general path, the rest viewed at its layout.
    assert sampler._answers.layouts.decoded == 2 and sampler._answers.layouts.viewed > 0
    # One connection served every call (a TCP one: the coordinator is another process).
    assert sampler.result_route.carrier == "data"
    assert isinstance(sampler.result_route._link, LeaseDataLink)


def test_large_result_frames_are_read_into_reused_buffers_never_one_still_viewed() -> None:
    # Fresh memory's first touch costs more than the copy off the socket, so
    # a results connection reads large frames into buffers it keeps, taken
    # again once nothing views them: the next answer's frames take the last
    # answer's buffers once its rows were placed, never while it is read.
    ours, theirs = socket.socketpair()
    link = LeaseDataLink(ours, max_frame_bytes=1 << 21)
    try:

        def received(fill: int, size: int = 300_000) -> memoryview:
            with ThreadPoolExecutor(1) as sender:  # more than the socket's buffer holds
                sent = sender.submit(theirs.sendall, frame(bytes([fill]) * size))
                payload = link.receive_message(10.0)
                sent.result(10.0)
            assert isinstance(payload, memoryview) and payload == bytes([fill]) * size
            return payload

        view = received(1)
        buffer = id(view.obj)  # not the buffer itself: a reference keeps it out
        first = np.frombuffer(view, np.uint8)  # an array viewing the frame
        del view
        second = received(2)
        assert id(second.obj) != buffer  # ``first`` still views its buffer
        assert (first == 1).all()
        del first, second
        assert link._buffers is not None
        for fill in range(3, 6):
            received(fill)
        made = link._buffers.made
        for fill in range(6, 12):  # nothing views them any more: taken again
            received(fill)
        assert link._buffers.made == made
    finally:
        link.close()
        theirs.close()


def test_a_samplers_next_answers_read_into_the_buffers_its_last_one_let_go() -> None:
    # An answer placed from its frames lets go of them once its results go:
    # nothing but the collector would free a reference cycle holding them, so
    # with the collector off the next answers' reads still take the landings
    # the last one read into, not new memory. One new buffer over the four
    # answers is allowed: where an answer's frames start in a landing depends
    # on when they come, and one that starts late may span a landing more
    # than those before it did; a cycle holding the frames makes one or more
    # an answer.
    fleet = Fleet.local(workers=2, envs_per_worker=2, seed=SEED)
    collecting = gc.isenabled()
    try:
        # A sampler that dials the data port (the fleet's own attaches in memory).
        with RemoteSampler(fleet.address, seed=SEED, timeout=120) as sampler:
            # Answers of about 200 kB: each fills most of a landing (LANDING_BYTES).
            expected = local_episodes(CARTPOLE, *[300] * 6, seed=SEED)
            assert_same_batch(sampler.obtain_episodes(300), expected[0])
            assert_same_batch(sampler.obtain_episodes(300), expected[1])  # layouts learned
            link = sampler.result_route._link
            assert isinstance(link, LeaseDataLink) and link._buffers is not None
            gc.disable()
            made = link._buffers.made
            for want in expected[2:]:
                assert_same_batch(sampler.obtain_episodes(300), want)
            assert link._buffers.made - made <= 1, (
                f"{link._buffers.made - made} new receive buffers over four answers"
            )
    finally:
        if collecting:
            gc.enable()
        fleet.close()


def test_a_local_fleet_hands_results_over_in_memory() -> None:
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        expected = local_episodes(CARTPOLE, 9, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(9), expected[0])
        assert isinstance(sampler.result_route._link, InProcessLink)


def test_frames_past_the_results_an_answer_needs_are_read_as_they_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once a result has told the bytes per episode, the reader's wait for
    # the next frames asks for what the answer still needs; once the results
    # read make the answer, what follows (results past it, the end marker)
    # is read as it comes, not after a gathering wait.
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        expected = local_episodes(CARTPOLE, 2, 9, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(2), expected[0])  # opens the connection
        link = sampler.result_route._link
        assert isinstance(link, InProcessLink)
        asked: list[int] = []
        receive = link.receive_message

        def recorded(seconds: float | None, *, gather: int = 0) -> Any:
            asked.append(gather)
            return receive(seconds, gather=gather)

        monkeypatch.setattr(link, "receive_message", recorded)
        assert_same_batch(sampler.obtain_episodes(9), expected[1])
    # The header (the request went on the connection) and the first result are
    # read as they come; then what the answer still needs is asked for.
    assert asked[:2] == [0, 0] and asked[2] > 0 and asked[-1] == 0
    # Less and less is asked for as the results arrive, then nothing.
    assert asked[2:] == sorted(asked[2:], reverse=True)


def test_a_connection_cut_mid_answer_fails_the_call_and_the_retry_is_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = EnvConfig(SLOW_ENV.id, SLOW_ENV.kwargs, imports=(TEST_ENVS_MODULE,))
    fleet = Fleet.local(workers=2, envs_per_worker=1, env=env, seed=SEED)
    try:
        # A sampler that dials the data port (the fleet's own attaches in memory).
        with RemoteSampler(fleet.address, seed=SEED, timeout=120) as sampler:
            calls = Calls(sampler.result_route, monkeypatch)
            cut = threading.Event()

            def cut_at_first_result(done: int, target: int) -> None:
                if not cut.is_set():
                    cut.set()
                    link = sampler.result_route._link
                    assert isinstance(link, LeaseDataLink)
                    link.close()  # as a network that drops the connection

            with pytest.raises(UnavailableError, match=r"mid-answer.*retry"):
                sampler.obtain_episodes(6, progress=cut_at_first_result)
            assert cut.is_set()
            assert sampler.result_route.carrier == "grpc"  # the cut connection was dropped
            assert sampler.requests_made == 0  # the failed call does not count

            # The retry opens a new connection and gets the whole, right batch.
            expected = local_episodes(SLOW_ENV_TWIN, 6, seed=SEED)
            assert_same_batch(sampler.obtain_episodes(6), expected[0])
            assert calls.reads[-1] is not None and calls.reads[-1].ended
            assert sampler.result_route.carrier == "data"
    finally:
        fleet.close()


def test_an_unreachable_data_port_keeps_results_on_grpc(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="rlfleet.transport.lease_channel")
    # The data port listens on another loopback address than the one dialled
    # for gRPC: the learner cannot reach it (as behind a proxy passing gRPC only).
    port = free_port()
    options = {"lease_data_listen": f"127.0.0.2:{port}"}
    with (
        Fleet.local(workers=1, envs_per_worker=2, seed=SEED, coordinator_options=options) as fleet,
        RemoteSampler(fleet.address, seed=SEED) as sampler,
    ):
        calls = Calls(sampler.result_route, monkeypatch)
        expected = local_episodes(CARTPOLE, 5, 5, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(5), expected[0])
        assert_same_batch(sampler.obtain_episodes(5), expected[1])
        assert calls.reads == [None, None]  # on gRPC, without a second try
    warnings = [r.getMessage() for r in caplog.records if f"127.0.0.1:{port}" in r.getMessage()]
    assert len(warnings) == 1
    assert f"Open TCP port {port}" in warnings[0]


def test_a_coordinator_without_a_data_channel_answers_on_grpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = {"lease_data_listen": LEASE_DATA_OFF}
    with Fleet.local(workers=1, envs_per_worker=2, seed=SEED, coordinator_options=options) as s:
        calls = Calls(s.result_route, monkeypatch)
        assert_same_batch(s.obtain_episodes(4), local_episodes(CARTPOLE, 4, seed=SEED)[0])
        assert calls.reads == [None]
        assert s.result_route.carrier == "grpc"


def test_a_sampler_over_two_coordinators_reads_each_on_its_own_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED, coordinators=2) as sampler:
        shards = sampler._shards
        assert shards is not None
        recorders = [Calls(shard.coordinator.result_route, monkeypatch) for shard in shards.shards]
        expected = local_episodes(CARTPOLE, 12, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(12), expected[0])
        for recorder in recorders:
            assert recorder.all_on_data()
            # Each range's request went on its coordinator's connection too.
            assert all(data is not None and data.requests for data in recorder.reads)


def test_a_coordinator_that_does_not_know_the_method_keeps_results_on_grpc() -> None:
    # An older coordinator answers OpenResultChannel with UNIMPLEMENTED (a
    # server without the method is one).
    server = grpc.server(ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = _rpc.open_channel(f"127.0.0.1:{port}", security=ClientSecurity.from_options())
    try:
        stubs = LearnerStubs(channel)
        route = ResultRoute(f"127.0.0.1:{port}", stubs, ClientSecurity.from_options(), 1 << 20)
        ask = SampleAsk(2, 4)
        for _ in range(2):  # asked once: the answer holds for the sampler's life
            assert route.prepare(ask, 10.0) == (ask, None)
        assert route.carrier == "grpc"
    finally:
        channel.close()
        server.stop(None)


def test_an_error_mid_answer_arrives_after_the_end_marker_and_keeps_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashing = EnvConfig(
        "rlfleet/Crashing-v0", {"crash_at_step": 3, "length": 5}, imports=(TEST_ENVS_MODULE,)
    )
    with (
        Fleet.local(workers=1, envs_per_worker=2, env=crashing, seed=SEED) as fleet_sampler,
        RemoteSampler(fleet_sampler.address, seed=SEED, timeout=60) as sampler,
    ):
        calls = Calls(sampler.result_route, monkeypatch)
        with pytest.raises(EnvError, match="step 3"):
            sampler.obtain_episodes(10)
        # The coordinator ended the call's frames with the marker before its
        # error status: the connection holds nothing of the call and is kept.
        (data,) = calls.reads
        assert data is not None and data.ended
        link = sampler.result_route._link
        with pytest.raises(EnvError):
            sampler.obtain_episodes(10)
        assert sampler.result_route._link is link


def test_a_call_that_overtakes_its_connections_booking_still_gets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older_learner(monkeypatch)  # a Sample call that names the connection
    # The learner has LeaseDataAccepted a moment before the coordinator books
    # the connection: here the booking waits until the call has asked for it.
    asked = threading.Event()
    take, attach = ResultChannels.take, ResultChannels._attach

    def asking(self: ResultChannels, channel: int, call: int, **kwargs: Any) -> Any:
        asked.set()
        return take(self, channel, call, **kwargs)

    def late(self: ResultChannels, channel: int, connection: Any) -> Any:
        assert asked.wait(60), "no call asked for the connection"
        return attach(self, channel, connection)

    monkeypatch.setattr(ResultChannels, "take", asking)
    monkeypatch.setattr(ResultChannels, "_attach", late)
    with (
        Fleet.local(workers=1, envs_per_worker=2, seed=SEED) as fleet_sampler,
        RemoteSampler(fleet_sampler.address, seed=SEED) as sampler,
    ):
        calls = Calls(sampler.result_route, monkeypatch)
        assert_same_batch(sampler.obtain_episodes(4), local_episodes(CARTPOLE, 4, seed=SEED)[0])
        assert calls.all_on_data()


def _lane_waits_for_the_learner() -> bool:
    """True while a worker's result lane waits in a send to the learner's connection."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, top in sys._current_frames().items():
        if not names.get(ident, "").startswith("rlfleet-data-results-"):
            continue
        frame: types.FrameType | None = top
        while frame is not None:
            if frame.f_code.co_name in ("send_parts", "send_frames"):
                return True
            frame = frame.f_back
    return False


def test_a_learner_that_stops_reading_holds_the_result_lane_and_loses_nothing() -> None:
    # Results of megabytes to a sampler that stops reading at its first
    # result: the lane that booked the next ones waits in its send (the
    # coordinator holds at most the connection's paced bytes, not the
    # answer), and once the learner reads again the batch is whole, in order.
    env = EnvConfig("rlfleet/Frames-v0", {"length": 20}, imports=(TEST_ENVS_MODULE,))
    fleet = Fleet.local(workers=1, envs_per_worker=4, env=env, seed=SEED)
    try:
        with RemoteSampler(fleet.address, seed=SEED, timeout=120) as sampler:
            held = threading.Event()

            def hold_at_first_result(done: int, target: int) -> None:
                if not held.is_set():
                    held.set()
                    wait_until(_lane_waits_for_the_learner, "the lane waiting for the learner")

            batch = sampler.obtain_episodes(64, progress=hold_at_first_result)
            assert held.is_set() and sampler.result_route.carrier == "data"
        assert_same_batch(batch, local_episodes(env, 64, seed=SEED)[0])
    finally:
        fleet.close()


@contextlib.contextmanager
def _frames_sent(*payloads: bytes) -> Iterator[DataResults]:
    """The reader of call 1 on a link whose other end sent ``payloads`` as frames."""
    ours, theirs = socket.socketpair()
    link = LeaseDataLink(ours, max_frame_bytes=1 << 20)
    try:
        for payload in payloads:
            theirs.sendall(frame(payload))
        yield DataResults(link, 1, 10.0, "here")
    finally:
        link.close()
        theirs.close()


def _as_read(header: ResultHeader, chunk: Chunk | None) -> tuple[ResultHeader, Chunk | None]:
    return header, chunk


def _footer_frame(num_episodes: int, data_results: int) -> bytes:
    footer = learner_pb2.SampleFooter(num_episodes=num_episodes, data_results=data_results)
    return learner_pb2.SampleResponse(footer=footer, result_call=1).SerializeToString()


def test_a_footer_on_the_connection_ends_the_answer_only_where_its_header_said_so() -> None:
    with _frames_sent(_footer_frame(1, 0)) as announced:
        announced.footer_expected = True
        assert list(announced.results(_as_read)) == []
        assert announced.ended and announced.footer == Footer(1, 0, 0, 0, 0)
    with (
        _frames_sent(_footer_frame(1, 0)) as unannounced,
        pytest.raises(ProtocolError, match="neither a result nor an end marker"),
    ):
        list(unannounced.results(_as_read))


def test_a_footer_that_miscounts_the_connections_results_is_a_protocol_error() -> None:
    header = learner_pb2.SampleResponse(
        header=learner_pb2.SampleHeader(results_on_data=True, footer_on_data=True)
    ).SerializeToString()
    reader = AnswerMemory().reader("Sample", keep_pieces=True)
    call = [_learner_messages.parse_response(header)]
    with (
        _frames_sent(_footer_frame(0, 2)) as data,
        pytest.raises(ProtocolError, match=r"footer counts 2 results.*0 arrived"),
    ):
        collect_answer(call, reader, 2, 1, None, data=data)


def test_a_learner_that_does_not_ask_gets_the_footer_on_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older_learner(monkeypatch)  # a Sample call that names the connection
    # An older learner: the end marker on the connection, the footer on the stream.
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        route = sampler.result_route
        prepare = route.prepare

        def older(ask: SampleAsk, timeout: float | None) -> Any:
            asked, data = prepare(ask, timeout)
            return dataclasses.replace(asked, footer_on_data=False), data

        monkeypatch.setattr(route, "prepare", older)
        calls = Calls(route, monkeypatch)
        expected = local_episodes(CARTPOLE, 6, 5, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(6), expected[0])
        assert_same_batch(sampler.obtain_episodes(5), expected[1])
        assert calls.all_on_data()
        assert all(data is not None and data.footer is None for data in calls.reads)


def test_a_coordinator_that_does_not_know_the_field_keeps_the_footer_on_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older_learner(monkeypatch)  # a Sample call that names the connection
    take = ResultChannels.take

    def older(self: ResultChannels, channel: int, call: int, **kwargs: Any) -> Any:
        return take(self, channel, call)  # SampleRequest.footer_on_data unknown: unset

    monkeypatch.setattr(ResultChannels, "take", older)
    with Fleet.local(workers=2, envs_per_worker=2, seed=SEED) as sampler:
        calls = Calls(sampler.result_route, monkeypatch)
        expected = local_episodes(CARTPOLE, 6, 5, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(6), expected[0])
        assert_same_batch(sampler.obtain_episodes(5), expected[1])
        assert calls.all_on_data()
        assert all(data is not None and data.footer is None for data in calls.reads)


class _Unsendable:
    """A results connection whose sends fail (the learner went away)."""

    closed = False

    def send_parts(self, parts: Any, wait: float) -> None:
        raise ConnectionClosedError("gone")

    def close(self, reason: str) -> None:
        self.closed = True


def test_a_footer_that_cannot_be_sent_fails_the_call() -> None:
    # The answer is incomplete without it: the call must end with an error,
    # not its OK status; the connection is closed and given back.
    channels = ResultChannels(None)
    connection = _Unsendable()
    sender = ResultSender(channels, 5, connection, 1, footer_on_data=True)  # type: ignore[arg-type]
    channels._busy.add(5)
    with pytest.raises(CallError) as failed:
        sender.end(Footer(1, 10, 1, 0))
    assert failed.value.code is grpc.StatusCode.UNAVAILABLE
    assert "footer" in failed.value.message
    assert connection.closed and 5 not in channels._busy
    sender.end()  # once: the call's later end sends nothing more


class _SentFrames:
    """A results connection that records what is sent on it, frames per call."""

    closed = False

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def send_frames(self, frames: Any, wait_seconds: float) -> None:
        self.calls.append([list(parts) for parts in frames])

    def send_parts(self, parts: Any, wait_seconds: float) -> None:
        self.calls.append([list(parts)])


def test_a_result_lanes_batch_goes_to_the_learner_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The results a lane books in one batch, gathered by call: each call's go
    # to its connection in one send_frames (one sendmsg on TCP, see
    # test_lease_data_channel.py's test_frames_sent_together_go_in_one_sendmsg...),
    # in booking order, and the end marker counts every one.
    monkeypatch.setattr(
        result_channels, "forwarded_parts", lambda forward, tail: iter([[forward, tail]])
    )
    channels: Any = types.SimpleNamespace(give_back=lambda sender: None)
    connection = _SentFrames()
    senders = [ResultSender(channels, 1, cast(Any, connection), call) for call in (7, 8)]
    outboxes = [CallOutbox(k, subscription=False, sender=s) for k, s in enumerate(senders)]
    booked = [(0, "a1"), (1, "b1"), (0, "a2"), (0, "a3")]
    sends = []
    for call, forward in booked:
        sender = outboxes[call].reserve()
        assert sender is senders[call]
        sends.append((outboxes[call], sender, cast(Any, forward)))
    for outbox, sender, forwards in calls.by_call(sends):
        outbox.send_reserved(sender, forwards)
    seven, eight = senders[0].tail, senders[1].tail
    assert connection.calls == [
        [["a1", seven], ["a2", seven], ["a3", seven]],
        [["b1", eight]],
    ]
    senders[0].end()
    assert connection.calls[-1] == [[results_end(7, 3)]]
