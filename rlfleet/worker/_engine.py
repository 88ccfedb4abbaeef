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
from typing import Any

import numpy as np

from rlfleet._util.closing import close_quietly
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.step_type import StepType
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.dummy import DummyVectorEnv
from rlfleet.policies.base import Policy
from rlfleet.worker._checks import ActionChecker, SuspectRows, nonfinite_rows
from rlfleet.worker._draw_blocks import DrawBlocks
from rlfleet.worker._episode_buffer import StepRing
from rlfleet.worker._native_columns import WIDTH as _ROW_WIDTH
from rlfleet.worker._native_slots import NativeSlots
from rlfleet.worker._numeric import all_finite
from rlfleet.worker._restarts import RestartLedger
from rlfleet.worker._segments import NEVER, Live, SegmentRecorder, Sink
from rlfleet.worker._slot_failures import SlotFailures
from rlfleet.worker._updates import EnvSource, check_policy_fits
from rlfleet.worker.units import QueuedUnit

logger = logging.getLogger("rlfleet.worker")

_TERMINAL = int(StepType.TERMINAL)
_TIMEOUT = int(StepType.TIMEOUT)


class _Acting:
    """The policy the slots act with, and what installing it found out."""

    def __init__(self) -> None:
        self.policy: Policy | None = None
        self.checked = False  # check_policy_fits passed against the current env
        self.resets = False  # it keeps per-row state (overrides Policy.reset)
        self.name = ""
        # Its draws, a block per slot, if it declares them (else generators).
        self.blocks: DrawBlocks | None = None


class _Rows:
    """Cache of the live slots, each one's row in the batch, rebuilt when membership changes."""

    def __init__(self) -> None:
        self.active: list[int] = []
        self.position: dict[int, int] = {}  # slot -> its row in the batch
        self.rngs: list[np.random.Generator] = []
        self.cols: np.ndarray | None = None  # None: every slot is live
        self.went_idle: list[int] = []
        self.changed = False


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
        self.check_actions = check_actions
        self.failures = SlotFailures(name=name, ledger=ledger, nan_mode=nan_mode)
        # The envs: their source, every slot's env (slot i is env i, whatever
        # the backend), the native backend's slot states when one native env
        # steps every slot (else None), and what their spec sizes.
        self.source: EnvSource | None = None
        self.venv: BaseVectorEnv | None = None
        self.native: NativeSlots | None = None
        self.spec: EnvSpec | None = None
        self.max_len: int | None = None
        self.ring: StepRing | None = None
        self.checker: ActionChecker | None = None
        self._suspect_rows: SuspectRows | None = None  # a native backend's observation check
        self._recorder: SegmentRecorder | None = None
        self._acting = _Acting()
        # The segments in flight, one per busy slot (a native backend's are
        # its NativeSlots' per-slot lists instead: no object per episode).
        self.live: list[Live | None] = [None] * n_envs
        self.n_live = 0
        self.step_count = 0
        self._rows = _Rows()
        # The stops each future vector step brings (time limit, window end),
        # so the hot loop needs no per-env check; stale entries are skipped.
        self._stops: dict[int, list[int]] = {}
        # A lower bound of the first step of the live segments: segments only
        # start at the current step, so an old value stays a lower bound.
        self._oldest = 0
        # Whether a checked batch passes the native env's own action check
        # (NativeVectorEnv.vouches_for).
        self._vouch = False

    @property
    def policy(self) -> Policy | None:
        """The policy the slots act with (None before one is installed)."""
        return self._acting.policy

    @property
    def source_name(self) -> str:
        """The env's name, for messages."""
        if self.native is not None:
            return self.native.name
        return self.source.name if self.source is not None else "(no env)"

    @property
    def policy_resets(self) -> bool:
        """Whether the policy keeps per-row state (it overrides ``Policy.reset``)."""
        return self._acting.resets

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
        return [None if slot in self.failures.broken else env for slot, env in enumerate(venv.envs)]

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
        self._rows.changed = True  # the cache of running slots is built anew
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
        self._rows.position = {}
        self._rows.active, self._rows.cols = list(range(self.n_envs)), None
        # The checker's range check of a batch is then the env's own: the env
        # need not look at the batch's values again.
        self._vouch = self.check_actions and native.native.vouches_for(spec.action_space)

    def _install_spec(self, spec: EnvSpec) -> None:
        self.max_len = spec.max_episode_length
        obs_space = spec.observation_space
        assert obs_space.shape is not None  # checked by the caller
        native = self.native is not None
        nan_mode = self.failures.nan_mode
        self.ring = StepRing(
            self.n_envs,
            tuple(obs_space.shape),
            np.dtype(obs_space.dtype),
            obs_flags=native and nan_mode == "flag",
        )
        self._suspect_rows = (
            SuspectRows(obs_space, nonfinite=nan_mode == "error") if native else None
        )
        self.checker = ActionChecker(spec.action_space, enabled=self.check_actions)
        self._recorder = SegmentRecorder(
            self.ring,
            spec,
            nan_mode=self.failures.nan_mode,
            failures=self.failures,
            source_name=self.source_name,
        )
        self._stops.clear()
        self._acting.checked = False

    def install_policy(self, policy: Policy) -> None:
        """Acts with ``policy`` from the next step (the caller drops live work)."""
        acting = self._acting
        acting.policy = policy
        acting.name = type(policy).__name__
        acting.checked = False
        # Stateless policies keep Policy.reset, a no-op: skip building masks.
        acting.resets = type(policy).reset is not Policy.reset
        draws = policy.row_draws()
        acting.blocks = None if draws is None else DrawBlocks(self.n_envs, draws)
        if self.ring is not None:
            self.ring.reset_policy_outputs()

    def close_envs(self) -> None:
        """Closes every env."""
        if self.venv is not None:
            close_quietly(self.venv, f"env {self.source_name}", logger)
        self.venv = None
        self.failures.broken = set()
        if self.native is not None:
            self.native = None
            self._rows.changed = True  # the next envs' slots build the cache anew

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
            version, _, _, _, worker = live.meta
            self.begin_native([slot], [live.unit], version, worker)
            return True
        while True:
            try:
                if slot in self.failures.broken:
                    self.rebuild_env(slot)
                observation = venv.reset_env(slot, env_seed)
                ring.obs[self.step_count % ring.capacity, slot] = observation
                break
            except Exception as exc:
                if not self._restart_env(slot, exc, "reset", live, step=0):
                    return False
        self._place(slot, live, window_end)
        return True

    def begin_native(
        self, slots: list[int], units: list[QueuedUnit], agent_version: int, worker: int
    ) -> None:
        """:meth:`begin` on a native backend, for episodes of units on many slots at once.

        Each slot's episode is its entries in :class:`NativeSlots`' per-slot
        lists, no object of its own.

        Args:
            slots: A prefix of :attr:`idle_slots`, in its order.
            units: The unit to run on each slot.
            agent_version: The agent version the episodes run with.
            worker: The worker's number (in the episodes' infos).
        """
        native = self.native
        assert native is not None
        if native.needs_reset():
            self._reset_native(units[0].env_seed, units[0].policy_seed)
        # The slots' first observations are in the ring already: the env's
        # autoreset (or the reset) wrote them.
        native.begin_many(slots, units, self.step_count, agent_version, worker)
        self.n_live += len(slots)

    def running_units(self) -> list[tuple[int, QueuedUnit]]:
        """``(slot, unit)`` of every running episode of a unit, in slot order."""
        if self.native is not None:
            return self.native.running_units()
        return [
            (slot, live.unit)
            for slot, live in enumerate(self.live)
            if live is not None and live.unit is not None
        ]

    def running_starts(self) -> list[int]:
        """The vector step of the first step of every running segment."""
        if self.native is not None:
            return self.native.running_starts()
        return [live.seg_start for live in self.live if live is not None]

    def _reset_native(self, env_seed: int, policy_seed: int) -> None:
        """Resets a native env as a whole, one vector step on.

        The current step's row holds the last observations of the episodes
        that ended at the step before: the reset writes the next row.
        """
        native, ring = self.native, self.ring
        assert native is not None and ring is not None
        self.step_count += 1
        row = self._claim_row()
        first = native.reset(env_seed, policy_seed)
        ring.obs[row] = first
        self._check_native_rows(ring, first, row, self.step_count)

    def _check_native_rows(
        self, ring: StepRing, observations: np.ndarray, row: int, step: int
    ) -> None:
        """Checks the observations a native env returned, all slots at once.

        Slots whose row may fail the exact checks become suspects: their
        episode is checked exactly when it ends. In ``"flag"`` mode the rows'
        finiteness goes to the ring's ``obs_flags``.
        """
        if ring.obs_flags is not None:
            ring.obs_flags[row] = nonfinite_rows(observations)
        assert self._suspect_rows is not None
        suspect = self._suspect_rows(observations)
        if suspect is not None:
            self._note_suspects(suspect, step)

    def _note_suspects(self, suspect: np.ndarray, step: int) -> None:
        """Makes the slots of ``suspect``'s True rows suspects from ``step`` on."""
        assert self.native is not None
        suspects = self.native.suspects
        for slot in np.flatnonzero(suspect).tolist():
            suspects.setdefault(slot, step)

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
        self.failures.broken.discard(slot)

    def resume(self, slot: int, live: Live, window_end: int = NEVER) -> None:
        """Continues a parked episode from its parked observation."""
        ring = self.ring
        assert ring is not None and live.parked_obs is not None
        ring.obs[self.step_count % ring.capacity, slot] = live.parked_obs
        live.parked_obs = None
        self._place(slot, live, window_end)

    def reset_policy_rows(self, slots: list[int]) -> None:
        """Tells a stateful policy that new episodes start on ``slots``."""
        acting = self._acting
        if slots and acting.resets and acting.policy is not None:
            mask = np.zeros(self.n_envs, dtype=bool)
            mask[slots] = True
            acting.policy.reset(mask)

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
        blocks = self._acting.blocks
        if blocks is not None and self.native is None:  # native rows share one generator
            # A window may cut the episode, which goes on later: keep the state to rewind to.
            live.rng_state = live.rng.bit_generator.state if window_end != NEVER else None
            blocks.start(slot, live.rng, s)
        self.live[slot] = live
        self.n_live += 1
        position = self._rows.position.get(slot)
        if position is None:
            self._rows.changed = True
        else:  # the slot keeps its row: refresh what may have changed on it
            self._rows.rngs[position] = live.rng

    def drop(self, slot: int) -> Live:
        """Takes the live segment off a slot (its data is forgotten)."""
        native = self.native
        if native is not None:
            live = native.release(slot)
            self.n_live -= 1
            return live
        segment = self.live[slot]
        assert segment is not None
        self.live[slot] = None
        self.n_live -= 1
        self._rows.went_idle.append(slot)
        if self._acting.blocks is not None:
            self._acting.blocks.stop(slot)
        return segment

    def drop_all(self) -> list[Live]:
        """Drops every live segment; returns them in slot order."""
        if self.native is not None:
            return [self.drop(slot) for slot, _ in self.running_units()]
        return [self.drop(slot) for slot, live in enumerate(self.live) if live is not None]

    def _refresh_active(self) -> None:
        rows = self._rows
        if rows.went_idle:
            if any(self.live[slot] is None for slot in rows.went_idle):
                rows.changed = True
            rows.went_idle.clear()
        if rows.changed:
            rows.changed = False
            lives = [(slot, live) for slot, live in enumerate(self.live) if live is not None]
            rows.active = [slot for slot, _ in lives]
            rows.position = {slot: row for row, slot in enumerate(rows.active)}
            rows.rngs = [live.rng for _, live in lives]
            everyone = len(rows.active) == self.n_envs
            rows.cols = None if everyone else np.array(rows.active, dtype=np.intp)

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
        rows = self._rows
        if rows.went_idle or rows.changed:
            self._refresh_active()
        active = rows.active
        if not active:
            return 0
        ring, policy, checker = self._stepping_parts()
        s, row, cols = self.step_count, self._claim_row(), rows.cols
        observations = ring.obs[row] if cols is None else ring.obs[row, cols]
        try:
            blocks = self._acting.blocks
            if blocks is None:
                actions, agent_infos = policy.get_actions(observations, rows.rngs)
            else:
                draws = blocks.take(s, cols)
                actions, agent_infos = policy.get_actions_from_draws(observations, draws)
            per_env = checker(actions, active, self._acting.name)
            ring.put_policy_outputs(row, cols, actions, agent_infos)
        except Exception as exc:
            self.failures.raise_policy_failure(
                exc,
                observations,
                active,
                self.drop,
                step_count=self.step_count,
                source_name=self.source_name,
            )
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
            position = rows.position
            for slot, _ in failed:
                next_obs[position[slot]] = ring.obs[row, slot]
        try:
            ring.put_env_outputs(row, cols, next_obs, rewards)
        except (ValueError, TypeError):
            skip = {slot for slot, _ in failed}
            bad = ring.put_env_outputs_one_by_one(row, active, next_obs, rewards, skip)
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
        ring, policy, checker, spec = self.ring, self._acting.policy, self.checker, self.spec
        assert ring is not None and policy is not None and checker is not None
        assert spec is not None
        if not self._acting.checked:
            check_policy_fits(policy, spec)
            self._acting.checked = True
        return ring, policy, checker

    def _claim_row(self) -> int:
        """The ring row of this vector step, making room first if the ring may be full."""
        ring, s = self.ring, self.step_count
        assert ring is not None
        if s + 2 - self._oldest > ring.capacity:  # the ring may be full: look closer
            starts = self.running_starts()
            self._oldest = ring.make_room(min(starts, default=s), s + 1)
        return s % ring.capacity

    def _advance_native(self, sink: Sink) -> int:
        """:meth:`advance` on a native backend: one batched policy call, one env call.

        The policy acts on every slot's observation (row i is slot i), all
        rows drawing from the backend's one generator
        (``Policy.get_actions_batched``, docs/policies.md); every slot's
        outputs are written to the ring with one whole-row write per field,
        the running slots' steps being the ones recorded. The observations
        are checked with a few whole-batch calls (:class:`SuspectRows`); an
        episode that ends is a row of ints saying where its steps are in the
        ring (``FinishedTable``), gathered with the others when they are
        taken. The env truncates episodes at the time limit itself (it is
        made with the engine's limit), so no limit step is tracked here.
        """
        native = self.native
        assert native is not None
        running = self.n_live
        if not running:
            return 0
        went_idle = self._rows.went_idle
        if went_idle:  # the gym path's cache bookkeeping
            went_idle.clear()
        # The parts are plain attribute reads once the policy was checked: this
        # runs once per vector step, so it avoids calls that only re-check.
        ring, policy, checker = self.ring, self._acting.policy, self.checker
        if not self._acting.checked:
            ring, policy, checker = self._stepping_parts()
        assert ring is not None and policy is not None and checker is not None
        s = self.step_count
        capacity = ring.capacity
        row = self._claim_row() if s + 2 - self._oldest > capacity else s % capacity
        observations = ring.obs[row]
        try:
            batch, agent_infos = policy.get_actions_batched(observations, native.generator)
            actions = checker(batch, self._rows.active, self._acting.name, "get_actions_batched")
            ring.put_policy_outputs(row, None, actions, agent_infos)
        except Exception as exc:
            self.failures.raise_native_policy_failure(
                exc,
                observations,
                native.running_mask(),
                self.drop,
                step_count=self.step_count,
                source_name=self.source_name,
            )
            raise
        try:
            next_obs, rewards, ended, terminated = native.step(actions, self._vouch)
            ring.put_env_outputs(row, None, next_obs, rewards)  # type: ignore[arg-type]
        except Exception as exc:
            self._native_failed(exc, s, sink)
            return 0
        self.step_count = s + 1
        if ring.obs_flags is not None:
            # One whole-batch call in the common case: every value finite.
            finite = all_finite(next_obs)
            ring.obs_flags[(row + 1) % capacity] = False if finite else nonfinite_rows(next_obs)
        assert self._suspect_rows is not None
        suspect = self._suspect_rows(next_obs)
        if suspect is not None:
            self._note_suspects(suspect, s + 1)
        if ended:
            self._finish_native(ended, terminated, s, sink)
        if native.suspects:
            native.clear_suspects()
        return running

    def _finish_native(self, ended: list[int], terminated: np.ndarray, s: int, sink: Sink) -> None:
        """Records the episodes that ended at step ``s`` as rows of ints (``FinishedTable``)."""
        ring, spec, recorder, native = self.ring, self.spec, self._recorder, self.native
        assert ring is not None and spec is not None and recorder is not None
        assert native is not None
        self.n_live -= len(ended)

        def rejects(slot: int, start: int, length: int) -> bool:
            assert ring is not None and recorder is not None and native is not None
            observations = ring.segment_steps(start, length, slot)[0]
            return recorder.rejects(slot, native.live(slot), observations)

        rows, steps = native.end(ended, terminated, s, rejects)
        if rows:
            sink.on_rows(ring, spec, rows, steps, min(rows[::_ROW_WIDTH]))

    def _native_failed(self, exc: Exception, s: int, sink: Sink) -> None:
        """A native env's step raised: every live segment is lost, none restarted.

        The env's state is unknown, so it is reset as a whole before any
        new episode begins (no slot is running after this).
        """
        lives = [(slot, self.drop(slot)) for slot, _ in self.running_units()]
        self.failures.native_failed(exc, lives, s, self.source_name)
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
            blocks = self._acting.blocks
            if blocks is not None and live.rng_state is not None:
                blocks.rewind(live.rng, live.rng_state, length)
        assert self._recorder is not None
        record = self._recorder.record(slot, live, length, last)
        if record is not None:
            sink.on_record(slot, live, record, continues=last is None)

    def _on_step_failure(self, slot: int, exc: Exception, s: int, sink: Sink) -> None:
        live = self.drop(slot)
        length = s - live.seg_start
        if sink.keeps_partial and length:
            assert self._recorder is not None
            record = self._recorder.record(slot, live, length, None)
            if record is not None:
                sink.on_record(slot, live, record, continues=False)
        restarted = self._restart_env(slot, exc, "step", live, step=live.offset + length + 1)
        sink.on_env_failure(slot, live, restarted)

    def _restart_env(self, slot: int, exc: Exception, call: str, live: Live, *, step: int) -> bool:
        """Marks a failed env for rebuilding; True if it may be, else queues an EnvError."""
        assert self.source is not None
        return self.failures.restart(
            slot,
            exc,
            call,
            live,
            step=step,
            rebuildable=self.source.rebuildable,
            source_name=self.source_name,
        )

    def raise_deferred(self) -> None:
        """Raises the first queued EnvError (noting the others), if any."""
        self.failures.raise_deferred()
