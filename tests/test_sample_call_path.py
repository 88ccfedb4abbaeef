"""What a Sample call costs per request beyond its results, on both ends.

The coordinator writes a call's header, footer and end marker as bytes
(what protobuf writes, without a message object per call), and the end of
a call whose handler returned costs it no lock. The learner reads a Sample call on
its own thread (no thread of gRPC's starts per call) and reads a complete
answer's call up to its status rather than cancelling it.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlfleet.client import Fleet
from rlfleet.client._learner_messages import LearnerStubs
from rlfleet.coordinator.calls import CallOutbox, CallScope
from rlfleet.coordinator.learner_messages import (
    footer_bytes,
    header_bytes,
    result_call_field,
    results_end,
)
from rlfleet.coordinator.requests import LearnerRequests
from rlfleet.envs import EnvConfig
from rlfleet.protocol.learner_calls import CallHeader
from rlfleet.protocol.modes import Footer
from rlfleet.v1 import learner_pb2
from rlfleet.wire import encode_env_spec
from rlfleet.wire._protowire import encode_varint
from tests.test_learner_results import older_learner
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

_UINT64 = st.integers(0, 2**64 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_UINT32 = st.integers(0, 2**32 - 1)


def _spec_wire() -> bytes:
    return encode_env_spec(EnvConfig("CartPole-v1").env_spec()).SerializeToString()


@given(
    request_id=_UINT64,
    agent_version=_INT64,
    env_generation=_UINT64,
    coordinator_id=st.text(max_size=40),
    with_spec=st.booleans(),
    results_on_data=st.booleans(),
    footer_on_data=st.booleans(),
)
def test_a_header_is_what_protobuf_writes(
    *,
    request_id: int,
    agent_version: int,
    env_generation: int,
    coordinator_id: str,
    with_spec: bool,
    results_on_data: bool,
    footer_on_data: bool,
) -> None:
    spec = _spec_wire() if with_spec else None
    header = CallHeader(request_id, agent_version, env_generation, coordinator_id, spec)
    expected = learner_pb2.SampleResponse(
        header=learner_pb2.SampleHeader(
            request_id=request_id,
            agent_version=agent_version,
            env_generation=env_generation,
            coordinator_id=coordinator_id,
            results_on_data=results_on_data,
            footer_on_data=footer_on_data,
        )
    )
    if spec is not None:
        expected.header.env_spec.MergeFromString(spec)
    written = header_bytes(header, results_on_data=results_on_data, footer_on_data=footer_on_data)
    assert written == expected.SerializeToString()


def test_a_header_passes_the_workers_spec_bytes_on_as_they_are() -> None:
    # A spec as a newer worker may write it: a field this version does not know.
    spec = _spec_wire() + encode_varint(111 << 3) + encode_varint(7)
    written = header_bytes(CallHeader(1, 2, 3, "c", spec), results_on_data=False)
    assert spec in written
    parsed = learner_pb2.SampleResponse.FromString(written)
    assert parsed.header.env_spec.SerializeToString() == spec


def test_an_empty_spec_is_still_a_spec() -> None:
    parsed = learner_pb2.SampleResponse.FromString(
        header_bytes(CallHeader(1, 0, 1, "", b""), results_on_data=False)
    )
    assert parsed.header.HasField("env_spec")
    parsed = learner_pb2.SampleResponse.FromString(
        header_bytes(CallHeader(1, 0, 1, "", None), results_on_data=False)
    )
    assert not parsed.header.HasField("env_spec")


@given(
    num_episodes=st.integers(0, 2**63 - 1),
    total_steps=st.integers(0, 2**63 - 1),
    workers_used=_UINT32,
    reassigned_units=_UINT32,
    data_results=_UINT64,
    call=st.integers(1, 2**64 - 1),
)
def test_a_footer_is_what_protobuf_writes(
    *,
    num_episodes: int,
    total_steps: int,
    workers_used: int,
    reassigned_units: int,
    data_results: int,
    call: int,
) -> None:
    footer = Footer(num_episodes, total_steps, workers_used, reassigned_units)
    expected = learner_pb2.SampleResponse(
        footer=learner_pb2.SampleFooter(
            num_episodes=num_episodes,
            total_steps=total_steps,
            workers_used=workers_used,
            reassigned_units=reassigned_units,
            data_results=data_results,
        )
    )
    assert footer_bytes(footer, data_results) == expected.SerializeToString()
    # On a results connection (in place of the end marker): the same plus the call's number.
    expected.result_call = call
    assert footer_bytes(footer, data_results) + result_call_field(call) == (
        expected.SerializeToString()
    )


@given(call=_UINT64, results=_UINT64)
def test_an_end_marker_is_what_protobuf_writes(call: int, results: int) -> None:
    expected = learner_pb2.SampleResponse(
        results_end=learner_pb2.ResultsEnd(results=results), result_call=call
    )
    assert results_end(call, results) == expected.SerializeToString()


class _Watched(threading.Condition):
    """The coordinator's condition, counting its wake-ups."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = _Watched(self.lock)


def test_the_end_of_a_served_call_wakes_nothing_but_a_hang_up_does() -> None:
    state = _State()
    requests = LearnerRequests.__new__(LearnerRequests)
    requests._state = state  # type: ignore[assignment]

    served = CallScope()
    served.outbox = CallOutbox(1, subscription=False)
    served.served = True  # its handler returned: gRPC then ends the call
    requests.cancel(served)
    assert not served.cancelled and state.changed.notified == 0

    waiting = CallScope()
    waiting.outbox = CallOutbox(2, subscription=False)
    requests.cancel(waiting)  # a learner that hung up mid-call
    assert waiting.cancelled and state.changed.notified == 1
    event = waiting.outbox.get()
    assert getattr(event, "code", None) is grpc.StatusCode.CANCELLED


def test_a_sample_call_is_read_on_the_calling_thread_and_ends_with_its_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older_learner(monkeypatch)  # Sample calls (not requests on the results connection)
    with Fleet.local(workers=1, envs_per_worker=2, seed=3) as sampler:
        sampler.obtain_episodes(2)  # warm: the results connection is open
        calls: list[Any] = []
        sample = LearnerStubs.sample

        def recorded(self: LearnerStubs, *args: Any, **kwargs: Any) -> Any:
            call = sample(self, *args, **kwargs)
            calls.append(call)
            return call

        monkeypatch.setattr(LearnerStubs, "sample", recorded)
        started: list[str] = []
        start = threading.Thread.start
        me = threading.current_thread()

        def counted(thread: threading.Thread) -> None:
            if threading.current_thread() is me:
                started.append(thread.name)
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)
        ends: list[bool] = []  # whether each call's handler had returned at its end
        cancel = LearnerRequests.cancel

        def ended(self: LearnerRequests, scope: CallScope) -> None:
            ends.append(scope.served)
            cancel(self, scope)

        monkeypatch.setattr(LearnerRequests, "cancel", ended)
        for _ in range(5):
            assert sampler.obtain_episodes(2).lengths.size >= 2
        assert started == []  # gRPC started no thread to read the calls
        assert len(calls) == 5
        # Read to their status, not cancelled before it arrived.
        assert all(call.code() is grpc.StatusCode.OK for call in calls)
        wait_until(lambda: len(ends) >= 5, "the five calls ended on the coordinator")
        assert all(ends)  # their ends took no lock
