"""One learner over several coordinators: each request cut into episode ranges.

One coordinator's Python runs under one GIL, so past about a core's worth
of results, more workers on it add nothing (docs/performance.md,
"Coordinator capacity: the model"). A :class:`~rlfleet.client.RemoteSampler`
given several addresses spreads each request over that many coordinators
("shards"), each with its own workers, through this module.

Why the batch does not depend on the number of shards: episode ``k`` of
request ``n`` gets its seeds from ``(seed, n, k)`` whoever runs it
(:mod:`rlfleet.core.seeding`). The sampler cuts the request's episode
indices into contiguous ranges and asks each shard for one range
(``SampleRequest.first_episode``); every result carries its global
``episode_index``, so the project's one assembler joins the pieces in
index order. A STEPS request becomes waves of such ranges, sized with the
mean episode length, until the episodes 0..m whose lengths first reach the
amount are all back: the same m, and the same episodes, as one coordinator
answers with.

A shard that is lost during a call (unreachable, dead, or without workers
until its wait ran out) has its ranges re-run by the other shards, so the
call still returns the same batch; only when every shard is lost does the
call fail, with an :class:`~rlfleet.errors.UnavailableError` naming each
shard and what it answered. A lost shard is tried again after
:data:`RETRY_LOST_SECONDS`, first brought up to the learner's env and agent
if it missed an update.

Fragment requests and subscriptions are not cut into ranges: a fragment
stream lives on one coordinator's env slot, so each coordinator runs its
own streams, for a share of the amount, and a fragments call during which
one is lost fails (:mod:`rlfleet.client.shard_fragments`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from rlfleet.client._coordinator_calls import CoordinatorCalls, Progress
from rlfleet.client._responses import SampleAnswer
from rlfleet.client._restore import PushedState
from rlfleet.client.shard_fragments import (
    env_slots,
    fragment_shares,
    renumbered,
    renumbered_batch,
)
from rlfleet.client.status import FleetStatus
from rlfleet.client.stream import MergedStream, SampleStream, StreamedBatch
from rlfleet.core.seeding import shard_seed
from rlfleet.errors import ConfigError, NoWorkersError, UnavailableError
from rlfleet.protocol.learner_calls import SampleAsk, SubscribeAsk
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.wire.results import Result

logger = logging.getLogger("rlfleet.client")

T = TypeVar("T")

#: Seconds after which a lost shard is tried again (sooner, every call would
#: first wait for an unreachable host to fail).
RETRY_LOST_SECONDS = 30.0
#: Episodes per shard in a STEPS request's first wave while no episode
#: length is known yet (later waves are sized with the mean length).
FIRST_WAVE_EPISODES_PER_SHARD = 8
#: The errors that make a shard lost for a call: its ranges go elsewhere.
LOST = (UnavailableError, NoWorkersError)


def parse_addresses(address: str | Sequence[str]) -> tuple[str, ...]:
    """The coordinator addresses of a sampler's ``address`` argument.

    Args:
        address: ``"HOST:PORT"``, several joined by commas, or a sequence of them.

    Raises:
        ConfigError: If there is none, one is not a non-empty string, or one
            comes twice (its episodes would be run twice as fast, not twice).
    """
    if isinstance(address, str):
        addresses = tuple(part.strip() for part in address.split(","))
    elif isinstance(address, Sequence):
        addresses = tuple(address)
    else:
        raise ConfigError(
            f"address must be 'HOST:PORT' or a sequence of them, got {type(address).__name__}"
        )
    if not addresses:
        raise ConfigError("address names no coordinator: give at least one 'HOST:PORT'")
    for item in addresses:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"every coordinator address must be a non-empty 'HOST:PORT' string, got {item!r} "
                f"in {address!r}"
            )
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ConfigError(
            f"coordinator address(es) {repeated} given twice in {address!r}: name each "
            "coordinator once"
        )
    return addresses


def random_seed() -> int:
    """A base seed for a sharded sampler without one.

    Without a seed each coordinator would use its own seed and request
    counter, and two shards could run the same episode seeds; one base seed
    drawn by the learner keeps every episode of every shard distinct.
    """
    return secrets.randbits(63)


@dataclasses.dataclass(eq=False)
class Shard:
    """One coordinator of a sharded sampler.

    Attributes:
        coordinator: The sampler's calls to it.
        lost_at: ``time.monotonic()`` when it was last found lost, else None.
        behind: It missed an update: push the learner's env and agent first.
        error: What it answered when it was lost.
    """

    coordinator: CoordinatorCalls
    lost_at: float | None = None
    behind: bool = False
    error: str = ""

    @property
    def address(self) -> str:
        return self.coordinator.address


class _Progress:
    """Sums the progress of pieces running in parallel for the caller's callback."""

    def __init__(self, callback: Progress | None, target: int) -> None:
        self._callback = callback
        self._target = target
        self._done = 0
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        if self._callback is None or amount <= 0:
            return
        with self._lock:
            self._done += amount
            self._callback(min(self._done, self._target), self._target)

    def piece(self) -> Progress | None:
        """A callback for one piece's own ``(done, target)`` reports."""
        if self._callback is None:
            return None
        last = 0

        def report(done: int, _target: int) -> None:
            nonlocal last
            self.add(done - last)
            last = done

        return report


class ShardSet:
    """Serves a sampler's requests and updates over several coordinators.

    Args:
        coordinators: The calls to each shard's coordinator (closed with the set).
        seed: Base seed of every request.
    """

    def __init__(self, coordinators: Sequence[CoordinatorCalls], *, seed: int) -> None:
        self.shards = [Shard(coordinator) for coordinator in coordinators]
        self.seed = seed
        #: The agent version of the last answer or update (None before any).
        self.agent_version: int | None = None
        self._pool = ThreadPoolExecutor(len(self.shards), thread_name_prefix="rlfleet-shard")
        self._pushed = PushedState()
        #: Mean episode length of the last STEPS call's episodes (sizes waves).
        self._mean_length: float | None = None

    # --- requests ------------------------------------------------------------------

    def sample(self, ask: SampleAsk, progress: Progress | None) -> SampleAnswer:
        """Runs a Sample request (with ``ask.request_index``) over the shards.

        Raises:
            UnavailableError: If every shard was lost; for FRAGMENTS, also
                if one shard was lost during the call (its streams cannot
                continue elsewhere).
        """
        # Updates go to every shard before any samples; a shard that misses
        # one is brought up to date before it samples again.
        if ask.env_update is not None:
            self.update_env(ask.env_update)
        if ask.agent_update is not None:
            self.update_agent(ask.agent_update)
        ask = dataclasses.replace(ask, seed=self.seed, agent_update=None, env_update=None)
        tracker = _Progress(progress, ask.amount)
        if ask.mode == Mode.FRAGMENTS:
            answer = self._sample_fragments(ask, tracker)
        elif ask.mode == Mode.EPISODES:
            answers = self._run(ask, split_ranges(0, ask.amount, self._live_count()), tracker)
            answer = _joined(answers, ask.amount)
        else:
            answer = self._sample_steps(ask, tracker)
        self.agent_version = answer.header.agent_version
        return answer

    def _sample_steps(self, ask: SampleAsk, tracker: _Progress) -> SampleAnswer:
        """STEPS: waves of episode ranges until episodes 0..m reach the amount."""
        answers: list[SampleAnswer] = []
        lengths: dict[int, int] = {}
        next_index = prefix_end = prefix_steps = 0
        while True:
            shards = self._live_count()
            if self._mean_length is None:
                count = FIRST_WAVE_EPISODES_PER_SHARD * shards
            elif not lengths:
                # The mean is the previous call's, and a learning agent's
                # episodes grow: half the estimate runs no episode past m
                # unless their mean length more than doubled since.
                count = math.ceil(ask.amount / self._mean_length / 2)
            else:
                # One spare episode per shard: this wave usually ends the request.
                count = math.ceil((ask.amount - prefix_steps) / self._mean_length) + shards
            wave = self._run(ask, split_ranges(next_index, count, shards), None)
            next_index += count
            answers.extend(wave)
            for answer in wave:
                for result in answer.results:
                    batch = result.arrays
                    indices = batch.episode_infos["episode_index"].tolist()
                    lengths.update(zip(indices, batch.lengths.tolist(), strict=True))
                    tracker.add(batch.total_steps)
            while prefix_end in lengths and prefix_steps < ask.amount:
                prefix_steps += lengths[prefix_end]
                prefix_end += 1
            total = sum(lengths.values())
            self._mean_length = total / len(lengths) if lengths else self._mean_length
            if prefix_steps >= ask.amount:
                answer = _joined(answers, prefix_end)
                answer.footer = dataclasses.replace(answer.footer, total_steps=prefix_steps)
                return answer

    def _sample_fragments(self, ask: SampleAsk, tracker: _Progress) -> SampleAnswer:
        """FRAGMENTS: every shard runs its own streams, for its share of the amount.

        Raises:
            UnavailableError: If a shard was lost during the call: its
                streams' episodes live on its workers and cannot continue on
                another coordinator.
        """
        # A shard lost before this call (and not due for another try yet, or
        # failing that try) has no streams in it; one lost in it fails it.
        known_lost = {shard for shard in self.shards if shard.lost_at is not None}
        statuses = self._on_live("GetStatus", lambda shard: shard.coordinator.status())
        lost = [s for s in self.shards if s.lost_at is not None and s not in known_lost]
        if lost:
            raise _streams_lost(lost)
        shares = fragment_shares(ask.amount, [env_slots(status) for _, status in statuses])
        running = {}
        for (shard, _), share in zip(statuses, shares, strict=True):
            if share:
                index = self.shards.index(shard)
                piece = dataclasses.replace(ask, amount=share, seed=shard_seed(self.seed, index))
                running[self._pool.submit(self._fragments_piece, shard, piece, tracker.piece())] = (
                    shard
                )
        answers: list[SampleAnswer] = []
        failure: BaseException | None = None
        for future, shard in running.items():
            try:
                answer = future.result()
            except LOST as exc:
                self._lose(shard, exc, "Sample")
                lost.append(shard)
                continue
            except BaseException as exc:  # re-raised once the other pieces ended
                failure = failure or exc
                continue
            index = self.shards.index(shard)
            answer.results = [renumbered(r, index, len(self.shards)) for r in answer.results]
            answers.append(answer)
        if failure is not None:
            raise failure
        if lost:
            raise _streams_lost(lost)
        return _joined(answers, sum(a.footer.num_episodes for a in answers))

    def _fragments_piece(
        self, shard: Shard, ask: SampleAsk, report: Progress | None
    ) -> SampleAnswer:
        if shard.behind:
            self._catch_up(shard)
        return shard.coordinator.sample(ask, report)

    def _on_live(
        self, name: str, call: Callable[[Shard], T], *, updates: bool = False
    ) -> list[tuple[Shard, T]]:
        """``call`` on every live shard at once, with the shards that answered.

        A lost shard is left out (and, for an update, marked behind). Other
        errors are raised once every call ended.

        Raises:
            UnavailableError: If no shard answered.
        """
        shards = self._live()
        futures = {self._pool.submit(self._caught_up(call), shard): shard for shard in shards}
        answers: list[tuple[Shard, T]] = []
        failure: BaseException | None = None
        for future, shard in futures.items():
            try:
                answers.append((shard, future.result()))
            except LOST as exc:
                self._lose(shard, exc, name)
                shard.behind = shard.behind or updates
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        if not answers:
            raise self._all_lost(name)
        return answers

    def _run(
        self, ask: SampleAsk, ranges: list[tuple[int, int]], tracker: _Progress | None
    ) -> list[SampleAnswer]:
        """Runs each ``(first, count)`` range on a shard, re-running a lost shard's elsewhere.

        Returns:
            The answers, in the order of ``ranges``.
        """
        pending = deque(ranges)
        answers: dict[tuple[int, int], SampleAnswer] = {}
        running: dict[Future[SampleAnswer], tuple[Shard, tuple[int, int]]] = {}
        failure: BaseException | None = None
        while True:
            busy = {shard for shard, _ in running.values()}
            for shard in self._live():
                if failure is not None or not pending:
                    break
                if shard in busy:
                    continue
                piece = pending.popleft()
                report = None if tracker is None else tracker.piece()
                future = self._pool.submit(self._piece, shard, ask, piece, report)
                running[future] = (shard, piece)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                shard, piece = running.pop(future)
                try:
                    answers[piece] = future.result()
                except LOST as exc:
                    self._lose(shard, exc, "Sample")
                    pending.appendleft(piece)
                except BaseException as exc:  # re-raised once the other pieces ended
                    failure = failure or exc
        if failure is not None:
            raise failure
        if pending:
            raise self._all_lost("Sample")
        return [answers[piece] for piece in ranges]

    def _piece(
        self, shard: Shard, ask: SampleAsk, piece: tuple[int, int], report: Progress | None
    ) -> SampleAnswer:
        if shard.behind:
            self._catch_up(shard)
        first, count = piece
        ranged = dataclasses.replace(ask, mode=Mode.EPISODES, amount=count, first_episode=first)
        return shard.coordinator.sample(ranged, report)

    def subscribe(self, ask: SubscribeAsk, timeout: float | None) -> MergedStream:
        """A subscription on every live shard, merged into one iterator.

        Each shard runs its subscription under its own base seed, as its
        fragment requests; fragment streams are numbered as in
        :meth:`_sample_fragments`.

        Raises:
            UnavailableError: If every shard is lost.
        """
        live = self._live()
        if not live:
            raise self._all_lost("Subscribe")
        streams: list[SampleStream] = []
        try:
            for shard in live:
                if shard.behind:
                    self._catch_up(shard)
                own = dataclasses.replace(ask, seed=shard_seed(self.seed, self.shards.index(shard)))
                streams.append(shard.coordinator.subscribe(own, timeout))
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        indices = [self.shards.index(shard) for shard in live]

        def relabel(i: int, item: StreamedBatch) -> StreamedBatch:
            if ask.mode != Mode.FRAGMENTS:
                return item
            batch = renumbered_batch(item.batch, indices[i], len(self.shards))
            return StreamedBatch(batch, item.agent_version)

        return MergedStream(streams, relabel)

    # --- updates and status --------------------------------------------------------

    def update_agent(self, update: AgentChange) -> int:
        """Pushes an agent to every reachable shard; returns its version."""
        versions = self._everywhere("UpdateAgent", lambda s: s.coordinator.update_agent(update))
        version = max(versions)
        self._pushed.agent_applied(update, version)
        self.agent_version = version
        return version

    def update_env(self, update: EnvChange) -> int:
        """Switches every reachable shard to another env; returns its generation."""
        generations = self._everywhere("UpdateEnv", lambda s: s.coordinator.update_env(update))
        self._pushed.env_applied(update)
        return max(generations)

    def status(self) -> FleetStatus:
        """Every reachable shard's status, summed (workers listed shard by shard).

        Worker ids are per coordinator, so two shards' workers may share one;
        ``coordinator_id`` joins the shards' ids with commas, in address order.
        """
        parts = self._everywhere("GetStatus", lambda s: s.coordinator.status(), updates=False)
        first = parts[0]
        return dataclasses.replace(
            first,
            coordinator_id=",".join(p.coordinator_id for p in parts),
            workers=tuple(w for p in parts for w in p.workers),
            steps_per_second=sum(p.steps_per_second for p in parts),
            steps_total=sum(p.steps_total for p in parts),
            agent_version=min(p.agent_version for p in parts),
            env_spec=next((p.env_spec for p in parts if p.env_spec is not None), None),
            draining=any(p.draining for p in parts),
            requests_in_flight=sum(p.requests_in_flight for p in parts),
            subscribers=sum(p.subscribers for p in parts),
            leases=sum(p.leases for p in parts),
            leased_envs=sum(p.leased_envs for p in parts),
        )

    def close(self) -> None:
        """Closes every shard's calls and the set's threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for shard in self.shards:
            shard.coordinator.close()

    # --- internals -----------------------------------------------------------------

    def _everywhere(
        self, name: str, call: Callable[[Shard], T], *, updates: bool = True
    ) -> list[T]:
        """What :meth:`_on_live` answers, without the shards."""
        return [answer for _, answer in self._on_live(name, call, updates=updates)]

    def _caught_up(self, call: Callable[[Shard], T]) -> Callable[[Shard], T]:
        def run(shard: Shard) -> T:
            if shard.behind:
                self._catch_up(shard)
            return call(shard)

        return run

    def _catch_up(self, shard: Shard) -> None:
        """Pushes the learner's env and agent to a shard that missed an update."""
        agent, env = self._pushed.restoring(None, None)
        logger.info("coordinator %s missed an update; pushing env and agent again", shard.address)
        if env is not None:
            shard.coordinator.update_env(env)
        if agent is not None:
            shard.coordinator.update_agent(agent)
        shard.behind = False

    def _live(self) -> list[Shard]:
        """The shards to use now: those not lost, and lost ones due for another try."""
        now = time.monotonic()
        live = []
        for shard in self.shards:
            if shard.lost_at is not None and now - shard.lost_at >= RETRY_LOST_SECONDS:
                logger.info("trying coordinator %s again", shard.address)
                shard.lost_at = None
            if shard.lost_at is None:
                live.append(shard)
        return live

    def _live_count(self) -> int:
        return max(len(self._live()), 1)

    def _lose(self, shard: Shard, exc: BaseException, name: str) -> None:
        shard.lost_at = time.monotonic()
        shard.error = str(exc)
        others = [s.address for s in self.shards if s.lost_at is None]
        logger.warning(
            "%s: coordinator %s is lost (%s); its work goes to %s for %g s",
            name,
            shard.address,
            exc,
            others or "no other coordinator",
            RETRY_LOST_SECONDS,
        )

    def _all_lost(self, name: str) -> UnavailableError:
        lost = "; ".join(f"{s.address}: {s.error or 'lost earlier'}" for s in self.shards)
        return UnavailableError(
            f"{name}: every coordinator of this sampler is lost ({lost}); start them or their "
            "workers, or fix the network, then retry: a retried call returns the same batch"
        )


def split_ranges(first: int, count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` episode indices from ``first`` as up to ``parts`` contiguous ``(first, count)``."""
    parts = max(min(parts, count), 1)
    bounds = [first + count * i // parts for i in range(parts + 1)]
    return [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


def _streams_lost(lost: Sequence[Shard]) -> UnavailableError:
    """The error of a fragments call during which ``lost`` were lost."""
    return UnavailableError(
        "obtain_fragments: "
        + "; ".join(f"coordinator {shard.address} was lost ({shard.error})" for shard in lost)
        + ". Its fragment streams' episodes live on its workers and cannot continue on another "
        "coordinator, so this call fails, and whatever fragments the other coordinators "
        "delivered in it are dropped. Retry: the next call samples on the others, and tries the "
        f"lost coordinator again after {RETRY_LOST_SECONDS:g} s"
    )


def _joined(answers: Sequence[SampleAnswer], num_episodes: int) -> SampleAnswer:
    """One answer of pieces: their results (assembled by index later), their footers summed."""
    results: list[Result] = [result for answer in answers for result in answer.results]
    footer = Footer(
        num_episodes,
        sum(a.footer.total_steps for a in answers),
        sum(a.footer.workers_used for a in answers),
        sum(a.footer.reassigned_units for a in answers),
    )
    return SampleAnswer(answers[0].header, footer, results)
