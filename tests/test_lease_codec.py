"""The lease replies' codec, worker to learner, as property tests.

A worker's answers (rlfleet.wire.leases.lease_report_message, with its
batched observations, scalar columns and infos sent only where they hold
something) cross the coordinator's relay as bytes and are decoded by the
learner (decode_lease_response). Whatever the answers hold, every env gets
back exactly its own observation, reward, flags, info and prefetched reset;
and a reply whose columns do not match its env ids is refused. The other
way, the coordinator's split of a learner's call gives each worker its own
ids, seeds and action rows.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.coordinator.leases.translation import (
    RelayReply,
    call_command,
    lease_response,
    parse_request,
    relay_deserializer,
)
from rlfleet.errors import ProtocolError
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import leases_pb2, worker_pb2
from rlfleet.wire import decode_tensor, encode_tensor
from rlfleet.wire.lease_values import ReplyCheck
from rlfleet.wire.leases import (
    LeaseAnswer,
    LeaseAnswers,
    LeaseCallOrder,
    LeaseRepliedEvent,
    call_request,
    decode_lease_response,
    lease_report_message,
)

BOX = gym.spaces.Box(-100, 100, (3,), np.float32)

_infos: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {"depth": st.integers(-5, 5)},
        optional={
            "score": st.floats(-1e3, 1e3),
            "note": st.text(max_size=5),
            "nested": st.fixed_dictionaries({"hits": st.integers(0, 9)}),
        },
    ),
)


@st.composite
def _answers(draw: st.DrawFn) -> list[LeaseAnswer]:
    env_ids = draw(st.lists(st.integers(0, 63), min_size=1, max_size=12, unique=True))
    answers = []
    for env_id in env_ids:
        obs = np.array(draw(st.lists(st.floats(-100, 100, width=32), min_size=3, max_size=3)))
        ended = draw(st.booleans())
        reset = None
        if ended and draw(st.booleans()):
            reset = (np.full(3, env_id, np.float32), draw(_infos))
        answers.append(
            LeaseAnswer(
                env_id,
                obs.astype(np.float32),
                draw(st.floats(-1e6, 1e6)),
                ended and draw(st.booleans()),
                ended,
                draw(_infos),
                reset=reset,
            )
        )
    return answers


def _relay(message: worker_pb2.WorkerMessage) -> bytes:
    """What the coordinator sends the learner for one worker's reply."""
    deserialize = relay_deserializer(_rpc.chunked_deserializer(worker_pb2.WorkerMessage))
    reply = deserialize(message.SerializeToString())
    assert isinstance(reply, RelayReply)
    return lease_response([reply.named("w")])


def _same_info(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, dict):
            _same_info(got[key], value)
        else:
            assert got[key] == value, key


@settings(max_examples=60, deadline=None)
@given(_answers())
def test_every_env_gets_back_exactly_its_own_answer(answers: list[LeaseAnswer]) -> None:
    message = lease_report_message(LeaseAnswers(1, 9, "step", answers), "w")
    event = decode_lease_response(_relay(message), ReplyCheck([BOX]))
    assert isinstance(event, LeaseRepliedEvent)
    assert event.call_id == 9
    assert event.env_ids == [a.env_id for a in answers]
    for want, got in zip(answers, event.answers, strict=True):
        obs, reward, terminated, truncated, info = got
        np.testing.assert_array_equal(obs, want.observation)
        assert obs.dtype == np.float32
        assert (reward, terminated, truncated) == (want.reward, want.terminated, want.truncated)
        assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
        _same_info(info, dict(want.info))
    resets = {a.env_id: a.reset for a in answers if a.reset is not None}
    assert event.resets.keys() == resets.keys()
    for env_id, (obs, info) in event.resets.items():
        np.testing.assert_array_equal(obs, resets[env_id][0])
        _same_info(info, dict(resets[env_id][1]))


def test_empty_infos_travel_as_empty_maps_without_json() -> None:
    answers = [LeaseAnswer(k, np.zeros(3, np.float32)) for k in range(4)]
    reply = lease_report_message(LeaseAnswers(1, 2, "step", answers), "w").lease_reply
    assert len(reply.infos) == 4 and not any(m.entries for m in reply.infos)
    assert not reply.infos_json  # no JSON text at all when no info holds any


@pytest.mark.parametrize("column", ["rewards", "terminated", "truncated"])
def test_a_scalar_column_of_the_wrong_length_is_refused(column: str) -> None:
    answers = [LeaseAnswer(k, np.zeros(3, np.float32)) for k in range(3)]
    message = lease_report_message(LeaseAnswers(1, 2, "step", answers), "w")
    wrong = np.zeros(2, np.float64 if column == "rewards" else bool)
    getattr(message.lease_reply, column).CopyFrom(encode_tensor(wrong))
    data = lease_response([message.lease_reply.SerializeToString()])
    with pytest.raises(ProtocolError, match=rf"{column} of shape \(2,\); it must be \(3,\)"):
        decode_lease_response(data, ReplyCheck([BOX]))


@pytest.mark.parametrize("wrong", [np.zeros(2, np.float64), np.zeros((3, 1), np.float64)])
def test_a_reward_column_of_the_wrong_shape_is_refused(wrong: np.ndarray) -> None:
    answers = [LeaseAnswer(k, np.zeros(3, np.float32)) for k in range(3)]
    message = lease_report_message(LeaseAnswers(1, 2, "step", answers), "w")
    message.lease_reply.rewards.CopyFrom(encode_tensor(wrong))
    data = lease_response([message.lease_reply.SerializeToString()])
    shape = re.escape(str(wrong.shape))
    with pytest.raises(ProtocolError, match=rf"rewards of shape {shape}; it must be \(3,\)"):
        decode_lease_response(data, ReplyCheck([BOX]))


def test_step_columns_of_other_numeric_dtypes_decode_as_floats_and_bools() -> None:
    # leases.proto says float64 and bool; other numbers are converted as numpy would.
    answers = [LeaseAnswer(k, np.zeros(3, np.float32), reward=k) for k in range(3)]
    message = lease_report_message(LeaseAnswers(1, 2, "step", answers), "w")
    reply = message.lease_reply
    reply.rewards.CopyFrom(encode_tensor(np.array([0.5, 1, 2], np.float32)))
    reply.terminated.CopyFrom(encode_tensor(np.array([0, 2, 0], np.uint8)))
    data = lease_response([reply.SerializeToString()])
    event = decode_lease_response(data, ReplyCheck([BOX]))
    assert isinstance(event, LeaseRepliedEvent)
    rewards = [answer[1] for answer in event.answers]
    terminated = [answer[2] for answer in event.answers]
    assert rewards == [0.5, 1.0, 2.0] and all(type(r) is float for r in rewards)
    assert terminated == [False, True, False] and all(type(t) is bool for t in terminated)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=10),
    st.sampled_from([np.int64, np.int32, np.uint8]),
)
def test_step_actions_travel_as_one_tensor(actions: list[int], dtype: type) -> None:
    rows = list(np.array(actions, dtype))
    data = call_request(4, "step", list(range(len(rows))), rows, True)
    call = leases_pb2.LeaseRequest.FromString(data).call
    assert call.prefetch_reset
    got = decode_tensor(call.actions)
    assert got.dtype == dtype and got.tolist() == actions


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_call_split_per_worker_gives_each_its_own_rows(data: st.DataObject) -> None:
    """The coordinator's command for a worker's envs carries exactly their
    ids, seeds and action rows, whether the worker's rows are a run (sent
    as a slice) or scattered."""
    count = data.draw(st.integers(1, 12))
    env_ids = data.draw(st.permutations(list(range(count))))
    rows = sorted(data.draw(st.sets(st.integers(0, count - 1), min_size=1)))
    actions = np.arange(count * 2, dtype=np.float32).reshape(count, 2)
    op = data.draw(st.sampled_from(["step", "reset"]))
    if op == "step":
        args: list[Any] = list(actions)
    else:
        args = [{"seed": 100 + k, "options": None} for k in range(count)]
    order = parse_request(call_request(3, op, env_ids, args, True, whole_reply=True))
    assert isinstance(order, LeaseCallOrder)
    command = call_command(5, order, rows).lease
    assert command.lease_id == 5
    part = command.call
    assert list(part.env_ids) == [env_ids[r] for r in rows]
    assert part.whole_reply and part.call_id == 3
    if op == "step":
        np.testing.assert_array_equal(decode_tensor(part.actions), actions[rows])
        assert part.prefetch_reset
    else:
        assert list(part.seeds) == [100 + r for r in rows]
