"""One worker's Join stream, as a check drives it: the coordinator's script.

:class:`WorkerLink` speaks the coordinator's side of worker.proto over a
:class:`~rlfleet.conformance.scripted_coordinator.ScriptedSession`: the handshake,
env and agent updates, tasks, cancels and drains, and waiting for what the
worker must answer. Everything the worker sends on the way is checked as it
arrives: message sizes against Welcome.max_message_bytes, and every
EpisodeResult against its task (:mod:`rlfleet.wire.result_checks`, the checks
the coordinator applies too), so a
check that only cares about agent updates still fails on a broken result.
Anything the worker was not asked for fails the check with what was
expected, what came, and the tail of the worker's output.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import numpy as np

from rlfleet.conformance._failure import CheckFailed
from rlfleet.conformance.capabilities import (
    GRANTED_CAPABILITIES,
    KNOWN_CAPABILITIES,
    granted_capabilities,
)
from rlfleet.conformance.kit_messages import (
    KitCommand,
    LeaseCall,
    LeaseCreate,
    LeaseRelease,
    agent_ready_of,
    body_text,
    command_bytes,
    env_ready_of,
    error_of,
    hello_of,
    result_header_of,
)
from rlfleet.conformance.scripted_coordinator import (
    BROKEN,
    CLOSED,
    MALFORMED,
    Inbound,
    ScriptedCoordinator,
    ScriptedSession,
)
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ResourceExhaustedError, WireFormatError
from rlfleet.policies.spec import PolicySpec
from rlfleet.protocol.error_reports import is_known_kind
from rlfleet.protocol.error_reports import kind_name as protocol_kind_name
from rlfleet.protocol.join import DrainOrder, TaskAssignment, TaskCancel, WorkerHello, WorkerWelcome
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import parse_env_spec
from rlfleet.wire.result_checks import FragmentWindow, ResultExpectation, check_result
from rlfleet.wire.results import DecodedResult, ResultAssembler, ResultError

if TYPE_CHECKING:
    from rlfleet.conformance.runner import WorkerUnderTest

#: An event of the stream a check waits for: a message or a whole result.
Event: TypeAlias = Inbound | DecodedResult

# Task, request and worker ids unique for the kit's lifetime, as a real
# coordinator's are for its own.
_task_ids = itertools.count(1)
_request_ids = itertools.count(0)
_worker_ids = itertools.count(7001)  # far from 0, which a worker might write by mistake


@dataclasses.dataclass(frozen=True)
class WelcomeSettings:
    """What the test coordinator puts in Welcome.

    Attributes:
        heartbeat_interval_seconds: How often the worker must send a Heartbeat.
        heartbeat_timeout_seconds: Silence after which a real coordinator
            would declare the worker dead (the kit only measures).
        max_message_bytes: Every message either side sends stays below this.
        first_stream: Global stream index of the worker's slot 0 (non-zero
            on purpose: a worker must offset its streams by it).
        data_port: A lease data port of the kit's: Welcome names it and
            grants ``rlfleet.leases`` and ``rlfleet.data-tasks`` if the
            worker lists both (None: no data channel).
    """

    heartbeat_interval_seconds: float = 0.2
    heartbeat_timeout_seconds: float = 5.0
    max_message_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES
    first_stream: int = 10
    data_port: int | None = None


class WorkerLink:
    """The coordinator's side of one worker's Join stream.

    Build it with :meth:`join`. Keeps the worker's state as the protocol
    defines it: env generation, agent version, tasks sent, results received.

    Attributes:
        session: The Join call.
        hello: The worker's Hello.
        welcome: The Welcome sent.
        env_spec: The EnvSpec of the worker's last EnvReady.
        generation: The env generation the worker is ready for.
        agent_version: The agent version the worker has applied.
        results: Every result received, by task id.
        timeout: Longest wait for any one answer, in seconds.
    """

    def __init__(
        self,
        session: ScriptedSession,
        hello: WorkerHello,
        welcome: WorkerWelcome,
        *,
        timeout: float,
        process: WorkerUnderTest | None,
    ) -> None:
        self.session = session
        self.hello = hello
        self.welcome = welcome
        self.timeout = timeout
        self.process = process
        self.env_spec: EnvSpec | None = None
        self.generation = 0
        self.agent_version = 0  # until an update, workers act randomly as version 0
        self.tasks: dict[int, TaskAssignment] = {}
        self.results: dict[int, list[DecodedResult]] = {}
        self._assembler: ResultAssembler | None = None
        self._next_generation = 1
        self._next_version = 1

    # --- the handshake ---------------------------------------------------------

    @classmethod
    def join(
        cls,
        coordinator: ScriptedCoordinator,
        *,
        timeout: float,
        join_timeout: float | None = None,
        process: WorkerUnderTest | None = None,
        settings: WelcomeSettings | None = None,
    ) -> WorkerLink:
        """Waits for a worker's Join call and answers its Hello with Welcome.

        Args:
            coordinator: The test coordinator.
            timeout: Longest wait for any one answer (here: Hello).
            join_timeout: Longest wait for the Join call (a process starting
                up); default ``timeout``.
            process: The worker's process, for failure messages.
            settings: What to put in Welcome.

        Raises:
            CheckFailed: If no worker joins, or its first message is not a
                Hello with protocol_version 1 and num_envs >= 1.
        """
        settings = settings or WelcomeSettings()
        session = _accept(coordinator, join_timeout or timeout, process)
        first = session.receive(timeout)
        hello = _hello_of(first, timeout, process)
        if hello.protocol_version != _rpc.PROTOCOL_VERSION or hello.num_envs < 1:
            session.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"conformance kit: Hello says protocol version {hello.protocol_version} and "
                f"{hello.num_envs} envs; this coordinator speaks version {_rpc.PROTOCOL_VERSION}",
            )
            raise CheckFailed(
                f"Hello has protocol_version={hello.protocol_version} and num_envs="
                f"{hello.num_envs}; expected protocol_version={_rpc.PROTOCOL_VERSION} "
                "(PROTOCOL_VERSION_1) and num_envs >= 1" + _context(process)
            )
        granted = granted_capabilities(hello.capabilities, settings.data_port)
        port = settings.data_port if _rpc.DATA_TASKS_CAPABILITY in granted else None
        welcome = WorkerWelcome(
            protocol_version=_rpc.PROTOCOL_VERSION,
            worker_id=next(_worker_ids),
            name=f"conformance-{hello.name or 'worker'}-{session.index}",
            heartbeat_interval_seconds=settings.heartbeat_interval_seconds,
            heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
            max_message_bytes=settings.max_message_bytes,
            capabilities=tuple(sorted(granted)),
            first_stream=settings.first_stream,
            coordinator_id="rlfleet-conformance",
            lease_data=None if port is None else (port, b"kit"),
        )
        link = cls(session, hello, welcome, timeout=timeout, process=process)
        link._send(welcome)
        return link

    @property
    def num_envs(self) -> int:
        """The worker's env slots (Hello.num_envs)."""
        return int(self.hello.num_envs)

    @property
    def worker_id(self) -> int:
        """Welcome.worker_id."""
        return int(self.welcome.worker_id)

    @property
    def spec(self) -> EnvSpec:
        """The worker's EnvSpec; fails the check if it has none yet."""
        if self.env_spec is None:
            raise CheckFailed("the worker has not reported an EnvSpec yet (no EnvReady)")
        return self.env_spec

    @property
    def next_version(self) -> int:
        """The agent version the next AgentUpdate creates by default."""
        return self._next_version

    def grants(self, capability: str) -> bool:
        """Whether Welcome granted ``capability``."""
        return capability in self.welcome.capabilities

    # --- updates ----------------------------------------------------------------

    def update_env(
        self,
        env_id: str,
        *,
        max_episode_length: int | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> EnvSpec:
        """Sends an EnvUpdate of the next generation and waits for its EnvReady.

        Returns:
            The EnvSpec the worker reported.

        Raises:
            CheckFailed: If the worker answers otherwise, or the EnvSpec
                does not decode.
        """
        generation = self.send_env_update(
            env_id, max_episode_length=max_episode_length, kwargs=kwargs
        )
        ready = self.wait_for(
            f"EnvReady(generation={generation})", lambda e: event_kind(e) == "env_ready"
        )
        assert isinstance(ready, Inbound) and ready.message is not None  # matched above
        ready_generation, spec_wire = env_ready_of(ready.message)
        if ready_generation != generation:
            raise self.failure(
                f"EnvReady names generation {ready_generation}, the EnvUpdate created "
                f"generation {generation}"
            )
        if spec_wire is None:
            raise self.failure(f"EnvReady(generation={generation}) carries no env_spec")
        try:
            spec = parse_env_spec(spec_wire)
        except WireFormatError as exc:
            raise self.failure(f"the EnvSpec of EnvReady does not decode: {exc}") from exc
        self.env_spec, self.generation = spec, generation
        self._assembler = ResultAssembler(spec)
        return spec

    def send_env_update(
        self,
        env_id: str,
        *,
        max_episode_length: int | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """Sends an EnvUpdate of the next generation; returns that generation."""
        generation = self._next_generation
        self._next_generation += 1
        update = EnvChange(
            generation=generation,
            env_id=env_id,
            kwargs_json=json.dumps(dict(kwargs or {})),
            max_episode_length=max_episode_length,
        )
        self._send(update)
        return generation

    def update_agent(
        self,
        params: Mapping[str, np.ndarray] | None,
        *,
        policy: PolicySpec | None = None,
        version: int | None = None,
    ) -> int:
        """Sends an AgentUpdate and waits for its AgentReady.

        Args:
            params: Parameter tensors by name, or None.
            policy: A PolicySpec to build first, or None.
            version: The version it creates; default the next one.

        Returns:
            The new agent version.
        """
        version = self.send_agent_update(params, policy=policy, version=version)
        ready = self.wait_for(
            f"AgentReady(version={version})", lambda e: event_kind(e) == "agent_ready"
        )
        assert isinstance(ready, Inbound) and ready.message is not None  # matched above
        ready_version = agent_ready_of(ready.message)
        if ready_version != version:
            raise self.failure(
                f"AgentReady names version {ready_version}, the AgentUpdate created version "
                f"{version}"
            )
        self.agent_version = version
        return version

    def send_agent_update(
        self,
        params: Mapping[str, np.ndarray] | None,
        *,
        policy: PolicySpec | None = None,
        version: int | None = None,
    ) -> int:
        """Sends an AgentUpdate (the next version unless given); returns its version."""
        if version is None:
            version = self._next_version
        self._next_version = max(self._next_version, version + 1)
        choice = None if policy is None else PolicyChoice(policy.name, json.dumps(policy.kwargs))
        self._send(AgentChange(version, choice, dict(params or {})))
        return version

    # --- tasks ------------------------------------------------------------------

    def send_episodes(
        self, count: int, *, mode: Mode = Mode.EPISODES, seed: int = 0
    ) -> TaskAssignment:
        """Sends a task of ``count`` episode units (seeded as the coordinator does)."""
        request = next(_request_ids)
        units = UnitColumns.seeded(seed, request, range(count))
        return self._send_task(TaskAssignment(0, request, mode, 0, 0, units=units))

    def send_fragments(
        self,
        fragment_length: int,
        rounds: int,
        *,
        base_seed: int = 0,
        streams: Sequence[int] = (),
        replays: Sequence[StreamReplay] = (),
    ) -> TaskAssignment:
        """Sends a FRAGMENTS task (``streams``, ``replays``: rlfleet.stream-takeover)."""
        task = TaskAssignment(
            0,
            next(_request_ids),
            Mode.FRAGMENTS,
            0,
            0,
            fragment_length=fragment_length,
            rounds=rounds,
            base_seed=base_seed,
            streams=tuple(streams),
            replays=tuple(replays),
        )
        return self._send_task(task)

    def _send_task(self, task: TaskAssignment) -> TaskAssignment:
        if self.env_spec is None:
            raise CheckFailed("kit error: a task was about to be sent before EnvReady")
        task = task._replace(
            task_id=next(_task_ids),
            agent_version=self.agent_version,
            env_generation=self.generation,
        )
        self.tasks[task.task_id] = task
        self.results[task.task_id] = []
        self._send(task)
        return task

    def cancel(self, task: TaskAssignment, episode_indices: Iterable[int] = ()) -> None:
        """Sends a Cancel for some units of ``task`` (none given: the whole task)."""
        self._send(TaskCancel(task.task_id, tuple(episode_indices)))

    def send_lease(self, command: LeaseCreate | LeaseCall | LeaseRelease) -> None:
        """Sends a LeaseCommand (step-level env leases, leases.proto)."""
        self._send(command)

    def drain(self, reason: str, grace_seconds: float) -> None:
        """Sends a Drain."""
        self._send(DrainOrder(reason, grace_seconds))

    def collect(self, task: TaskAssignment, *, timeout: float | None = None) -> list[DecodedResult]:
        """Waits until every unit of ``task`` came back once; returns its results.

        Raises:
            CheckFailed: If a unit comes back twice, or not all come back in time.
        """
        wanted = set(task.units.episode_indices.tolist())
        self.wait_until(
            f"results for all {len(wanted)} units of task {task.task_id}",
            lambda: wanted <= self.returned(task),
            pending=lambda: f"units {sorted(wanted - self.returned(task))[:10]} never came back",
            timeout=timeout,
        )
        return self.results[task.task_id]

    def collect_windows(
        self, task: TaskAssignment, *, timeout: float | None = None
    ) -> list[DecodedResult]:
        """Waits for ``task.rounds`` results of a FRAGMENTS task; returns them."""
        results = self.results[task.task_id]
        self.wait_until(
            f"{task.rounds} fragment windows of task {task.task_id}",
            lambda: len(results) >= task.rounds,
            pending=lambda: f"{len(results)} of {task.rounds} windows came back",
            timeout=timeout,
        )
        return results

    def returned(self, task: TaskAssignment) -> set[int]:
        """Units of ``task`` that came back so far."""
        return {i for result in self.results[task.task_id] for i in result.header.episode_indices}

    # --- waiting ----------------------------------------------------------------

    def wait_for(
        self,
        what: str,
        match: Callable[[Event], bool],
        *,
        timeout: float | None = None,
        allow_errors: bool = False,
    ) -> Event:
        """Reads the stream until an event matches ``match``; returns it.

        Results of any task are kept in :attr:`results` on the way (and
        checked). Any other message that does not match fails the check, as
        does a WorkerError unless ``allow_errors`` lets it reach ``match``.
        The end of the stream reaches ``match`` (kinds CLOSED and BROKEN).

        Args:
            what: What is awaited, for failure messages.
            match: Whether an event is the awaited one.
            timeout: Seconds to wait; default :attr:`timeout`.
            allow_errors: Let WorkerError messages reach ``match``.

        Raises:
            CheckFailed: As above, or on timeout.
        """
        event = self._wait(what, match=match, timeout=timeout, allow_errors=allow_errors)
        assert event is not None  # _wait returns None only when `done` is given
        return event

    def wait_until(
        self,
        what: str,
        done: Callable[[], bool],
        *,
        pending: Callable[[], str],
        timeout: float | None = None,
    ) -> None:
        """Reads the stream until ``done()`` holds; fails on anything but results.

        Args:
            what: What is awaited, for failure messages.
            done: Checked before every read.
            pending: Says what is still missing, for the timeout message.
            timeout: Seconds to wait; default :attr:`timeout`.
        """
        self._wait(what, done=done, pending=pending, timeout=timeout)

    def pump(self, seconds: float) -> list[Event]:
        """Reads whatever comes for ``seconds``; returns it (results are kept too).

        Raises:
            CheckFailed: On a WorkerError, a malformed message or a broken result.
        """
        deadline = time.monotonic() + seconds
        events = []
        while (remaining := deadline - time.monotonic()) > 0:
            item = self.session.receive(remaining)
            if item is None:
                break
            event = self._take(item, "nothing in particular", allow_errors=False)
            if event is not None:
                events.append(event)
            if isinstance(event, Inbound) and event.kind in (CLOSED, BROKEN):
                break
        return events

    def _wait(
        self,
        what: str,
        *,
        match: Callable[[Event], bool] | None = None,
        done: Callable[[], bool] | None = None,
        pending: Callable[[], str] | None = None,
        timeout: float | None,
        allow_errors: bool = False,
    ) -> Event | None:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while done is None or not done():
            item = self.session.receive(deadline - time.monotonic())
            if item is None:
                still = f" ({pending()})" if pending is not None else ""
                raise self.failure(f"expected {what} within {limit:g} seconds{still}")
            event = self._take(item, what, allow_errors=allow_errors)
            if event is None:
                continue
            if match is not None and match(event):
                return event
            if isinstance(event, Inbound):
                raise self.failure(f"expected {what}, got {describe(event)}")
        return None

    def failure(self, message: str) -> CheckFailed:
        """A CheckFailed with the worker's state and output tail appended."""
        return CheckFailed(message + _context(self.process))

    def _take(self, item: Inbound, what: str, *, allow_errors: bool) -> Event | None:
        limit = self.welcome.max_message_bytes
        if item.size > limit:
            raise self.failure(
                f"message #{item.seq} ({item.kind}) is {item.size} bytes, above "
                f"Welcome.max_message_bytes={limit}; batches must be chunked below it"
            )
        if item.kind == MALFORMED:
            raise self.failure(f"message #{item.seq} is not a valid WorkerMessage: {item.error}")
        if item.kind == "error" and not allow_errors:
            raise self.failure(f"expected {what}, got {describe(item)}")
        if item.kind in (CLOSED, BROKEN):
            return item  # the caller decides whether an end is expected
        if item.kind != "result":
            return item
        if self._assembler is None:
            raise self.failure(f"got an EpisodeResult (message #{item.seq}) before any EnvReady")
        result = self._assemble(item)
        if result is None:
            return None
        task = self.tasks.get(result.header.task_id)
        if task is None:
            raise self.failure(
                f"got a result for task {result.header.task_id}, which was never sent"
            )
        try:
            check_result(result, self._expectation(task))
        except ResultError as exc:
            raise self.failure(str(exc)) from None
        earlier = self.returned(task) if task.mode != Mode.FRAGMENTS else set()
        twice = earlier.intersection(result.header.episode_indices)
        if twice:
            raise self.failure(f"units {sorted(twice)} of task {task.task_id} came back twice")
        self.results[task.task_id].append(result)
        return result

    def _assemble(self, item: Inbound) -> DecodedResult | None:
        """Joins and decodes a result message (the coordinator's assembler)."""
        if self._assembler is None or item.message is None:
            raise self.failure(f"message #{item.seq}: a result before any EnvReady")
        meta = result_header_of(item.message)
        where = f"EpisodeResult for task {meta.task_id} (message #{item.seq})"
        try:
            result = self._assembler.add(meta, item.chunk, item.size)
        except ResultError as exc:
            raise self.failure(f"{where}: {exc}") from None
        except (WireFormatError, ResourceExhaustedError) as exc:
            raise self.failure(f"{where}: bad chunk sequence: {exc}") from None
        if result is None:
            return None
        return dataclasses.replace(result, seq=item.seq, at=item.at)

    def _expectation(self, task: TaskAssignment) -> ResultExpectation:
        window = units = None
        if task.mode == Mode.FRAGMENTS:
            first = int(self.welcome.first_stream)
            window = FragmentWindow(
                base_seed=task.base_seed,
                streams=tuple(task.streams) or tuple(range(first, first + self.num_envs)),
                fragment_length=task.fragment_length,
            )
        else:
            units = task.units.sorted()
        return ResultExpectation(
            env_spec=self.spec,
            worker_id=self.worker_id,
            agent_version=task.agent_version,
            env_generation=task.env_generation,
            units=units,
            window=window,
        )

    def _send(self, command: KitCommand) -> None:
        body, data = command_bytes(command, unit_columns=self.grants(_rpc.UNIT_COLUMNS_CAPABILITY))
        if len(data) > self.welcome.max_message_bytes and body != "welcome":
            raise CheckFailed(
                f"kit error: a {body} of {len(data)} bytes is above the "
                f"Welcome.max_message_bytes={self.welcome.max_message_bytes} the kit promised"
            )
        try:
            self.session.send(data)
        except RuntimeError as exc:
            raise self.failure(f"cannot send {body}: {exc}") from exc


# --- helpers -------------------------------------------------------------------


def _accept(
    coordinator: ScriptedCoordinator, timeout: float, process: WorkerUnderTest | None
) -> ScriptedSession:
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        session = coordinator.accept(min(remaining, 0.2))
        if session is not None:
            return session
        if process is not None and process.returncode is not None:
            raise CheckFailed(
                f"the worker exited before opening a Join stream to {coordinator.address}"
                + _context(process)
            )
    raise CheckFailed(
        f"no worker opened a Join stream to {coordinator.address} within {timeout:g} seconds"
        + _context(process)
    )


def _hello_of(
    first: Inbound | None, timeout: float, process: WorkerUnderTest | None
) -> WorkerHello:
    if first is None:
        raise CheckFailed(
            f"the worker opened a Join stream but sent nothing within {timeout:g} seconds; "
            "its first message must be Hello" + _context(process)
        )
    if first.kind != "hello" or first.message is None:
        raise CheckFailed(
            f"the first message on the Join stream is {describe(first)}; it must be Hello"
            + _context(process)
        )
    return hello_of(first.message)


def event_kind(event: Event) -> str:
    """An event's kind: the WorkerMessage body name, an end of stream, or ``"result"``."""
    return event.kind if isinstance(event, Inbound) else "result"


def describe(item: Inbound) -> str:
    """A short text for a stream event, for failure messages."""
    if item.kind in (CLOSED, BROKEN):
        return f"the end of the stream ({item.kind}{': ' + item.error if item.error else ''})"
    if item.message is None:
        return f"{item.kind} message #{item.seq}"
    if item.kind == "error":
        report = error_of(item.message)
        return f"WorkerError {kind_name(report.kind)}: {report.message!r}"
    text = body_text(item.message, item.kind)
    return f"{item.kind} ({text[:200]})" if text else item.kind


def kind_name(kind: int) -> str:
    """An ErrorKind's name, or the bare number for a kind this version does not define."""
    return protocol_kind_name(kind) if is_known_kind(kind) else f"error kind {kind}"


def _context(process: WorkerUnderTest | None) -> str:
    return f"\n{process.describe()}" if process is not None else ""


__all__ = [
    "GRANTED_CAPABILITIES",
    "describe",
    "event_kind",
    "kind_name",
    "KNOWN_CAPABILITIES",
    "Event",
    "WelcomeSettings",
    "WorkerLink",
]
