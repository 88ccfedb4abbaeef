"""The leases check: a worker that advertises ``rlfleet.leases`` hosts leased envs.

The kit leases two envs, resets them with seeds, steps them and releases
them, comparing every reply with ``gymnasium.make``'s envs run here
(protos/rlfleet/v1/leases.proto, docs/conformance.md).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.conformance._expectations import fail_if
from rlfleet.conformance.kit_messages import (
    LeaseCall,
    LeaseCreate,
    LeaseRelease,
    LeaseRows,
    lease_rows_of,
    merged_rows,
)
from rlfleet.conformance.link import WorkerLink, event_kind
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.conformance.scripted_coordinator import Inbound
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import parse_env_spec

#: Seed of the lease check's first env (the second gets the next one).
LEASE_SEED = 21
#: Steps the lease check compares with gymnasium.make's env.
LEASE_STEPS = 10


def check_leases(harness: WorkerHarness) -> str:
    """The leases check: leased envs follow gymnasium.make's trajectory (see checks.py)."""
    link = harness.shared()
    if not link.grants(_rpc.LEASE_CAPABILITY):
        return (
            "'rlfleet.leases' not advertised: coordinators place no leased envs on this "
            "worker, so nothing was tried"
        )
    lease_id = 5
    reply = _lease_reply(link, "a CREATE reply", LeaseCreate(lease_id, harness.env_id, (0, 1)))
    if reply.error is not None or reply.env_spec is None:
        raise link.failure(f"LeaseCreate of {harness.env_id!r} was answered with {reply.text}")
    spec = parse_env_spec(reply.env_spec)
    local = [gym.make(harness.env_id) for _ in range(2)]
    want_obs = np.stack(
        [local[0].reset(seed=LEASE_SEED)[0], local[1].reset(seed=LEASE_SEED + 1)[0]]
    )
    reset = LeaseCall(lease_id, 1, (0, 1), seeds=(LEASE_SEED, LEASE_SEED + 1))
    _expect_rows(link, _lease_reply(link, "a RESET reply", reset), reset, want_obs, "RESET")
    problems = []
    for step in range(LEASE_STEPS):
        actions = np.stack([spec.action_space.sample() for _ in range(2)])
        want = [local[i].step(actions[i]) for i in range(2)]
        call = LeaseCall(lease_id, 2 + step, (0, 1), actions=actions)
        reply = _lease_reply(link, "a STEP reply", call)
        _expect_rows(link, reply, call, np.stack([w[0] for w in want]), f"STEP {step + 1}")
        if reply.rewards is None or reply.terminated is None or reply.truncated is None:
            raise link.failure(f"a STEP reply lacks rewards, terminated or truncated: {reply.text}")
        rewards, ended = reply.rewards, reply.terminated | reply.truncated
        if not np.array_equal(rewards, np.array([float(w[1]) for w in want])):
            problems.append(
                f"step {step + 1}: rewards {rewards}, gymnasium gives {[w[1] for w in want]}"
            )
        if ended.any():
            break
    fail_if(link, "leased envs do not follow gymnasium.make's trajectory", problems)
    link.send_lease(LeaseRelease(lease_id))
    gone = LeaseCall(lease_id, 99, (0,), seeds=())
    reply = _lease_reply(link, "an error reply for a released env", gone)
    if reply.error is None:
        raise link.failure("a RESET of a released env was answered without an error")
    return (
        f"2 envs of {harness.env_id!r} built, reset with seeds and stepped {step + 1} times "
        "exactly as gymnasium.make's; released, after which a call is an error"
    )


def _lease_reply(link: WorkerLink, what: str, command: LeaseCreate | LeaseCall) -> LeaseRows:
    """Sends a command and gathers its replies into one, rows in the call's env order.

    A worker may answer a call in several replies (envs that finish first
    go first); together they must name each env of the call once.
    """
    link.send_lease(command)
    wanted = list(command.env_ids) if isinstance(command, LeaseCall) else []
    parts: list[LeaseRows] = []
    answered: list[int] = []
    while True:
        event = link.wait_for(what, lambda e: event_kind(e) == "lease_reply")
        assert isinstance(event, Inbound) and event.message is not None  # matched above
        reply = lease_rows_of(event.message)
        if reply.lease_id != command.lease_id:
            raise link.failure(f"{what} names lease {reply.lease_id}, not {command.lease_id}")
        if reply.error is not None or not wanted:
            return reply
        parts.append(reply)
        answered += list(reply.env_ids)
        if len(answered) >= len(wanted):
            break
    if sorted(answered) != sorted(wanted):
        raise link.failure(f"{what}: the replies answer envs {answered}, the call {wanted}")
    return merged_rows(parts, wanted)


def _expect_rows(
    link: WorkerLink, reply: LeaseRows, call: LeaseCall, want_obs: np.ndarray, what: str
) -> None:
    """Fails the check if a RESET or STEP reply is not the call's rows."""
    if reply.error is not None:
        raise link.failure(f"{what} of leased envs failed: {reply.error}")
    if reply.observations is None:
        raise link.failure(f"the {what} reply carries no observations: {reply.text}")
    problems = []
    obs = reply.observations
    if not np.array_equal(obs, want_obs):
        problems.append(f"observations {obs.tolist()}, gymnasium.make gives {want_obs.tolist()}")
    if reply.infos != len(call.env_ids):
        problems.append(f"{reply.infos} infos for {len(call.env_ids)} envs")
    fail_if(link, f"the {what} reply breaks leases.proto", problems)
