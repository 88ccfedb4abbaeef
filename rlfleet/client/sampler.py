"""RemoteSampler: garage's Sampler contract over a coordinator (or several).

``RemoteSampler(address, seed=s)`` returns, for the same seed, env and agent
updates, the batches ``LocalSampler(seed=s)`` returns (every field but
``episode_infos["worker"]``, which names the producer), however many
workers the fleet has and even if some die mid-request: episode k of the
n-th call gets its seeds from ``(s, n, k)`` and batches are ordered by
episode index. Given several coordinator addresses, it cuts each request
into episode ranges over them (:mod:`rlfleet.client.shards`), with the same
batches; fragments and subscriptions then run on each coordinator's own
streams (:mod:`rlfleet.client.shard_fragments`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import grpc

from rlfleet._util.closing import ClosesOnExit
from rlfleet._util.values import check_int
from rlfleet.client._errors import call_error
from rlfleet.client._learner_messages import (
    AgentUpdateLike,
    EnvUpdateLike,
    LearnerStubs,
    agent_change_of,
    env_change_of,
    subscribe,
)
from rlfleet.client._responses import AnswerMemory, SampleAnswer, collect_answer
from rlfleet.client._restore import PushedState
from rlfleet.client._result_route import ResultRoute
from rlfleet.client.shards import ShardSet, parse_addresses, random_seed
from rlfleet.client.status import FleetStatus, count_workers
from rlfleet.client.stream import STREAM_WINDOW_BYTES, SampleStream, subscribe_ask
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import (
    AuthenticationError,
    ConfigError,
    CoordinatorRestartedError,
    NoWorkersError,
    RlfleetError,
    UnavailableError,
)
from rlfleet.protocol.learner_calls import SampleAsk, SubscribeAsk, UpdatePush
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.security import ClientSecurity, Token
from rlfleet.security.tls_probe import describe_tls_failure, tls_failure
from rlfleet.transport import rpc as _rpc
from rlfleet.wire.chunks import FORWARDED_RESULT_BYTES

logger = logging.getLogger("rlfleet.client")

#: What the protocol's integer fields hold (learner.proto).
_UINT32_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1

#: ``progress(done, target)``: steps (STEPS, FRAGMENTS) or episodes (EPISODES).
Progress = Callable[[int, int], None]
T = TypeVar("T")

#: The coordinator's default wait for workers, used when none was given.
_DEFAULT_WAIT_FOR_WORKERS = 60.0


class RemoteSampler(ClosesOnExit):
    """Samples on a fleet through its coordinator (garage's Sampler API).

    Every call carries a deadline (``timeout``) and failures surface as
    rlfleet's typed errors: :class:`~rlfleet.errors.EnvError` naming worker,
    env index and step for a crashing env, :class:`~rlfleet.errors.PolicyError`
    for refused parameters, :class:`~rlfleet.errors.NoWorkersError`,
    :class:`~rlfleet.errors.UnavailableError` (retryable) when the
    coordinator went away, :class:`~rlfleet.errors.RlfleetTimeoutError`
    naming the seconds. The channel reconnects by itself: after a
    coordinator restart the next call works again, and the sampler first
    pushes the env and agent it had established (the new coordinator starts
    from its defaults), so a retried call returns the failed one's batch.

    Args:
        address: ``HOST:PORT`` of the coordinator; or several coordinators,
            each with its own workers, as a sequence of addresses or one
            string joining them with commas: each request is then cut into
            episode ranges over them, with the batch one coordinator would
            give, and a lost coordinator's ranges re-run on the others
            (docs/sharding.md). Over several, ``obtain_fragments`` and
            :meth:`stream` run on every coordinator's own streams, and
            :meth:`open_channel` is a ConfigError.
        seed: Base seed of every request. With a seed, the n-th successful
            ``obtain_*`` call (n = 0, 1, ...) sends ``request_index=n``, as
            LocalSampler numbers its requests, so the batches equal
            LocalSampler's; a failed call does not advance the counter, so
            retrying it reproduces the same batch. None: the coordinator's
            own seed and request counter (over several coordinators: a base
            seed the sampler draws, with its own counter).
        timeout: Deadline of each call in seconds; None for no deadline.
        wait_for_workers: Seconds a request waits for a first ready worker
            before failing with NoWorkersError; None: the coordinator's default.
        max_message_bytes: Largest message sent or accepted; result
            messages as a coordinator forwards them are accepted up to
            ``rlfleet.wire.chunks.FORWARDED_RESULT_BYTES`` (about 9 MiB)
            whatever this says (docs/protocol.md, "Chunking").
        tls_ca: PEM CA bundle to verify a TLS coordinator with
            (docs/security.md); any ``tls_*`` argument turns TLS on.
        tls_cert: PEM client certificate, for a coordinator requiring mTLS.
        tls_key: Its PEM private key.
        tls_server_name: Name the coordinator's certificate must carry, if
            not the dialled host's (e.g. through ``kubectl port-forward``).
        token: The learner token; None reads ``RLFLEET_TOKEN``, then
            ``RLFLEET_LEARNER_TOKEN`` (no token if neither is set).

    Raises:
        ConfigError: If an argument is invalid.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        seed: int | None = None,
        timeout: float | None = 600.0,
        wait_for_workers: float | None = None,
        max_message_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
        token: str | Token | None = None,
    ) -> None:
        if seed is not None:
            check_int("seed", seed, minimum=0, maximum=_UINT64_MAX)
        for name, value in (("timeout", timeout), ("wait_for_workers", wait_for_workers)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be > 0 seconds or None, got {value!r}")
        addresses = parse_addresses(address)
        #: The coordinators' addresses; ``address`` joins them with commas.
        self.addresses = addresses
        self.address = ",".join(addresses)
        self.seed = seed
        self.timeout = timeout
        self.wait_for_workers = wait_for_workers
        self._max_message_bytes = max_message_bytes
        # The coordinator forwards each result message as its worker cut it
        # (up to FORWARDED_RESULT_BYTES): a smaller limit would refuse honest results.
        self._receive_bytes = max(max_message_bytes, FORWARDED_RESULT_BYTES)
        self._security = ClientSecurity.from_options(
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=tls_server_name,
            token=token,
        )
        self._shards: ShardSet | None = None
        if len(addresses) > 1:
            one = functools.partial(
                RemoteSampler,
                timeout=timeout,
                wait_for_workers=wait_for_workers,
                max_message_bytes=max_message_bytes,
                tls_ca=tls_ca,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_server_name=tls_server_name,
                token=token,
            )
            shards = [one(address) for address in addresses]
            self._shards = ShardSet(shards, seed=random_seed() if seed is None else seed)
        # Over several coordinators every call goes through the shards' own
        # channels; this one (gRPC connects lazily) then never connects.
        self._channel = _rpc.open_channel(
            addresses[0],
            max_message_bytes=max_message_bytes,
            security=self._security,
            receive_message_bytes=self._receive_bytes,
        )
        self._stubs = LearnerStubs(self._channel)
        #: Where Sample answers' results travel (rlfleet.client._result_route).
        self.result_route = ResultRoute(
            addresses[0], self._stubs, self._security, max_message_bytes
        )
        self._requests = 0
        self._pushed = PushedState()
        self._agent_version: int | None = None
        self._answers = AnswerMemory()
        self._closed = False

    # --- garage's Sampler API ------------------------------------------------------

    def obtain_samples(
        self,
        itr: int,
        num_samples: int,
        agent_update: AgentUpdateLike | None = None,
        env_update: EnvUpdateLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> EpisodeBatch:
        """Complete episodes totalling at least ``num_samples`` steps.

        The answer is episodes 0..m of the request, m the smallest index
        whose lengths sum to >= ``num_samples``, ordered by index.

        Args:
            itr: The learner's iteration (for the coordinator's logs).
            num_samples: Steps wanted (>= 1).
            agent_update: Applied on every worker first (see
                :meth:`update_agent` for the accepted forms).
            env_update: Applied on every worker first (see :meth:`update_env`).
            progress: Called as results land with (steps so far, num_samples).

        Returns:
            One EpisodeBatch.
        """
        answer = self._run_sample(
            Mode.STEPS,
            num_samples,
            agent_update=agent_update,
            env_update=env_update,
            itr=itr,
            progress=progress,
        )
        return self._answers.episodes(answer, answer.footer.num_episodes)

    def obtain_episodes(
        self,
        n_episodes: int,
        agent_update: AgentUpdateLike | None = None,
        env_update: EnvUpdateLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> EpisodeBatch:
        """Exactly ``n_episodes`` complete episodes, ordered by episode index.

        Args:
            n_episodes: Episodes wanted (>= 1).
            agent_update: As in :meth:`obtain_samples`.
            env_update: As in :meth:`obtain_samples`.
            progress: Called with (episodes so far, n_episodes).
        """
        answer = self._run_sample(
            Mode.EPISODES,
            n_episodes,
            agent_update=agent_update,
            env_update=env_update,
            progress=progress,
        )
        return self._answers.episodes(answer, n_episodes)

    def obtain_exact_episodes(
        self,
        n_eps_per_worker: int,
        agent_update: AgentUpdateLike | None = None,
        env_update: EnvUpdateLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> EpisodeBatch:
        """``n_eps_per_worker`` episodes per worker (garage's contract).

        The fleet assigns episodes to whichever worker is free, so "per
        worker" only sets the count: ``n_eps_per_worker`` times the number
        of workers connected (and not leaving) when the call starts,
        episodes 0..N-1 of the request, ordered by index. With no worker
        connected, it waits up to ``wait_for_workers`` seconds for one.

        Raises:
            NoWorkersError: If no worker is connected in time.
        """
        check_int("n_eps_per_worker", n_eps_per_worker, minimum=1, maximum=_INT64_MAX)
        workers = count_workers(
            self.status, self.wait_for_workers or _DEFAULT_WAIT_FOR_WORKERS, self.address
        )
        return self.obtain_episodes(
            n_eps_per_worker * workers, agent_update, env_update, progress=progress
        )

    def obtain_fragments(
        self,
        num_samples: int,
        fragment_length: int,
        agent_update: AgentUpdateLike | None = None,
        env_update: EnvUpdateLike | None = None,
        *,
        progress: Progress | None = None,
    ) -> EpisodeBatch:
        """Fixed-length fragments (RLlib ``truncate_episodes``) totalling >= ``num_samples``.

        Every env slot of the fleet is a stream whose episodes continue
        across calls; each returned "episode" is a piece of at most
        ``fragment_length`` steps, ordered by (stream, episode, fragment),
        as LocalSampler orders them. Over several coordinators each runs its
        own streams for a share of ``num_samples`` in proportion to its env
        slots, and a call during which one is lost fails with an
        UnavailableError naming it (docs/sharding.md).

        Args:
            num_samples: Steps wanted (>= 1).
            fragment_length: Steps per slot per window (>= 1).
            agent_update: As in :meth:`obtain_samples`.
            env_update: As in :meth:`obtain_samples`.
            progress: Called with (steps so far, num_samples).
        """
        answer = self._run_sample(
            Mode.FRAGMENTS,
            num_samples,
            fragment_length=fragment_length,
            agent_update=agent_update,
            env_update=env_update,
            progress=progress,
        )
        return self._answers.fragments(answer)

    # --- updates, streaming, status --------------------------------------------------

    def update_agent(self, agent_update: AgentUpdateLike) -> int:
        """Pushes a new agent to every worker; returns its version.

        Args:
            agent_update: A params dict (set on the current policy; names
                not given keep their values), a PolicySpec or policy name
                (built with default weights), a ``(spec, params)`` tuple, or
                a built-in Policy instance (its spec and params).

        Raises:
            PolicyError: If a worker refused it (bad names or shapes); the
                fleet is then back on the previous agent, as a new version.
        """
        update = agent_change_of(agent_update)
        if self._shards is not None:
            self._agent_version = self._shards.update_agent(update)
            return self._agent_version
        return self._apply_agent(update)

    def update_env(self, env_update: EnvUpdateLike) -> int:
        """Switches every worker to another env; returns its generation.

        Args:
            env_update: An EnvConfig or a registered gymnasium id. Its
                ``imports`` are not sent: workers import only the modules of
                their own ``--import`` flag.

        Raises:
            EnvNotFoundError, ConfigError: If a worker could not build it;
                the fleet is then back on the previous env.
        """
        update = env_change_of(env_update)
        if self._shards is not None:
            return self._shards.update_env(update)
        return self._apply_env(update)

    def stream(
        self,
        mode: Literal["episodes", "fragments"] = "episodes",
        *,
        fragment_length: int | None = None,
        max_buffered_steps: int | None = None,
        timeout: float | None = None,
    ) -> SampleStream:
        """Subscribes to results as they land (asynchronous learners).

        Workers keep sampling with the latest agent version; each
        :class:`~rlfleet.client.StreamedBatch` names the version that
        produced it, and an :meth:`update_agent` during the stream applies
        at once (episodes in flight are re-run with the new version). A
        Sample request pauses the stream while it runs. When the reader
        falls behind by ``max_buffered_steps``, workers get no new work.

        Args:
            mode: ``"episodes"`` (complete episodes) or ``"fragments"``.
            fragment_length: Steps per fragment (fragments mode only).
            max_buffered_steps: Steps the coordinator may hold for this
                reader; None: the coordinator's default.
            timeout: Deadline of the whole subscription; None: none.

        Returns:
            A context-manager iterator of ``StreamedBatch(batch,
            agent_version)``; leaving the ``with`` block ends the
            subscription. Over several coordinators, one iterator over a
            subscription on each (docs/sharding.md): ``max_buffered_steps``
            is then per coordinator, and a failure of any ends them all.
        """
        ask = subscribe_ask(mode, fragment_length, max_buffered_steps, self.seed)
        if self._shards is not None:
            return self._shards.subscribe(ask, timeout)
        return self._subscribe(ask, timeout)

    def _subscribe(self, ask: SubscribeAsk, timeout: float | None) -> SampleStream:
        """Opens a subscription on this (one) coordinator."""
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
            self._answers.reader(what),
            timeout,
            channel,
            failed=lambda exc: self._failed(exc, "Subscribe", timeout=timeout),
        )

    @property
    def security(self) -> ClientSecurity:
        """The TLS settings and token this sampler dials with."""
        return self._security

    @property
    def max_message_bytes(self) -> int:
        """The largest message this sampler's channels accept."""
        return self._max_message_bytes

    def open_channel(self) -> grpc.Channel:
        """A new channel to the coordinator with this sampler's address and credentials.

        For other calls that need a stream of their own (e.g.
        :class:`~rlfleet.client.RemoteVectorEnv`'s lease); the caller closes it.
        """
        self._one_coordinator("open_channel()")
        return _rpc.open_channel(
            self.address, max_message_bytes=self._max_message_bytes, security=self._security
        )

    def status(self) -> FleetStatus:
        """The fleet's workers, rates, agent version and env (summed over coordinators)."""
        if self._shards is not None:
            return self._shards.status()
        return self._unary("GetStatus", lambda: self._stubs.status(timeout=self.timeout))

    @property
    def agent_version(self) -> int | None:
        """The agent version of the last answer or update (None before any)."""
        return self._agent_version

    @property
    def coordinator_id(self) -> str | None:
        """The id of the coordinator process that answered this sampler last (None before).

        It changes when the coordinator restarted (``FleetStatus.coordinator_id``).
        """
        return self._pushed.coordinator_id

    @property
    def env_spec(self) -> EnvSpec:
        """The fleet's env spec (asks the coordinator).

        Raises:
            NoWorkersError: If no worker has built the env yet.
        """
        spec = self.status().env_spec
        if spec is None:
            raise NoWorkersError(
                f"the coordinator at {self.address} knows no env spec yet: no worker has built "
                "the env; start workers with `rlfleet worker --coordinator ADDR`"
            )
        return spec

    @property
    def requests_made(self) -> int:
        """Successful ``obtain_*`` calls so far (the next request index)."""
        return self._requests

    def set_next_request(self, request_index: int) -> None:
        """Makes the next ``obtain_*`` call request ``request_index``.

        A run resumed from a snapshot continues the request numbering where
        the interrupted run stopped, so its batches get the seeds the
        uninterrupted run's would have (``rlfleet.Trainer.restore``).

        Raises:
            ConfigError: If the sampler has no seed (the coordinator then
                numbers requests itself) or the index is not an int >= 0.
        """
        if self.seed is None and self._shards is None:
            raise ConfigError(
                "set_next_request needs a sampler with a seed: without one the coordinator "
                "numbers requests itself; construct RemoteSampler(..., seed=N)"
            )
        check_int("request_index", request_index, minimum=0)
        self._requests = request_index

    def close(self) -> None:
        """Closes the channel (idempotent)."""
        if not self._closed:
            self._closed = True
            self.result_route.close()
            self._channel.close()
            if self._shards is not None:
                self._shards.close()

    # --- internals ---------------------------------------------------------------------

    def _run_sample(
        self,
        mode: Mode,
        amount: int,
        *,
        fragment_length: int = 0,
        agent_update: AgentUpdateLike | None,
        env_update: EnvUpdateLike | None,
        itr: int = 0,
        progress: Progress | None,
    ) -> SampleAnswer:
        # Checked here: protobuf would raise ValueError or TypeError instead.
        check_int("the amount to sample", amount, minimum=1, maximum=_INT64_MAX)
        if mode is Mode.FRAGMENTS:
            check_int("fragment_length", fragment_length, minimum=1, maximum=_UINT32_MAX)
        check_int("itr", itr, minimum=-_INT64_MAX - 1, maximum=_INT64_MAX)
        ask = SampleAsk(
            mode,
            amount,
            fragment_length=fragment_length,
            seed=self.seed,
            wait_for_workers_seconds=self.wait_for_workers or 0.0,
            itr=itr,
        )
        agent = None if agent_update is None else agent_change_of(agent_update)
        env = None if env_update is None else env_change_of(env_update)
        if self._shards is not None:
            ask = dataclasses.replace(
                ask, request_index=self._requests, agent_update=agent, env_update=env
            )
            answer = self._shards.sample(ask, progress)
            self._requests += 1
            self._agent_version = answer.header.agent_version
            return answer
        return self._restoring_on_restart(lambda: self._sample_once(ask, agent, env, progress))

    def _sample_range(self, ask: SampleAsk, progress: Progress | None) -> SampleAnswer:
        """``ask`` as it is (its request index, no updates): one shard's piece of a request."""
        return self._restoring_on_restart(
            lambda: self._sample_once(ask, None, None, progress, counted=False)
        )

    def _apply_agent(self, update: AgentChange) -> int:
        """Pushes an agent change to this coordinator (restoring its state if it restarted)."""

        def push() -> int:
            agent, env = self._restore(update, None)
            if env is not None:
                self._push_env(env)
            assert agent is not None  # restoring keeps the caller's update
            return self._push_agent(agent)

        return self._restoring_on_restart(push)

    def _apply_env(self, update: EnvChange) -> int:
        """Pushes an env change to this coordinator (restoring its state if it restarted)."""

        def push() -> int:
            agent, env = self._restore(None, update)
            assert env is not None  # restoring keeps the caller's update
            generation = self._push_env(env)
            if agent is not None:
                self._push_agent(agent)
            return generation

        return self._restoring_on_restart(push)

    def _one_coordinator(self, what: str) -> None:
        if self._shards is not None:
            raise ConfigError(
                f"{what} works on one coordinator, and this sampler has {len(self.addresses)} "
                f"({self.address}); use a RemoteSampler with a single address for it"
            )

    def _sample_once(
        self,
        ask: SampleAsk,
        agent_update: AgentChange | None,
        env_update: EnvChange | None,
        progress: Progress | None,
        *,
        counted: bool = True,
    ) -> SampleAnswer:
        """One attempt at ``ask``, with this sampler's request index and state.

        ``counted=False``: with ``ask``'s own request index (a shard's piece).
        """
        agent, env = self._restore(agent_update, env_update)
        ask = dataclasses.replace(
            ask,
            request_index=self._requests if counted else ask.request_index,
            agent_update=agent,
            env_update=env,
            coordinator_id=self._pushed.expected_id,
        )
        with self.result_route.routed(ask, self.timeout) as (ask, data):
            call = self._stubs.sample(ask, timeout=self.timeout)
            try:
                reader = self._answers.reader(self._what("Sample"), keep_pieces=True)
                answer = collect_answer(call, reader, ask.mode, ask.amount, progress, data=data)
            except grpc.RpcError as exc:
                raise self._failed(exc, "Sample", timeout=self.timeout) from None
            finally:
                call.cancel()  # a no-op after a complete answer; frees the call on errors
        self._requests += counted
        self._agent_version = answer.header.agent_version
        if env is not None:
            self._pushed.env_applied(env)
        if agent is not None:
            self._pushed.agent_applied(agent, answer.header.agent_version)
        self._pushed.answered_by(answer.header.coordinator_id)
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
            self._pushed.suspect_restart = True
        return error

    def _push_agent(self, agent: AgentChange) -> int:
        push = UpdatePush(agent, self._pushed.expected_id)
        ack = self._unary(
            "UpdateAgent", lambda: self._stubs.update_agent(push, timeout=self.timeout)
        )
        self._agent_version = ack.agent_version
        self._pushed.agent_applied(agent, ack.agent_version)
        self._pushed.answered_by(ack.coordinator_id)
        return int(ack.agent_version)

    def _push_env(self, env: EnvChange) -> int:
        push = UpdatePush(env, self._pushed.expected_id)
        ack = self._unary("UpdateEnv", lambda: self._stubs.update_env(push, timeout=self.timeout))
        self._pushed.env_applied(env)
        self._pushed.answered_by(ack.coordinator_id)
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
            self._pushed.suspect_restart = True
            return attempt()

    def _restore(
        self, agent: AgentChange | None, env: EnvChange | None
    ) -> tuple[AgentChange | None, EnvChange | None]:
        """The updates to send: the caller's, plus this sampler's state on a new coordinator."""
        pushed = self._pushed
        if not (pushed.suspect_restart and pushed.pushed_anything):
            return agent, env
        status = self._unary("GetStatus", lambda: self._stubs.status(timeout=self.timeout))
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

    def _what(self, name: str) -> str:
        return f"{name} on coordinator {self.address}"
