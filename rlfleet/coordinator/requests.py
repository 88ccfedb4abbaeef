"""Learner requests: Sample and Subscribe calls, and the turn they share with updates.

Sample, UpdateAgent and UpdateEnv take turns, in arrival order: an update
must not change the agent under a request whose episodes all have to come
from one version. Subscriptions take no turn: they run beside, get work
only while no Sample request runs, and take the latest agent (-1).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from contextlib import contextmanager

import grpc

from rlfleet.coordinator.calls import CallOutbox, CallScope, Event, Finished, Forward
from rlfleet.coordinator.failures import CallError, detail_of
from rlfleet.coordinator.request_checks import sample_mode, subscription_mode
from rlfleet.coordinator.result_channels import ResultSender
from rlfleet.coordinator.rollouts import Rollouts
from rlfleet.coordinator.state import FleetState, OpenCall
from rlfleet.protocol.error_reports import ErrorKind
from rlfleet.protocol.learner_calls import CallHeader, SampleAsk, SubscribeAsk, UpdateReceipt
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.scheduling.scheduler import RequestSpec

logger = logging.getLogger("rlfleet.coordinator")


class LearnerRequests:
    """Serves learner calls against the fleet state.

    Args:
        state: The fleet state.
    """

    def __init__(self, state: FleetState) -> None:
        self._state = state
        self._rollouts = Rollouts(state)
        self._unseeded_requests = 0

    def cancel(self, scope: CallScope) -> None:
        """A learner call ended (hung up, deadline): wake whatever it waits for.

        gRPC calls this at the end of every call; one whose handler already
        returned holds nothing and waits for nothing, so it costs no lock.
        """
        if scope.served:
            return
        with self._state.lock:
            scope.cancel()
            self._state.changed.notify_all()

    def sample(
        self, request: SampleAsk, scope: CallScope, sender: ResultSender | None = None
    ) -> Generator[Event, None, None]:
        """Serves a Sample request: its header, results, then a footer.

        With ``sender`` (the learner's results connection), a result booked by
        a worker's result lane is sent by that lane, not yielded.

        Yields:
            A CallHeader, Forward events, then Finished or a CallError.

        Raises:
            CallError: If the request is invalid, an update in it fails,
                or no worker is ready in time.
        """
        mode = sample_mode(request, self._state.config.max_fragment_length)
        state = self._state
        with self._turn(scope, f"Sample(itr={request.itr})", request.coordinator_id):
            # The env first: the agent's policy is built for the env's spaces.
            if request.env_update is not None:
                self._rollouts.update_env(request.env_update, scope)
            if request.agent_update is not None:
                self._rollouts.update_agent(request.agent_update, scope)
            wait = request.wait_for_workers_seconds or state.config.wait_for_workers_seconds
            with state.lock:
                self._await_workers(wait, scope)
                seed, request_index = self._seeds(request.seed, request.request_index)
                spec = RequestSpec(
                    mode=mode,
                    amount=request.amount,
                    seed=seed,
                    request_index=request_index,
                    agent_version=state.agent.version,
                    env_generation=state.env.generation,
                    fragment_length=request.fragment_length,
                    first_episode=request.first_episode,
                )
                request_id = state.scheduler.start_sample(spec)
                outbox, header = self._open(
                    request_id, wait, scope, subscription=False, sender=sender
                )
            logger.info(
                "request %d (itr %d): %s %d, seed %d/%d, agent %d, env %d",
                request_id,
                request.itr,
                mode.name,
                request.amount,
                seed,
                request_index,
                spec.agent_version,
                spec.env_generation,
                extra={"request_id": request_id},
            )
            yield from self._events(outbox, header)

    def subscribe(self, request: SubscribeAsk, scope: CallScope) -> Generator[Event, None, None]:
        """Serves a subscription until the learner cancels it.

        Yields:
            A CallHeader (and one more on each env change), Forward events,
            and finally a CallError if it ends from this side.
        """
        mode = subscription_mode(request, self._state.config.max_fragment_length)
        state = self._state
        config = state.config
        with state.lock:
            if state.subscribers >= config.max_subscribers:
                raise CallError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{state.subscribers} subscriptions are open (the limit); end one first "
                    "or raise --max-subscribers",
                )
            self._await_workers(config.wait_for_workers_seconds, scope)
            seed, request_index = self._seeds(request.seed, 0)
            spec = RequestSpec(
                mode=mode,
                amount=0,
                seed=seed,
                request_index=request_index,
                agent_version=-1,
                env_generation=state.env.generation,
                fragment_length=request.fragment_length,
                max_buffered_steps=request.max_buffered_steps or config.max_buffered_steps,
            )
            request_id = state.scheduler.start_subscription(spec)
            outbox, header = self._open(
                request_id, config.wait_for_workers_seconds, scope, subscription=True
            )
        logger.info(
            "subscription %d: %s, seed %d",
            request_id,
            mode.name,
            seed,
            extra={"request_id": request_id},
        )
        yield from self._events(outbox, header)

    def update_agent(
        self, update: AgentChange, expected_id: str, scope: CallScope
    ) -> UpdateReceipt:
        """UpdateAgent, in its turn (see :meth:`Rollouts.update_agent`).

        Args:
            update: The change.
            expected_id: The coordinator the learner believes it talks to ("": any).
            scope: The call.
        """
        with self._turn(scope, "UpdateAgent", expected_id):
            return self._rollouts.update_agent(update, scope)

    def update_env(self, update: EnvChange, expected_id: str, scope: CallScope) -> UpdateReceipt:
        """UpdateEnv, in its turn (see :meth:`Rollouts.update_env`); as :meth:`update_agent`."""
        with self._turn(scope, "UpdateEnv", expected_id):
            return self._rollouts.update_env(update, scope)

    # --- internals ------------------------------------------------------------------

    @contextmanager
    def _turn(self, scope: CallScope, what: str, expected_id: str) -> Iterator[None]:
        """Holds the FIFO turn shared by Sample, UpdateAgent and UpdateEnv.

        Args:
            scope: The call.
            what: The call, for logs.
            expected_id: The coordinator id the learner believes it talks to
                ("": any).

        Raises:
            CallError: UNAVAILABLE while draining; ABORTED
                (ERROR_KIND_COORDINATOR_RESTARTED) if ``expected_id`` names
                another coordinator: this one lacks the env and agent the
                learner pushed there.
        """
        state = self._state
        with state.lock:
            if expected_id and expected_id != state.coordinator_id:
                message = (
                    f"{what} names coordinator {expected_id}, but this is coordinator "
                    f"{state.coordinator_id}: it restarted and lost the env and agent pushed "
                    "to it; push them again, then retry (RemoteSampler does this itself)"
                )
                raise CallError(
                    grpc.StatusCode.ABORTED,
                    message,
                    detail_of(ErrorKind.COORDINATOR_RESTARTED, message),
                )
            if state.draining:
                raise CallError(
                    grpc.StatusCode.UNAVAILABLE,
                    "the coordinator is draining and takes no new requests; retry on its "
                    "replacement",
                )
            ticket = state.gate.enter(scope, what)
        try:
            yield
        finally:
            with state.lock:
                state.gate.leave(ticket)

    def _seeds(self, seed: int | None, request_index: int) -> tuple[int, int]:
        """(base seed, request index) of a request (lock held)."""
        if seed is not None:
            return seed, request_index
        # No seed: the coordinator's own seed and its own request counter.
        index = self._unseeded_requests
        self._unseeded_requests += 1
        return self._state.config.seed, index

    def _await_workers(self, seconds: float, scope: CallScope) -> None:
        """Waits until a worker is ready for the current state (lock held).

        Raises:
            CallError: UNAVAILABLE (ERROR_KIND_NO_WORKERS) after ``seconds``.
        """
        state = self._state
        if not state.wait(lambda: state.scheduler.eligible_workers > 0, seconds, scope):
            raise state.no_workers(seconds)

    def _open(
        self,
        request_id: int,
        wait: float,
        scope: CallScope,
        *,
        subscription: bool,
        sender: ResultSender | None = None,
    ) -> tuple[CallOutbox, CallHeader]:
        """Registers a started request's call and hands out its first work (lock held)."""
        state = self._state
        outbox = CallOutbox(request_id, subscription=subscription, sender=sender)
        state.calls[request_id] = OpenCall(outbox, wait)
        scope.outbox = outbox
        if scope.cancelled:
            scope.cancel()  # hung up in between: the outbox must see it too
        state.dispatch()
        return outbox, state.header(request_id, -1 if subscription else state.agent.version)

    def _events(self, outbox: CallOutbox, header: CallHeader) -> Generator[Event, None, None]:
        """The call's events until it ends; closes the request however it ends."""
        state = self._state
        try:
            yield header
            while True:
                event = outbox.get()
                yield event
                if isinstance(event, Forward) and outbox.subscription:
                    # Sent: the subscriber's buffer has room again.
                    with state.lock:
                        state.scheduler.consumed(outbox.request_id, event.steps)
                        state.dispatch()
                if isinstance(event, Finished | CallError):
                    return
        finally:
            with state.lock:
                state.finish_request(outbox.request_id)
