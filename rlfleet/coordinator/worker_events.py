"""What the coordinator does when a worker joins, speaks, or goes away.

The worker face calls these from each Join stream's reader thread, in the
order the worker sent its messages. Results are checked between two short
critical sections (classify, decode outside the lock, complete), so a large
batch never holds the lock while it is decoded.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Sequence

import grpc

from rlfleet._util.prebuilt import prebuilt
from rlfleet.coordinator.calls import Finished, Forward, ReservedSend, by_call
from rlfleet.coordinator.failures import CallDetail, CallError, detail_of, invalid
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.result_expectations import ResultExpectations
from rlfleet.coordinator.state import FleetState
from rlfleet.core import EpisodeBatch
from rlfleet.envs.native import NATIVE_VECTORIZATIONS
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.protocol.error_reports import (
    ErrorKind,
    ErrorReport,
    describe_report,
    is_known_kind,
    kind_name,
)
from rlfleet.protocol.join import (
    AgentApplied,
    EnvBuilt,
    WorkerBeat,
    WorkerHello,
    WorkerLeaving,
    WorkerWelcome,
)
from rlfleet.protocol.multi_agent import MULTI_AGENT_CAPABILITY
from rlfleet.scheduling.scheduler import ResultRuling, Verdict
from rlfleet.security import PICKLE_CAPABILITY, InflightBudget
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import Chunk
from rlfleet.wire.result_checks import ResultExpectation
from rlfleet.wire.results import (
    JoinedResult,
    ResultAssembler,
    ResultError,
    ResultHeader,
)

logger = logging.getLogger("rlfleet.coordinator")

#: What the scheduler judges and books of a result (``classify_many``,
#: ``complete_many``), taken by ``map``: no frame per result, as a
#: comprehension's.
_judged = operator.attrgetter("header.task_id", "header.episode_indices")
_booked_fields = operator.attrgetter("header.task_id", "header.episode_indices", "header.lengths")

#: Refused results a request survives: the first is re-run on other workers
#: (its worker dropped); the second ends the request with the refusal.
MAX_REFUSED_RESULTS = 2

#: Capabilities this coordinator offers (worker.proto Hello).
CAPABILITIES = (
    "rlfleet.episodes",
    "rlfleet.fragments",
    _rpc.LEASE_CAPABILITY,
    MULTI_AGENT_CAPABILITY,
    _rpc.TAKEOVER_CAPABILITY,
    _rpc.UNIT_COLUMNS_CAPABILITY,
    _rpc.DATA_RESULTS_CAPABILITY,
    _rpc.RESULTS_SWITCH_CAPABILITY,
    _rpc.DATA_TASKS_CAPABILITY,
    _rpc.DATA_HEARTBEATS_CAPABILITY,
)


class WorkerEvents:
    """Handles the worker side of the protocol against the fleet state.

    Args:
        state: The fleet state.
    """

    def __init__(self, state: FleetState) -> None:
        self._state = state
        #: Called (lock not held) with each worker removed, after its units were re-queued.
        self.lost_listeners: list[Callable[[WorkerHandle], None]] = []
        #: Set while the lease data channel is served: a new ticket (and the
        #: port) for a lease-hosting worker's Welcome.
        self.lease_data_ticket: Callable[[WorkerHandle], tuple[int, bytes]] | None = None
        # Each live task's expectation, kept across batches (lock held).
        self._expectations = ResultExpectations(state)

    def admit(self, hello: WorkerHello, peer: str) -> WorkerHandle:
        """Admits a worker that said Hello and queues its Welcome and state.

        Raises:
            CallError: FAILED_PRECONDITION for another protocol version,
                INVALID_ARGUMENT for a Hello without env slots,
                RESOURCE_EXHAUSTED when full, UNAVAILABLE when draining.
        """
        if hello.protocol_version != _rpc.PROTOCOL_VERSION:
            message = (
                f"the worker speaks rlfleet protocol version {hello.protocol_version}, this "
                f"coordinator speaks version {_rpc.PROTOCOL_VERSION}; run matching rlfleet "
                "versions"
            )
            detail = detail_of(ErrorKind.VERSION, message, worker=hello.name)
            raise CallError(grpc.StatusCode.FAILED_PRECONDITION, message, detail)
        if hello.num_envs < 1:
            raise invalid(f"Hello.num_envs must be >= 1, got {hello.num_envs}")
        state = self._state
        limit = state.config.max_envs_per_worker
        if hello.num_envs > limit:
            raise invalid(
                f"Hello.num_envs is {hello.num_envs}, above this coordinator's limit of {limit} "
                "env slots per worker (--max-envs-per-worker); start the worker with fewer "
                "--envs, or more workers"
            )
        with state.lock:
            if state.draining:
                raise CallError(
                    grpc.StatusCode.UNAVAILABLE, "the coordinator is draining; join another one"
                )
            pickled = state.agent.pickled_policy or state.env.update.pickled_env_factory
            if pickled and PICKLE_CAPABILITY not in hello.capabilities:
                message = (
                    f"this fleet runs a pickled policy or env factory, which worker "
                    f"{hello.name!r} would refuse: start it with --allow-pickle (and TLS and "
                    "a token)"
                )
                detail = detail_of(ErrorKind.PERMISSION, message, worker=hello.name)
                raise CallError(grpc.StatusCode.PERMISSION_DENIED, message, detail)
            handle = state.registry.admit(hello, peer)
            streams = state.scheduler.add_worker(
                handle.worker_id,
                hello.num_envs,
                takeover=_rpc.TAKEOVER_CAPABILITY in hello.capabilities,
            )
            handle.first_stream = streams[0]
            handle.send(self._welcome(handle))
            # Then the current state, so that it matches every other worker's
            # (a worker that cannot run a multi-agent env waits for the next env, one
            # that cannot build the joint policy for the next agent).
            if state.takes_env(handle):
                handle.send(state.env.update)
                state.send_agent(handle)
            else:
                state.sat_out.add(handle.worker_id)
        logger.info(
            "worker %r joined (id %d, %d envs, %s, pid %d, from %s)",
            handle.name,
            handle.worker_id,
            hello.num_envs,
            hello.host or "?",
            hello.pid,
            peer,
            extra={"worker": handle.name},
        )
        return handle

    def _welcome(self, handle: WorkerHandle) -> WorkerWelcome:
        config = self._state.config
        data = None
        hosts_leases = _rpc.LEASE_CAPABILITY in handle.hello.capabilities
        if self.lease_data_ticket is not None and hosts_leases:
            port, handle.lease_ticket = self.lease_data_ticket(handle)
            data = (port, handle.lease_ticket)
        return WorkerWelcome(
            protocol_version=_rpc.PROTOCOL_VERSION,
            worker_id=handle.worker_id,
            name=handle.name,
            heartbeat_interval_seconds=config.heartbeat_interval_seconds,
            heartbeat_timeout_seconds=config.heartbeat_timeout_seconds,
            max_message_bytes=config.max_message_bytes,
            capabilities=tuple(
                c
                for c in (*CAPABILITIES, *config.security.pickle.capabilities)
                if c in handle.hello.capabilities
            ),
            first_stream=handle.first_stream,
            coordinator_id=self._state.coordinator_id,
            lease_data=data,
        )

    def on_env_ready(self, handle: WorkerHandle, ready: EnvBuilt) -> None:
        """A worker built its envs.

        Raises:
            CallError: FAILED_PRECONDITION if its env spec differs from the
                fleet's; INVALID_ARGUMENT if the spec cannot be decoded.
        """
        state = self._state
        with state.lock:
            if not handle.alive or ready.generation != state.env.generation:
                return  # an older generation: the newer EnvUpdate is on its way
            if state.env.spec_wire is None:
                try:
                    state.env = state.env.with_spec(ready.env_spec_wire)
                except WireFormatError as exc:
                    raise invalid(f"EnvReady carries a malformed env spec: {exc}") from None
                state.announce_env()
            elif ready.env_spec_wire != state.env.spec_wire:
                raise CallError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"worker {handle.name!r} built env {state.env.update.env_id!r} with spaces "
                    "that differ from those the rest of the fleet reported; give every "
                    "worker the same rlfleet, gymnasium and --import versions",
                )
            handle.env_generation = ready.generation
            state.refresh(handle)

    def on_agent_ready(self, handle: WorkerHandle, ready: AgentApplied) -> None:
        """A worker applied an agent update.

        Raises:
            ProtocolError: For a version that was never sent.
        """
        state = self._state
        with state.lock:
            if not 0 <= ready.version <= state.agent.version:
                raise ProtocolError(
                    f"worker {handle.name!r} reports agent version {ready.version}, but the "
                    f"latest sent is {state.agent.version}"
                )
            handle.agent_version = max(handle.agent_version, ready.version)
            state.refresh(handle)

    def on_heartbeat(self, handle: WorkerHandle, heartbeat: WorkerBeat) -> None:
        """Records a worker's progress figures (its liveness is its reader's job)."""
        with self._state.lock:
            handle.heartbeat = heartbeat

    def on_leaving(self, handle: WorkerHandle, leaving: WorkerLeaving) -> None:
        """The worker will leave: no new work; its units in flight still count."""
        with self._state.lock:
            handle.leaving = True
            self._state.refresh(handle)
        logger.info("worker %r is leaving: %s", handle.name, leaving.reason or "no reason given")

    def on_error(self, handle: WorkerHandle, detail: ErrorReport) -> None:
        """A worker reported an error: fail the request or update it names, if still open.

        An error is charged only to what it names (its task, or the update's
        generation or version): the late error of a request that already
        ended, or of an update already rolled back, is only logged.
        """
        if not detail.worker:
            detail = dataclasses.replace(detail, worker=handle.name)
        state = self._state
        state.metrics.error(kind_name(detail.kind) if is_known_kind(detail.kind) else "unknown")
        with state.lock:
            handle.last_error = detail
            if detail.task_id:
                # The worker abandoned the task's streams' episodes with the error.
                state.streams.forget(state.scheduler.task_streams(detail.task_id))
                request_id = state.scheduler.request_of_task(detail.task_id)
                if request_id is not None and request_id in state.calls:
                    logger.warning(
                        "task %d failed: %s",
                        detail.task_id,
                        describe_report(detail),
                        extra={
                            "task_id": detail.task_id,
                            "request_id": request_id,
                            "worker": handle.name,
                        },
                    )
                    failure = CallError(
                        grpc.StatusCode.FAILED_PRECONDITION, describe_report(detail), detail
                    )
                    state.fail_call(request_id, failure)
                    return
            wait = state.update_wait
            if wait is not None and handle.worker_id in wait.targets and wait.refused_by(detail):
                wait.errors.setdefault(handle.worker_id, detail)
                state.changed.notify_all()
                return
        logger.warning(
            "worker %r reported (charged to nothing open): %s",
            handle.name,
            describe_report(detail),
            extra={"worker": handle.name},
        )

    def on_chunk(
        self,
        handle: WorkerHandle,
        assembler: ResultAssembler,
        budget: InflightBudget,
        meta: ResultHeader,
        chunk: Chunk | None,
    ) -> None:
        """One message of a worker's result, from its Join stream: joined
        (:meth:`join_chunk`), then booked once whole (:meth:`on_results`).

        Raises:
            ProtocolError: For a message without its chunk, chunks out of order
                or a result that breaks the protocol.
            ResourceExhaustedError: Past the in-flight limit.
        """
        joined = self.join_chunk(handle, assembler, budget, meta, chunk)
        if joined is not None:
            self.on_results(handle, (joined,))

    def join_chunk(
        self,
        handle: WorkerHandle,
        assembler: ResultAssembler,
        budget: InflightBudget,
        meta: ResultHeader,
        chunk: Chunk | None,
    ) -> JoinedResult | None:
        """One message of a worker's result, from its Join stream or its lease data
        connection (each with its own assembler and budget), joined to the
        result's earlier ones.

        Returns:
            The result once its last chunk is in (to book with
            :meth:`on_results`), else None.

        Raises:
            ProtocolError: For a message without its chunk or chunks out of order.
            ResourceExhaustedError: Past the in-flight limit.
        """
        if chunk is None:
            raise ProtocolError(f"worker {handle.name!r} sent an EpisodeResult without its chunk")
        budget.charge(len(chunk.data))  # raises past the in-flight limit
        # Left in its chunks: the one-pass check reads them where they are.
        joined = assembler.join(meta, chunk, keep_pieces=True)  # raises on any disorder
        if joined is not None:
            budget.release()
        return joined

    def on_results_switch(self, handle: WorkerHandle) -> None:
        """The worker's results switch marker, read on its Join stream: every
        result before it on the stream was booked, so its data connection's
        results, held until now, are booked next (result_lane.py).

        Raises:
            ProtocolError: Without ``rlfleet.results-switch`` and
                ``rlfleet.data-results`` agreed, or for a second marker.
        """
        agreed = handle.hello.capabilities
        if not {_rpc.RESULTS_SWITCH_CAPABILITY, _rpc.DATA_RESULTS_CAPABILITY} <= set(agreed):
            raise ProtocolError(
                f"worker {handle.name!r} sent a results switch marker without agreeing on "
                f"{_rpc.RESULTS_SWITCH_CAPABILITY} and {_rpc.DATA_RESULTS_CAPABILITY} in its Hello"
            )
        if handle.join_results_over.is_set():
            raise ProtocolError(f"worker {handle.name!r} sent a second results switch marker")
        handle.join_results_over.set()

    def await_data_results(self, handle: WorkerHandle) -> None:
        """Waits, before a worker's graceful end is booked, until its lease data
        connection delivered its last result (its end-of-results marker, or the
        connection's end): episodes whose results are still on that socket are
        not written off and re-run. Bounded by the heartbeat timeout, the
        silence after which a worker counts as lost anyway.
        """
        done = handle.data_results_done
        if done is None or done.is_set():
            return
        timeout = self._state.config.heartbeat_timeout_seconds
        logger.info(
            "worker %r ended its Join stream; waiting up to %g seconds for its last results on "
            "its lease data connection",
            handle.name,
            timeout,
            extra={"worker": handle.name},
        )
        if not done.wait(timeout):
            logger.warning(
                "worker %r ended its Join stream, but its lease data connection did not "
                "deliver its last results within %g seconds (the heartbeat timeout); its "
                "episodes still in flight are re-run elsewhere",
                handle.name,
                timeout,
                extra={"worker": handle.name},
            )

    def on_results(
        self,
        handle: WorkerHandle,
        results: Sequence[JoinedResult],
        *,
        send_here: bool = False,
        sends: list[ReservedSend] | None = None,
    ) -> None:
        """A worker's complete results, in the order it sent them: check them,
        account them, forward them.

        Booked as if each came alone, one after the other (the same verdicts,
        refusals and error texts; ``tests/test_result_booking.py``), but with
        the lock taken twice per batch, not per result: the scheduler judges
        them all (:meth:`~rlfleet.scheduling.scheduler.Scheduler.classify_many`),
        the lock is released while each is checked, then they are booked and
        the fleet is refilled once. Each batch is viewed in its received
        bytes only to check it (:mod:`rlfleet.wire.result_checks`, vectorised;
        in one pass with the layout of the worker's earlier results of its
        mode, :mod:`rlfleet.wire.result_layout`); the learner gets the
        worker's chunks as they came.

        With ``send_here`` (a worker's result lane: a thread that may wait for
        a slow learner), a result for a call with a results connection is
        sent by this thread once the lock is let go, not by the call's
        thread: one thread hand-off fewer per result. With ``sends`` (the
        data loop booking a lane's results, which must not wait for a
        learner), such a result is reserved the same way and appended to
        ``sends`` instead, for the caller to send (:func:`by_call`), also
        when this raises.

        Raises:
            ResultError: If a result breaks the protocol (the worker is then
                dropped by the caller and its units re-run elsewhere); the
                results before it are booked, those after it are not.
        """
        rest: Sequence[JoinedResult] = results
        own = send_here and sends is None
        while rest:
            batch: list[ReservedSend] | None = [] if own else sends
            try:
                rest = self._book_batch(handle, rest, batch)
            finally:
                # After the lock (a send may wait for the learner): each call's
                # results in booking order, together (one write for the batch).
                if own and batch:
                    for outbox, sender, forwards in by_call(batch):
                        outbox.send_reserved(sender, forwards)

    def _book_batch(
        self,
        handle: WorkerHandle,
        results: Sequence[JoinedResult],
        sends: list[ReservedSend] | None,
    ) -> Sequence[JoinedResult]:
        """Books ``results`` up to the first whose check fails; returns those
        still to book after it (only when that one, judged again after the
        earlier ones were booked, turns out to be ignored, as it would have
        been alone)."""
        state = self._state
        scheduler = state.scheduler
        with state.lock:
            if not handle.alive:
                return ()  # declared dead: its units are someone else's now
            rulings = scheduler.classify_many(handle.worker_id, list(map(_judged, results)))
            latest = state.agent.version
            env_spec = state.env.spec
            # A subprocess worker's episodes keep their seeds; a native one's have none.
            native = state.env.update.vectorization in NATIVE_VECTORIZATIONS
            # What a result must be depends on its task alone: worked out once per task.
            expectations: dict[int, ResultExpectation] = {}
            # One ruling per result: indexed, as zip's strict keyword costs a
            # parse of its own per loop (and the batch is often one result).
            for position, ruling in enumerate(rulings):
                if ruling.verdict is not Verdict.ACCEPT:
                    continue
                task_id = results[position].header.task_id
                if task_id not in expectations:
                    if env_spec is None:  # cannot happen: results follow an EnvReady
                        raise ResultError(f"{results[0].header.where} arrived before any EnvReady")
                    expectations[task_id] = self._expectations.get(
                        handle, task_id, ruling.request_id, env_spec, latest, native=native
                    )
        # Checked outside the lock, in order, up to the first that fails.
        windows: list[EpisodeBatch | None] = []  # fragment windows' batches, for their streams
        failure: Exception | None = None
        for position, ruling in enumerate(rulings):
            if ruling.verdict is Verdict.REJECT:
                break  # judged again below, once the results before it are booked
            window = None
            if ruling.verdict is Verdict.ACCEPT and env_spec is not None:
                joined = results[position]
                expect = expectations[joined.header.task_id]
                try:  # in one pass with the layout of the worker's results of this mode
                    window = handle.result_layout.check(joined, env_spec, expect)  # fragments
                except (ProtocolError, WireFormatError) as exc:
                    failure = exc
                    break
            windows.append(window)
        refused: tuple[int, Exception] | None = None
        rest: Sequence[JoinedResult] = ()
        with state.lock:
            if not handle.alive:
                return ()
            # Booked in order; a request completed by one of them ends at once,
            # so that the results after it are judged as they would be alone.
            booked: list[JoinedResult] = []
            # (Those ignored above stay ignored: their tasks are over.)
            # The checked results from position ``done`` on are still to book.
            done, checked = 0, len(windows)
            while done < checked:
                outcomes = scheduler.complete_many(
                    handle.worker_id, list(map(_booked_fields, results[done:checked]))
                )
                for position, outcome in enumerate(outcomes, done):
                    joined = results[position]
                    if outcome.verdict is Verdict.REJECT:  # alone, classify would have said so
                        self._booked(handle, booked)
                        raise ResultError(f"{joined.header.where}: {outcome.reason}")
                    if outcome.verdict is not Verdict.ACCEPT:
                        # Its task is over (maybe since the batch was judged).
                        self._ignored(joined.header, outcome)
                        continue
                    self._book(handle, joined, outcome, windows[position], sends)
                    booked.append(joined)
                done += len(outcomes)
            if len(windows) < len(results):
                # The first result not checked or whose check failed: what
                # would it have been, judged after those before it?
                stopped = results[len(windows)]
                header = stopped.header
                again = scheduler.classify(handle.worker_id, header.task_id, header.episode_indices)
                if again.verdict is Verdict.IGNORE:
                    # Booked as ignored: units of its task it names go back.
                    again = scheduler.complete(
                        handle.worker_id, header.task_id, header.episode_indices, header.lengths
                    )
                    self._ignored(header, again)
                    rest = results[len(windows) + 1 :]
                elif again.verdict is Verdict.REJECT:
                    self._booked(handle, booked)
                    raise ResultError(f"{header.where}: {again.reason}")
                elif failure is None:
                    rest = results[len(windows) :]  # acceptable now: checked next round
                else:
                    refused = (again.request_id, failure)
            self._booked(handle, booked)
        if refused is not None:
            self._refused(handle, *refused)
            raise refused[1]
        return rest

    def _ignored(self, header: ResultHeader, ruling: ResultRuling) -> None:
        """A result for units no longer its worker's (lock held)."""
        self._state.metrics.discarded(len(header.episode_indices))
        if ruling.requeued:  # it named units moved away: the others it named are re-run
            self._state.dispatch()
        logger.debug("ignored a result of task %d: %s", header.task_id, ruling.reason)

    def _booked(self, handle: WorkerHandle, booked: list[JoinedResult]) -> None:
        """Counts the results of a batch that were booked and refills the fleet
        (lock held): once per batch, not per result."""
        if not booked:
            return
        state = self._state
        latest = state.agent.version
        lags: dict[int, int] = {}
        payload_bytes = 0
        for joined in booked:  # one pass: their bytes and their episodes by lag
            header = joined.header
            # A comparison, not max(): CPython 3.11's min and max parse their
            # keywords on every call.
            lag = latest - header.agent_version if latest > header.agent_version else 0
            lags[lag] = lags.get(lag, 0) + len(header.lengths)
            payload_bytes += joined.chunks[0].total_bytes
        state.metrics.forwarded_many(len(booked), payload_bytes, lags)
        state.progress.delivered(handle.worker_id, time.monotonic())
        state.dispatch()

    def _book(
        self,
        handle: WorkerHandle,
        joined: JoinedResult,
        outcome: ResultRuling,
        window: EpisodeBatch | None,
        sends: list[ReservedSend] | None = None,
    ) -> None:
        """Accounts an accepted result and passes it on (lock held): to the call's
        thread, or into ``sends`` for this thread to send after the lock."""
        state = self._state
        header = joined.header
        if window is not None:
            seed = state.scheduler.request_spec(outcome.request_id).seed
            state.streams.record(seed, handle.worker_id, window)
        steps = sum(header.lengths)
        call = state.calls.get(outcome.request_id)
        if call is not None:
            # Its fields are checked already: made without the frozen __init__.
            forward = prebuilt(
                Forward,
                header=header,
                worker_id=handle.worker_id,
                chunks=joined.chunks,
                steps=steps,
            )
            sender = call.outbox.reserve() if sends is not None else None
            if sender is not None and sends is not None:
                sends.append((call.outbox, sender, forward))
            else:
                call.outbox.put(forward)
            if outcome.subscription:
                state.metrics.delivered(len(header.lengths), steps)
        if outcome.done:
            footer = state.scheduler.footer(outcome.request_id)
            state.finish_request(outcome.request_id)
            self._expectations.forget(outcome.request_id)
            if call is not None:
                # What the learner's answer holds, not every accepted
                # result: a STEPS answer ends at its prefix.
                state.metrics.delivered(footer.num_episodes, footer.total_steps)
                call.outbox.put(Finished(footer))

    def _refused(self, handle: WorkerHandle, request_id: int, exc: Exception) -> None:
        """Counts a refused result against its request; past the bound, ends the request.

        The worker is dropped by the caller and its units re-queued: one
        hostile or broken worker does not end a request other workers can
        finish. A request whose results keep being refused (every worker
        sends values its env's space does not hold, or a worker keeps
        rejoining to forge them) ends with the refusal instead of
        re-queueing its units forever.
        """
        state = self._state
        with state.lock:
            call = state.calls.get(request_id)
            if call is None:
                return
            call.refused_results += 1
            if call.refused_results < MAX_REFUSED_RESULTS:
                return
            message = (
                f"the coordinator refused {call.refused_results} results of this request, so "
                f"it ends instead of re-running their episodes again; the last, from worker "
                f"{handle.name!r}: {exc}. A worker sent values that break the protocol or the "
                "env's declared spaces: fix the env (or the worker), or remove the worker"
            )
            logger.warning(
                "request %d ended: %s",
                request_id,
                message,
                extra={"request_id": request_id, "worker": handle.name},
            )
            detail = detail_of(ErrorKind.PROTOCOL, message, worker=handle.name)
            state.fail_call(
                request_id, CallError(grpc.StatusCode.FAILED_PRECONDITION, message, detail)
            )

    def drop(
        self,
        handle: WorkerHandle,
        code: grpc.StatusCode,
        message: str,
        detail: CallDetail | None = None,
    ) -> None:
        """Removes a worker (dead, gone or misbehaving) and ends its call.

        Its outstanding units go back to their requests; anything it sends
        from now on is ignored. Idempotent.
        """
        state = self._state
        with state.lock:
            if not handle.alive:
                return
            handle.alive = False
            state.registry.remove(handle.worker_id)
            state.progress.forget(handle.worker_id)
            requeued = state.scheduler.remove_worker(handle.worker_id, keep_streams=True)
            state.departed_steps += handle.heartbeat.steps_total
            state.metrics.worker_removed(code.name, requeued)
            state.dispatch()
            state.changed.notify_all()
        handle.end(code, message, detail)
        for listener in self.lost_listeners:
            listener(handle)
        level = logging.INFO if code is grpc.StatusCode.OK else logging.WARNING
        logger.log(
            level,
            "worker %r removed (%s: %s); %d units re-queued",
            handle.name,
            code.name,
            message,
            requeued,
            extra={"worker": handle.name},
        )
