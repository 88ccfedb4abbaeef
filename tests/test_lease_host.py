"""The worker's LeaseHost in-process: blocking envs are stepped at once, on its pool.

A worker must step its leased envs concurrently when they block (an env
behind a socket), or K envs that each wait W take K x W per step. These
envs meet at a barrier in ``step``: a step only completes when every env
of the call is inside ``step`` at the same time, so the test fails (the
barrier breaks after its timeout) if the host steps them one after another.
"""

from __future__ import annotations

import gc
import json
import queue
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.envs.testing import CounterEnv
from rlfleet.v1 import leases_pb2, updates_pb2, worker_pb2
from rlfleet.wire import decode_tensor, encode_tensor
from rlfleet.wire.leases import (
    LeaseCallOrder,
    LeaseCreateOrder,
    LeaseReleaseOrder,
    decode_lease_command,
    lease_report_message,
)
from rlfleet.worker.leases.host import LeaseHost
from tests.test_result_message import python_calls

ENVS = 6
#: Steps that sleep before the barrier steps, so that the host's estimate of
#: a step's seconds (LeasedEnv.step_seconds) keeps the envs on the pool.
SLOW_STEPS = 6
ENV_ID = "rlfleet-tests/Barrier-v0"
_barrier = threading.Barrier(ENVS, timeout=20)


class BarrierEnv(CounterEnv):
    """A Counter that sleeps 1 ms per step (10 ms in its first steps, so
    the host learns it is slow); past them, its steps also wait at the
    shared barrier."""

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(0.01 if self.total_steps < SLOW_STEPS else 0.001)
        if self.total_steps >= SLOW_STEPS:
            _barrier.wait()
        return super().step(action)


gym.register(ENV_ID, entry_point=f"{__name__}:BarrierEnv", kwargs={"length": 1000})


def _command(lease_id: int, **body: Any) -> LeaseCreateOrder | LeaseCallOrder:
    order = decode_lease_command(leases_pb2.LeaseCommand(lease_id=lease_id, **body))
    assert isinstance(order, LeaseCreateOrder | LeaseCallOrder)
    return order


def _answers(out: queue.SimpleQueue[worker_pb2.WorkerMessage], count: int) -> list[Any]:
    replies = []
    while count > 0:
        reply = out.get(timeout=30).lease_reply
        assert not reply.HasField("error"), reply.error.message
        replies.append(reply)
        count -= len(reply.env_ids)
    return replies


def test_blocking_envs_are_stepped_concurrently_and_each_answers() -> None:
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        env = updates_pb2.EnvUpdate(env_id=ENV_ID, kwargs_json=json.dumps({}))
        host.submit(_command(1, create=leases_pb2.LeaseCreate(env=env, env_ids=range(ENVS))))
        _answers(out, ENVS)
        reset = leases_pb2.LeaseCall(call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(ENVS))
        host.submit(_command(1, call=reset))
        _answers(out, ENVS)
        for call_id in range(2, 5 + SLOW_STEPS):
            call = leases_pb2.LeaseCall(
                call_id=call_id,
                op=leases_pb2.LEASE_OP_STEP,
                env_ids=range(ENVS),
                actions=encode_tensor(np.zeros(ENVS, np.int64)),
            )
            host.submit(_command(1, call=call))
            replies = _answers(out, ENVS)
            assert {r.call_id for r in replies} == {call_id}
            assert sorted(i for r in replies for i in r.env_ids) == list(range(ENVS))
        assert not _barrier.broken
    finally:
        host.shutdown()


def test_the_hosted_count_a_session_reads_every_vector_step_is_one_c_call() -> None:
    """``hosted_count``, which a session's TaskBook calls before every vector
    step, counts the envs hosted as they are leased and released, and runs no
    Python function (each nested call cost a native worker about 0.1 us a step)."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        assert host.hosted_count() == 0
        env = updates_pb2.EnvUpdate(env_id=ENV_ID, kwargs_json=json.dumps({}))
        host.submit(_command(1, create=leases_pb2.LeaseCreate(env=env, env_ids=range(3))))
        _answers(out, 3)
        assert host.hosted_count() == 3
        gc.disable()  # a collection may run the test runner's Python callbacks
        try:
            calls = python_calls(host.hosted_count)
        finally:
            gc.enable()
        assert calls == 0
        release = leases_pb2.LeaseCommand(lease_id=1, release=leases_pb2.LeaseRelease(env_ids=[0]))
        order = decode_lease_command(release)
        assert isinstance(order, LeaseReleaseOrder)
        host.submit(order)
        deadline = time.monotonic() + 30
        while host.hosted_count() != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host.hosted_count() == 2
    finally:
        host.shutdown()


MEETING_ID = "rlfleet-tests/Meeting-v0"
_meeting = threading.Barrier(3, timeout=10)


class MeetingEnv(CounterEnv):
    """A Counter whose first reset and first step wait for two other envs at
    a barrier: a simulator whose cost the host has not seen yet."""

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if not self.total_steps:
            _meeting.wait()
        return super().reset(seed=seed, options=options)

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.total_steps:
            _meeting.wait()
        return super().step(action)


gym.register(MEETING_ID, entry_point=f"{__name__}:MeetingEnv", kwargs={"length": 1000})


def test_first_resets_and_steps_run_concurrently() -> None:
    """Until the host has timed an env's reset and step, they run on its pool:
    slow envs on one worker never wait for each other (tianshou's process
    per env would not), even on the first call."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        env = updates_pb2.EnvUpdate(env_id=MEETING_ID, kwargs_json="{}")
        host.submit(_command(1, create=leases_pb2.LeaseCreate(env=env, env_ids=range(3))))
        _answers(out, 3)
        host.submit(
            _command(
                1,
                call=leases_pb2.LeaseCall(
                    call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(3)
                ),
            )
        )
        _answers(out, 3)  # raises on an error reply: a broken barrier
        step = leases_pb2.LeaseCall(
            call_id=2,
            op=leases_pb2.LEASE_OP_STEP,
            env_ids=range(3),
            actions=encode_tensor(np.zeros(3, np.int64)),
        )
        host.submit(_command(1, call=step))
        _answers(out, 3)
        assert not _meeting.broken
    finally:
        host.shutdown()


PAIR_ID = "rlfleet-tests/Pair-v0"
_pair = threading.Barrier(2, timeout=10)


class PairEnv(CounterEnv):
    """A Counter that sleeps 1 ms per step; from its fourth step on, it also
    waits for another env's step at a barrier."""

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(0.001)
        if self.total_steps >= 3:
            _pair.wait()
        return super().step(action)


gym.register(PAIR_ID, entry_point=f"{__name__}:PairEnv", kwargs={"length": 1000})


def test_a_slow_envs_call_never_holds_up_the_next_call() -> None:
    """Async stepping sends a call per ready env: a slow env's call runs on
    the pool even alone, so the next call (another env's) runs meanwhile."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))

    def step(call_id: int, env_ids: list[int]) -> None:
        actions = encode_tensor(np.zeros(len(env_ids), np.int64))
        call = leases_pb2.LeaseCall(
            call_id=call_id, op=leases_pb2.LEASE_OP_STEP, env_ids=env_ids, actions=actions
        )
        host.submit(_command(1, call=call))

    try:
        env = updates_pb2.EnvUpdate(env_id=PAIR_ID, kwargs_json="{}")
        host.submit(_command(1, create=leases_pb2.LeaseCreate(env=env, env_ids=range(2))))
        _answers(out, 2)
        host.submit(
            _command(
                1,
                call=leases_pb2.LeaseCall(
                    call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(2)
                ),
            )
        )
        _answers(out, 2)
        for call_id in (2, 3, 4):  # the host learns that the envs are slow
            step(call_id, [0, 1])
            _answers(out, 2)
        step(5, [0])  # waits at the barrier for env 1's step, sent next
        step(6, [1])
        replies = _answers(out, 2)  # raises on an error reply: a broken barrier
        assert sorted(r.call_id for r in replies) == [5, 6]
        assert not _pair.broken
    finally:
        host.shutdown()


GATED_ID = "rlfleet-tests/Gated-v0"
_gate = threading.Event()
_gated: list[GatedEnv] = []


class GatedEnv(CounterEnv):
    """A Counter that sleeps 1 ms per step (10 ms in its first steps, so the
    host learns it is slow); past them, the first env made also waits in
    ``step`` until ``_gate`` is set."""

    def __init__(self, length: int = 1000) -> None:
        super().__init__(length)
        _gated.append(self)

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(0.01 if self.total_steps < SLOW_STEPS else 0.001)
        if self is _gated[0] and not _gate.wait(20):
            raise TimeoutError("the test never opened the gate")
        return super().step(action)


gym.register(GATED_ID, entry_point=f"{__name__}:GatedEnv", kwargs={"length": 1000})


def _step(call_id: int, *, whole_reply: bool) -> LeaseCallOrder:
    call = leases_pb2.LeaseCall(
        call_id=call_id,
        op=leases_pb2.LEASE_OP_STEP,
        env_ids=[3, 1, 0, 2, 5, 4],  # not in id order: replies keep this order
        actions=encode_tensor(np.zeros(ENVS, np.int64)),
        whole_reply=whole_reply,
    )
    order = _command(1, call=call)
    assert isinstance(order, LeaseCallOrder)
    return order


def test_pooled_calls_answer_each_env_once_whole_or_as_it_finishes() -> None:
    """A whole-reply call is one reply in the call's order; an async call's
    envs answer as they finish, so a stuck env holds back no other."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        env = updates_pb2.EnvUpdate(env_id=GATED_ID, kwargs_json="{}")
        host.submit(_command(1, create=leases_pb2.LeaseCreate(env=env, env_ids=range(ENVS))))
        _answers(out, ENVS)
        reset = leases_pb2.LeaseCall(call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(ENVS))
        host.submit(_command(1, call=reset))
        _answers(out, ENVS)
        _gate.set()  # the slow steps first: the host learns to pool
        for call_id in range(2, 2 + SLOW_STEPS):
            host.submit(_step(call_id, whole_reply=True))
            _answers(out, ENVS)
        call_id = 2 + SLOW_STEPS
        for _ in range(3):  # pooled and whole: one reply, in the call's order
            host.submit(_step(call_id, whole_reply=True))
            (reply,) = _answers(out, ENVS)
            assert list(reply.env_ids) == [3, 1, 0, 2, 5, 4]
            assert decode_tensor(reply.observations).shape == (ENVS, 1)
            call_id += 1
        _gate.clear()
        host.submit(_step(call_id, whole_reply=False))
        # Env 0 (the first made) is stuck: the other five answer without it.
        fast = _answers(out, ENVS - 1)
        assert sorted(i for r in fast for i in r.env_ids) == [1, 2, 3, 4, 5]
        assert out.empty()
        _gate.set()
        (late,) = _answers(out, 1)
        assert list(late.env_ids) == [0] and late.call_id == call_id
        # An absence cannot be awaited: a short window for a second answer to show.
        time.sleep(0.05)
        assert out.empty()  # no env answered twice
    finally:
        _gate.set()
        host.shutdown()


def test_a_call_behind_a_queued_order_waits_for_it() -> None:
    """Calls may run on the submitting thread (LeaseHost.submit), but never
    ahead of an order submitted before them: a reset sent right after the
    CREATE that builds its envs finds them built."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        env = updates_pb2.EnvUpdate(env_id="CartPole-v1", kwargs_json="{}")
        for lease_id in (1, 2):
            create = leases_pb2.LeaseCreate(env=env, env_ids=range(3))
            host.submit(_command(lease_id, create=create))
            reset = leases_pb2.LeaseCall(call_id=1, op=leases_pb2.LEASE_OP_RESET, env_ids=range(3))
            host.submit(_command(lease_id, call=reset))
        replies = _answers(out, 12)  # raises on an error reply ("not hosted here")
        # A first reset runs on the pool (its cost is unknown), so the two
        # leases' replies may interleave; each lease's CREATE comes first.
        for lease_id in (1, 2):
            own = [r for r in replies if r.lease_id == lease_id]
            assert own[0].op == leases_pb2.LEASE_OP_CREATE
            assert {r.op for r in own[1:]} == {leases_pb2.LEASE_OP_RESET}
            assert sorted(env for r in own[1:] for env in r.env_ids) == [0, 1, 2]
    finally:
        host.shutdown()


def test_leased_envs_skip_gymnasiums_order_wrappers_and_refuse_a_step_before_reset() -> None:
    """Leased envs are built with make_env(..., worker_checked=True); the host's
    own check answers a step before the first reset with a clear error."""
    out: queue.SimpleQueue[worker_pb2.WorkerMessage] = queue.SimpleQueue()
    host = LeaseHost((), lambda report: out.put(lease_report_message(report, "w")))
    try:
        env = updates_pb2.EnvUpdate(env_id="CartPole-v1", kwargs_json="{}")
        host.submit(_command(3, create=leases_pb2.LeaseCreate(env=env, env_ids=[0, 1])))
        _answers(out, 2)
        for leased in host._envs.values():
            layers = []
            layer = leased.env
            while isinstance(layer, gym.Wrapper):
                layers.append(type(layer))
                layer = layer.env
            assert gym.wrappers.OrderEnforcing not in layers
            assert gym.wrappers.PassiveEnvChecker not in layers
            assert gym.wrappers.TimeLimit in layers
        step = leases_pb2.LeaseCall(
            call_id=1,
            op=leases_pb2.LEASE_OP_STEP,
            env_ids=[0, 1],
            actions=encode_tensor(np.zeros(2, np.int64)),
        )
        host.submit(_command(3, call=step))
        for _ in range(2):  # each env's error is its own reply
            refused = out.get(timeout=30).lease_reply
            (env_id,) = refused.env_ids
            assert f"env {env_id} was stepped before its first reset" in refused.error.message
            assert refused.error.exception_type == "EnvError"
        reset = leases_pb2.LeaseCall(call_id=2, op=leases_pb2.LEASE_OP_RESET, env_ids=[0])
        host.submit(_command(3, call=reset))
        _answers(out, 1)
        step.call_id = 3
        del step.env_ids[1:]
        step.actions.CopyFrom(encode_tensor(np.zeros(1, np.int64)))
        host.submit(_command(3, call=step))
        (reply,) = _answers(out, 1)
        assert list(reply.env_ids) == [0] and decode_tensor(reply.rewards).tolist() == [1.0]
    finally:
        host.shutdown()
