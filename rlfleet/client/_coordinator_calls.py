"""A sampler's calls to one coordinator, and its state there kept across restarts.

:class:`~rlfleet.client.RemoteSampler` turns garage's API into requests
and answers into batches; :class:`CoordinatorCalls` makes those requests on
one coordinator (with several, :mod:`rlfleet.client.shards` holds one per
coordinator). It owns what talking to that coordinator takes: the channel
and the largest message it accepts, where answers' results travel
(:mod:`rlfleet.client._result_route`), the typed error of a failed call (a
refused TLS certificate named as such), and the env and agent pushed there,
pushed again once the coordinator restarted (:mod:`rlfleet.client._restore`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import TypeVar

import grpc

from rlfleet.client._errors import call_error
from rlfleet.client._learner_messages import (
    LearnerStubs,
    ResponsePart,
    sample_request,
    subscribe,
)
from rlfleet.client._responses import AnswerMemory, SampleAnswer, collect_answer
from rlfleet.client._restore import PushedState
from rlfleet.client._result_route import ResultRoute
from rlfleet.client.status import FleetStatus
from rlfleet.client.stream import STREAM_WINDOW_BYTES, SampleStream
from rlfleet.errors import (
    AuthenticationError,
    CoordinatorRestartedError,
    RlfleetError,
    UnavailableError,
)
from rlfleet.protocol.learner_calls import SampleAsk, SubscribeAsk, UpdatePush
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.security import ClientSecurity
from rlfleet.security.tls_probe import describe_tls_failure, tls_failure
from rlfleet.transport import rpc as _rpc
from rlfleet.wire.chunks import FORWARDED_RESULT_BYTES

logger = logging.getLogger("rlfleet.client")

#: ``progress(done, target)``: steps (STEPS, FRAGMENTS) or episodes (EPISODES).
Progress = Callable[[int, int], None]
T = TypeVar("T")


class CoordinatorCalls:
    """One sampler's calls to one coordinator.

    Args:
        address: ``HOST:PORT`` of the coordinator (gRPC connects lazily).
        timeout: Deadline of each call in seconds; None for no deadline.
        max_message_bytes: Largest message sent or accepted; result
            messages as the coordinator forwards them are accepted up to
            ``rlfleet.wire.chunks.FORWARDED_RESULT_BYTES`` whatever this says.
        security: TLS settings and token to dial with.
        answers: What the sampler keeps across calls to read answers; a new
            one if None.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float | None,
        max_message_bytes: int,
        security: ClientSecurity,
        answers: AnswerMemory | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._max_message_bytes = max_message_bytes
        # The coordinator forwards each result message as its worker cut it
        # (up to FORWARDED_RESULT_BYTES), on gRPC and on the results connection
        # alike: a smaller limit would refuse honest results.
        self._receive_bytes = max(max_message_bytes, FORWARDED_RESULT_BYTES)
        self._security = security
        # A Sample call is read on the thread that makes it: no thread of
        # gRPC's starts per call to receive its messages and hand them over.
        self._channel = _rpc.open_channel(
            address,
            max_message_bytes=max_message_bytes,
            security=security,
            receive_message_bytes=self._receive_bytes,
            calling_thread_streams=True,
        )
        self._stubs = LearnerStubs(self._channel)
        #: Where Sample answers' results travel (rlfleet.client._result_route).
        self.result_route = ResultRoute(
            address, self._stubs, security, self._receive_bytes, send_bytes=max_message_bytes
        )
        #: What the sampler keeps across calls to read (and assemble) answers.
        self.answers = AnswerMemory() if answers is None else answers
        #: The env and agent pushed to the coordinator, and its id.
        self.pushed = PushedState()
        #: The agent version of the last answer or update (None before any).
        self.agent_version: int | None = None

    def sample(self, ask: SampleAsk, progress: Progress | None) -> SampleAnswer:
        """Runs ``ask`` (its request index and updates as they are).

        If the coordinator restarted since this sampler pushed its env or
        agent, they go first (merged with ``ask``'s updates).
        """
        return self._restoring_on_restart(lambda: self._sample_once(ask, progress))

    def subscribe(self, ask: SubscribeAsk, timeout: float | None) -> SampleStream:
        """Opens a subscription; ``timeout`` bounds the whole subscription."""
        # A channel of its own whose receive window does not grow (no BDP
        # probing): the transport then holds at most STREAM_WINDOW_BYTES for
        # a reader that stops, so the coordinator's buffer fills and
        # backpressure stops the workers within a few hundred KiB.
        channel = _rpc.open_channel(
            self.address,
            max_message_bytes=self._max_message_bytes,
            receive_window_bytes=STREAM_WINDOW_BYTES,
            security=self._security,
            receive_message_bytes=self._receive_bytes,
        )
        try:
            call = subscribe(channel, ask, timeout=timeout)
        except BaseException:
            channel.close()
            raise
        what = self._what("Subscribe")
        return SampleStream(
            call,
            what,
            self.answers.reader(what),
            timeout,
            channel,
            failed=lambda exc: self._failed(exc, "Subscribe", timeout=timeout),
        )

    def update_agent(self, update: AgentChange) -> int:
        """Pushes an agent change (restoring the env if it restarted); returns its version."""

        def push() -> int:
            agent, env = self._restore(update, None)
            if env is not None:
                self._push_env(env)
            assert agent is not None  # restoring keeps the caller's update
            return self._push_agent(agent)

        return self._restoring_on_restart(push)

    def update_env(self, update: EnvChange) -> int:
        """Pushes an env change (restoring the agent if it restarted); returns its generation."""

        def push() -> int:
            agent, env = self._restore(None, update)
            assert env is not None  # restoring keeps the caller's update
            generation = self._push_env(env)
            if agent is not None:
                self._push_agent(agent)
            return generation

        return self._restoring_on_restart(push)

    def status(self) -> FleetStatus:
        """The coordinator's status."""
        return self._unary("GetStatus", lambda: self._stubs.status(timeout=self.timeout))

    def _what(self, name: str) -> str:
        """Names the call ``name`` on this coordinator, for errors."""
        return f"{name} on coordinator {self.address}"

    def close(self) -> None:
        """Closes the results connection and the channel."""
        self.result_route.close()
        self._channel.close()

    def _sample_once(self, ask: SampleAsk, progress: Progress | None) -> SampleAnswer:
        """One attempt at ``ask``, with the state this sampler must restore."""
        agent, env = self._restore(ask.agent_update, ask.env_update)
        ask = dataclasses.replace(
            ask, agent_update=agent, env_update=env, coordinator_id=self.pushed.expected_id
        )
        with self.result_route.routed(ask, self.timeout) as (ask, data):
            reader = self.answers.reader(self._what("Sample"), keep_pieces=True)
            if data is not None and data.requests:
                # The request and its whole answer on the results connection: no call.
                try:
                    answer = collect_answer(
                        data.requested(sample_request(ask)),
                        reader,
                        ask.mode,
                        ask.amount,
                        progress,
                        data=data,
                    )
                except UnavailableError:
                    self.pushed.suspect_restart = True  # as a failed call's UNAVAILABLE
                    raise
            else:
                call = self._stubs.sample(ask, timeout=self.timeout)
                try:
                    answer = collect_answer(call, reader, ask.mode, ask.amount, progress, data=data)
                except grpc.RpcError as exc:
                    raise self._failed(exc, "Sample", timeout=self.timeout) from None
                else:
                    _read_status(call)
                finally:
                    call.cancel()  # a no-op after the status; frees the call on errors
        self.agent_version = answer.header.agent_version
        if env is not None:
            self.pushed.env_applied(env)
        if agent is not None:
            self.pushed.agent_applied(agent, answer.header.agent_version)
        self.pushed.answered_by(answer.header.coordinator_id)
        return answer

    def _unary(self, name: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except grpc.RpcError as exc:
            raise self._failed(exc, name, timeout=self.timeout) from None

    def _failed(self, exc: grpc.RpcError, name: str, *, timeout: float | None) -> RlfleetError:
        """The typed error of a failed call; an UNAVAILABLE one may mean a restart.

        Or a refused TLS certificate, which gRPC reports as UNAVAILABLE too:
        that one is an AuthenticationError naming TLS (retrying cannot help).
        """
        error = call_error(exc, what=self._what(name), timeout=timeout)
        if isinstance(error, UnavailableError):
            tls = self._security.tls
            reason = None if tls is None else tls_failure(self.address, tls)
            if tls is not None and reason is not None:
                return AuthenticationError(
                    f"{self._what(name)}: {describe_tls_failure(self.address, reason, tls)}"
                )
            self.pushed.suspect_restart = True
        return error

    def _push_agent(self, agent: AgentChange) -> int:
        push = UpdatePush(agent, self.pushed.expected_id)
        ack = self._unary(
            "UpdateAgent", lambda: self._stubs.update_agent(push, timeout=self.timeout)
        )
        self.agent_version = ack.agent_version
        self.pushed.agent_applied(agent, ack.agent_version)
        self.pushed.answered_by(ack.coordinator_id)
        return int(ack.agent_version)

    def _push_env(self, env: EnvChange) -> int:
        push = UpdatePush(env, self.pushed.expected_id)
        ack = self._unary("UpdateEnv", lambda: self._stubs.update_env(push, timeout=self.timeout))
        self.pushed.env_applied(env)
        self.pushed.answered_by(ack.coordinator_id)
        return int(ack.env_generation)

    def _restoring_on_restart(self, attempt: Callable[[], T]) -> T:
        """Runs ``attempt``; once more if the coordinator restarted since the last push.

        The refused attempt changed nothing (the coordinator refuses before
        applying or sampling anything), and the second one restores this
        sampler's env and agent first (see :meth:`_restore`).
        """
        try:
            return attempt()
        except CoordinatorRestartedError:
            self.pushed.suspect_restart = True
            return attempt()

    def _restore(
        self, agent: AgentChange | None, env: EnvChange | None
    ) -> tuple[AgentChange | None, EnvChange | None]:
        """The updates to send: the caller's, plus this sampler's state on a new coordinator."""
        pushed = self.pushed
        if not (pushed.suspect_restart and pushed.pushed_anything):
            return agent, env
        status = self.status()
        pushed.suspect_restart = False
        if not pushed.restarted(status):
            return agent, env
        logger.info(
            "coordinator %s restarted (id %s); restoring the env and agent this sampler pushed",
            self.address,
            status.coordinator_id,
        )
        pushed.coordinator_id = status.coordinator_id
        return pushed.restoring(agent, env)


def _read_status(call: grpc.CallIterator[ResponsePart]) -> None:
    """Reads a complete answer's call up to its status, which follows the footer.

    Cancelling it instead, before the status arrived, would make both ends
    handle a cancellation (RST_STREAM) for a call that succeeded. What
    follows the footer changes nothing in the answer: a message there is
    left unread and a failed status ignored, as a cancelled call's would be.
    """
    with contextlib.suppress(grpc.RpcError):
        for _ in call:
            break
