"""What the conformance checks expect of a worker's messages, shared by every check.

Each helper either returns the problems it found (a check gathers them and
fails once, naming them all) or fails the check itself
(:meth:`~rlfleet.conformance.link.WorkerLink.failure`).
"""

from __future__ import annotations

import itertools
import math

import gymnasium as gym

from rlfleet.conformance.agents import Agent, balancing_agent
from rlfleet.conformance.kit_messages import error_of, heartbeat_of
from rlfleet.conformance.link import WorkerLink, event_kind, kind_name
from rlfleet.conformance.scripted_coordinator import BROKEN, CLOSED, Inbound
from rlfleet.core.env_spec import EnvSpec
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import TaskAssignment, WorkerBeat
from rlfleet.wire.results import DecodedResult

#: Grace a draining or SIGTERMed worker has to close its stream and exit.
DRAIN_GRACE_SECONDS = 10.0


def bullets(problems: list[str]) -> str:
    """Problems as an indented list, one a line."""
    return "\n".join(f"  - {problem}" for problem in problems)


def fail_if(link: WorkerLink, what: str, problems: list[str]) -> None:
    """Fails the check with ``what`` and the problems, if there are any."""
    if problems:
        raise link.failure(f"{what}:\n{bullets(problems)}")


def spec_text(spec: EnvSpec) -> str:
    """An EnvSpec in words, for check summaries."""
    return (
        f"observations {spec.observation_space}, actions {spec.action_space}, "
        f"max_episode_length {spec.max_episode_length}"
    )


def env_spec_problems(env_id: str, spec: EnvSpec) -> list[str]:
    """Compares the reported EnvSpec with gymnasium's, when the id is registered here."""
    if env_id not in gym.registry:
        return []  # e.g. an env of the worker's own language
    try:
        env = gym.make(env_id)
    except Exception:  # registered but not buildable here (missing extra): nothing to compare
        return []
    try:
        want = EnvSpec.from_env(env)
    finally:
        env.close()
    return [
        f"EnvReady reports {name} {getattr(spec, name)}, gymnasium.make({env_id!r}) has "
        f"{getattr(want, name)}"
        for name in ("observation_space", "action_space", "max_episode_length")
        if getattr(spec, name) != getattr(want, name)
    ]


def heartbeat(beat: Inbound) -> WorkerBeat:
    """The Heartbeat a received event holds."""
    assert beat.message is not None  # the session files only parsed heartbeats
    return heartbeat_of(beat.message)


def steps_total_problems(
    beats: list[Inbound], task_sent: float, results: list[DecodedResult]
) -> list[str]:
    """steps_total never goes down, and grows by at least a task's steps across it."""
    totals = [heartbeat(b).steps_total for b in beats]
    if any(later < earlier for earlier, later in itertools.pairwise(totals)):
        return [f"steps_total went down: {totals[-10:]}"]
    # A heartbeat that arrived before the task was sent was sent before the
    # worker had it; one that arrived after the last result was sent after.
    before = [b for b in beats if b.at < task_sent]
    after = [b for b in beats if b.seq > max(r.seq for r in results)]
    steps = sum(int(r.batch.lengths.sum()) for r in results)
    if before and after:
        grown = heartbeat(after[0]).steps_total - heartbeat(before[-1]).steps_total
        if grown < steps:
            return [
                f"steps_total grew by {grown} across a task whose results hold {steps} steps; "
                "it counts every env step since the worker started"
            ]
    return []


def heartbeat_field_problems(link: WorkerLink, window: list[Inbound]) -> list[str]:
    """Heartbeat fields out of their range (active envs, rate)."""
    problems = []
    for beat in window:
        body = heartbeat(beat)
        if body.active_envs > link.num_envs:
            problems.append(
                f"active_envs={body.active_envs} is more than the worker's {link.num_envs} slots"
            )
        if not math.isfinite(body.steps_per_second) or body.steps_per_second < 0:
            problems.append(f"steps_per_second={body.steps_per_second} is not a rate")
        if problems:
            break
    return problems


def check_pinned(link: WorkerLink, agent: Agent, results: list[DecodedResult], when: str) -> None:
    """Fails the check if a result took an action the pinned agent never takes."""
    for result in results:
        step = agent.off_pin(result.batch.actions)
        if step is not None:
            raise link.failure(
                f"{when}, task {result.header.task_id} took action {result.batch.actions[step]} at "
                f"step {step} of a batch; the parameters pin every action to {agent.action}, "
                "so the worker is not acting with them"
            )


def expect_error(
    link: WorkerLink, sent: str, kind: int, named: str, *, refusal: str, update: int
) -> ErrorReport:
    """Waits for the WorkerError refusing an update, and checks what it names."""
    want = kind_name(kind)
    event = link.wait_for(
        f"WorkerError {want} for {sent}",
        lambda e: event_kind(e) in ("error", refusal),
        allow_errors=True,
    )
    assert isinstance(event, Inbound) and event.message is not None  # matched above
    if event.kind == refusal:
        raise link.failure(f"the worker accepted {sent} ({refusal}); expected WorkerError {want}")
    detail = error_of(event.message)
    problems = []
    if detail.kind != kind:
        problems.append(f"its kind is {kind_name(detail.kind)}, expected {want}")
    if named not in detail.message:
        problems.append(f"its message {detail.message!r} does not name {named!r}")
    # The coordinator charges an error only to what it names (updates.proto).
    field = "env_generation" if refusal == "env_ready" else "agent_version"
    if getattr(detail, field) != update:
        shown = "unset" if getattr(detail, field) is None else getattr(detail, field)
        problems.append(f"its {field} is {shown}, expected {update} (the refused update)")
    fail_if(link, f"the WorkerError for {sent} is not what the protocol asks", problems)
    return detail


def start_long_task(link: WorkerLink, *, units: int, seed: int) -> TaskAssignment:
    """Sends a task of long episodes and waits for its first result: work is in flight."""
    agent = balancing_agent(link.spec)
    if agent is not None:
        link.update_agent(agent.params, policy=agent.policy)
    task = link.send_episodes(units, seed=seed)
    link.wait_until(
        f"a first result of task {task.task_id}",
        lambda: bool(link.results[task.task_id]),
        pending=lambda: "no result came",
    )
    return task


def expect_close(link: WorkerLink, when: str) -> None:
    """Waits for the worker to half-close the stream (a broken stream fails the check)."""
    end = link.wait_for(
        f"the worker to close its side of the stream {when}",
        lambda e: event_kind(e) in (CLOSED, BROKEN),
        timeout=DRAIN_GRACE_SECONDS,
    )
    assert isinstance(end, Inbound)  # matched above
    if end.kind == BROKEN:
        raise link.failure(
            f"{when}, the stream broke ({end.error}) instead of being closed: the worker "
            "sends its last results, then closes its side (half-close) and waits for the "
            "coordinator to end the call"
        )
