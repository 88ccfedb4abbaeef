"""The coordinator's lease relay forwards worker replies as their bytes
(rlfleet.coordinator.leases.translation) and checks their header and rows.

The replies are made by the worker's own translation (rlfleet.wire.leases)
and read back by the learner's, so the three sides are tested together; the
hostile case runs over a real coordinator's Join stream.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import grpc
import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet
from rlfleet.coordinator.leases.translation import RelayReply, lease_response, relay_deserializer
from rlfleet.envs import EnvConfig
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import leases_pb2, worker_pb2
from rlfleet.wire import encode_tensor
from rlfleet.wire.lease_values import ReplyCheck
from rlfleet.wire.leases import (
    LeaseAnswer,
    LeaseAnswers,
    LeaseRepliedEvent,
    call_request,
    decode_lease_response,
    lease_report_message,
    open_request,
)
from tests.test_fuzz_handlers import hello, raw_join, start

BOX = gym.spaces.Box(-9, 9, (4,))


def step_reply(env_ids: list[int], *, prefetch: bool = False) -> worker_pb2.WorkerMessage:
    """A worker's STEP reply for ``env_ids``, as the worker's translation builds it."""
    answers = [
        LeaseAnswer(
            env_id,
            np.full(4, env_id, np.float32),
            reward=0.5 * env_id,
            terminated=env_id == 1,
            info={"depth": env_id, "note": "x"},
            reset=(np.ones(4, np.float32), {}) if prefetch and env_id == 1 else None,
        )
        for env_id in env_ids
    ]
    return lease_report_message(LeaseAnswers(7, 3, "step", answers), "self-named")


def relay(message: worker_pb2.WorkerMessage) -> RelayReply:
    item = relay_deserializer(_rpc.chunked_deserializer(worker_pb2.WorkerMessage))(
        message.SerializeToString()
    )
    assert isinstance(item, RelayReply)
    return item


def test_a_relayed_reply_is_the_workers_bytes_named_by_the_coordinator() -> None:
    message = step_reply([0, 1, 2], prefetch=True)
    reply = relay(message)
    assert (reply.lease_id, reply.call_id, reply.op, reply.env_ids) == (7, 3, "step", [0, 1, 2])
    assert reply.body == message.lease_reply.SerializeToString()  # not re-encoded

    response = leases_pb2.LeaseResponse.FromString(lease_response([reply.named("w1")]))
    expected = leases_pb2.LeaseReply()
    expected.CopyFrom(message.lease_reply)
    expected.worker = "w1"  # the coordinator's name for it wins over the worker's
    assert response.reply == expected

    event = decode_lease_response(lease_response([reply.named("w1")]), ReplyCheck([BOX]))
    assert isinstance(event, LeaseRepliedEvent)
    obs, reward, terminated, _, info = event.answers[1]
    np.testing.assert_array_equal(obs, np.full(4, 1, np.float32))
    assert (reward, terminated, info["depth"], info["note"]) == (0.5, True, 1, "x")
    assert list(event.resets) == [1]


def test_other_worker_messages_take_the_usual_deserializer() -> None:
    heartbeat = worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat())
    item = relay_deserializer(_rpc.chunked_deserializer(worker_pb2.WorkerMessage))(
        heartbeat.SerializeToString()
    )
    assert isinstance(item, _rpc.WithChunk)
    assert item.message.WhichOneof("body") == "heartbeat"


def _spoil_rows(reply: leases_pb2.LeaseReply) -> None:
    reply.observations.CopyFrom(encode_tensor(np.zeros((3, 4), np.float32)))


def _spoil_rewards(reply: leases_pb2.LeaseReply) -> None:
    reply.rewards.CopyFrom(encode_tensor(np.zeros(1)))


def _repeat_ids(reply: leases_pb2.LeaseReply) -> None:
    reply.env_ids[1] = reply.env_ids[0]


def _drop_an_info(reply: leases_pb2.LeaseReply) -> None:
    del reply.infos[0]


def _foreign_reset(reply: leases_pb2.LeaseReply) -> None:
    reply.reset_env_ids[0] = 5


SPOILERS: dict[str, tuple[Callable[[leases_pb2.LeaseReply], None], str]] = {
    "observation rows": (_spoil_rows, "'observations': 3"),
    "reward rows": (_spoil_rewards, "'rewards': 1"),
    "repeated ids": (_repeat_ids, "env ids [0, 0] repeat"),
    "missing info": (_drop_an_info, "'infos': 1"),
    "foreign reset": (_foreign_reset, "reset_env_ids [5]"),
}


@pytest.mark.parametrize("case", sorted(SPOILERS))
def test_the_relay_refuses_replies_whose_rows_do_not_match_their_ids(case: str) -> None:
    spoil, expected = SPOILERS[case]
    message = step_reply([0, 1], prefetch=True)
    spoil(message.lease_reply)
    with pytest.raises(WireFormatError) as info:
        relay(message)
    assert expected in str(info.value)


def test_a_worker_sending_a_reply_with_wrong_rows_is_dropped_naming_the_field() -> None:
    message = step_reply([0, 1])
    _spoil_rows(message.lease_reply)
    with start() as server:
        outcome = raw_join(server.address, [hello(), message.SerializeToString()])
    assert outcome.code is grpc.StatusCode.INVALID_ARGUMENT, outcome
    assert "observations" in outcome.details and "one row per env id" in outcome.details


def test_replies_of_several_workers_to_one_call_decode_as_one_answer() -> None:
    parts = [relay(step_reply([0, 2])).named("w0"), relay(step_reply([1])).named("w1")]
    response = leases_pb2.LeaseResponse.FromString(lease_response(parts))
    assert [r.worker for r in response.replies.replies] == ["w0", "w1"]
    event = decode_lease_response(lease_response(parts), ReplyCheck([BOX]))
    assert isinstance(event, LeaseRepliedEvent)
    assert event.env_ids == [0, 2, 1]
    assert [answer[1] for answer in event.answers] == [0.0, 1.0, 0.5]


def lease_exchange(fleet: Fleet, *, whole_reply: bool) -> list[leases_pb2.LeaseResponse]:
    """Leases 4 CartPole envs over a raw Lease stream, resets them in one call
    and returns the responses that answer it."""
    requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    channel = fleet.sampler.open_channel()
    try:
        call = channel.stream_stream(_rpc.LEASE, None, None)(iter(requests.get, None), timeout=60)
        requests.put(open_request(EnvConfig("CartPole-v1"), 4, 30.0, "relay-test"))
        responses = iter(call)
        opened = leases_pb2.LeaseResponse.FromString(next(responses)).opened
        assert len(set(opened.env_workers)) == 2  # spread over both workers
        seeds = [{"seed": 10 + i} for i in range(4)]
        requests.put(call_request(1, "reset", [0, 1, 2, 3], seeds, False, whole_reply=whole_reply))
        answers: list[leases_pb2.LeaseResponse] = []
        answered = 0
        while answered < 4:
            answers.append(leases_pb2.LeaseResponse.FromString(next(responses)))
            replies = answers[-1].replies.replies or [answers[-1].reply]
            answered += sum(len(reply.env_ids) for reply in replies)
        requests.put(None)
        return answers
    finally:
        channel.close()


def test_a_whole_reply_call_is_answered_in_one_message_and_others_as_workers_answer() -> None:
    fleet = Fleet.local(workers=2, envs_per_worker=2)
    try:
        whole = lease_exchange(fleet, whole_reply=True)
        apart = lease_exchange(fleet, whole_reply=False)
    finally:
        fleet.close()
    assert [r.WhichOneof("body") for r in whole] == ["replies"]
    assert len({reply.worker for reply in whole[0].replies.replies}) == 2
    # One reply at least per worker, each sent as it came (a worker may split
    # its part when its envs finish apart).
    assert len(apart) >= 2 and {r.WhichOneof("body") for r in apart} == {"reply"}
    event = decode_lease_response(whole[0].SerializeToString(), ReplyCheck([BOX]))
    assert isinstance(event, LeaseRepliedEvent)
    for env_id, (obs, _) in zip(event.env_ids, event.answers, strict=True):
        expected, _ = gym.make("CartPole-v1").reset(seed=10 + env_id)
        np.testing.assert_array_equal(obs, expected)


def test_the_learner_refuses_observations_that_do_not_fit_the_leases_space() -> None:
    """The relay leaves dtypes and shapes to the learner, which knows the space."""
    response = lease_response([relay(step_reply([0, 1])).named("w0")])
    with pytest.raises(ProtocolError, match="dtype float32 per env"):
        decode_lease_response(response, ReplyCheck([gym.spaces.Box(-9, 9, (4,), np.float64)]))
    with pytest.raises(ProtocolError, match=r"shape \(4,\)"):
        decode_lease_response(response, ReplyCheck([gym.spaces.Box(-9, 9, (5,))]))
