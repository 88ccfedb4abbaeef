"""Fragment streams: env slots run episodes that continue across calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.seeding import stream_seeds
from rlfleet.errors import EnvError, PolicyError, WireFormatError
from rlfleet.policies.base import Policy
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.worker._engine import SlotEngine
from rlfleet.worker._episode_buffer import Segment, StepRing, record_key
from rlfleet.worker._segments import Live


@dataclasses.dataclass
class _Parked:
    """A stream's episode between windows, with what rebuilds its env state."""

    live: Live
    actions: list[np.ndarray]  # delivered since its reset, one array per piece
    #: Its rng still has to be drawn over the replayed steps (it came from a replay).
    draws_pending: bool = False


class FragmentStreams:
    """The fragment streams a worker runs (``VecWorker.collect_fragments``).

    Implements the engine's Sink during a :meth:`collect` call: a piece cut
    by the window parks its episode under its stream (with the observation
    it continues from and the actions that led there), and the next call
    naming that stream resumes it. If the slot's env was used by another
    stream meanwhile, or the episode came from another worker
    (:class:`StreamReplay`), the env is rebuilt first by replaying
    ``reset(seed)`` and those actions. Episode numbers are kept per
    (base seed, stream), so a stream whose episode was abandoned goes on
    with its next episode, never repeating seeds.

    Args:
        engine: The worker's engine.
        worker_number: Recorded in episode_infos.
        agent_version: Returns the agent version in force.
    """

    keeps_partial = True

    def __init__(
        self, engine: SlotEngine, *, worker_number: int, agent_version: Callable[[], int]
    ) -> None:
        self._engine = engine
        self._worker_number = worker_number
        self._agent_version = agent_version
        self._parked: dict[int, _Parked] = {}
        # The stream whose episode each slot's env holds (None: none, or unknown).
        self._holder: list[int | None] = [None] * engine.n_envs
        # Actions of each running episode's delivered pieces, by slot.
        self._logs: list[list[np.ndarray]] = [[] for _ in range(engine.n_envs)]
        self._next_episode: dict[tuple[int, int], int] = {}
        self._quota = [0] * engine.n_envs
        self._pieces: list[Segment] = []

    def abandon(self) -> None:
        """Ends every stream's current episode; streams go on with the next one."""
        self._parked.clear()
        self._holder = [None] * len(self._holder)

    def release_envs(self) -> None:
        """The envs will run other work: waiting episodes are rebuilt by replay when resumed."""
        self._holder = [None] * len(self._holder)

    def collect(
        self,
        length: int,
        base_seed: int,
        streams: Sequence[int],
        tick: Callable[[], object] | None = None,
        replays: Sequence[StreamReplay] = (),
    ) -> list[Segment]:
        """Steps slot ``i`` ``length`` times on ``streams[i]``; returns the pieces in order.

        ``tick`` runs after every vector step: a window may last longer
        than the coordinator's heartbeat timeout, and the worker must go on
        beating during it.
        """
        for stream, parked in list(self._parked.items()):
            if parked.live.stream != (base_seed, stream):
                del self._parked[stream]  # another seed: that episode is abandoned
        for replay in replays:
            self._adopt(base_seed, replay)
        self._quota = [length if slot < len(streams) else 0 for slot in range(len(self._quota))]
        self._pieces = []
        try:
            while any(self._quota):
                self._fill(base_seed, streams)
                self._engine.advance(self)
                self._engine.raise_deferred()
                if tick is not None:
                    tick()
            return sorted(self._pieces, key=record_key)
        except BaseException:
            self._engine.drop_all()
            self.abandon()
            raise
        finally:
            self._pieces = []
            self._quota = [0] * len(self._quota)

    def _adopt(self, base_seed: int, replay: StreamReplay) -> None:
        """Takes over a stream from another worker (it replaces what this one held)."""
        key = (base_seed, replay.stream)
        self._parked.pop(replay.stream, None)
        self._holder = [None if h == replay.stream else h for h in self._holder]
        if replay.fragment_index == 0:
            self._next_episode[key] = replay.episode_index
            return
        self._next_episode[key] = replay.episode_index + 1
        env_seed, policy_seed = stream_seeds(base_seed, replay.stream, replay.episode_index)
        actions = replay.actions
        if actions is None or replay.last_observation is None:
            raise WireFormatError(
                "a replay of an episode in progress needs its actions and observation"
            )
        live = Live(
            unit=None,
            rng=np.random.default_rng(policy_seed),
            # FRAGMENT_INFO_KEYS order; _continue moves it to the next piece.
            meta=(
                self._agent_version(),
                env_seed,
                policy_seed,
                replay.episode_index,
                self._worker_number,
                replay.stream,
                replay.fragment_index - 1,
            ),
            key=(replay.stream, replay.episode_index, replay.fragment_index - 1),
            stream=key,
        )
        live.offset = len(actions)
        live.parked_obs = replay.last_observation
        self._parked[replay.stream] = _Parked(live, [actions], draws_pending=True)

    def _fill(self, base_seed: int, streams: Sequence[int]) -> None:
        """Gives idle slots with quota left their stream's current or next episode."""
        engine = self._engine
        started = []
        for slot in engine.idle_slots:
            if not self._quota[slot]:
                continue
            window_end = engine.step_count + self._quota[slot] - 1
            stream = streams[slot]
            parked = self._parked.pop(stream, None)
            if parked is not None:
                if self._holder[slot] != stream or slot in engine.failures.broken:
                    self._rebuild(slot, parked)
                self._holder[slot] = stream
                self._logs[slot] = parked.actions
                self._continue(parked.live)
                engine.resume(slot, parked.live, window_end)
                continue
            index = self._next_episode.get((base_seed, stream), 0)
            self._next_episode[(base_seed, stream)] = index + 1
            env_seed, policy_seed = stream_seeds(base_seed, stream, index)
            # FRAGMENT_INFO_KEYS order.
            meta = (
                self._agent_version(),
                env_seed,
                policy_seed,
                index,
                self._worker_number,
                stream,
                0,
            )
            live = Live(
                unit=None,
                rng=np.random.default_rng(policy_seed),
                meta=meta,
                key=(stream, index, 0),
                stream=(base_seed, stream),
            )
            self._holder[slot] = stream
            self._logs[slot] = []
            if engine.begin(slot, live, env_seed, window_end):
                started.append(slot)
        engine.reset_policy_rows(started)

    def _rebuild(self, slot: int, parked: _Parked) -> None:
        """Brings the slot's env to a parked episode's state by replaying it.

        Raises:
            EnvError: If the env does not reach the delivered observation
                (it is not deterministic given its seed and the actions).
            PolicyError: If the rng must be drawn by a stateful policy.
        """
        engine = self._engine
        live = parked.live
        _, env_seed, _, episode, _, stream, fragment = live.meta
        policy = engine.policy
        venv = engine.venv
        assert venv is not None and policy is not None and engine.spec is not None
        if parked.draws_pending and engine.policy_resets:
            raise PolicyError(
                f"stream {stream} moved to worker {engine.name!r}, but policy "
                f"{type(policy).__name__} keeps state across steps (it overrides "
                "Policy.reset): its episode cannot be rebuilt by replay. Use a stateless "
                "policy for fragments that must survive worker faults"
            )
        actions = np.concatenate(parked.actions)
        ended = False
        try:
            if slot in engine.failures.broken:
                engine.rebuild_env(slot)
            observation = venv.reset_env(slot, env_seed)
            for step, action in enumerate(actions):
                if parked.draws_pending:
                    self._draw(policy, observation, live, stream)
                (observation,), _, done, _, failures = venv.step_envs([slot], [action])
                if failures:
                    raise failures[0][1]
                if done and step < len(actions) - 1:
                    ended = True
                    break
        except (EnvError, PolicyError):
            raise
        except Exception as exc:
            self._holder[slot] = None
            raise EnvError(
                f"env {engine.source_name} raised {type(exc).__name__}: {exc} while episode "
                f"{episode} of stream {stream} was rebuilt by replaying its {len(actions)} "
                "delivered actions",
                worker=engine.name,
                env_index=slot,
            ) from exc
        parked.draws_pending = False
        want = live.parked_obs
        assert want is not None
        got = np.asarray(observation)
        if ended or got.shape != want.shape or not np.array_equal(got.astype(want.dtype), want):
            self._holder[slot] = None
            raise EnvError(
                f"env {engine.source_name} is not replayable: reset(seed={env_seed}) and the "
                f"{len(actions)} delivered actions of episode {episode} of stream {stream} "
                f"did not lead back to the observation delivered before fragment "
                f"{fragment + 1}, so the stream cannot move to this worker. Fragments "
                "survive worker faults only with envs that are deterministic given their "
                "seed and actions",
                worker=engine.name,
                env_index=slot,
                step=len(actions),
            )

    @staticmethod
    def _draw(policy: Policy, observation: object, live: Live, stream: int) -> None:
        """Draws the episode's generator as the policy did on ``observation``."""
        try:
            policy.get_actions(np.asarray(observation)[None], [live.rng])
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(
                f"policy {type(policy).__name__} raised {type(exc).__name__}: {exc} while "
                f"stream {stream}'s episode was rebuilt by replay"
            ) from exc

    def _continue(self, live: Live) -> None:
        """Turns a parked episode's state into its next piece's."""
        _, env_seed, policy_seed, episode, worker, stream, fragment = live.meta
        fragment += 1
        live.meta = (
            self._agent_version(),
            env_seed,
            policy_seed,
            episode,
            worker,
            stream,
            fragment,
        )
        live.key = (*live.key[:2], fragment)
        live.first = False

    def on_record(self, slot: int, live: Live, record: Segment, continues: bool) -> None:
        self._pieces.append(record)
        self._quota[slot] -= record.length
        if continues:
            live.offset += record.length
            live.parked_obs = record.last_observation
            assert live.stream is not None
            # A copy: the record views the engine's ring, whose rows are reused
            # once the record is gone, and the episode may wait for long.
            actions = np.array(record.actions)
            self._parked[live.stream[1]] = _Parked(live, [*self._logs[slot], actions])
        self._logs[slot] = []

    def on_rows(
        self, ring: StepRing, spec: EnvSpec, rows: list[int], steps: int, first_start: int
    ) -> None:
        """Never called: fragment streams never run on a native engine."""
        # builtin on purpose: a broken invariant of the worker's own code, not an error of input.
        raise AssertionError("fragment streams never run on a native engine")

    def on_env_failure(self, slot: int, live: Live, restarted: bool) -> None:
        # The stream moves on to its next episode; past the budget the
        # engine's EnvError ends the call.
        self._holder[slot] = None
        if not restarted:
            self._quota[slot] = 0
