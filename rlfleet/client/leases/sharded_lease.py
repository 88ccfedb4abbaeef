"""ShardedLease: a vector env's envs leased on several coordinators, one lease each.

A learner over several coordinators ("shards", docs/sharding.md) leases a
:class:`~rlfleet.client.RemoteVectorEnv`'s K envs on all of them: the
envs are cut into contiguous blocks in address order, as
:func:`~rlfleet.client.shards.split_ranges` cuts a request's episodes
(env ``i`` on shard ``s`` when ``K*s//N <= i < K*(s+1)//N``; with fewer
envs than shards, one env on each of the first K), and each block is one
:class:`~rlfleet.client.leases.lease_stream.LeaseStream` on its shard.
Contiguous blocks make a shard's env ``j`` the vector env's ``first + j``,
so translating ids, and the env indices in errors, is an addition.

This class speaks the LeaseStream interface RemoteVectorEnv uses, in the
vector env's env ids: a call on envs of several shards becomes one call per
shard, sent before any answer is awaited. Every shard's stream shares one
condition, notified whenever an answer lands or a lease fails, so
:meth:`ShardedLease.receive` waits on all the shards at once, up to the
caller's timeout and the envs' own deadlines, with no polling: that is why
each shard's data channel is read by a thread of its stream (one thread
hand-off per reply, which a one-coordinator lease avoids by reading on the
caller's thread).

A lease does not survive its coordinator, here as on one coordinator: if a
shard's coordinator dies, every call on its envs fails with the error its
lease ended with (an :class:`~rlfleet.errors.UnavailableError`), naming its
address; its envs are not leased again elsewhere (their episodes and state
lived there), while the other shards' envs keep working. Make a new vector
env to lease them again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from rlfleet.client.leases.lease_stream import LeaseEnvFailure, LeaseStream
from rlfleet.client.shards import split_ranges
from rlfleet.core import EnvSpec
from rlfleet.errors import RlfleetError, UsageError, WorkerError


class Channel(Protocol):
    """A lease's channel to its coordinator (a grpc.Channel), closed with the lease."""

    def close(self) -> None: ...


#: Opens the lease of ``count`` envs on ``address``, its env 0 being the
#: vector env's ``first``, with the shared condition: ``(stream, its channel)``.
OpenLease = Callable[[str, int, int, threading.Condition], tuple[LeaseStream, Channel]]


@dataclass(frozen=True, eq=False)
class _Shard:
    """One coordinator's lease: envs ``first .. first + stream.num_envs - 1``."""

    address: str
    first: int
    stream: LeaseStream
    channel: Channel


class ShardedLease:
    """K envs leased over several coordinators, in contiguous blocks (module docstring).

    Use :meth:`open`.
    """

    def __init__(self, shards: Sequence[_Shard], changed: threading.Condition) -> None:
        self._shards = list(shards)
        self._changed = changed
        #: The shard of each env.
        self._shard_of = [shard for shard in self._shards for _ in range(shard.stream.num_envs)]
        self.num_envs = len(self._shard_of)

    @classmethod
    def open(cls, addresses: Sequence[str], num_envs: int, lease: OpenLease) -> ShardedLease:
        """Opens one lease per coordinator of ``addresses`` at once (one block of envs each).

        Raises:
            RlfleetError: The first shard's failure to open (its own type,
                naming its address), after every lease opened was released.
        """
        changed = threading.Condition(threading.Lock())
        blocks = list(zip(addresses, split_ranges(0, num_envs, len(addresses)), strict=False))
        shards: list[_Shard] = []
        failures: list[BaseException] = []
        with ThreadPoolExecutor(len(blocks), thread_name_prefix="rlfleet-lease-open") as pool:
            futures = [
                pool.submit(lease, address, first, count, changed)
                for address, (first, count) in blocks
            ]
            for (address, (first, _)), future in zip(blocks, futures, strict=True):
                try:
                    stream, channel = future.result()
                except RlfleetError as exc:
                    failures.append(_located(exc, address, first))
                except BaseException as exc:  # raised once every lease is settled
                    failures.append(exc)
                else:
                    shards.append(_Shard(address, first, stream, channel))
        sharded = cls(shards, changed)
        if failures:
            sharded.close()
            raise failures[0]
        return sharded

    # --- what RemoteVectorEnv reads ---------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """The coordinators holding a block of envs, in env order."""
        return [shard.address for shard in self._shards]

    @property
    def lease_ids(self) -> list[int]:
        """Each shard's lease id (its coordinator's number), in env order."""
        return [shard.stream.lease_id for shard in self._shards]

    @property
    def env_spec(self) -> EnvSpec:
        """Env 0's spec."""
        return self._shards[0].stream.env_spec

    @property
    def env_specs(self) -> list[EnvSpec]:
        """Each env's spec, env i's at index i."""
        return [spec for shard in self._shards for spec in shard.stream.env_specs]

    @property
    def env_workers(self) -> list[str]:
        """The worker hosting each env (names are per coordinator)."""
        return [worker for shard in self._shards for worker in shard.stream.env_workers]

    @property
    def carrier(self) -> str:
        """The shards' carrier (LeaseStream.carrier); their list, comma-joined, if they differ."""
        carriers = [shard.stream.carrier for shard in self._shards]
        return carriers[0] if len(set(carriers)) == 1 else ",".join(carriers)

    # --- calls ----------------------------------------------------------------------

    def send(
        self, op: str, ids: Sequence[int], args: Sequence[Any], *, whole_reply: bool = False
    ) -> None:
        """Starts ``op`` on envs ``ids`` (``args[k]`` for ``ids[k]``): one call per shard.

        As :meth:`LeaseStream.send`: nothing is awaited and nothing raised;
        every env of ``ids`` answers once through :meth:`receive`.
        """
        parts = self._parts(ids)
        if len(parts) == 1:  # the caller's rows as they are (an action array)
            ((shard, (_, local)),) = parts.items()
            shard.stream.send(op, local, args, whole_reply=whole_reply)
            return
        for shard, (positions, local) in parts.items():
            rows = [args[k] for k in positions]
            shard.stream.send(op, local, rows, whole_reply=whole_reply)

    def receive(self, ids: Sequence[int], count: int, timeout: float | None) -> dict[int, Any]:
        """Answers of envs ``ids`` once ``count`` have one, or after ``timeout`` seconds.

        As :meth:`LeaseStream.receive`, over every shard at once: the wait
        ends as soon as ``count`` envs of any shards answered, when
        ``timeout`` passes, or at the earliest ``call_timeout`` of an env
        in flight (which is then answered with its timeout). A shard's
        failure names its coordinator.

        Returns:
            ``{env id: answer}`` of the envs that answered by then.
        """
        end = None if timeout is None else time.monotonic() + timeout
        parts = [(shard, local) for shard, (_, local) in self._parts(ids).items()]
        with self._changed:  # every shard's lock: their answers hold still
            while True:
                now = time.monotonic()
                earliest = end
                found = []
                total = 0
                for shard, local in parts:
                    ready, due = shard.stream.answered(local, now)
                    if ready:
                        found.append((shard, ready))
                        total += len(ready)
                    if due is not None and (earliest is None or due < earliest):
                        earliest = due
                if total >= count or (end is not None and now >= end):
                    return {
                        shard.first + i: _answer_of(answer, shard)
                        for shard, ready in found
                        for i, answer in shard.stream.take(ready).items()
                    }
                if earliest is None:
                    raise UsageError(f"envs {list(ids)} have no call in flight")
                # Any shard's answer or failure notifies this shared condition.
                self._changed.wait(max(earliest - now, 0.0) + 1e-3)

    def take_prefetched(
        self, ids: Sequence[int], args: Sequence[Any]
    ) -> dict[int, tuple[Any, dict[str, Any]]]:
        """:meth:`LeaseStream.take_prefetched` of each shard's envs among ``ids``."""
        found: dict[int, tuple[Any, dict[str, Any]]] = {}
        for shard, (positions, local) in self._parts(ids).items():
            hits = shard.stream.take_prefetched(local, [args[k] for k in positions])
            found.update((shard.first + i, hit) for i, hit in hits.items())
        return found

    def close(self, timeout: float = 5.0) -> None:
        """Releases every shard's lease and closes its channel.

        Raises:
            Exception: The first error a shard's release raised, after every
                shard was released.
        """
        errors: list[BaseException] = []
        for shard in self._shards:
            try:
                shard.stream.close(timeout)
            except Exception as exc:  # the other shards must be released even so
                errors.append(exc)
            shard.channel.close()
        if errors:
            raise errors[0]

    def _parts(self, ids: Sequence[int]) -> dict[_Shard, tuple[list[int], list[int]]]:
        """Each shard's envs among ``ids``: their positions in ``ids`` and their
        ids in the shard's own lease; shards in env order."""
        shard_of = self._shard_of
        parts: dict[_Shard, tuple[list[int], list[int]]] = {}
        for k, i in enumerate(ids):
            shard = shard_of[i]
            positions, local = parts.setdefault(shard, ([], []))
            positions.append(k)
            local.append(i - shard.first)
        return parts


def _answer_of(answer: Any, shard: _Shard) -> Any:
    """An answer of ``shard``'s lease as the vector env sees it (a failure names the shard)."""
    if isinstance(answer, LeaseEnvFailure):
        return LeaseEnvFailure(_located(answer.error, shard.address, shard.first))
    return answer


def _located(error: RlfleetError, address: str, first_env: int) -> RlfleetError:
    """``error`` of the lease on ``address`` as the vector env reports it: of the
    same type, naming that coordinator, its env index the vector env's own."""
    located: RlfleetError
    if isinstance(error, WorkerError):
        located = type(error)(
            f"coordinator {address}: {error.bare_message}",
            worker=error.worker,
            env_index=None if error.env_index is None else first_env + error.env_index,
            step=error.step,
            episode_index=error.episode_index,
            remote_traceback=error.remote_traceback,
        )
    else:
        located = type(error)(f"coordinator {address}: {error}")
    located.__cause__ = error
    return located


__all__ = ["OpenLease", "ShardedLease"]
