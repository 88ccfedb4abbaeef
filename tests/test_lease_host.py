"""The worker's LeaseHost in-process: blocking envs are stepped at once, on its pool.

A worker must step its leased envs concurrently when they block (an env
behind a socket), or K envs that each wait W take K x W per step. These
envs meet at a barrier in ``step``: a step only completes when every env
of the call is inside ``step`` at the same time, so the test fails (the
barrier breaks after its timeout) if the host steps them one after another.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.envs.testing import CounterEnv
from rlfleet.lease_messages import (
    LeaseCallOrder,
    LeaseCreateOrder,
    decode_lease_command,
    lease_report_message,
)
from rlfleet.v1 import leases_pb2, updates_pb2, worker_pb2
from rlfleet.wire import encode_tensor
from rlfleet.worker._leases import LeaseHost

ENVS = 6
ENV_ID = "rlfleet-tests/Barrier-v0"
_barrier = threading.Barrier(ENVS, timeout=20)


class BarrierEnv(CounterEnv):
    """A Counter whose first step sleeps (so the host learns it is slow) and
    whose later steps wait at the shared barrier."""

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.total_steps == 0:
            time.sleep(0.01)
        else:
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
        for call_id in range(2, 5):
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
