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

The policy samples every row from one :attr:`NativeSlots.generator`,
reseeded with that same unit's policy seed at that same whole reset: the
env and the actions restart together, so the same units and calls on the
same layout give the same batch (docs/reliability.md section 10).
"""

from __future__ import annotations

import numpy as np

from rlfleet.envs.native import NativeVectorEnv
from rlfleet.worker._checks import nonfinite_rows

FRESH, RUNNING, AWAITING, DRAINING = 0, 1, 2, 3


class NativeSlots:
    """Maps the engine's slots onto one native vector env.

    Args:
        native: The vector env; it has one env per slot.
    """

    def __init__(self, native: NativeVectorEnv) -> None:
        self.native = native
        self.n = native.num_envs
        self.state = np.full(self.n, DRAINING, dtype=np.int8)
        self._running = 0
        self._observations: np.ndarray | None = None
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

    def ready(self) -> list[int]:
        """The slots an episode may begin on now, ascending (vectorised: called every step)."""
        if self._running == 0:
            return list(range(self.n))
        return np.flatnonzero(self.state == FRESH).tolist()

    def begin(self, slot: int, env_seed: int, policy_seed: int) -> np.ndarray:
        """Begins an episode on a slot :meth:`ready` listed; returns its first observation.

        If no slot is running (and the env is not fresh from a reset), the
        whole env is reset first with ``env_seed``, and :attr:`generator`
        reseeded with ``policy_seed``.
        """
        if self._running == 0 and not (self.state == FRESH).all():
            self._observations = self.native.reset_all(env_seed)
            self.state[:] = FRESH
            self.generator = np.random.default_rng(policy_seed)
        assert self._observations is not None and self.state[slot] == FRESH
        self.state[slot] = RUNNING
        self._running += 1
        return self._observations[slot]

    def release(self, slot: int) -> None:
        """The engine dropped the slot's episode (ended, cut or aborted)."""
        if self.state[slot] == RUNNING:
            # Cut or aborted mid-episode: its env goes on unseen until it ends.
            self.state[slot] = DRAINING
            self._running -= 1

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, bool, bool]]]:
        """Steps every env; the slots that are not ``RUNNING`` get the placeholder action.

        A draining env thus runs on with the env's own first action (for
        CartPole, always pushing one way: its episode ends within a few
        dozen steps), not with the policy's, which may keep it going.

        Args:
            actions: One action per slot (rows of idle slots are ignored).

        Returns:
            ``(observations, rewards, done)`` of every slot; ``done`` lists
            ``(slot, terminated, truncated)`` of the running slots whose
            episode ended (they are ``AWAITING`` from now on).
        """
        state = self.state
        some_idle = self._running < self.n
        if some_idle:
            idle = state != RUNNING
            where = idle.reshape((self.n,) + (1,) * (np.ndim(actions) - 1))
            actions = np.where(where, self._placeholder, actions)
        observations, rewards, terminated, truncated = self.native.step_all(actions)
        if some_idle:
            state[idle & (state == FRESH)] = DRAINING
            state[idle & (state == AWAITING)] = FRESH
            observations = self._hide_unseen_nonfinite(observations, state == DRAINING)
        done: list[tuple[int, bool, bool]] = []
        for slot in np.flatnonzero(terminated | truncated).tolist():
            if state[slot] == RUNNING:
                done.append((slot, bool(terminated[slot]), bool(truncated[slot])))
                self._running -= 1
            state[slot] = AWAITING
        self._observations = observations
        return observations, rewards, done

    @staticmethod
    def _hide_unseen_nonfinite(observations: np.ndarray, draining: np.ndarray) -> np.ndarray:
        """Zeroes the non-finite observations of draining slots.

        The policy acts on every row (the engine passes the whole batch), and
        a draining slot's observations are never recorded: a NaN there must
        not fail the running episodes' policy call.
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
