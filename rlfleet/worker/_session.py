"""One joined Join stream of a remote worker: the main loop that serves it.

Everything here runs on the worker's main thread, which owns the
VecWorker. Each turn of the loop handles the messages already queued (in
order: an update applies to every task sent after it), takes one vector
step if there is work, sends finished episodes in groups, and sends a
heartbeat when one is due. Network work never blocks a step on the
coordinator's answer: the inbox is polled without waiting, and sends queue
messages for gRPC's thread, except results on the lease data connection,
written from this thread straight to its socket (``SessionLeases.send_results``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import time
from typing import TYPE_CHECKING

from rlfleet.core import EpisodeBatch
from rlfleet.core._pieces import EpisodePieces
from rlfleet.errors import ConfigError, EnvError, PermissionDeniedError, PolicyError, ProtocolError
from rlfleet.protocol.error_reports import kind_name, report_of_exception
from rlfleet.protocol.join import (
    AgentApplied,
    DrainOrder,
    TaskAssignment,
    TaskCancel,
    WorkerBeat,
    WorkerLeaving,
    WorkerWelcome,
)
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.security import PICKLE_CAPABILITY, PickleGate
from rlfleet.security.pickle import embedded_child
from rlfleet.worker._connection import Incoming, JoinStream, StreamEnded, Wakeup
from rlfleet.worker._flush import FlushMemory, FlushPolicy, flush_steps_for
from rlfleet.worker._held_tasks import HeldTasks
from rlfleet.worker._join_messages import (
    DataChannelWork,
    LeaseCommandIn,
    LeaseDataSwitch,
    Outgoing,
    UnreadableAgentUpdate,
    body_name,
    env_built,
    result_messages,
)
from rlfleet.worker._remote_updates import agent_of, env_config, format_traceback, observation_bytes
from rlfleet.worker._stepping import SessionStep
from rlfleet.worker._tasks import TaskBook, book_entry
from rlfleet.worker.leases.session_leases import SessionLeases
from rlfleet.worker.vec import VecWorker

if TYPE_CHECKING:
    from rlfleet.worker.remote import RemoteWorker

logger = logging.getLogger("rlfleet.worker")

#: The sample modes a task may name.
_MODES = frozenset(Mode)


@dataclasses.dataclass(frozen=True)
class _Encoded:
    """A result's messages, ready to send, and what the book keeps of it."""

    task_id: int
    indices: list[int]
    episodes: int
    total_bytes: int
    messages: list[memoryview]


class Outcome(enum.Enum):
    """How a session ended."""

    LEFT = "left"  # the worker left on purpose: exit
    DRAINED = "drained"  # the coordinator drained it: reconnect
    LOST = "lost"  # the stream broke: reconnect


class Session:
    """One joined stream: the main loop that serves the coordinator.

    Each session builds a fresh VecWorker (the coordinator it joined may be
    a restarted one, at another agent version) and shuts it down when the
    stream ends.

    Args:
        worker: The worker process's life (its config, leave flag, health).
        stream: The Join call, past its handshake.
        welcome: The coordinator's Welcome.
    """

    def __init__(self, worker: RemoteWorker, stream: JoinStream, welcome: WorkerWelcome) -> None:
        config = worker.config
        self._worker = worker
        self._config = config
        self._stream = stream
        self._inbox = stream.inbox
        self._welcome = welcome
        self.name = welcome.name or config.name
        # Pickles only when both sides opted in (this worker's flag and the
        # coordinator's grant in Welcome), or from the parent of an embedded fleet.
        self._pickle = PickleGate(
            (config.allow_pickle and PICKLE_CAPABILITY in welcome.capabilities)
            or embedded_child(config.coordinator),
            "worker",
        )
        self.end_reason = ""
        self._vec = VecWorker(
            n_envs=config.envs,
            seed=config.seed,
            worker_number=welcome.worker_id,
            name=self.name,
            max_env_restarts=config.env_restarts,
            nan_observations=config.nonfinite,
        )
        self._generation = 0
        self._leaving = False
        self._leave_deadline = float("inf")
        self._next_batch_id = 0
        self._max_message_bytes = min(
            welcome.max_message_bytes or config.max_message_bytes, config.max_message_bytes
        )
        self._leases = SessionLeases(
            stream,
            welcome,
            name=self.name,
            imports=config.imports,
            pickle=self._pickle,
            coordinator=config.coordinator,
            tls=config.security.tls,
            lease_slots=config.lease_slots,
            max_frame_bytes=self._max_message_bytes,
            leaving=lambda: self._leaving or worker.leave_requested,
            on_broken=self._data_broken,
            on_work=self._inbox.put,
        )
        self._book = TaskBook(self._vec, self._leases.host.hosted_count)
        self._held = HeldTasks(
            self._on_task,
            self._on_cancel,
            lambda: (self._vec.agent_version, self._generation),
        )
        self._heartbeat_interval = (
            config.heartbeat_interval or welcome.heartbeat_interval_seconds or 1.0
        )
        self._beat_steps = 0
        self._beat_time = time.monotonic()
        self._next_beat = self._beat_time
        self._flush_policy = FlushPolicy(
            flush_steps_for(config.flush_steps, native=False),
            config.flush_bytes,
            config.flush_seconds,
        )
        self._memory = FlushMemory()
        self._stepper = SessionStep(self._book, self._vec, self._flush_policy, self._on_task_error)
        self._metrics = worker.metrics
        self._metrics.joined(config.envs)
        logger.info(
            "joined coordinator %s as %r (worker id %d, %d envs, streams %d..%d)",
            config.coordinator,
            self.name,
            welcome.worker_id,
            config.envs,
            welcome.first_stream,
            welcome.first_stream + config.envs - 1,
        )
        self._leases.start()

    # --- the main loop -------------------------------------------------------------

    def run(self) -> Outcome:
        """Serves the stream until it ends; returns how it ended."""
        try:
            return self._loop()
        except Exception as exc:  # a bug here must not kill the process: rejoin fresh
            logger.exception("worker %r failed; rejoining with fresh envs", self.name)
            self._send_error(exc)
            self.end_reason = f"internal error {type(exc).__name__}: {exc}"
            self._stream.close_send()
            return Outcome.LOST
        finally:
            self._report_progress()  # the steps since the last heartbeat
            self._metrics.left()
            # Also unblocks gRPC's thread waiting on the request generator.
            self._stream.cancel()
            self._leases.close()
            self._vec.shutdown()

    def _loop(self) -> Outcome:
        vec, inbox, worker = self._vec, self._inbox, self._worker
        step = self._stepper.step  # the hot path: one vector step, then (maybe) a flush
        while True:
            if not inbox.empty():
                outcome = self._handle_queued(None)
                if outcome is not None:
                    return outcome
            if not vec.idle:
                if worker.leave_requested and not self._leaving:
                    # Checked right before units start (a signal may land mid-step).
                    self._start_leaving(worker.leave_reason, tell=True)
                if step():
                    self._flush()
            elif self._book.fragment_tasks and not self._leaving:
                self._run_window()
            else:
                self._book.feed()  # units left waiting by a cancel or an update
                if not vec.idle:
                    continue
                self._flush()
                if self._leaving:
                    return self._close()
                outcome = self._wait_for_message()
                if outcome is not None:
                    return outcome
            if self._beat_if_due() and time.monotonic() >= self._leave_deadline:
                self._abandon_in_flight()

    def _beat_if_due(self) -> bool:
        """Sends a heartbeat if one is due; returns whether it did."""
        now = time.monotonic()
        if now < self._next_beat:
            return False
        self._heartbeat(now)
        return True

    def _run_window(self) -> None:
        """One window of the oldest fragment task, sent as one result."""
        task = self._book.fragment_tasks[0]
        try:
            batch = self._vec.collect_fragments(
                task.fragment_length,
                base_seed=task.base_seed,
                first_stream=self._welcome.first_stream,
                streams=task.streams or None,
                replays=task.replays,
                tick=self._beat_if_due,
            )
            task.replays = []  # rebuilt: later windows continue here
        except (EnvError, PolicyError, ConfigError) as exc:
            self._on_task_error(exc)
            return
        self._stepper.steps_total += batch.total_steps
        self._send_result(task.task_id, batch)
        task.rounds_left -= 1
        if (
            task.rounds_left <= 0
            and self._book.fragment_tasks
            and self._book.fragment_tasks[0] is task
        ):
            self._book.fragment_tasks.popleft()

    def _wait_for_message(self) -> Outcome | None:
        """Blocks for the next message until the next heartbeat is due."""
        timeout = max(self._next_beat - time.monotonic(), 0.0)
        try:
            message = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        return self._handle_queued(message)

    def _handle_queued(self, first: Incoming | None) -> Outcome | None:
        """Handles ``first`` and every message already queued, in order."""
        message = first
        while True:
            if message is None:
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    return None
            outcome = self._handle(message)
            if outcome is not None:
                return outcome
            message = None

    # --- messages from the coordinator ----------------------------------------------

    def _handle(self, message: Incoming) -> Outcome | None:
        if isinstance(message, StreamEnded):
            return self._ended(message)
        if isinstance(message, Wakeup):
            if self._worker.leave_requested and not self._leaving:
                self._start_leaving(self._worker.leave_reason, tell=True)
            return None
        if isinstance(message, EnvChange):
            self._on_env_update(message)
        elif isinstance(message, AgentChange | UnreadableAgentUpdate):
            self._on_agent_update(message)
        elif isinstance(message, TaskAssignment):
            self._held.seen(message.task_id)
            self._on_task(message)
        elif isinstance(message, TaskCancel):
            self._on_cancel(message)
        elif isinstance(message, DataChannelWork):
            work = message.work
            if isinstance(work, TaskCancel):
                self._held.on_cancel(work)
            elif not self._leaving:
                self._held.on_task(work)
        elif isinstance(message, LeaseCommandIn | LeaseDataSwitch):
            self._leases.submit(message)
        elif isinstance(message, DrainOrder):
            logger.info("coordinator drains this worker: %s", message.reason or "no reason")
            self._start_leaving(message.reason, tell=False)
        else:
            logger.warning(
                "ignored an unexpected %r message from the coordinator", body_name(message)
            )
        return None

    def _on_env_update(self, update: EnvChange) -> None:
        self._flush()  # finished episodes belong to the old env
        try:
            self._vec.update_env(env_config(update, self._config.imports, self._pickle))
        except Exception as exc:  # any failure building an env is the env's config
            error = (
                exc
                if isinstance(exc, ConfigError | PermissionDeniedError)
                else ConfigError(
                    f"building env {update.env_id!r} raised {type(exc).__name__}: {exc}"
                )
            )
            logger.warning("env update %d refused: %s", update.generation, error)
            self._send_error(
                error, traceback_text=format_traceback(exc), env_generation=update.generation
            )
            return
        self._generation = update.generation
        policy = self._flush_policy
        policy.set_max_steps(flush_steps_for(self._config.flush_steps, native=self._vec.native))
        policy.expect_step_bytes(observation_bytes(self._vec.env_spec))
        self._book.drop_stale(env_generation=update.generation)
        self._send(env_built(update.generation, self._vec.env_spec))
        logger.info("env generation %d: %s", update.generation, update.env_id)
        self._held.update_applied()

    def _on_agent_update(self, update: AgentChange | UnreadableAgentUpdate) -> None:
        self._flush()  # finished episodes belong to the old version
        try:
            if isinstance(update, UnreadableAgentUpdate):
                raise update.error  # its parameters did not decode
            agent = agent_of(
                update,
                self._vec,
                self._pickle,
                seed=self._config.seed,
                imports=self._config.imports,
            )
            self._vec.update_agent(agent, version=update.version)
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, PolicyError | PermissionDeniedError)
                else PolicyError(
                    f"agent version {update.version} refused: {type(exc).__name__}: {exc}"
                )
            )
            logger.warning("agent update %d refused: %s", update.version, error)
            self._send_error(
                error, traceback_text=format_traceback(exc), agent_version=update.version
            )
            return
        self._book.drop_stale(agent_version=update.version)
        self._send(AgentApplied(update.version))
        logger.debug("agent version %d applied", update.version)
        self._held.update_applied()

    def _on_task(self, task: TaskAssignment) -> None:
        if self._leaving:
            return  # sent before our Leaving arrived; the coordinator re-assigns it
        vec = self._vec
        problem = None
        if task.env_generation != self._generation:
            problem = f"env generation {task.env_generation}, this worker has {self._generation}"
        elif task.agent_version not in (-1, vec.agent_version):
            problem = f"agent version {task.agent_version}, this worker has {vec.agent_version}"
        elif task.mode not in _MODES:
            problem = f"unknown sample mode {task.mode}"
        elif task.mode == Mode.FRAGMENTS and task.fragment_length < 1:
            problem = "a FRAGMENTS task needs fragment_length >= 1"
        elif task.mode == Mode.FRAGMENTS and len(task.streams) > vec.n_envs:
            problem = f"{len(task.streams)} streams, this worker has {vec.n_envs} env slots"
        parsed = book_entry(task)
        if task.unreadable:
            problem = task.unreadable
        if problem is not None:
            self._send_error(
                ProtocolError(f"task {task.task_id} asks for {problem}"), task_id=task.task_id
            )
            return
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "task %d of request %d: %d units",
                task.task_id,
                task.request_id,
                len(task.units) or task.rounds,
                extra={"task_id": task.task_id, "request_id": task.request_id},
            )
        self._book.add(*parsed)

    def _on_cancel(self, cancel: TaskCancel) -> None:
        self._book.cancel(cancel.task_id, cancel.episode_indices)

    def _on_task_error(self, exc: Exception) -> None:
        """Reports an error that stops a request, once per request, and drops its tasks.

        A policy error concerns every task (the policy is broken); other
        errors the request whose episodes are running.
        """
        book = self._book
        tasks = book.tasks() if isinstance(exc, PolicyError) else book.running_request()
        first = min(tasks, key=lambda t: t.task_id, default=None)
        ids = {} if first is None else {"task_id": first.task_id, "request_id": first.request_id}
        logger.warning("task error: %s", str(exc).splitlines()[0], extra=ids)
        book.drop(task.task_id for task in tasks)
        first_of_request: dict[int, int] = {}
        for task in sorted(tasks, key=lambda t: t.task_id):
            first_of_request.setdefault(task.request_id, task.task_id)
        for task_id in first_of_request.values():
            self._send_error(exc, task_id=task_id)
        if not tasks:
            self._send_error(exc)

    # --- messages to the coordinator --------------------------------------------------

    def _flush(self) -> None:
        """Sends every finished episode, one result per task, all in one send."""
        vec = self._vec
        self._flush_policy.sent()
        if not vec.finished_count:
            return
        results: list[_Encoded] = []
        for task_id in list(self._book.episode_tasks):
            # Each batch is encoded before the next is taken: its columns
            # are gathered from the ring, which holds them until the next step.
            while (batch := vec.take_finished_pieces(request=task_id)) is not None:
                results.append(self._encode_result(task_id, batch))
        if results:
            self._send_results(results)
        leftover = vec.take_finished()
        if leftover is not None:  # of tasks cancelled meanwhile
            logger.debug("dropped %d finished episodes of cancelled tasks", leftover.n_episodes)

    def _send_result(self, task_id: int, batch: EpisodeBatch | EpisodePieces) -> None:
        """Sends a batch as one EpisodeResult, chunked below the message limit."""
        self._send_results([self._encode_result(task_id, batch)])

    def _encode_result(self, task_id: int, batch: EpisodeBatch | EpisodePieces) -> _Encoded:
        """A batch's EpisodeResult messages (its step data copied once, into them)."""
        indices = batch.episode_infos["episode_index"]
        on_data = self._leases.results_on_data
        messages, total_bytes = result_messages(
            batch,
            task_id=task_id,
            episode_indices=indices,
            env_generation=self._generation,
            batch_id=self._next_batch_id,
            max_message_bytes=self._max_message_bytes,
            # Sent from this thread before the next flush: the memory is reused.
            allocate=self._memory.allocate if on_data else None,
            on_data_channel=on_data,
        )
        self._next_batch_id += 1
        self._flush_policy.expect_step_bytes(total_bytes / batch.total_steps)
        return _Encoded(task_id, indices.tolist(), batch.n_episodes, total_bytes, messages)

    def _send_results(self, results: list[_Encoded]) -> None:
        """Sends results' messages in order: on the data connection in one send."""
        messages = [m for result in results for m in result.messages]
        if self._leases.send_results(messages, len(results)):
            self._memory.reset()  # the kernel's now
        else:
            for message in messages:
                self._stream.send(message)
        for result in results:
            self._book.reported(result.task_id, result.indices)
            self._metrics.sent(result.episodes, result.total_bytes)

    def _report_progress(self) -> None:
        self._metrics.progress(
            self._stepper.steps_total - self._beat_steps, self._vec.restarts, self._vec.active_count
        )

    def _heartbeat(self, now: float) -> None:
        elapsed = now - self._beat_time
        rate = (self._stepper.steps_total - self._beat_steps) / elapsed if elapsed > 0 else 0.0
        self._report_progress()
        self._beat_time, self._beat_steps = now, self._stepper.steps_total
        self._next_beat = now + self._heartbeat_interval
        self._worker.beat(now, self._heartbeat_interval)
        beat = WorkerBeat(
            steps_total=self._stepper.steps_total,
            steps_per_second=rate,
            active_envs=self._vec.active_count,
            queued_units=self._book.queued_units,
        )
        if not self._leases.send_beat(beat):
            self._send(beat)

    def _send_error(
        self,
        exc: BaseException,
        *,
        task_id: int = 0,
        traceback_text: str = "",
        env_generation: int | None = None,
        agent_version: int | None = None,
    ) -> None:
        """Reports an error, naming the task or the update it belongs to."""
        report = report_of_exception(
            exc,
            worker=self.name,
            task_id=task_id,
            traceback_text=traceback_text
            or str(getattr(exc, "remote_traceback", "") or "")
            or format_traceback(exc),
            env_generation=env_generation,
            agent_version=agent_version,
        )
        self._metrics.error(kind_name(report.kind))
        self._send(report)

    def _send(self, message: Outgoing) -> None:
        self._stream.send(message)

    def _data_broken(self, why: str) -> None:
        """The data connection broke: the coordinator writes this session off, so end it."""
        self.end_reason = f"the lease data connection ended ({why})"
        self._stream.cancel()

    # --- leaving ------------------------------------------------------------------------

    def _start_leaving(self, reason: str, *, tell: bool) -> None:
        """Stops taking work; in-flight episodes finish, unstarted units are dropped."""
        self._leaving = True
        self._leave_deadline = time.monotonic() + self._config.drain_grace_seconds
        if tell:
            self._send(WorkerLeaving(reason))
        self._book.drop_unstarted()
        self._held.clear()
        logger.info(
            "leaving (%s): finishing %d episodes in flight",
            reason or "drain",
            self._vec.active_count,
        )

    def _abandon_in_flight(self) -> None:
        """Gives up on episodes that did not finish within the drain grace."""
        logger.warning(
            "%d episodes did not finish within the drain grace of %g seconds; abandoning "
            "them (the coordinator re-assigns them)",
            self._vec.active_count,
            self._config.drain_grace_seconds,
        )
        self._book.drop(task.task_id for task in self._book.tasks())
        self._vec.cancel()
        self._leave_deadline = float("inf")

    def _close(self) -> Outcome:
        """Ends the stream after the last result was queued."""
        self._leases.end_results()
        self._stream.close_send()
        if not self._stream.wait_closed(self._config.close_timeout):
            self._stream.cancel()
        self.end_reason = "drained by the coordinator"
        return Outcome.LEFT if self._worker.leave_requested else Outcome.DRAINED

    def _ended(self, ended: StreamEnded) -> Outcome:
        self.end_reason = ended.describe()
        if self._leaving:
            return Outcome.LEFT if self._worker.leave_requested else Outcome.DRAINED
        if self._worker.leave_requested:
            return Outcome.LEFT
        return Outcome.LOST
