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
import signal
import time
from collections.abc import Callable, Mapping

import grpc
import numpy as np

from rlfleet.conformance._expectations import (
    DRAIN_GRACE_SECONDS,
    bullets,
    check_pinned,
    env_spec_problems,
    expect_close,
    expect_error,
    fail_if,
    heartbeat,
    heartbeat_field_problems,
    spec_text,
    start_long_task,
    steps_total_problems,
)
from rlfleet.conformance._failure import Check, CheckFailed, CheckResult, run_check
from rlfleet.conformance._stall import StallMeter
from rlfleet.conformance.agents import balancing_agent, pinned_agent
from rlfleet.conformance.data_task_checks import check_data_tasks
from rlfleet.conformance.lease_checks import check_leases
from rlfleet.conformance.link import (
    KNOWN_CAPABILITIES,
    WelcomeSettings,
    WorkerLink,
    event_kind,
)
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.conformance.unit_column_checks import check_unit_columns
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.policies.mlp import weight_name
from rlfleet.protocol.error_reports import ErrorKind
from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.stream_replay import StreamBook
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.transport import rpc as _rpc
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
    problems += env_spec_problems(harness.env_id, link.spec)
    fail_if(link, "the handshake is incomplete", problems)
    return (
        f"Hello from {hello.implementation!r} (pid {hello.pid} on {hello.host!r}, "
        f"{hello.num_envs} envs, capabilities {list(hello.capabilities)}); "
        f"EnvReady(1) with {spec_text(link.spec)}"
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
    fail_if(link, "Hello.capabilities break the protocol", problems)
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
    problems += heartbeat_field_problems(link, window)
    problems += steps_total_problems(beats, task_sent, results)
    last = heartbeat(window[-1])
    if last.queued_units:
        problems.append(f"an idle worker reports queued_units={last.queued_units}")
    fail_if(link, "heartbeats break the protocol", problems)
    return (
        f"{len(window)} heartbeats in {end - start:.1f} s (interval {interval:g} s, longest gap "
        f"{gaps[worst]:.2f} s); steps_total, active_envs and queued_units plausible"
    )


@_check("sampling", "STEPS, EPISODES and FRAGMENTS tasks come back complete and well-formed")
def sampling(harness: WorkerHarness) -> str:
    link = harness.shared()
    n = link.num_envs
    episodes = _refilled(
        link, link.send_episodes(3 * n + 1, mode=Mode.EPISODES, seed=11), n, seed=11
    )
    episode_results = link.collect(episodes)
    steps = link.send_episodes(n + 1, mode=Mode.STEPS, seed=12)
    link.collect(steps)
    link.pump(0.2)  # a unit sent twice would show up now, and fail this check
    done = (
        f"EPISODES task refilled once: {len(episodes.units)} units back exactly once in "
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
        fail_if(link, f"window {number} of FRAGMENTS task {fragments.task_id}", problems)
    link.pump(0.2)
    if len(link.results[fragments.task_id]) != rounds:
        raise link.failure(
            f"FRAGMENTS task {fragments.task_id} asked for {rounds} windows, the worker sent "
            f"{len(link.results[fragments.task_id])}"
        )
    return f"{done}; FRAGMENTS task: {rounds} windows of {length} steps per stream, continuous"


def _refilled(link: WorkerLink, task: TaskAssignment, count: int, *, seed: int) -> TaskAssignment:
    """Sends ``count`` more units in a Task naming ``task``'s id, as a coordinator refills.

    A coordinator tops up a worker's live task for a request this way, so
    that results hold many units; a worker that replaced the task instead of
    adding to it would drop the units it had not run yet.

    Returns:
        The task with every unit it now holds.
    """
    first = int(task.units.episode_indices.max()) + 1
    more = UnitColumns.seeded(seed, task.request_id, range(first, first + count))
    whole = task._replace(units=UnitColumns.concat([task.units, more]))
    link.tasks[task.task_id] = whole
    link._send(task._replace(units=more))
    return whole


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
    fail_if(
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
    check_pinned(link, agent, results, "after the AgentUpdate")
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
    detail = expect_error(
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
    expect_error(
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
    check_pinned(link, agent, results, "after the refused AgentUpdate (the old policy)")
    return (
        f"unknown env: ERROR_KIND_ENV_NOT_FOUND {detail.message!r}; wrong shape: "
        f"ERROR_KIND_POLICY naming {name!r}; then a task ran with agent version {good}"
    )


@_check(
    "unit-columns",
    "if 'rlfleet.unit-columns' is advertised: malformed unit columns are refused, none run",
)
def unit_columns(harness: WorkerHarness) -> str:
    """Malformed columns are refused by task (rlfleet/conformance/unit_column_checks.py)."""
    return check_unit_columns(harness)


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
    fail_if(link, "Cancel was not honoured", problems)
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
            + bullets(problems)
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
        start_long_task(link, units=6 * link.num_envs, seed=20)
        drained = time.monotonic()
        link.drain("conformance kit: drain check", DRAIN_GRACE_SECONDS)
        expect_close(link, "after Drain")
        closed = time.monotonic()
        link.session.finish()

        rejoined = harness.join(process)  # a drained worker reconnects with backoff
        rejoin_after = time.monotonic() - closed
        start_long_task(rejoined, units=20 * rejoined.num_envs, seed=21)
        signalled = time.monotonic()
        process.signal(signal.SIGTERM)
        rejoined.wait_for(
            "Leaving after SIGTERM", lambda e: event_kind(e) == "leaving", timeout=LEAVING_SECONDS
        )
        leaving_after = time.monotonic() - signalled
        expect_close(rejoined, "after SIGTERM and Leaving")
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


@_check("leases", "if 'rlfleet.leases' is advertised: leased envs build, reset, step and release")
def leases(harness: WorkerHarness) -> str:
    """Leased envs follow gymnasium.make's trajectory (rlfleet/conformance/lease_checks.py)."""
    return check_leases(harness)


@_check(
    "data-tasks",
    "if 'rlfleet.data-tasks' is advertised: Tasks on the data connection wait for their "
    "update; a Cancel that came first is kept",
)
def data_tasks(harness: WorkerHarness) -> str:
    """Tasks and Cancels on the lease data channel (rlfleet/conformance/data_task_checks.py)."""
    return check_data_tasks(harness)


# --- fragment streams --------------------------------------------------------------


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
