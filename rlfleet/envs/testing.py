"""Tiny deterministic envs for tests, registered with gymnasium on import.

Importing this module registers:

* ``rlfleet/Counter-v0``: observation = steps taken in the episode, as a
  float32 array of shape (1,); reward 1.0 per step; terminates after
  ``length`` steps (default 5). Actions: ``Discrete(2)``, ignored. The reset
  info holds the ``seed`` given to ``reset``, so tests can see which seed an
  episode got. ``render_mode="rgb_array"`` renders a 4x4 frame filled with
  the step count (no pygame needed).
* ``rlfleet/Crashing-v0``: a Counter that raises ``RuntimeError``.
* ``rlfleet/Hanging-v0``: a Counter that sleeps (forever by default).
* ``rlfleet/NaN-v0``: a Counter whose observation is NaN at one step.
* ``rlfleet/Slow-v0``: a Counter that sleeps ``step_seconds`` in every step
  (or a uniform draw up to ``max_seconds``): a slow or I/O-bound env.
* ``rlfleet/OffSpace-v0``: an honest env that leaves its declared space:
  observations are 0.0 in a ``Box(-1, 1, (3,))`` except every
  ``every``-th step of an episode (default 5), where they are ``value``
  (default 50.0).
* ``rlfleet/ObjectInfo-v0``: a Counter that puts itself into its infos
  (``info["env"]``, as tianshou's test env does): a value no JSON carries.
* ``rlfleet/DictObservation-v0``: a Counter observing ``{"count": obs}`` in
  a Dict space.
* ``rlfleet/Frames-v0``: a Counter observing Atari-sized frames (84x84x4
  uint8, :data:`ATARI_FRAME_SHAPE`) filled with the step count: results of
  a few episodes are megabytes.

When the faulty envs fire (``at_step`` stands for ``crash_at_step`` /
``hang_at_step``):

* ``..._in="step"`` (default): in the step call that would make the episode's
  step count reach ``at_step`` (1-based), in every episode.
* ``..._in="reset"``: in every reset once the env has taken ``at_step``
  steps in its lifetime; ``at_step=0`` fires on the very first reset.

In another process (``SubprocVectorEnv``, a worker), build them with
``EnvConfig("rlfleet/Counter-v0", imports=("rlfleet.envs.testing",))``.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlfleet.errors import InvalidValueError

_FAULT_CALLS = ("step", "reset")
#: Frame size of the ``rgb_array`` render mode.
FRAME_SHAPE = (4, 4, 3)


class CounterEnv(gym.Env[np.ndarray, np.int64]):
    """Counts steps; see the module docstring.

    Args:
        length: Steps per episode (>= 1).
        render_mode: None or ``"rgb_array"``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 30}  # noqa: RUF012

    def __init__(self, length: int = 5, render_mode: str | None = None) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            # builtin on purpose: a plain ValueError, as a third-party env
            # raises; the vector-env tests see how such an error travels.
            raise ValueError(f"length must be a positive int, got {length!r}")
        if render_mode not in (None, "rgb_array"):
            raise InvalidValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.length = length
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, float(length), shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode_step = 0
        self.total_steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode at step 0; the info holds the seed."""
        super().reset(seed=seed)
        self._before("reset")
        self.episode_step = 0
        return self._observation(), {"seed": seed}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advances the count; terminates at ``length``."""
        self._before("step")
        self.episode_step += 1
        self.total_steps += 1
        return self._observation(), 1.0, self.episode_step >= self.length, False, {}

    def render(self) -> np.ndarray | None:
        """Returns a 4x4 RGB frame filled with the step count in rgb_array mode."""
        if self.render_mode != "rgb_array":
            return None
        return np.full(FRAME_SHAPE, min(self.episode_step, 255), dtype=np.uint8)

    def _observation(self) -> np.ndarray:
        return np.array([self.episode_step], dtype=np.float32)

    def _before(self, call: str) -> None:
        """Hook run at the start of ``step``/``reset``; the faulty envs fire here."""


class _FaultyEnv(CounterEnv, abc.ABC):
    """A Counter with a fault that fires in ``step`` or ``reset`` (module docstring)."""

    def __init__(self, at_step: int, fault_in: str, length: int, render_mode: str | None) -> None:
        super().__init__(length, render_mode)
        if fault_in not in _FAULT_CALLS:
            raise InvalidValueError(
                f"the fault must fire in one of {_FAULT_CALLS}, got {fault_in!r}"
            )
        lowest = 1 if fault_in == "step" else 0
        if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < lowest:
            raise InvalidValueError(f"the fault step must be an int >= {lowest}, got {at_step!r}")
        if fault_in == "step" and at_step > length:
            raise InvalidValueError(f"fault step {at_step} is past the episode length {length}")
        self._at_step = at_step
        self._fault_in = fault_in

    def _before(self, call: str) -> None:
        if call != self._fault_in:
            return
        due = (
            self.episode_step + 1 == self._at_step
            if call == "step"
            else self.total_steps >= self._at_step
        )
        if due:
            self._fault(call)

    @abc.abstractmethod
    def _fault(self, call: str) -> None:
        """Does the fault (crash, hang, ...) in ``call``."""


class CrashingEnv(_FaultyEnv):
    """Raises ``RuntimeError`` in ``step`` or ``reset`` (module docstring).

    Args:
        crash_at_step: When to raise.
        crash_in: ``"step"`` or ``"reset"``.
        length: Steps per episode.
        render_mode: None or ``"rgb_array"``.
    """

    def __init__(
        self,
        crash_at_step: int = 1,
        crash_in: str = "step",
        length: int = 5,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(crash_at_step, crash_in, length, render_mode)

    def _fault(self, call: str) -> None:
        # builtin on purpose: a third-party env's crash, which tests name by its type.
        raise RuntimeError(
            f"rlfleet/Crashing-v0 crashed on purpose in {call}, after {self.episode_step} "
            f"steps of the episode ({self.total_steps} in total)"
        )


class HangingEnv(_FaultyEnv):
    """Sleeps in ``step`` or ``reset`` (module docstring).

    Args:
        hang_at_step: When to sleep.
        hang_in: ``"step"`` or ``"reset"``.
        hang_seconds: How long to sleep; None sleeps forever.
        length: Steps per episode.
        render_mode: None or ``"rgb_array"``.
    """

    def __init__(
        self,
        hang_at_step: int = 1,
        hang_in: str = "step",
        hang_seconds: float | None = None,
        length: int = 5,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(hang_at_step, hang_in, length, render_mode)
        if hang_seconds is not None and hang_seconds < 0:
            raise InvalidValueError(f"hang_seconds must be >= 0 or None, got {hang_seconds!r}")
        self._hang_seconds = hang_seconds

    def _fault(self, call: str) -> None:
        if self._hang_seconds is not None:
            time.sleep(self._hang_seconds)
            return
        while True:
            time.sleep(3600.0)


class SlowEnv(CounterEnv):
    """A Counter that sleeps in every step: a slow simulator (module docstring).

    Args:
        step_seconds: Seconds each step sleeps (>= 0); with ``max_seconds``,
            the least of a uniform draw.
        length: Steps per episode.
        render_mode: None or ``"rgb_array"``.
        max_seconds: If set, each step sleeps a uniform draw in
            ``[step_seconds, max_seconds]`` from the env's own generator
            (seeded by ``reset(seed=...)``): a step time that varies.
    """

    def __init__(
        self,
        step_seconds: float = 0.01,
        length: int = 5,
        render_mode: str | None = None,
        max_seconds: float | None = None,
    ) -> None:
        super().__init__(length, render_mode)
        if not step_seconds >= 0:
            raise InvalidValueError(f"step_seconds must be >= 0, got {step_seconds!r}")
        if max_seconds is not None and not max_seconds >= step_seconds:
            raise InvalidValueError(f"max_seconds must be >= step_seconds, got {max_seconds!r}")
        self._step_seconds = step_seconds
        self._max_seconds = max_seconds

    def _before(self, call: str) -> None:
        if call == "step":
            if self._max_seconds is None:
                time.sleep(self._step_seconds)
            else:
                time.sleep(float(self.np_random.uniform(self._step_seconds, self._max_seconds)))


class NaNEnv(CounterEnv):
    """A Counter whose observation is NaN right after step ``nan_at_step``.

    Args:
        nan_at_step: The episode step (1-based) whose observation is NaN.
        length: Steps per episode.
        render_mode: None or ``"rgb_array"``.
    """

    def __init__(
        self, nan_at_step: int = 1, length: int = 5, render_mode: str | None = None
    ) -> None:
        super().__init__(length, render_mode)
        if isinstance(nan_at_step, bool) or not isinstance(nan_at_step, int):
            raise InvalidValueError(f"nan_at_step must be an int, got {nan_at_step!r}")
        if not 1 <= nan_at_step <= length:
            raise InvalidValueError(f"nan_at_step must be in [1, {length}], got {nan_at_step}")
        self._nan_at_step = nan_at_step

    def _observation(self) -> np.ndarray:
        if self.episode_step == self._nan_at_step:
            return np.full((1,), np.nan, dtype=np.float32)
        return super()._observation()


class OffSpaceEnv(CounterEnv):
    """Observations of 0.0 in ``Box(-1, 1, (3,))``, but ``value`` at every ``every``-th step.

    Args:
        every: The episode steps (multiples of it) whose observation is ``value``.
        value: The observation's elements there.
        length: Steps per episode.
        render_mode: None or ``"rgb_array"``.
    """

    def __init__(
        self, every: int = 5, value: float = 50.0, length: int = 20, render_mode: str | None = None
    ) -> None:
        super().__init__(length, render_mode)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidValueError(f"every must be a positive int, got {every!r}")
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self._every, self._value = every, float(value)

    def _observation(self) -> np.ndarray:
        off = self.episode_step and self.episode_step % self._every == 0
        return np.full((3,), self._value if off else 0.0, dtype=np.float32)


class ObjectInfoEnv(CounterEnv):
    """A Counter whose infos hold the env itself (module docstring)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "env": self}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "env": self}


class DictObservationEnv(CounterEnv):
    """A Counter observing a Dict (module docstring)."""

    def __init__(self, length: int = 5, render_mode: str | None = None) -> None:
        super().__init__(length, render_mode)
        self.observation_space = spaces.Dict({"count": self.observation_space})  # type: ignore[assignment]

    def _observation(self) -> Any:
        return {"count": super()._observation()}


#: An Atari frame stack's shape (84x84 grey frames, 4 of them).
ATARI_FRAME_SHAPE = (84, 84, 4)


class FramesEnv(CounterEnv):
    """A Counter observing ``ATARI_FRAME_SHAPE`` uint8 frames filled with the step count."""

    def __init__(self, length: int = 5, render_mode: str | None = None) -> None:
        super().__init__(length, render_mode)
        self.observation_space = spaces.Box(0, 255, shape=ATARI_FRAME_SHAPE, dtype=np.uint8)

    def _observation(self) -> Any:
        return np.full(ATARI_FRAME_SHAPE, min(self.episode_step, 255), dtype=np.uint8)


#: The ids this module registers, mapped to their env classes.
TEST_ENVS: dict[str, type[CounterEnv]] = {
    "rlfleet/Counter-v0": CounterEnv,
    "rlfleet/Crashing-v0": CrashingEnv,
    "rlfleet/Hanging-v0": HangingEnv,
    "rlfleet/NaN-v0": NaNEnv,
    "rlfleet/Slow-v0": SlowEnv,
    "rlfleet/OffSpace-v0": OffSpaceEnv,
    "rlfleet/ObjectInfo-v0": ObjectInfoEnv,
    "rlfleet/DictObservation-v0": DictObservationEnv,
    "rlfleet/Frames-v0": FramesEnv,
}

for _env_id, _env_class in TEST_ENVS.items():
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point=f"{__name__}:{_env_class.__name__}")

__all__ = [
    "ATARI_FRAME_SHAPE",
    "FRAME_SHAPE",
    "TEST_ENVS",
    "CounterEnv",
    "CrashingEnv",
    "DictObservationEnv",
    "FramesEnv",
    "HangingEnv",
    "NaNEnv",
    "ObjectInfoEnv",
    "OffSpaceEnv",
]
