"""The stepping engine of a worker: env slots advanced with one policy call.

:class:`SlotEngine` owns the envs, the step ring and the segments in
flight, and advances every busy slot by one step at a time. What becomes of
a finished segment (a finished episode, or a fragment piece to park) is
decided by the caller's :class:`Sink`; which work a slot takes is decided
by the caller too (:class:`~rlfleet.worker.vec.VecWorker`).

The envs are one rlfleet :class:`~rlfleet.envs.BaseVectorEnv` whatever
the backend: in-process (``DummyVectorEnv``), one child process per slot
(``SubprocVectorEnv``), each stepped through its engine primitives
(``reset_env``, ``step_envs``, ``rebuild_env``), or a native vector env
(``NativeVectorEnv``, driven whole through
:class:`~rlfleet.worker._native_slots.NativeSlots`).

The in-process hot loop (``DummyVectorEnv.step_envs``) does, per env, the
``step`` call, two list appends and a test of the info dict (kept only
when not empty, which most envs' is); everything else is one numpy call
per field per vector step, or per finished segment.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from rlfleet.core._arrays import NestedArrays
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.step_type import StepType
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.dummy import DummyVectorEnv
from rlfleet.errors import EnvError
from rlfleet.policies.base import Policy
from rlfleet.worker._checks import ActionChecker, nonfinite_rows, outside_space_error
from rlfleet.worker._draw_blocks import DrawBlocks
from rlfleet.worker._episode_buffer import Segment, StepRing, stack_step_infos
from rlfleet.worker._native_slots import RUNNING, NativeSlots
from rlfleet.worker._numeric import all_finite
from rlfleet.worker._restarts import RestartLedger
from rlfleet.worker._updates import EnvSource, check_policy_fits
from rlfleet.worker.units import EpisodeUnit

logger = logging.getLogger("rlfleet.worker")

#: ``stop_step`` of a segment that only ends when its episode does.
NEVER = -1

_TERMINAL = int(StepType.TERMINAL)
_TIMEOUT = int(StepType.TIMEOUT)


class Live:
    """The in-flight segment (an episode, or a fragment piece) of one slot.

    Attributes:
        unit: The episode unit, or None for a fragment stream's episode.
        rng: The episode's action-sampling generator.
        meta: The episode_infos of the segment (``Segment.infos``).
        key: Sort key of the segment's record.
        stream: ``(base_seed, stream)`` of a fragment stream, else None.
        offset: Steps of the episode taken before this segment.
        first: Whether the segment starts its episode.
        seg_start: Vector step of the segment's first step.
        limit_step: Vector step at which max_episode_length is reached.
        stop_step: Vector step at which the segment ends at the latest.
        infos: ``(vector step, info)`` of the steps whose info was not empty
            (most envs return ``{}``: nothing is stored for them).
        parked_obs: A parked stream episode's next observation.
        rng_state: ``rng``'s state when a segment that may be cut by a
            window started, if its draws come in blocks (to rewind it).
    """

    __slots__ = (
        "first",
        "infos",
        "key",
        "limit_step",
        "meta",
        "offset",
        "parked_obs",
        "rng",
        "rng_state",
        "seg_start",
        "stop_step",
        "stream",
        "unit",
    )

    def __init__(
        self,
        *,
        unit: EpisodeUnit | None,
        rng: np.random.Generator,
        meta: tuple[int, ...],
        key: tuple[int, ...],
        stream: tuple[int, int] | None = None,
    ) -> None:
        self.unit = unit
        self.rng = rng
        self.meta = meta
        self.key = key
        self.stream = stream
        self.offset = 0
        self.first = True
        self.seg_start = 0
        self.limit_step = NEVER
        self.stop_step = NEVER
        self.infos: list[tuple[int, Any]] = []
        self.parked_obs: np.ndarray | None = None
        self.rng_state: Mapping[str, Any] | None = None

    @property
    def episode_index(self) -> int | None:
        """The unit's episode index (the request's numbering); None for streams."""
        return None if self.unit is None else self.unit.episode_index

    def describe(self) -> str:
        """``episode k`` or ``episode k of stream s``, for messages.

        A unit's ``request`` is not named: on a fleet worker it holds the
        coordinator's task id, which a learner would mistake for its request.
        """
        if self.unit is not None:
            return f"episode {self.unit.episode_index}"
        _, _, _, episode, _, stream, _ = self.meta
        return f"episode {episode} of stream {stream}"


class Sink(Protocol):
    """Receives what the engine produces; implemented per sampling mode."""

    #: Whether a segment interrupted by an env crash is kept (cut) or dropped.
    keeps_partial: bool

    def on_record(self, slot: int, live: Live, record: Segment, continues: bool) -> None:
        """A segment ended; ``continues`` if its episode goes on (window cut)."""

    def on_env_failure(self, slot: int, live: Live, restarted: bool) -> None:
        """The slot's env raised in ``step``; ``restarted`` if it may be rebuilt."""


class SlotEngine:
    """Advances env slots together: one ``get_actions`` call per vector step.

    Args:
        n_envs: Number of slots.
        name: Names the worker in errors.
        nan_mode: ``"error"``, ``"flag"`` or ``"ignore"`` (see VecWorker).
        check_actions: Validate action batches.
        ledger: The restart budget, shared by all slots.
    """

    def __init__(
        self,
        n_envs: int,
        *,
        name: str,
        nan_mode: str,
        check_actions: bool,
        ledger: RestartLedger,
    ) -> None:
        self.n_envs = n_envs
        self.name = name
        self.nan_mode = nan_mode
        self.check_actions = check_actions
        self.ledger = ledger
        self.source: EnvSource | None = None
        #: The envs of every slot (slot i is env i), whatever the backend.
        self.venv: BaseVectorEnv | None = None
        #: Slots whose env crashed: rebuilt before their next episode.
        self.broken: set[int] = set()
        # The native backend's slot states, when one native env steps every slot (else None).
        self.native: NativeSlots | None = None
        self.spec: EnvSpec | None = None
        self.max_len: int | None = None
        self.ring: StepRing | None = None
        self.checker: ActionChecker | None = None
        self.policy: Policy | None = None
        self._policy_checked = False
        self._policy_resets = False
        self._policy_name = ""
        # The policy's draws, a block per slot, if it declares them (else generators).
        self._blocks: DrawBlocks | None = None
        self.live: list[Live | None] = [None] * n_envs
        self.n_live = 0
        self.step_count = 0
        self.errors: list[EnvError] = []
        # The stops each future vector step brings (time limit, window end),
        # so the hot loop needs no per-env check; stale entries are skipped.
        self._stops: dict[int, list[int]] = {}
        # Cache of the live slots, rebuilt when membership changes.
        self._active: list[int] = []
        self._position: dict[int, int] = {}  # slot -> its row in the batch
        self._active_rngs: list[np.random.Generator] = []
        self._cols: np.ndarray | None = None
        self._went_idle: list[int] = []
        self._membership_changed = False
        # A lower bound of the first step of the live segments: segments only
        # start at the current step, so an old value stays a lower bound.
        self._oldest = 0

    @property
    def source_name(self) -> str:
        """The env's name, for messages."""
        if self.native is not None:
            return self.native.name
        return self.source.name if self.source is not None else "(no env)"

    @property
    def policy_resets(self) -> bool:
        """Whether the policy keeps per-row state (it overrides ``Policy.reset``)."""
        return self._policy_resets

    @property
    def idle_slots(self) -> list[int]:
        """Slots where a segment may begin now, in order.

        A native backend's slot also needs its env at an episode start.
        """
        if self.native is not None:
            return self.native.ready()  # a slot is FRESH only while idle
        return [slot for slot, live in enumerate(self.live) if live is None]

    # ----------------------------------------------------------- installing

    @property
    def envs(self) -> list[Any]:
        """The env object of each slot in this process (None where there is none).

        Only the in-process backend holds env objects here; a crashed
        slot's env shows as None until it is rebuilt.
        """
        venv = self.venv
        if not isinstance(venv, DummyVectorEnv):
            return [None] * self.n_envs
        return [None if slot in self.broken else env for slot, env in enumerate(venv.envs)]

    def install_envs(self, source: EnvSource, venv: BaseVectorEnv, spec: EnvSpec) -> None:
        """Replaces the envs (closing the old ones); drops every live segment."""
        self.drop_all()
        old = self.venv
        if isinstance(old, DummyVectorEnv) and isinstance(venv, DummyVectorEnv):
            # An env instance given again is in both: the old vector env must not close it.
            kept = {id(env) for env in venv.envs}
            old.envs[:] = [env for env in old.envs if id(env) not in kept]
        self.close_envs()
        self.source, self.venv, self.spec = source, venv, spec
        self._install_spec(spec)
        self._membership_changed = True  # the cache of running slots is built anew
        # The envs' TimeLimit was taken off: its limit is the engine's to enforce.
        if source.time_limit is not None:
            limit = spec.max_episode_length
            self.max_len = source.time_limit if limit is None else min(limit, source.time_limit)

    def install_native(self, source: EnvSource, native: NativeSlots, spec: EnvSpec) -> None:
        """Replaces the envs with a native vector env of one env per slot."""
        self.drop_all()
        self.close_envs()
        self.source, self.native, self.venv, self.spec = source, native, native.native, spec
        self._install_spec(spec)
        # The native path steps every slot, row i being slot i: no slot keeps
        # a row of the gym path's cache of the running slots.
        self._position = {}
        self._active, self._cols = list(range(self.n_envs)), None

    def _install_spec(self, spec: EnvSpec) -> None:
        self.max_len = spec.max_episode_length
        obs_space = spec.observation_space
        assert obs_space.shape is not None  # checked by the caller
        self.ring = StepRing(self.n_envs, tuple(obs_space.shape), np.dtype(obs_space.dtype))
        self.checker = ActionChecker(spec.action_space, enabled=self.check_actions)
        self._stops.clear()
        self._policy_checked = False

    def install_policy(self, policy: Policy) -> None:
        """Acts with ``policy`` from the next step (the caller drops live work)."""
        self.policy = policy
        self._policy_name = type(policy).__name__
        self._policy_checked = False
        # Stateless policies keep Policy.reset, a no-op: skip building masks.
        self._policy_resets = type(policy).reset is not Policy.reset
        draws = policy.row_draws()
        self._blocks = None if draws is None else DrawBlocks(self.n_envs, draws)
        if self.ring is not None:
            self.ring.reset_policy_outputs()

    def close_envs(self) -> None:
        """Closes every env."""
        if self.venv is not None:
            close_quietly(self.venv, self.source_name)
        self.venv = None
        self.broken = set()
        if self.native is not None:
            self.native = None
            self._membership_changed = True  # the next envs' slots build the cache anew

    # ---------------------------------------------------------------- slots

    def begin(self, slot: int, live: Live, env_seed: int, window_end: int = NEVER) -> bool:
        """Resets the slot's env with ``env_seed`` and makes ``live`` run on it.

        A failing reset is retried with a rebuilt env within the restart
        budget.

        Returns:
            False if the env failed past the budget (an EnvError is queued).
        """
        ring, venv = self.ring, self.venv
        assert ring is not None and venv is not None  # the caller checked for an env
        if self.native is not None:
            assert live.unit is not None  # native workers refuse fragment streams
            first = self.native.begin(slot, env_seed, live.unit.policy_seed)
            ring.obs[self.step_count % ring.capacity, slot] = first
            self._place(slot, live, window_end)
            return True
        while True:
            try:
                if slot in self.broken:
                    self.rebuild_env(slot)
                observation = venv.reset_env(slot, env_seed)
                ring.obs[self.step_count % ring.capacity, slot] = observation
                break
            except Exception as exc:
                if not self._restart_env(slot, exc, "reset", live, step=0):
                    return False
        self._place(slot, live, window_end)
        return True

    def rebuild_env(self, slot: int) -> None:
        """Replaces a crashed slot's env by a new one from the env's factory.

        Raises:
            ConfigError: If the env was given as an instance (it cannot be rebuilt).
            Exception: What building the env raised.
        """
        source, venv = self.source, self.venv
        assert source is not None and venv is not None
        source.check_rebuildable()
        venv.rebuild_env(slot)
        self.broken.discard(slot)

    def resume(self, slot: int, live: Live, window_end: int = NEVER) -> None:
        """Continues a parked episode from its parked observation."""
        ring = self.ring
        assert ring is not None and live.parked_obs is not None
        ring.obs[self.step_count % ring.capacity, slot] = live.parked_obs
        live.parked_obs = None
        self._place(slot, live, window_end)

    def reset_policy_rows(self, slots: list[int]) -> None:
        """Tells a stateful policy that new episodes start on ``slots``."""
        if slots and self._policy_resets and self.policy is not None:
            mask = np.zeros(self.n_envs, dtype=bool)
            mask[slots] = True
            self.policy.reset(mask)

    def _place(self, slot: int, live: Live, window_end: int) -> None:
        s = self.step_count
        live.seg_start = s
        live.infos = []
        live.limit_step = s + self.max_len - live.offset - 1 if self.max_len is not None else NEVER
        stop = live.limit_step
        if window_end != NEVER and (stop == NEVER or window_end < stop):
            stop = window_end
        live.stop_step = stop
        if stop != NEVER:
            self._stops.setdefault(stop, []).append(slot)
        if self._blocks is not None and self.native is None:  # native rows share one generator
            # A window may cut the episode, which goes on later: keep the state to rewind to.
            live.rng_state = live.rng.bit_generator.state if window_end != NEVER else None
            self._blocks.start(slot, live.rng, s)
        self.live[slot] = live
        self.n_live += 1
        position = self._position.get(slot)
        if position is None:
            self._membership_changed = True
        else:  # the slot keeps its row: refresh what may have changed on it
            self._active_rngs[position] = live.rng

    def drop(self, slot: int) -> Live:
        """Takes the live segment off a slot (its data is forgotten)."""
        live = self.live[slot]
        assert live is not None
        self.live[slot] = None
        self.n_live -= 1
        self._went_idle.append(slot)
        if self._blocks is not None:
            self._blocks.stop(slot)
        if self.native is not None:
            self.native.release(slot)
        return live

    def drop_all(self) -> list[Live]:
        """Drops every live segment; returns them in slot order."""
        return [self.drop(slot) for slot, live in enumerate(self.live) if live is not None]

    def _refresh_active(self) -> None:
        if self._went_idle:
            if any(self.live[slot] is None for slot in self._went_idle):
                self._membership_changed = True
            self._went_idle.clear()
        if self._membership_changed:
            self._membership_changed = False
            lives = [(slot, live) for slot, live in enumerate(self.live) if live is not None]
            self._active = [slot for slot, _ in lives]
            self._position = {slot: row for row, slot in enumerate(self._active)}
            self._active_rngs = [live.rng for _, live in lives]
            everyone = len(self._active) == self.n_envs
            self._cols = None if everyone else np.array(self._active, dtype=np.intp)

    # -------------------------------------------------------------- stepping

    def advance(self, sink: Sink) -> int:
        """Steps every live slot once.

        Returns:
            The number of env steps taken.

        Raises:
            PolicyError: Or whatever the policy raised; nothing was stepped.
            EnvError: If the policy failed on a non-finite observation in
                ``"error"`` mode (that slot's segment is dropped).
        """
        if self.native is not None:
            return self._advance_native(sink)
        if self._went_idle or self._membership_changed:
            self._refresh_active()
        active = self._active
        if not active:
            return 0
        ring, policy, checker = self._stepping_parts()
        s, row, cols = self.step_count, self._claim_row(), self._cols
        observations = ring.obs[row] if cols is None else ring.obs[row, cols]
        try:
            blocks = self._blocks
            if blocks is None:
                actions, agent_infos = policy.get_actions(observations, self._active_rngs)
            else:
                draws = blocks.take(s, cols)
                actions, agent_infos = policy.get_actions_from_draws(observations, draws)
            per_env = checker(actions, active, self._policy_name)
            ring.put_policy_outputs(row, cols, actions, agent_infos)
        except Exception as exc:
            self._raise_policy_failure(exc, observations)
            raise

        venv = self.venv
        assert venv is not None
        next_obs, rewards, done, infos, failed = venv.step_envs(active, per_env)
        if infos:
            live = self.live
            for slot, info in infos:
                live[slot].infos.append((s, info))  # type: ignore[union-attr]
        if failed:
            # Placeholders keep the rows aligned; the slot's step is discarded.
            position = self._position
            for slot, _ in failed:
                next_obs[position[slot]] = ring.obs[row, slot]
        try:
            ring.put_env_outputs(row, cols, next_obs, rewards)
        except (ValueError, TypeError):
            bad = self._find_bad_outputs(row, active, next_obs, rewards, failed)
            failed.extend(bad)
            bad_slots = {slot for slot, _ in bad}
            done = [entry for entry in done if entry[0] not in bad_slots]
        self.step_count = s + 1
        stops = self._stops.pop(s, None)
        if stops:
            done.extend(self._stopped(stops, s, done, failed))
        for slot, terminated, truncated in done:
            self._finish(slot, s, terminated, truncated, sink)
        for slot, error in failed:
            self._on_step_failure(slot, error, s, sink)
        return len(active) - len(failed)

    def _stepping_parts(self) -> tuple[StepRing, Policy, ActionChecker]:
        """The ring, policy and checker of a step; checks the policy once per install."""
        ring, policy, checker, spec = self.ring, self.policy, self.checker, self.spec
        assert ring is not None and policy is not None and checker is not None
        assert spec is not None
        if not self._policy_checked:
            check_policy_fits(policy, spec)
            self._policy_checked = True
        return ring, policy, checker

    def _claim_row(self) -> int:
        """The ring row of this vector step, making room first if the ring may be full."""
        ring, s = self.ring, self.step_count
        assert ring is not None
        if s + 2 - self._oldest > ring.capacity:  # the ring may be full: look closer
            starts = [live.seg_start for live in self.live if live is not None]
            self._oldest = ring.make_room(min(starts), s + 1)
        return s % ring.capacity

    def _advance_native(self, sink: Sink) -> int:
        """:meth:`advance` on a native backend: one batched policy call, one env call.

        The policy acts on every slot's observation (row i is slot i), all
        rows drawing from the backend's one generator
        (``Policy.get_actions_batched``, docs/policies.md); only the running
        slots' steps are recorded. Whole-array writes, no per-slot indexing:
        the running slots change nearly every step (a finished slot spends
        one step in its env's autoreset), so a cache of them would not pay.
        """
        native = self.native
        assert native is not None
        self._went_idle.clear()  # the gym path's cache bookkeeping
        running = self.n_live
        if not running:
            return 0
        ring, policy, checker = self._stepping_parts()
        s, row = self.step_count, self._claim_row()
        observations = ring.obs[row]
        try:
            batch, agent_infos = policy.get_actions_batched(observations, native.generator)
            actions = checker(batch, self._active, self._policy_name, "get_actions_batched")
            ring.put_policy_outputs(row, None, actions, agent_infos)
        except Exception as exc:
            self._raise_native_policy_failure(exc, observations)
            raise
        try:
            next_obs, rewards, done = native.step(actions)
            ring.put_env_outputs(row, None, next_obs, rewards)  # type: ignore[arg-type]
        except Exception as exc:
            self._native_failed(exc, s, sink)
            return 0
        self.step_count = s + 1
        stops = self._stops.pop(s, None)
        if stops:
            done.extend(self._stopped(stops, s, done, []))
        for slot, terminated, truncated in done:
            self._finish(slot, s, terminated, truncated, sink)
        return running

    def _raise_native_policy_failure(self, exc: Exception, observations: np.ndarray) -> None:
        """:meth:`_raise_policy_failure` for a native step, whose rows include idle slots.

        Only a running slot's non-finite observation drops an episode; one
        of an idle slot (stepped unrecorded) is named in a note.
        """
        native = self.native
        assert native is not None
        running = native.state == RUNNING
        bad = nonfinite_rows(observations)
        unseen = np.flatnonzero(bad & ~running)
        if len(unseen):
            exc.add_note(
                f"native env {self.source_name}: slots {unseen[:8].tolist()} "
                "returned non-finite observations while no episode was recorded on them (row i "
                "of the policy's batch is slot i)"
            )
        rows = running.reshape((len(running),) + (1,) * (observations.ndim - 1))
        zero = np.zeros((), dtype=observations.dtype)
        self._raise_policy_failure(exc, np.where(rows, observations, zero))

    def _native_failed(self, exc: Exception, s: int, sink: Sink) -> None:
        """A native env's step raised: every live segment is lost, none restarted.

        The env's state is unknown, so it is reset as a whole before any
        new episode begins (no slot is running after this).
        """
        lives = [(slot, self.drop(slot)) for slot, live in enumerate(self.live) if live is not None]
        first_slot, first = lives[0]
        self.errors.append(
            EnvError(
                f"native vector env {self.source_name} raised {type(exc).__name__}: {exc} in "
                f"step; the {len(lives)} episodes in flight were dropped (native envs are "
                "not restarted one by one; the whole env is reset before the next episode)",
                worker=self.name,
                env_index=first_slot,
                step=first.offset + s - first.seg_start + 1,
                episode_index=first.episode_index,
                remote_traceback="".join(traceback.format_exception(exc)),
            )
        )
        for slot, live in lives:
            sink.on_env_failure(slot, live, restarted=False)

    def _stopped(
        self,
        stops: list[int],
        s: int,
        done: list[tuple[int, bool, bool]],
        failed: list[tuple[int, Exception]],
    ) -> list[tuple[int, bool, bool]]:
        """The slots whose segment reached its stop step ``s`` (and is still live)."""
        skip = {slot for slot, _, _ in done} | {slot for slot, _ in failed}
        stopped = []
        for slot in stops:
            live = self.live[slot]
            # A slot can be listed twice: once by an earlier segment that ended early.
            if live is not None and live.stop_step == s and slot not in skip:
                stopped.append((slot, False, False))
                skip.add(slot)
        return stopped

    def _find_bad_outputs(
        self,
        row: int,
        active: list[int],
        next_obs: list[Any],
        rewards: list[Any],
        failed: list[tuple[int, Exception]],
    ) -> list[tuple[int, Exception]]:
        """Stores outputs one by one; returns the slots whose outputs do not fit."""
        ring = self.ring
        assert ring is not None
        already = {slot for slot, _ in failed}
        bad: list[tuple[int, Exception]] = []
        for slot, observation, reward in zip(active, next_obs, rewards, strict=True):
            if slot in already:
                continue
            try:
                ring.put_env_output(row, slot, observation, reward)
            except (ValueError, TypeError) as exc:
                shape = np.shape(observation)
                bad.append(
                    (
                        slot,
                        type(exc)(
                            f"step returned an observation of shape {shape} (the space has "
                            f"{ring.obs.shape[2:]}) or a non-numeric reward {reward!r}: {exc}"
                        ),
                    )
                )
        return bad

    def _finish(self, slot: int, s: int, terminated: bool, truncated: bool, sink: Sink) -> None:
        live = self.drop(slot)
        length = s - live.seg_start + 1
        # step_type_from_gym's rules for a step that ends its episode: terminated
        # wins; else truncated or the length limit (s == limit_step) is TIMEOUT.
        if terminated:
            last: int | None = _TERMINAL
        elif truncated or s == live.limit_step:
            last = _TIMEOUT
        else:
            last = None  # a window cut: the episode goes on
            if self._blocks is not None and live.rng_state is not None:
                self._blocks.rewind(live.rng, live.rng_state, length)
        record = self._record(slot, live, length, last)
        if record is not None:
            sink.on_record(slot, live, record, continues=last is None)

    def _record(self, slot: int, live: Live, length: int, last: int | None) -> Segment | None:
        """Makes a segment of ``length`` steps, viewing them in the ring.

        Returns None (and queues an EnvError) if ``"error"`` mode rejects a
        non-finite observation.
        """
        ring, spec = self.ring, self.spec
        assert ring is not None and spec is not None
        observations, actions, rewards, agent_infos = ring.segment_steps(
            live.seg_start, length, slot
        )
        env_infos = self._env_infos(live, length) if live.infos else {}
        if self.nan_mode == "flag":
            bad = nonfinite_rows(observations)
            env_infos["nonfinite_obs"] = bad[:-1] | bad[1:]
        elif self.nan_mode == "error" and not all_finite(observations):
            index = int(np.argmax(nonfinite_rows(observations)))
            self._reject_nonfinite(slot, live, live.offset + index, "")
            return None
        outside = outside_space_error(
            observations, spec.observation_space, self.source_name, live.describe(), live.offset
        )
        if outside is not None:
            message, step = outside
            self.errors.append(
                EnvError(
                    message,
                    worker=self.name,
                    env_index=slot,
                    step=step,
                    episode_index=live.episode_index,
                )
            )
            return None
        record = Segment(
            key=live.key,
            infos=live.meta,
            observations=observations[:-1],
            # Copied: the slot's next episode starts in that very cell.
            last_observation=observations[-1].copy(),
            actions=actions,
            rewards=rewards,
            agent_infos=agent_infos,
            env_infos=env_infos,
            first=live.first,
            last=last,
            env_spec=spec,
        )
        ring.pin(record, live.seg_start)
        return record

    def _env_infos(self, live: Live, length: int) -> NestedArrays:
        """Stacks the segment's infos (only its non-empty ones were kept)."""
        per_step: list[Any] = [{}] * length
        for step, info in live.infos:
            index = step - live.seg_start
            if index < length:  # a failed last step's info is not part of the segment
                per_step[index] = info
        return stack_step_infos(per_step, self.source_name)

    def _reject_nonfinite(self, slot: int, live: Live, step: int, why: str) -> None:
        returned_by = "reset" if step == 0 else f"step {step}"
        self.errors.append(
            EnvError(
                f"env {self.source_name} returned a non-finite observation (NaN or inf) "
                f"from {returned_by} of {live.describe()}{why}; the episode was dropped. "
                "Fix the env, or create the worker with nan_observations='flag' or 'ignore'",
                worker=self.name,
                env_index=slot,
                step=step,
                episode_index=live.episode_index,
            )
        )

    def _raise_policy_failure(self, exc: Exception, observations: np.ndarray) -> None:
        """Reports a non-finite observation as the root cause of a policy failure.

        In ``"error"`` mode, the slot's segment is dropped and EnvError raised.
        """
        if self.nan_mode != "error":
            return
        bad = nonfinite_rows(np.asarray(observations))
        if not bad.any():
            return
        slot = self._active[int(np.argmax(bad))]
        live = self.drop(slot)
        step = live.offset + self.step_count - live.seg_start
        self._reject_nonfinite(
            slot, live, step, f", and the policy failed on it ({type(exc).__name__}: {exc})"
        )
        error = self.errors.pop()
        raise error from exc

    def _on_step_failure(self, slot: int, exc: Exception, s: int, sink: Sink) -> None:
        live = self.drop(slot)
        length = s - live.seg_start
        if sink.keeps_partial and length:
            record = self._record(slot, live, length, None)
            if record is not None:
                sink.on_record(slot, live, record, continues=False)
        restarted = self._restart_env(slot, exc, "step", live, step=live.offset + length + 1)
        sink.on_env_failure(slot, live, restarted)

    def _restart_env(self, slot: int, exc: Exception, call: str, live: Live, *, step: int) -> bool:
        """Marks a failed env for rebuilding; True if it may be, else queues an EnvError."""
        self.broken.add(slot)
        assert self.source is not None
        rebuildable = self.source.rebuildable
        if rebuildable and self.ledger.try_restart():
            logger.warning(
                "worker %s: env %d (%s) raised %s: %s in %s of %s; rebuilding it and "
                "re-running (%d restarts so far)",
                self.name,
                slot,
                self.source_name,
                type(exc).__name__,
                exc,
                call,
                live.describe(),
                self.ledger.total,
            )
            return True
        why = (
            self.ledger.describe()
            if rebuildable
            else "the env was given as an instance and cannot be rebuilt"
        )
        self.errors.append(
            EnvError(
                f"env {self.source_name} raised {type(exc).__name__}: {exc} in {call} of "
                f"{live.describe()}; not restarted ({why})",
                worker=self.name,
                env_index=slot,
                step=step,
                episode_index=live.episode_index,
                remote_traceback="".join(traceback.format_exception(exc)),
            )
        )
        return False

    def raise_deferred(self) -> None:
        """Raises the first queued EnvError (noting the others), if any."""
        if not self.errors:
            return
        first, *rest = self.errors
        self.errors = []
        for other in rest:
            first.add_note(f"also in the same step: {str(other).splitlines()[0]}")
        raise first


def close_quietly(env: BaseVectorEnv, name: str) -> None:
    """Closes envs, logging instead of raising: a broken env must not stop the worker."""
    try:
        env.close()
    except Exception as exc:
        logger.warning("closing env %s raised %s: %s", name, type(exc).__name__, exc)
