"""RemoteVectorEnv: tianshou's vector env with its envs on fleet workers.

The counterpart of tianshou's ``RayVectorEnv``, without Ray and, unless the
fleet takes code, without pickle: the envs are leased on the fleet's
workers (step-level env leases, protos/rlfleet/v1/leases.proto) and
stepped over one stream through the coordinator, so workers need no
inbound port. The learner keeps the policy:
this is central inference (SEED RL), envs on many machines and one batched
policy on the learner's device.

It is one more :class:`~rlfleet.envs.BaseVectorEnv` backend: every public
method, the async mode (``wait_num``/``timeout``) and the error rules come
from the base class; this module only sends commands over a
:class:`~rlfleet.client.leases.lease_stream.LeaseStream` (over several
coordinators, a :class:`~rlfleet.client.leases.sharded_lease.ShardedLease`
of one such lease per coordinator) and collects answers.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

import grpc

from rlfleet._util.values import check_int
from rlfleet.client.fleet import Fleet
from rlfleet.client.leases.lease_stream import LeaseEnvFailure, LeaseStream
from rlfleet.client.leases.sharded_lease import ShardedLease
from rlfleet.client.sampler import RemoteSampler
from rlfleet.client.shards import parse_addresses
from rlfleet.core import EnvSpec
from rlfleet.envs import BaseVectorEnv, EnvConfig
from rlfleet.envs.batching import Seeds
from rlfleet.envs.commands import GET_ATTR, RESET, EnvFactory, FailedCall, check_env_fns
from rlfleet.errors import ConfigError
from rlfleet.security import ClientSecurity, Token
from rlfleet.security.pickle import dumps as pickle_dumps
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.data_address import coordinator_host

logger = logging.getLogger("rlfleet.client")

FleetLike: TypeAlias = str | RemoteSampler | Fleet
#: The env id a lease of pickled factories names them by in messages.
_PICKLED_ENV_ID = "rlfleet/pickled-factories"
#: Most workers an embedded fleet of RemoteVectorEnv(env_fns) starts.
_MAX_OWN_WORKERS = 8

#: Attributes answered from the lease's EnvSpec, without a round trip.
_LOCAL_ATTRIBUTES = ("observation_space", "action_space")


class RemoteVectorEnv(BaseVectorEnv):
    """``num_envs`` envs leased on a fleet, with the API of ``SubprocVectorEnv``.

    Each env is built on a worker exactly like ``gymnasium.make`` builds it
    here, so env ``i`` reset with seed ``s`` and given the same actions
    follows the trajectory a local env follows, whichever worker hosts it.
    If a worker dies, its envs are re-created on other workers: the next
    answer of each such env is ``truncated`` with
    ``info["rlfleet_env_lost"] = True`` (its episode was cut), and the env is
    reset like after any end of episode. With no worker left to host them,
    calls fail with :class:`~rlfleet.errors.NoWorkersError`.

    **Over several coordinators** (a RemoteSampler or address list naming
    several, or ``Fleet.local(coordinators=N)``), the envs are cut into
    contiguous blocks, one lease per coordinator on its own workers (env
    ``i`` of K on coordinator ``s`` when ``K*s//N <= i < K*(s+1)//N``), and
    the vector env behaves as on one: same ids, seeds, answers and async
    mode, every failure naming its coordinator. A lease does not outlive its
    coordinator: if one dies, calls on its envs raise the
    :class:`~rlfleet.errors.UnavailableError` its lease ended with, and
    they are not leased again elsewhere (docs/sharding.md).

    **tianshou's form**, ``RemoteVectorEnv(env_fns, wait_num=..., on=...)``
    as ``RayVectorEnv(env_fns, ...)``: one env per factory. Factories that
    are all the same :class:`~rlfleet.envs.EnvConfig` lease that env id, on
    any fleet. Any other factories (lambdas, classes, differing configs)
    are code, and travel only where the fleet takes code: always to an
    embedded fleet's own workers (``on=Fleet.local(...)``, or no ``on``: a
    fleet of its own is started, and closed with this vector env), over the
    network only to a coordinator and workers both started with
    ``--allow-pickle`` (which needs TLS and tokens). Elsewhere the lease is
    refused with :class:`~rlfleet.errors.PermissionDeniedError` saying how
    to register the env on the workers (``--import``). A lease of pickled
    factories carries what ``RayVectorEnv`` carries: objects in infos,
    attributes and return values, Dict observations and envs of different
    spaces (:attr:`env_specs`) travel pickled (rlfleet.wire.lease_values),
    and this learner unpickles them on such a lease only. A lease of an env
    id carries numbers, arrays and JSON, and refuses the rest saying how to
    opt in.

    Args:
        fleet: Where to lease: a coordinator's ``HOST:PORT`` (several
            joined by commas), a :class:`~rlfleet.client.RemoteSampler` (its
            addresses and credentials), or a :class:`~rlfleet.client.Fleet`
            (``Fleet.local``);
            None starts an embedded fleet of its own (``Fleet.local``, up to 8
            workers, closed with this vector env); or tianshou's ``env_fns``
            (then ``env`` and ``num_envs`` are not given, and ``on`` says where).
        env: The env: a gymnasium id or an EnvConfig (registered on the
            workers; custom envs via the workers' ``--import``).
        num_envs: How many envs to lease.
        on: With ``env_fns``, where to lease (as ``fleet``); None starts an
            embedded fleet of its own (``Fleet.local``, up to 8 workers).
        seed: Seeds of the envs' first reset, as :meth:`seed` takes them
            (None, an int ``s`` for ``s + i``, or one per env); they travel
            with that reset (``LeaseCall.seeds``).
        wait_num: Async mode (tianshou's): :meth:`step` returns once this
            many envs are ready. None: all of them.
        timeout: Async mode: seconds :meth:`step` waits for ``wait_num``
            envs before returning the ready ones.
        call_timeout: Deadline of each env's answer, in seconds; past it the
            call raises :class:`~rlfleet.errors.RlfleetTimeoutError` naming it.
        open_timeout: Seconds to wait for workers with free slots to take
            and build the envs.
        prefetch_resets: Workers reset an env as soon as its episode ends
            and send that reset with the step, so a later ``reset(id)``
            without seed or options costs no round trip (its observation is
            that of a reset made when the episode ended). A seeded reset
            resets the env again, as asked.
        learner: This learner's name for the coordinator's per-learner caps
            (``--max-leases-per-learner``, ``--max-envs-per-learner``); the
            coordinator adds the host it calls from. None: ``HOST:PID`` of
            this process, so all its vector envs count as one learner.
        token: Learner token when ``fleet`` is an address (None reads
            ``RLFLEET_TOKEN``/``RLFLEET_LEARNER_TOKEN``).
        tls_ca: PEM CA bundle for a TLS coordinator, when ``fleet`` is an address.

    Raises:
        ConfigError: For bad arguments, or factories that are code over
            several coordinators (lease an env id there).
        NoWorkersError: If no worker took the envs within ``open_timeout``
            (workers host up to their ``--envs`` leased envs each).
        ResourceExhaustedError: Past the coordinator's lease caps.
        WorkerError: If a worker could not build the env.
    """

    def __init__(
        self,
        fleet: FleetLike | Sequence[EnvFactory] | None,
        env: str | EnvConfig | None = None,
        num_envs: int | None = None,
        *,
        on: FleetLike | None = None,
        seed: Seeds = None,
        wait_num: int | None = None,
        timeout: float | None = None,
        call_timeout: float = 60.0,
        open_timeout: float = 60.0,
        prefetch_resets: bool = True,
        learner: str | None = None,
        token: str | Token | None = None,
        tls_ca: str | None = None,
    ) -> None:
        for name, value in (("call_timeout", call_timeout), ("open_timeout", open_timeout)):
            if not value > 0:
                raise ConfigError(f"RemoteVectorEnv {name} must be > 0 seconds, got {value!r}")
        own_fleet: Fleet | None = None
        pickled = b""
        where = cast("FleetLike | None", fleet)
        if _is_env_fns(fleet):
            if env is not None or num_envs is not None:
                raise ConfigError(
                    "RemoteVectorEnv(env_fns) leases one env per factory: give no env or "
                    "num_envs, and say where with on=... (None: a fleet of its own)"
                )
            factories = check_env_fns(fleet)  # type: ignore[arg-type]
            num_envs = len(factories)
            env, pickled = _lease_source(factories)
            where = on
        # LeaseOpen.num_envs is a uint32; the coordinator's --max-leased-envs caps it lower.
        num_envs = check_int("RemoteVectorEnv num_envs", num_envs, maximum=2**32 - 1)
        config = EnvConfig(env) if isinstance(env, str) else env
        if not isinstance(config, EnvConfig):
            raise ConfigError(f"env must be a gymnasium id or an EnvConfig, got {env!r}")
        if where is None:
            where = own_fleet = _own_fleet(num_envs, open_timeout)
        # Only a lease of pickled factories carries (and is unpickled) pickled values.
        pickles = bool(pickled)
        local_factories = None
        if pickled and isinstance(where, Fleet) and len(where.addresses) == 1:
            # Its coordinator runs in this process: the factories reach it in
            # memory, and it builds the envs on its own children only.
            local_factories = where.server.coordinator.leases
            config = EnvConfig(local_factories.register_local_factories(pickled))
            pickled = b""
        try:
            self._open(
                where,
                config=config,
                num_envs=num_envs,
                pickled=pickled,
                pickles=pickles,
                call_timeout=call_timeout,
                open_timeout=open_timeout,
                prefetch_resets=prefetch_resets,
                learner=learner,
                token=token,
                tls_ca=tls_ca,
            )
        except BaseException:
            if local_factories is not None:
                local_factories.forget_local_factories(config.id)
            if own_fleet is not None:
                own_fleet.close()
            raise
        # The lease keeps what it was built from; the envs are rebuilt from
        # the coordinator's copy if a worker dies.
        #: The embedded fleet this vector env started for itself (None if it was given one).
        self.own_fleet = own_fleet
        forget = None
        if local_factories is not None:
            forget = functools.partial(local_factories.forget_local_factories, config.id)
        release = _Release(self._stream, own_fleet, forget, self._channel)
        try:
            super().__init__(num_envs, release, wait_num=wait_num, timeout=timeout)
        except BaseException:
            release()
            raise
        if seed is not None:
            self._seed_next_reset(seed)
        stream = self._stream
        logger.info(
            "leased %d envs of %s (%s) on %s",
            num_envs,
            config.id,
            f"lease {stream.lease_id}"
            if isinstance(stream, LeaseStream)
            else ", ".join(
                f"lease {n} on {a}" for n, a in zip(stream.lease_ids, stream.addresses, strict=True)
            ),
            sorted(set(stream.env_workers)),
        )

    def _open(
        self,
        fleet: FleetLike,
        *,
        config: EnvConfig,
        num_envs: int,
        pickled: bytes,
        pickles: bool,
        call_timeout: float,
        open_timeout: float,
        prefetch_resets: bool,
        learner: str | None,
        token: str | Token | None,
        tls_ca: str | None,
    ) -> None:
        """Opens the lease, or one per coordinator (sets ``_stream``, ``env_config``)."""
        in_process = None
        if isinstance(fleet, Fleet):
            if len(fleet.addresses) == 1:
                # Its coordinator runs in this process: the lease's frames need no socket.
                data_server = fleet.server.coordinator.lease_data
                in_process = None if data_server is None else data_server.attach_in_process
            fleet = fleet.sampler
        sampler_channel = None
        if isinstance(fleet, RemoteSampler):
            addresses, security = fleet.addresses, fleet.security
            max_message_bytes = fleet.max_message_bytes
            if len(addresses) == 1:
                sampler_channel = fleet.open_channel  # the sampler's own way to dial
        elif isinstance(fleet, str):
            addresses = parse_addresses(fleet)
            security = ClientSecurity.from_options(tls_ca=tls_ca, token=token)
            max_message_bytes = _rpc.DEFAULT_MAX_MESSAGE_BYTES
        else:
            raise ConfigError(
                f"fleet must be an address, a RemoteSampler or a Fleet, got {type(fleet).__name__}"
            )
        if pickled and len(addresses) > 1:
            raise ConfigError(
                f"RemoteVectorEnv(env_fns) of code (not one EnvConfig) leases on one "
                f"coordinator, and this fleet has {len(addresses)} ({','.join(addresses)}): "
                "register the env on the workers (rlfleet worker --import mypkg.envs) and "
                "lease its id, or use one coordinator"
            )
        name = f"{socket.gethostname()}:{os.getpid()}" if learner is None else learner

        def lease(
            address: str, first: int, count: int, changed: threading.Condition | None
        ) -> tuple[LeaseStream, grpc.Channel]:
            channel = (
                sampler_channel()
                if sampler_channel is not None
                else _rpc.open_channel(
                    address, max_message_bytes=max_message_bytes, security=security
                )
            )
            try:
                stream = LeaseStream(
                    channel,
                    config,
                    count,
                    open_timeout=open_timeout,
                    call_timeout=call_timeout,
                    prefetch_resets=prefetch_resets,
                    learner=name,
                    data_host=coordinator_host(address),
                    tls=security.tls,
                    max_message_bytes=max_message_bytes,
                    data_in_process=in_process,
                    pickled_factories=pickled,
                    pickles=pickles,
                    changed=changed,
                    first_env=first,
                )
            except BaseException:
                channel.close()
                raise
            return stream, channel

        if len(addresses) == 1:
            stream, channel = lease(addresses[0], 0, num_envs, None)
            self._stream: LeaseStream | ShardedLease = stream
            self._channel: grpc.Channel | None = channel
        else:
            self._stream = ShardedLease.open(addresses, num_envs, lease)
            self._channel = None  # each shard's lease holds its own
        self.env_config = config
        # Answers of attribute reads served from the EnvSpec, until received.
        self._local: dict[int, Any] = {}

    @property
    def env_spec(self) -> EnvSpec:
        """Spaces and episode limit of env 0: of every env, unless factories
        built envs with different ones (see :attr:`env_specs`)."""
        return self._stream.env_spec

    @property
    def env_specs(self) -> list[EnvSpec]:
        """Spaces and episode limit of each env, env i's at index i."""
        return list(self._stream.env_specs)

    @property
    def env_workers(self) -> list[str]:
        """The worker hosting each env, as of its latest answer (the lease's
        opening until then): an env re-created after its worker was lost names
        its new host from the answer that reports the loss (info
        ``rlfleet_env_lost``)."""
        return list(self._stream.env_workers)

    def _seed_envs(self, ids: list[int], seeds: list[int | None]) -> list[Any]:
        """seed(): leased envs are gymnasium envs, seeded by a reset (tianshou's way)."""
        self._call(ids, RESET, [{"seed": seed} for seed in seeds])
        return [[seed] for seed in seeds]

    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        if command == GET_ATTR and args and args[0] in _LOCAL_ATTRIBUTES:
            specs = self._stream.env_specs
            self._local.update((i, getattr(specs[i], args[0])) for i in ids)
            return
        if command == RESET:
            # Episode ends were reset by the workers already (prefetch_resets).
            hits = self._stream.take_prefetched(ids, args)
            self._local.update(hits)
            if hits:
                rest = [k for k, i in enumerate(ids) if i not in hits]
                if rest:
                    self._stream.send(
                        command,
                        [ids[k] for k in rest],
                        [args[k] for k in rest],
                        whole_reply=not self.is_async,
                    )
                return
        # In sync mode every env's answer is awaited: one message carries them all.
        self._stream.send(command, ids, args, whole_reply=not self.is_async)

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        if self._local:
            ready = {i: self._local.pop(i) for i in ids if i in self._local}
            rest = [i for i in ids if i not in ready]
        else:
            ready, rest = {}, ids
        if rest and len(ready) < count:
            answers = self._stream.receive(rest, count - len(ready), timeout)
            ready.update(answers)
            for i, a in answers.items():
                if isinstance(a, LeaseEnvFailure):
                    ready[i] = FailedCall(a.error)
        return ready


def _is_env_fns(value: object) -> bool:
    """Whether the first argument is tianshou's ``env_fns`` (a list of callables)."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and len(value) > 0
        and all(callable(item) for item in value)
    )


def _lease_source(factories: list[EnvFactory]) -> tuple[EnvConfig, bytes]:
    """What to lease for ``factories``: one shared EnvConfig, or their pickles."""
    first = factories[0]
    if isinstance(first, EnvConfig) and all(f == first for f in factories):
        return first, b""
    return EnvConfig(_PICKLED_ENV_ID), pickle_dumps(factories, "RemoteVectorEnv env_fns")


def _own_fleet(num_envs: int, join_timeout: float) -> Fleet:
    """The embedded fleet a RemoteVectorEnv(env_fns) without ``on`` starts for itself."""
    workers = max(1, min(num_envs, os.cpu_count() or 1, _MAX_OWN_WORKERS))
    return Fleet.local(
        workers=workers,
        envs_per_worker=math.ceil(num_envs / workers),
        join_timeout=join_timeout,
        authenticate=True,
    )


class _Release:
    """Closes the lease(s), their channels and an own fleet (not the vector env itself)."""

    def __init__(
        self,
        stream: LeaseStream | ShardedLease,
        fleet: Fleet | None,
        forget: Callable[[], None] | None,
        channel: grpc.Channel | None = None,
    ) -> None:
        self._stream = stream
        self._channel = channel
        self._fleet = fleet
        self._forget = forget

    def __call__(self) -> list[BaseException]:
        errors: list[BaseException] = []
        try:
            self._stream.close()
        except Exception as exc:  # the channel must close even so
            errors.append(exc)
        if self._channel is not None:
            self._channel.close()
        if self._forget is not None:
            self._forget()
        if self._fleet is not None:
            self._fleet.close()
        return errors
