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

import os
from collections.abc import Sequence
from typing import Literal

import grpc

from rlfleet._util.closing import ClosesOnExit
from rlfleet._util.values import check_int
from rlfleet.client._coordinator_calls import CoordinatorCalls, Progress
from rlfleet.client._learner_messages import (
    AgentUpdateLike,
    EnvUpdateLike,
    agent_change_of,
    env_change_of,
)
from rlfleet.client._responses import AnswerMemory, SampleAnswer
from rlfleet.client._result_route import ResultRoute
from rlfleet.client.shards import ShardSet, parse_addresses, random_seed
from rlfleet.client.status import FleetStatus, count_workers
from rlfleet.client.stream import SampleStream, subscribe_ask
from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.errors import ConfigError, NoWorkersError
from rlfleet.protocol.learner_calls import SampleAsk
from rlfleet.protocol.modes import Mode
from rlfleet.security import ClientSecurity, Token
from rlfleet.transport import rpc as _rpc

#: What the protocol's integer fields hold (learner.proto).
_UINT32_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1

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
        self.wait_for_workers = wait_for_workers
        self._max_message_bytes = max_message_bytes
        self._security = ClientSecurity.from_options(
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_server_name=tls_server_name,
            token=token,
        )
        self._answers = AnswerMemory()
        # Over several coordinators every call goes through the shards' own
        # calls; this one's channel (gRPC connects lazily) then never connects.
        self._coordinator = CoordinatorCalls(
            addresses[0],
            timeout=timeout,
            max_message_bytes=max_message_bytes,
            security=self._security,
            answers=self._answers,
        )
        self._shards: ShardSet | None = None
        #: Where requests, updates and subscriptions go.
        self._calls: ShardSet | CoordinatorCalls = self._coordinator
        if len(addresses) > 1:
            shards = [
                CoordinatorCalls(
                    address,
                    timeout=timeout,
                    max_message_bytes=max_message_bytes,
                    security=self._security,
                )
                for address in addresses
            ]
            self._shards = ShardSet(shards, seed=random_seed() if seed is None else seed)
            self._calls = self._shards
        self._requests = 0
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
        return self._calls.update_agent(agent_change_of(agent_update))

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
        return self._calls.update_env(env_change_of(env_update))

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
        return self._calls.subscribe(ask, timeout)

    @property
    def timeout(self) -> float | None:
        """Deadline of each call in seconds (None: none)."""
        return self._coordinator.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._coordinator.timeout = value

    @property
    def result_route(self) -> ResultRoute:
        """Where Sample answers' results travel (rlfleet.client._result_route)."""
        return self._coordinator.result_route

    @property
    def security(self) -> ClientSecurity:
        """The TLS settings and token this sampler dials with."""
        return self._security

    @property
    def max_message_bytes(self) -> int:
        """The largest message this sampler sends and accepts, result messages aside.

        Result messages as the coordinator forwards them are accepted up to
        ``rlfleet.wire.chunks.FORWARDED_RESULT_BYTES`` whatever this says.
        """
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
        return self._calls.status()

    @property
    def agent_version(self) -> int | None:
        """The agent version of the last answer or update (None before any)."""
        return self._calls.agent_version

    @property
    def coordinator_id(self) -> str | None:
        """The id of the coordinator process that answered this sampler last (None before).

        It changes when the coordinator restarted (``FleetStatus.coordinator_id``).
        """
        return self._coordinator.pushed.coordinator_id

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
            self._coordinator.close()
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
            request_index=self._requests,
            agent_update=None if agent_update is None else agent_change_of(agent_update),
            env_update=None if env_update is None else env_change_of(env_update),
            wait_for_workers_seconds=self.wait_for_workers or 0.0,
            itr=itr,
        )
        # A failed call does not count: retried, it gets the same seeds.
        answer = self._calls.sample(ask, progress)
        self._requests += 1
        return answer

    def _one_coordinator(self, what: str) -> None:
        if self._shards is not None:
            raise ConfigError(
                f"{what} works on one coordinator, and this sampler has {len(self.addresses)} "
                f"({self.address}); use a RemoteSampler with a single address for it"
            )
