"""RandomPolicy: uniform actions drawn from each row's own generator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError
from rlfleet.policies._distributions import row_generators
from rlfleet.policies._observations import batch_size
from rlfleet.policies.base import AgentInfos, Policy

RowSampler = Callable[[np.random.Generator], Any]


class RandomPolicy(Policy):
    """Acts uniformly at random; has no parameters and empty agent_infos.

    Row i draws from ``rngs[i]`` only (never from the action space's own
    generator, which would make actions depend on the batch):

    * Discrete: ``start + rng.integers(n)``.
    * MultiDiscrete: ``start + rng.integers(nvec)``.
    * MultiBinary: ``rng.integers(0, 2, size=shape)``.
    * Box, per element as gymnasium's ``Box.sample``: uniform in
      [low, high] where bounded on both sides, ``low + Exp(1)`` or
      ``high - Exp(1)`` where bounded on one side, N(0, 1) where unbounded;
      integer Boxes take the floor of a uniform draw in [low, high + 1).

    Args:
        env_spec: The spaces; any observation space, and a Box, Discrete,
            MultiDiscrete or MultiBinary action space.
        seed: Seeds the policy's own generator (used when ``get_actions`` is
            called without per-row generators).

    Raises:
        ConfigError: If the action space is not one of those above.
    """

    def __init__(self, env_spec: EnvSpec, *, seed: int | None = None) -> None:
        super().__init__(env_spec, seed=seed)
        space = env_spec.action_space
        self._sample_row = _row_sampler(space)
        self._shape = tuple(space.shape or ())
        self._dtype = space.dtype

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Draws one action per observation row (see :class:`Policy`).

        Raises:
            PolicyError: If the observations do not match the observation
                space or ``rngs`` has the wrong length.
        """
        owner = type(self).__name__
        n = batch_size(observations, self.env_spec.observation_space, owner)
        actions = np.empty((n, *self._shape), dtype=self._dtype)
        for row, rng in enumerate(row_generators(rngs, n, self.rng, owner)):
            actions[row] = self._sample_row(rng)
        return actions, {}


def _row_sampler(space: gym.Space) -> RowSampler:
    if isinstance(space, gym.spaces.Discrete):
        start, n = int(space.start), int(space.n)
        return lambda rng: start + rng.integers(n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        start_md, nvec = space.start.astype(np.int64), space.nvec.astype(np.int64)
        return lambda rng: start_md + rng.integers(nvec)
    if isinstance(space, gym.spaces.MultiBinary):
        shape = tuple(space.shape)
        return lambda rng: rng.integers(0, 2, size=shape, dtype=np.int8)
    if isinstance(space, gym.spaces.Box):
        return _BoxSampler(space)
    raise ConfigError(
        f"RandomPolicy draws Box, Discrete, MultiDiscrete or MultiBinary actions, got {space}"
    )


class _BoxSampler:
    """Draws one Box element-wise by interval type (see :class:`RandomPolicy`)."""

    def __init__(self, space: gym.spaces.Box) -> None:
        below, above = space.bounded_below, space.bounded_above
        self._shape = tuple(space.shape)
        self._integer = space.dtype.kind in "iu"
        self._low = space.low.astype(np.float64)
        self._high = space.high.astype(np.float64)
        # Integer draws floor a uniform over [low, high + 1): each integer
        # in [low, high] gets the same width.
        self._draw_high = self._high + 1.0 if self._integer else self._high
        self._unbounded = ~below & ~above
        self._low_only = below & ~above
        self._high_only = ~below & above
        self._bounded = below & above
        if self._integer:
            # float64 rounds the int64/uint64 maxima up, past the dtype: stay below.
            info = np.iinfo(cast("np.dtype[np.integer[Any]]", space.dtype))
            top = float(info.max)
            if int(top) > info.max:
                top = float(np.nextafter(top, -np.inf))
            self._clip_low = np.maximum(self._low, float(info.min))
            self._clip_high = np.minimum(self._high, top)
        self._counts = [
            int(mask.sum())
            for mask in (self._unbounded, self._low_only, self._high_only, self._bounded)
        ]

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        n_unbounded, n_low, n_high, n_bounded = self._counts
        sample = np.empty(self._shape, dtype=np.float64)
        sample[self._unbounded] = rng.standard_normal(n_unbounded)
        sample[self._low_only] = self._low[self._low_only] + rng.exponential(size=n_low)
        sample[self._high_only] = self._draw_high[self._high_only] - rng.exponential(size=n_high)
        sample[self._bounded] = rng.uniform(
            self._low[self._bounded], self._draw_high[self._bounded], size=n_bounded
        )
        if self._integer:
            # floor then clip: rounding can land exactly on high + 1.
            sample = np.clip(np.floor(sample), self._clip_low, self._clip_high)
        return sample
