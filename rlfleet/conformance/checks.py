"""The conformance checks: what a worker in any language must do, one check each.

Each check scripts the test coordinator's side of a conversation
(:class:`~rlfleet.conformance.link.WorkerLink`), watches what the worker
answers, and returns a :class:`CheckResult`. A failure says what the
protocol expected, what came instead, and ends with the worker's state and
the last lines of its output. docs/conformance.md describes every check for
people writing a worker.

Checks run in :data:`CHECKS` order. Those that leave the worker as they
found it share one worker process; the others start their own
(:class:`~rlfleet.conformance.runner.WorkerHarness`).
"""

from __future__ import annotations

import functools
import itertools
import math
import signal
import time
from collections.abc import Callable, Mapping

import grpc
import gymnasium as gym
import numpy as np

from rlfleet.conformance._failure import Check, CheckFailed, CheckResult, run_check
from rlfleet.conformance._stall import StallMeter
from rlfleet.conformance.agents import Agent, balancing_agent, pinned_agent
from rlfleet.conformance.kit_messages import (
    LeaseCall,
    LeaseCreate,
    LeaseRelease,
    LeaseRows,
    error_of,
    heartbeat_of,
    lease_rows_of,
    merged_rows,
)
from rlfleet.conformance.link import (
    KNOWN_CAPABILITIES,
    WelcomeSettings,
    WorkerLink,
    event_kind,
    kind_name,
)
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.conformance.scripted_coordinator import BROKEN, CLOSED, Inbound
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.policies.mlp import weight_name
from rlfleet.protocol.error_reports import ErrorKind, ErrorReport
from rlfleet.protocol.join import TaskAssignment, WorkerBeat
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.stream_replay import StreamBook
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import parse_env_spec
from rlfleet.wire.result_checks import pieces_by_stream
from rlfleet.wire.results import DecodedResult, cut_pieces

#: Idle time the heartbeat check watches before and after its task.
HEARTBEAT_IDLE_SECONDS = (1.0, 0.6)
#: The version the agent-update check creates (the kit's first update).
AGENT_VERSION = 7
#: max_episode_length of the env-update check.
ENV_UPDATE_LIMIT = 5
#: An env id no worker has.
MISSING_ENV_ID = "RlfleetConformanceMissing-v0"
#: Welcome.max_message_bytes of the chunking check: far above a chunk
#: header, far below a 500-step CartPole episode (about 25 KB).
CHUNK_LIMIT_BYTES = 8 * 1024
#: The stream, window length and seed of the stream-takeover check.
TAKEOVER_STREAM, TAKEOVER_LENGTH, TAKEOVER_SEED = 90, 6, 31
#: Units of each cancel-check task.
CANCEL_UNITS = 40
#: How long the version-mismatch check watches a refused worker.
REFUSAL_WATCH_SECONDS = 3.0
#: Most Join attempts per second a refused worker may make.
MAX_RETRIES_PER_SECOND = 3.0
#: Grace a draining or SIGTERMed worker has to close its stream and exit.
DRAIN_GRACE_SECONDS = 10.0
#: Seed of the lease check's first env (the second gets the next one).
LEASE_SEED = 21
#: Steps the lease check compares with gymnasium.make's env.
LEASE_STEPS = 10
#: How soon after SIGTERM a worker must say Leaving.
LEAVING_SECONDS = 5.0


#: Every check, by name, in the order they run.
CHECKS: dict[str, Check[WorkerHarness]] = {}


def _check(
    name: str, summary: str
) -> Callable[[Callable[[WorkerHarness], str]], Check[WorkerHarness]]:
    """Registers a check body: it returns what it verified or raises CheckFailed."""

    def register(body: Callable[[WorkerHarness], str]) -> Check[WorkerHarness]:
        @functools.wraps(body)
        def run(harness: WorkerHarness) -> CheckResult:
            result = run_check(name, body, harness)
            if not result.passed:
                harness.spoil()  # the shared stream may be in any state now
            return result

        check = Check(name, summary, run)
        CHECKS[name] = check
        return check

    return register


# --- the checks, in running order ------------------------------------------------


@_check("handshake", "Hello first, then Welcome and EnvUpdate answered by EnvReady")
def handshake(harness: WorkerHarness) -> str:
    link = harness.shared()
    hello = link.hello
    problems = []
    if not hello.capabilities:
        problems.append("Hello.capabilities is empty: list what the worker serves")
    for field in ("host", "implementation"):
        if not getattr(hello, field):
            problems.append(f"Hello.{field} is empty")
    if hello.pid <= 0:
        problems.append(f"Hello.pid is {hello.pid}: send the worker's process id")
    problems += _env_spec_problems(harness.env_id, link.spec)
    _fail_if(link, "the handshake is incomplete", problems)
    return (
        f"Hello from {hello.implementation!r} (pid {hello.pid} on {hello.host!r}, "
        f"{hello.num_envs} envs, capabilities {list(hello.capabilities)}); "
        f"EnvReady(1) with {_spec_text(link.spec)}"
    )


@_check("capabilities", "capabilities come from the known set; fragments are served if advertised")
def capabilities(harness: WorkerHarness) -> str:
    link = harness.shared()
    advertised = list(link.hello.capabilities)
    problems = []
    unknown = sorted(set(advertised) - KNOWN_CAPABILITIES)
    if unknown:
        problems.append(
            f"unknown capabilities {unknown}; protocol version 1 defines "
            f"{sorted(KNOWN_CAPABILITIES)}"
        )
    if len(set(advertised)) != len(advertised):
        problems.append(f"capabilities are listed more than once: {advertised}")
    if "rlfleet.episodes" not in advertised:
        problems.append("'rlfleet.episodes' is missing: every coordinator sends episode tasks")
    _fail_if(link, "Hello.capabilities break the protocol", problems)
    if not link.grants("rlfleet.fragments"):
        return f"capabilities {advertised}; fragments not advertised, so not tried"
    task = link.send_fragments(4, 1, base_seed=3)
    link.collect_windows(task)
    return f"capabilities {advertised}; a FRAGMENTS task was served"


@_check("heartbeats", "a Heartbeat every Welcome.heartbeat_interval_seconds, idle or busy")
def heartbeats(harness: WorkerHarness) -> str:
    link = harness.shared()
    interval = link.welcome.heartbeat_interval_seconds
    beats = link.session.heartbeats
    with StallMeter() as stall:
        start = time.monotonic()
        link.pump(HEARTBEAT_IDLE_SECONDS[0])
        if not any(beat.at >= start for beat in beats):
            raise link.failure(
                f"no Heartbeat in {time.monotonic() - start:.1f} seconds of idling; Welcome "
                f"asked for one every {interval:g} seconds"
            )
        task_sent = time.monotonic()
        task = link.send_episodes(2 * link.num_envs, seed=10)
        results = link.collect(task)
        link.pump(HEARTBEAT_IDLE_SECONDS[1])
        end = time.monotonic()

    window = [beat for beat in beats if start <= beat.at <= end]
    earlier = [beat.at for beat in beats if beat.at < start]
    times = np.array([earlier[-1] if earlier else start, *(b.at for b in window), end])
    gaps = np.diff(times)
    worst = int(np.argmax(gaps))
    # Slack for scheduling, plus what the machine's load cost the kit itself.
    allowed = max(3 * interval, interval + 0.5) + 2 * stall.worst
    problems = []
    if gaps[worst] > allowed:
        problems.append(
            f"no Heartbeat for {gaps[worst]:.2f} seconds (from {times[worst] - start:.2f} s "
            f"into the {end - start:.1f} s window); Welcome asked for one every {interval:g} "
            f"seconds, the kit allows gaps up to {allowed:.2f} (its own threads woke up to "
            f"{stall.worst:.2f} s late meanwhile)"
        )
    problems += _heartbeat_field_problems(link, window)
    problems += _steps_total_problems(beats, task_sent, results)
    last = _heartbeat(window[-1])
    if last.queued_units:
        problems.append(f"an idle worker reports queued_units={last.queued_units}")
    _fail_if(link, "heartbeats break the protocol", problems)
    return (
        f"{len(window)} heartbeats in {end - start:.1f} s (interval {interval:g} s, longest gap "
        f"{gaps[worst]:.2f} s); steps_total, active_envs and queued_units plausible"
    )


@_check("sampling", "STEPS, EPISODES and FRAGMENTS tasks come back complete and well-formed")
def sampling(harness: WorkerHarness) -> str:
    link = harness.shared()
    n = link.num_envs
    episodes = link.send_episodes(3 * n + 1, mode=Mode.EPISODES, seed=11)
    episode_results = link.collect(episodes)
    steps = link.send_episodes(n + 1, mode=Mode.STEPS, seed=12)
    link.collect(steps)
    link.pump(0.2)  # a unit sent twice would show up now, and fail this check
    done = (
        f"EPISODES task: {len(episodes.units)} units back exactly once in "
        f"{len(episode_results)} results; STEPS task: {len(steps.units)} units"
    )
    if not link.grants("rlfleet.fragments"):
        return f"{done}; fragments not advertised, so not tried"
    rounds, length = 3, 16
    fragments = link.send_fragments(length, rounds, base_seed=5)
    windows = link.collect_windows(fragments)
    previous: dict[int, tuple[DecodedResult, int]] = {}
    for number, window in enumerate(windows):
        problems, previous = continuity_problems(previous, window)
        _fail_if(link, f"window {number} of FRAGMENTS task {fragments.task_id}", problems)
    link.pump(0.2)
    if len(link.results[fragments.task_id]) != rounds:
        raise link.failure(
            f"FRAGMENTS task {fragments.task_id} asked for {rounds} windows, the worker sent "
            f"{len(link.results[fragments.task_id])}"
        )
    return f"{done}; FRAGMENTS task: {rounds} windows of {length} steps per stream, continuous"


@_check(
    "stream-takeover",
    "if 'rlfleet.stream-takeover' is advertised: Task.streams run, Task.replays rebuild exactly",
)
def stream_takeover(harness: WorkerHarness) -> str:
    link = harness.shared()
    if not link.grants(_rpc.TAKEOVER_CAPABILITY):
        return (
            "'rlfleet.stream-takeover' not advertised: coordinators never move streams to "
            "this worker, so nothing was tried"
        )
    stream, length, seed = TAKEOVER_STREAM, TAKEOVER_LENGTH, TAKEOVER_SEED
    first = link.send_fragments(length, 2, base_seed=seed, streams=[stream])
    windows = link.collect_windows(first)
    for number, window in enumerate(windows):
        got = sorted(set(window.infos("stream").tolist()))
        if got != [stream]:
            raise link.failure(
                f"window {number} of a task with Task.streams [{stream}] covers streams {got}"
            )
    # Rebuild the stream from its first window, as if another worker had sent it.
    book = StreamBook()
    book.record(seed, link.worker_id + 1, windows[0].batch)
    replay = book.replay(seed, stream, link.worker_id)
    assert replay is not None  # recorded under another worker's id
    again = link.send_fragments(length, 1, base_seed=seed, streams=[stream], replays=[replay])
    (rebuilt,) = link.collect_windows(again)
    problems = _same_pieces(rebuilt.batch, windows[1].batch)
    _fail_if(
        link,
        f"the window after a replay of stream {stream} (episode {replay.episode_index}, "
        f"{replay.fragment_index} pieces delivered) differs from the worker's own second window",
        problems,
    )
    return (
        f"stream {stream} ran as Task.streams named; rebuilt from a replay of "
        f"{0 if replay.actions is None else len(replay.actions)} actions, its next window "
        "equals the undisturbed one"
    )


def _same_pieces(got: EpisodeBatch, want: EpisodeBatch) -> list[str]:
    """What differs between two batches, but the ``worker`` and ``agent_version`` infos."""
    problems = []
    for name in (
        "lengths",
        "observations",
        "last_observations",
        "actions",
        "rewards",
        "step_types",
    ):
        a, b = getattr(got, name), getattr(want, name)
        if a.shape != b.shape or not np.array_equal(a, b):
            problems.append(f"{name} differ")
    for key in ("stream", "episode_index", "fragment_index", "env_seed", "policy_seed"):
        a, b = got.episode_infos.get(key), want.episode_infos.get(key)
        if a is None or b is None or not np.array_equal(a, b):
            problems.append(f"episode_infos[{key!r}] differ")
    return problems


@_check("agent-updates", "AgentUpdate -> AgentReady; the next episodes use the new parameters")
def agent_updates(harness: WorkerHarness) -> str:
    link = harness.shared()
    agent = pinned_agent(link.spec)
    version = link.update_agent(
        agent.params, policy=agent.policy, version=max(AGENT_VERSION, link.next_version)
    )
    task = link.send_episodes(2 * link.num_envs, seed=13)
    results = link.collect(task)
    _check_pinned(link, agent, results, "after the AgentUpdate")
    return (
        f"AgentReady({version}); {len(task.units)} episodes carry agent_version {version} and "
        f"take the action its parameters pin ({agent.action})"
    )


@_check("env-updates", "EnvUpdate of a new generation -> EnvReady; tasks run in that generation")
def env_updates(harness: WorkerHarness) -> str:
    link = harness.shared()
    spec = link.update_env(harness.env_id, max_episode_length=ENV_UPDATE_LIMIT)
    generation = link.generation
    if spec.max_episode_length != ENV_UPDATE_LIMIT:
        raise link.failure(
            f"EnvReady(generation={generation}) reports max_episode_length "
            f"{spec.max_episode_length}; the EnvUpdate set {ENV_UPDATE_LIMIT}"
        )
    task = link.send_episodes(2 * link.num_envs, seed=14)
    link.collect(task)  # results must name the generation and respect the limit
    link.update_env(harness.env_id)  # back to the env's own limit for later checks
    return (
        f"EnvReady({generation}) with max_episode_length {ENV_UPDATE_LIMIT}; its task's "
        f"episodes name generation {generation} and stop at {ENV_UPDATE_LIMIT} steps; "
        f"EnvReady({link.generation}) after another update"
    )


@_check("errors", "unknown env id and bad parameters give structured WorkerErrors; work goes on")
def errors(harness: WorkerHarness) -> str:
    link = harness.shared()
    generation = link.send_env_update(MISSING_ENV_ID)
    detail = _expect_error(
        link,
        f"EnvUpdate(generation={generation}, env_id={MISSING_ENV_ID!r})",
        ErrorKind.ENV_NOT_FOUND,
        MISSING_ENV_ID,
        refusal="env_ready",
        update=generation,
    )
    link.update_env(harness.env_id)

    agent = pinned_agent(link.spec)
    good = link.update_agent(agent.params, policy=agent.policy)
    name = weight_name(0)
    bad = dict(agent.params)
    rows, cols = bad[name].shape
    bad[name] = np.zeros((rows + 1, cols), dtype=np.float32)
    version = link.send_agent_update(bad)
    _expect_error(
        link,
        f"AgentUpdate(version={version}) whose {name!r} is ({rows + 1}, {cols}) instead of "
        f"({rows}, {cols})",
        ErrorKind.POLICY,
        name,
        refusal="agent_ready",
        update=version,
    )
    task = link.send_episodes(2 * link.num_envs, seed=15)  # names version `good`
    results = link.collect(task)
    _check_pinned(link, agent, results, "after the refused AgentUpdate (the old policy)")
    return (
        f"unknown env: ERROR_KIND_ENV_NOT_FOUND {detail.message!r}; wrong shape: "
        f"ERROR_KIND_POLICY naming {name!r}; then a task ran with agent version {good}"
    )


@_check("cancel", "cancelled units never come back (but those in flight); work goes on")
def cancel(harness: WorkerHarness) -> str:
    link = harness.shared()
    agent = balancing_agent(link.spec)  # long episodes: the cancel lands mid-task
    if agent is not None:
        link.update_agent(agent.params, policy=agent.policy)
    n = link.num_envs
    allowed = 2 * n  # in flight when the cancel arrived, or finished and not yet sent

    part = link.send_episodes(CANCEL_UNITS, seed=16)
    keep = set(range(n))
    link.cancel(part, range(n, CANCEL_UNITS))
    link.wait_until(
        f"the {n} units of task {part.task_id} that were not cancelled",
        lambda: keep <= link.returned(part),
        pending=lambda: f"units {sorted(keep - link.returned(part))} never came back",
    )
    whole = link.send_episodes(CANCEL_UNITS, seed=17)
    link.cancel(whole)
    probe = link.send_episodes(n, seed=18)
    link.collect(probe)
    link.pump(0.3)
    problems = []
    for task, cancelled in ((part, CANCEL_UNITS - n), (whole, CANCEL_UNITS)):
        late = sorted(link.returned(task) - keep if task is part else link.returned(task))
        if len(late) > allowed:
            problems.append(
                f"task {task.task_id}: {len(late)} of its {cancelled} cancelled units came back "
                f"({late[:10]}...); at most {allowed} (2 x num_envs) may, those already running"
            )
    _fail_if(link, "Cancel was not honoured", problems)
    return (
        f"cancelled {CANCEL_UNITS - n} units, then a whole task of {CANCEL_UNITS}: "
        f"{len(link.returned(part) - keep)} and {len(link.returned(whole))} came back "
        f"(at most {allowed} allowed); the next task completed"
    )


@_check("chunking", "batches above Welcome.max_message_bytes arrive in chunks below it")
def chunking(harness: WorkerHarness) -> str:
    settings = WelcomeSettings(max_message_bytes=CHUNK_LIMIT_BYTES)
    with harness.fresh(settings) as (_, link):
        agent = balancing_agent(link.spec)
        if agent is not None:
            link.update_agent(agent.params, policy=agent.policy)
        count = (2 if agent is not None else 16) * link.num_envs
        task = link.send_episodes(count, seed=19)
        results = link.collect(task)  # every message was checked against the limit
        chunked = [r for r in results if len(r.message_sizes) > 1]
        if not chunked:
            raise link.failure(
                f"no batch needed chunking (the largest was "
                f"{max(r.total_bytes for r in results)} bytes, below "
                f"Welcome.max_message_bytes={CHUNK_LIMIT_BYTES}); run the kit with an env "
                "whose episodes are longer, e.g. CartPole-v1"
            )
        biggest = max(chunked, key=lambda r: r.total_bytes)
        return (
            f"{len(chunked)} of {len(results)} results came in chunks (largest: "
            f"{biggest.total_bytes} bytes in {len(biggest.message_sizes)} messages of at most "
            f"{max(biggest.message_sizes)} bytes), every message <= {CHUNK_LIMIT_BYTES} bytes; "
            "all reassembled and decoded"
        )


@_check("version-mismatch", "refused at Join: exits non-zero or backs off, and says why")
def version_mismatch(harness: WorkerHarness) -> str:
    coordinator = harness.coordinator
    coordinator.refuse(
        grpc.StatusCode.FAILED_PRECONDITION,
        "this coordinator speaks rlfleet protocol version 2 only; the worker sent version 1",
    )
    try:
        with harness.start() as process:
            before = len(coordinator.join_times)
            deadline = time.monotonic() + harness.startup_timeout
            while len(coordinator.join_times) == before and process.returncode is None:
                if time.monotonic() > deadline:
                    raise CheckFailed(
                        f"the worker never dialed {coordinator.address} within "
                        f"{harness.startup_timeout:g} seconds\n{process.describe()}"
                    )
                time.sleep(0.05)
            joins = coordinator.join_times[before:]
            first = joins[0] if joins else time.monotonic()
            watch_end = first + REFUSAL_WATCH_SECONDS
            while time.monotonic() < watch_end and process.returncode is None:
                time.sleep(0.05)
            code = process.returncode
            attempts = sum(1 for t in coordinator.join_times[before:] if t <= watch_end)
            process.kill()  # also waits for its output to be read
            stderr, description = process.stderr(), process.describe()
    finally:
        coordinator.refuse(None)
    retries = attempts - 1
    problems = []
    if code == 0:
        problems.append(
            "it exited with code 0: a worker refused for its protocol version exits non-zero "
            "(or retries with backoff)"
        )
    rate = retries / REFUSAL_WATCH_SECONDS
    if code is None and rate > MAX_RETRIES_PER_SECOND:
        problems.append(
            f"it dialed again {retries} times in {REFUSAL_WATCH_SECONDS:g} seconds ({rate:.1f} per "
            f"second): retry with exponential backoff, at most {MAX_RETRIES_PER_SECOND:g} per "
            "second, or exit non-zero"
        )
    if "version" not in stderr.lower():
        problems.append(
            "its stderr does not mention 'version': say that the coordinator refused the "
            "worker's protocol version, and the status message it sent"
        )
    if problems:
        raise CheckFailed(
            "after a FAILED_PRECONDITION (protocol version mismatch) at Join:\n"
            + _bullets(problems)
            + f"\n{description}"
        )
    outcome = (
        f"exited with code {code}"
        if code is not None
        else f"retried {retries} times in {REFUSAL_WATCH_SECONDS:g} s"
    )
    return f"refused at Join: {outcome}, and said so on stderr"


@_check("drain", "Drain closes the stream and the worker rejoins; SIGTERM: Leaving, close, exit 0")
def drain(harness: WorkerHarness) -> str:
    with harness.fresh() as (process, link):
        _start_long_task(link, units=6 * link.num_envs, seed=20)
        drained = time.monotonic()
        link.drain("conformance kit: drain check", DRAIN_GRACE_SECONDS)
        _expect_close(link, "after Drain")
        closed = time.monotonic()
        link.session.finish()

        rejoined = harness.join(process)  # a drained worker reconnects with backoff
        rejoin_after = time.monotonic() - closed
        _start_long_task(rejoined, units=20 * rejoined.num_envs, seed=21)
        signalled = time.monotonic()
        process.signal(signal.SIGTERM)
        rejoined.wait_for(
            "Leaving after SIGTERM", lambda e: event_kind(e) == "leaving", timeout=LEAVING_SECONDS
        )
        leaving_after = time.monotonic() - signalled
        _expect_close(rejoined, "after SIGTERM and Leaving")
        rejoined.session.finish()
        code = process.wait(DRAIN_GRACE_SECONDS - (time.monotonic() - signalled))
        if code is None:
            raise rejoined.failure(
                f"the worker is still running {DRAIN_GRACE_SECONDS:g} seconds after SIGTERM; "
                "after leaving gracefully it exits 0"
            )
        if code != 0:
            raise rejoined.failure(
                f"after SIGTERM the worker exited with code {code}; after leaving gracefully "
                "it exits 0"
            )
        exit_after = time.monotonic() - signalled
    return (
        f"Drain: stream closed after {closed - drained:.2f} s, rejoined after "
        f"{rejoin_after:.2f} s; "
        f"SIGTERM: Leaving after {leaving_after:.2f} s, stream closed, exit 0 after "
        f"{exit_after:.2f} s"
    )


# --- helpers ------------------------------------------------------------------------


def _bullets(problems: list[str]) -> str:
    return "\n".join(f"  - {problem}" for problem in problems)


def _fail_if(link: WorkerLink, what: str, problems: list[str]) -> None:
    if problems:
        raise link.failure(f"{what}:\n{_bullets(problems)}")


def _spec_text(spec: EnvSpec) -> str:
    return (
        f"observations {spec.observation_space}, actions {spec.action_space}, "
        f"max_episode_length {spec.max_episode_length}"
    )


def _env_spec_problems(env_id: str, spec: EnvSpec) -> list[str]:
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


def _heartbeat(beat: Inbound) -> WorkerBeat:
    assert beat.message is not None  # the session files only parsed heartbeats
    return heartbeat_of(beat.message)


def _steps_total_problems(
    beats: list[Inbound], task_sent: float, results: list[DecodedResult]
) -> list[str]:
    """steps_total never goes down, and grows by at least a task's steps across it."""
    totals = [_heartbeat(b).steps_total for b in beats]
    if any(later < earlier for earlier, later in itertools.pairwise(totals)):
        return [f"steps_total went down: {totals[-10:]}"]
    # A heartbeat that arrived before the task was sent was sent before the
    # worker had it; one that arrived after the last result was sent after.
    before = [b for b in beats if b.at < task_sent]
    after = [b for b in beats if b.seq > max(r.seq for r in results)]
    steps = sum(int(r.batch.lengths.sum()) for r in results)
    if before and after:
        grown = _heartbeat(after[0]).steps_total - _heartbeat(before[-1]).steps_total
        if grown < steps:
            return [
                f"steps_total grew by {grown} across a task whose results hold {steps} steps; "
                "it counts every env step since the worker started"
            ]
    return []


def _heartbeat_field_problems(link: WorkerLink, window: list[Inbound]) -> list[str]:
    problems = []
    for beat in window:
        body = _heartbeat(beat)
        if body.active_envs > link.num_envs:
            problems.append(
                f"active_envs={body.active_envs} is more than the worker's {link.num_envs} slots"
            )
        if not math.isfinite(body.steps_per_second) or body.steps_per_second < 0:
            problems.append(f"steps_per_second={body.steps_per_second} is not a rate")
        if problems:
            break
    return problems


def _check_pinned(link: WorkerLink, agent: Agent, results: list[DecodedResult], when: str) -> None:
    for result in results:
        step = agent.off_pin(result.batch.actions)
        if step is not None:
            raise link.failure(
                f"{when}, task {result.header.task_id} took action {result.batch.actions[step]} at "
                f"step {step} of a batch; the parameters pin every action to {agent.action}, "
                "so the worker is not acting with them"
            )


def _expect_error(
    link: WorkerLink, sent: str, kind: int, named: str, *, refusal: str, update: int
) -> ErrorReport:
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
    _fail_if(link, f"the WorkerError for {sent} is not what the protocol asks", problems)
    return detail


def _start_long_task(link: WorkerLink, *, units: int, seed: int) -> TaskAssignment:
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


def _expect_close(link: WorkerLink, when: str) -> None:
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


@_check("leases", "if 'rlfleet.leases' is advertised: leased envs build, reset, step and release")
def leases(harness: WorkerHarness) -> str:
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
    _fail_if(link, "leased envs do not follow gymnasium.make's trajectory", problems)
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
    _fail_if(link, f"the {what} reply breaks leases.proto", problems)


def continuity_problems(
    previous: Mapping[int, tuple[DecodedResult, int]], result: DecodedResult
) -> tuple[list[str], dict[int, tuple[DecodedResult, int]]]:
    """Checks that each fragment stream goes on where the last window left it.

    Args:
        previous: Stream -> (result, piece) of its last piece in the
            previous window of the same task.
        result: The next window.

    Returns:
        The problems, and the last piece of every stream in ``result``.
    """
    problems: list[str] = []
    streams, order = pieces_by_stream(result)
    starts = np.cumsum(result.batch.lengths) - result.batch.lengths
    last_pieces: dict[int, tuple[DecodedResult, int]] = {}
    for stream, pieces in zip(streams, order, strict=True):
        first, last = int(pieces[0]), int(pieces[-1])
        last_pieces[stream] = (result, last)
        if stream not in previous:
            continue
        before, piece = previous[stream]
        episode = int(before.infos("episode_index")[piece])
        fragment = int(before.infos("fragment_index")[piece])
        was_cut = cut_pieces(before.batch)[piece]
        got = (
            int(result.infos("episode_index")[first]),
            int(result.infos("fragment_index")[first]),
        )
        want = (episode, fragment + 1) if was_cut else (episode + 1, 0)
        if got != want:
            problems.append(
                f"stream {stream} starts the window with episode {got[0]} fragment {got[1]}, "
                f"expected episode {want[0]} fragment {want[1]} (the previous window "
                f"{'cut' if was_cut else 'ended'} episode {episode} at fragment {fragment})"
            )
        elif was_cut and not np.array_equal(
            before.batch.last_observations[piece],
            result.batch.observations[starts[first]],
        ):
            problems.append(
                f"stream {stream}: the fragment continuing episode {episode} does not start "
                "from the previous fragment's last observation"
            )
    return problems, last_pieces


__all__ = ["CHECKS", "Check", "CheckResult"]
