"""The engine's native backend: every slot is one env of a native vector env.

A native vector env steps all its envs at once and resets a finished env
itself on the step after (next-step autoreset, see
:mod:`rlfleet.envs.native`). The engine's slots still start and end
episodes one by one, so each slot is in one of four states:

* ``FRESH``: its env holds the first observation of an episode no step has
  touched; an episode may begin on it.
* ``RUNNING``: an episode the engine records runs on it.
* ``AWAITING``: its episode ended; the next vector step resets it (the
  action is ignored) and makes it ``FRESH``.
* ``DRAINING``: it was stepped without being recorded (idle while the
  others ran, or its episode was dropped); it is not used until its
  episode ends and the env resets it.

Nothing a slot does unrecorded ever reaches a batch, and an episode only
begins on a ``FRESH`` slot, so every recorded episode starts at its env's
reset and holds all of its steps. When no slot is ``RUNNING`` the whole
env is reset at the next begin, seeded with that unit's env seed: idle
periods (between requests, after an update) cost no draining.

A ``RUNNING`` slot's episode is its entries in per-slot lists (its unit,
the vector step of its first step, its agent version), no object of its
own: episodes start and end a few per vector step, nearly every step. A
:class:`~rlfleet.worker._segments.Live` is made only for the rare paths
that take one (a drop, a failure, the exact checks of a suspect episode).

The states are Python lists, not arrays: a few slots change state per
vector step, and a list entry costs less to read or set than a numpy call.
Each vector step's own work is whole-array (the env's step, one
``flatnonzero`` of its done flags); per slot, only the slots whose episode
ended are touched.

The policy samples every row from one :attr:`NativeSlots.generator`,
reseeded with that same unit's policy seed at that same whole reset: the
env and the actions restart together, so the same units and calls on the
same layout give the same batch (docs/reliability.md section 10).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.core.step_type import StepType
from rlfleet.envs.native import NativeVectorEnv
from rlfleet.worker._checks import nonfinite_rows
from rlfleet.worker._numeric import all_finite
from rlfleet.worker._segments import Live
from rlfleet.worker.units import QueuedUnit

FRESH, RUNNING, AWAITING, DRAINING = 0, 1, 2, 3

_TERMINAL = int(StepType.TERMINAL)
_TIMEOUT = int(StepType.TIMEOUT)


class NativeSlots:
    """Maps the engine's slots onto one native vector env.

    Args:
        native: The vector env; it has one env per slot.
    """

    def __init__(self, native: NativeVectorEnv) -> None:
        self.native = native
        self.n = native.num_envs
        self.state = [DRAINING] * self.n
        self._running = 0
        self._fresh: list[int] = []  # FRESH slots, ascending
        self._awaiting: list[int] = []  # AWAITING slots (ended at the last step)
        # The RUNNING slots' episodes: per slot its unit (None: none
        # recorded), the vector step of its first step and the agent version
        # it runs with; the worker's number, the same for all.
        self.units: list[QueuedUnit | None] = [None] * self.n
        self._starts = [0] * self.n
        self._versions = [0] * self.n
        self._worker = 0
        #: Slot -> vector step of the first observation of its current env
        #: episode that a quick check found suspect (cleared when it ends).
        self.suspects: dict[int, int] = {}
        #: The one generator all rows' actions draw from (``get_actions_batched``).
        self.generator = np.random.default_rng(0)
        space = native.single_action_space
        # Idle slots need an action too; the env's own first action (0 for
        # Discrete) is as good as any, and its result is never recorded.
        placeholder = np.zeros(space.shape or (), dtype=space.dtype)
        if hasattr(space, "start"):
            placeholder = placeholder + space.start
        self._placeholder = np.broadcast_to(placeholder, (self.n, *placeholder.shape)).copy()

    @property
    def name(self) -> str:
        """The env's name, for messages."""
        return self.native.name

    @property
    def running(self) -> int:
        """Number of ``RUNNING`` slots."""
        return self._running

    def running_mask(self) -> np.ndarray:
        """Bool per slot: ``RUNNING``."""
        return np.array(self.state) == RUNNING

    def ready(self) -> list[int]:
        """The slots an episode may begin on now, ascending."""
        if self._running == 0:
            return list(range(self.n))
        return list(self._fresh)

    def needs_reset(self) -> bool:
        """Whether the next :meth:`begin` must follow a :meth:`reset` (no slot runs)."""
        return self._running == 0 and len(self._fresh) < self.n

    def reset(self, env_seed: int, policy_seed: int) -> np.ndarray:
        """Resets the whole env with ``env_seed``, :attr:`generator` with ``policy_seed``.

        Returns:
            Every slot's first observation (all are ``FRESH``).
        """
        observations = self.native.reset_all(env_seed)
        self.state = [FRESH] * self.n
        self._fresh = list(range(self.n))
        self._awaiting = []
        self.suspects = {}
        self.generator = np.random.default_rng(policy_seed)
        return observations

    def begin_many(
        self,
        slots: list[int],
        units: list[QueuedUnit],
        start: int,
        agent_version: int,
        worker: int,
    ) -> None:
        """Begins the units' episodes on slots that are a prefix of :meth:`ready`'s list.

        Args:
            slots: The slots, in :meth:`ready`'s order.
            units: The unit of each slot's episode.
            start: The vector step of their first step.
            agent_version: The agent version they run with.
            worker: The worker's number (in the episodes' infos).
        """
        state, units_of, starts, versions = self.state, self.units, self._starts, self._versions
        for slot, unit in zip(slots, units, strict=True):
            assert state[slot] == FRESH
            state[slot] = RUNNING
            units_of[slot] = unit
            starts[slot] = start
            versions[slot] = agent_version
        self._worker = worker
        self._running += len(slots)
        fresh = self._fresh
        if fresh[: len(slots)] == slots:  # slots are taken in ascending order
            del fresh[: len(slots)]
        else:
            for slot in slots:
                fresh.remove(slot)

    def live(self, slot: int) -> Live:
        """A :class:`Live` of the slot's running episode, for the paths that take one."""
        unit = self.units[slot]
        assert unit is not None
        # EPISODE_INFO_KEYS order; a native env's episodes have no seeds of
        # their own (their env and actions follow the whole env's): say so,
        # never a wrong one.
        meta = (self._versions[slot], NO_ENV_SEED, NO_POLICY_SEED, unit.episode_index, self._worker)
        live = Live(unit, self.generator, meta, (unit.request, unit.episode_index))
        live.seg_start = self._starts[slot]
        return live

    def running_units(self) -> list[tuple[int, QueuedUnit]]:
        """``(slot, unit)`` of every recorded episode, in slot order."""
        return [(slot, unit) for slot, unit in enumerate(self.units) if unit is not None]

    def running_starts(self) -> list[int]:
        """The vector step of the first step of every recorded episode."""
        starts = self._starts
        return [starts[slot] for slot, unit in enumerate(self.units) if unit is not None]

    def release(self, slot: int) -> Live:
        """The engine dropped the slot's episode (cut or aborted); returns it."""
        live = self.live(slot)
        self.units[slot] = None
        if self.state[slot] == RUNNING:
            # Cut or aborted mid-episode: its env goes on unseen until it ends.
            self.state[slot] = DRAINING
            self._running -= 1
        return live

    def end(
        self,
        ended: list[int],
        terminated: np.ndarray,
        s: int,
        rejects: Callable[[int, int, int], bool],
    ) -> tuple[list[int], int]:
        """The rows of the episodes that ended at vector step ``s``, and their steps.

        Args:
            ended: The slots whose episode ended (:meth:`step`'s list).
            terminated: The env's flags (an ended slot not terminated was truncated).
            s: The vector step.
            rejects: ``(slot, start, length)`` -> whether the exact checks
                drop a suspect slot's episode (it gets no row).

        Returns:
            A ``FinishedTable`` row per kept episode (start, length, slot,
            last step type, the infos in EPISODE_INFO_KEYS order, request),
            flat; their steps in all.
        """
        units, starts, versions = self.units, self._starts, self._versions
        suspects, worker = self.suspects, self._worker
        rows: list[int] = []
        steps = 0
        for slot in ended:
            unit = units[slot]
            assert unit is not None
            start = starts[slot]
            length = s - start + 1
            if slot in suspects and rejects(slot, start, length):
                units[slot] = None
                continue
            units[slot] = None
            last = _TERMINAL if terminated[slot] else _TIMEOUT
            index = unit.episode_index
            rows += (start, length, slot, last, versions[slot], NO_ENV_SEED, NO_POLICY_SEED, index)
            rows += (worker, unit.request)
            steps += length
        return rows, steps

    def step(
        self, actions: np.ndarray, checked: bool = False
    ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
        """Steps every env; the slots that are not ``RUNNING`` get the placeholder action.

        A draining env thus runs on with the env's own first action (for
        CartPole, always pushing one way: its episode ends within a few
        dozen steps), not with the policy's, which may keep it going.
        ``AWAITING`` slots need none: their env ignores the action.

        Args:
            actions: One action per slot (rows of idle slots are ignored).
            checked: Every entry of ``actions`` was found in the range of a
                space the env ``vouches_for``: the env's own check of
                them, if they go to it unchanged, skips its range pass.

        Returns:
            ``(observations, rewards, ended, terminated)`` of every slot;
            ``ended`` lists the running slots whose episode ended, ascending
            (they are ``AWAITING`` from now on), ``terminated`` is the env's
            flags (an ended slot that is not terminated was truncated).
        """
        state = self.state
        awaiting = self._awaiting
        unseen = self._running + len(awaiting) < self.n  # some FRESH or DRAINING slot
        vouched = checked
        if unseen:
            vouched = False  # a new array: the env checks it all
            idle = np.array(state) != RUNNING
            where = idle.reshape((self.n,) + (1,) * (np.ndim(actions) - 1))
            actions = np.where(where, self._placeholder, actions)
            for slot in self._fresh:  # stepped without being recorded
                state[slot] = DRAINING
            self._fresh = []
        observations, rewards, terminated, truncated = self.native.step_all(actions, vouched)
        for slot in awaiting:  # their env restarted on this step
            state[slot] = FRESH
        self._fresh = awaiting
        if unseen and not all_finite(observations):
            draining = np.array(state) == DRAINING
            observations = self._hide_unseen_nonfinite(observations, draining)
        finished = (terminated | truncated).nonzero()[0].tolist()
        ended = []
        for slot in finished:
            if state[slot] == RUNNING:
                ended.append(slot)
            state[slot] = AWAITING
        self._running -= len(ended)
        self._awaiting = finished
        return observations, rewards, ended, terminated

    def clear_suspects(self) -> None:
        """Forgets the suspects of the slots whose env episode ended at the last step.

        Call once the ended episodes were checked: the next observation
        of those slots starts their env's next episode.
        """
        suspects = self.suspects
        for slot in self._awaiting:
            suspects.pop(slot, None)

    @staticmethod
    def _hide_unseen_nonfinite(observations: np.ndarray, draining: np.ndarray) -> np.ndarray:
        """Zeroes the non-finite observations of draining slots.

        The policy acts on every row (the engine passes the whole batch), and
        a draining slot's observations are never recorded: a NaN there must
        not fail the running episodes' policy call. The caller looks first
        with one whole-batch call (:func:`all_finite`): this runs only on a
        batch that holds a NaN or inf.
        """
        if observations.dtype.kind != "f":
            return observations
        unseen = draining & nonfinite_rows(observations)
        if not unseen.any():
            return observations
        observations = observations.copy()
        observations[unseen] = 0
        return observations

    def close(self) -> None:
        """Closes the vector env."""
        self.native.close()
