"""Observation filters (RLlib's ``NoFilter`` and ``MeanStdFilter``).

A filter maps each observation before the policy sees it. ``MeanStdFilter``
keeps a running mean and variance and also a *buffer*: the statistics of the
observations seen since the buffer was last flushed. Workers hand their
buffers (deltas) to a driver, which merges them into one state and sends it
back (RLlib's ``FilterManager``); the merge is exact because running
statistics combine in any order (Chan et al.'s parallel variance).

A filter's state is a dict of numpy arrays, so it is saved without pickle
and travels as tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfleet.errors import ConfigError

#: Names accepted by ``RolloutWorker(observation_filter=...)``.
FILTER_NAMES = ("NoFilter", "MeanStdFilter")


@dataclass(frozen=True)
class RunningStat:
    """Count, mean and sum of squared deviations of a stream of arrays.

    Attributes:
        n: Number of arrays pushed.
        mean: Element-wise mean.
        m2: Element-wise sum of squared deviations from the mean.
    """

    n: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningStat:
        """The statistics of nothing, for arrays of ``shape``."""
        return cls(0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def of(cls, rows: np.ndarray) -> RunningStat:
        """The statistics of the rows of ``rows`` (leading dimension = count)."""
        rows = np.asarray(rows, dtype=np.float64)
        mean = rows.mean(axis=0) if len(rows) else np.zeros(rows.shape[1:])
        return cls(len(rows), mean, ((rows - mean) ** 2).sum(axis=0))

    def merged(self, other: RunningStat) -> RunningStat:
        """The statistics of both streams together."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        m2 = self.m2 + other.m2 + delta**2 * (self.n * other.n / n)
        return RunningStat(n, mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation (1 where fewer than two arrays were seen)."""
        if self.n < 2:
            return np.ones_like(self.mean)
        return np.sqrt(self.m2 / (self.n - 1))


class NoFilter:
    """The identity filter; it has no state."""

    name = "NoFilter"

    def __call__(self, observations: np.ndarray, update: bool = True) -> np.ndarray:
        """Returns the observations unchanged."""
        del update
        return observations

    def apply_changes(self, other: ObservationFilter, with_buffer: bool = False) -> None:
        """Nothing to merge."""
        del other, with_buffer

    def rebase(self, other: ObservationFilter) -> None:
        """Nothing to take over."""
        del other

    def clear_buffer(self) -> None:
        """Nothing to clear."""

    def copy(self) -> NoFilter:
        """A new NoFilter."""
        return NoFilter()

    def get_state(self) -> dict[str, np.ndarray]:
        """An empty state."""
        return {}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Accepts only the empty state.

        Raises:
            ConfigError: If the state is not empty.
        """
        if state:
            raise ConfigError(f"NoFilter has no state, got {sorted(state)}")


class MeanStdFilter:
    """Normalises observations by a running mean and standard deviation.

    Args:
        shape: The shape of one observation.
        demean: Subtract the running mean.
        destd: Divide by the running standard deviation.
        clip: Clip the result to [-clip, clip] (None: no clip).
    """

    name = "MeanStdFilter"

    def __init__(
        self,
        shape: tuple[int, ...],
        *,
        demean: bool = True,
        destd: bool = True,
        clip: float | None = 10.0,
    ) -> None:
        self.shape = tuple(shape)
        self.demean = demean
        self.destd = destd
        self.clip = clip
        self.running = RunningStat.empty(self.shape)
        self.buffer = RunningStat.empty(self.shape)

    def __call__(self, observations: np.ndarray, update: bool = True) -> np.ndarray:
        """Filters a batch of observations (leading dimension = rows).

        Args:
            observations: Shape (B, *shape).
            update: Add the rows to the running statistics and the buffer
                first (as RLlib does).

        Returns:
            float32 array of the same shape.
        """
        rows = np.asarray(observations, dtype=np.float64)
        if update and len(rows):
            delta = RunningStat.of(rows)
            self.running = self.running.merged(delta)
            self.buffer = self.buffer.merged(delta)
        if self.demean:
            rows = rows - self.running.mean
        if self.destd:
            rows = rows / (self.running.std + 1e-8)
        if self.clip is not None:
            rows = np.clip(rows, -self.clip, self.clip)
        return rows.astype(np.float32)

    def apply_changes(self, other: ObservationFilter, with_buffer: bool = False) -> None:
        """Merges ``other``'s buffer (its delta) into this filter's statistics.

        Args:
            other: A MeanStdFilter of the same shape.
            with_buffer: Also take ``other``'s buffer as this one's.
        """
        other = self._same_kind(other)
        self.running = self.running.merged(other.buffer)
        if with_buffer:
            self.buffer = other.buffer

    def rebase(self, other: ObservationFilter) -> None:
        """Takes ``other``'s statistics, keeping this filter's unsent delta on top."""
        other = self._same_kind(other)
        self.running = other.running.merged(self.buffer)

    def clear_buffer(self) -> None:
        """Forgets the delta (after it was handed to the driver)."""
        self.buffer = RunningStat.empty(self.shape)

    def copy(self) -> MeanStdFilter:
        """An independent copy, buffer included."""
        new = MeanStdFilter(self.shape, demean=self.demean, destd=self.destd, clip=self.clip)
        new.set_state(self.get_state())
        return new

    def get_state(self) -> dict[str, np.ndarray]:
        """Running statistics and buffer as named float64/int64 arrays."""
        state = {}
        for prefix, stat in (("running", self.running), ("buffer", self.buffer)):
            state[f"{prefix}.n"] = np.array(stat.n, dtype=np.int64)
            state[f"{prefix}.mean"] = stat.mean.copy()
            state[f"{prefix}.m2"] = stat.m2.copy()
        return state

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restores what :meth:`get_state` returned.

        Raises:
            ConfigError: If a key is missing or an array has the wrong shape.
        """
        stats = []
        for prefix in ("running", "buffer"):
            try:
                n, mean, m2 = (state[f"{prefix}.{key}"] for key in ("n", "mean", "m2"))
            except KeyError as exc:
                raise ConfigError(
                    f"MeanStdFilter state lacks {exc.args[0]!r}; it has {sorted(state)}"
                ) from None
            for key, array in (("mean", mean), ("m2", m2)):
                if np.shape(array) != self.shape:
                    raise ConfigError(
                        f"MeanStdFilter state {prefix}.{key} has shape {np.shape(array)}, "
                        f"the filter's observations have {self.shape}"
                    )
            if np.shape(n) != () or int(n) < 0:
                raise ConfigError(f"MeanStdFilter state {prefix}.n must be a count, got {n!r}")
            stats.append(
                RunningStat(int(n), np.array(mean, dtype=np.float64), np.array(m2, np.float64))
            )
        self.running, self.buffer = stats

    def _same_kind(self, other: ObservationFilter) -> MeanStdFilter:
        if not isinstance(other, MeanStdFilter) or other.shape != self.shape:
            raise ConfigError(
                f"cannot combine a MeanStdFilter of shape {self.shape} with "
                f"{getattr(other, 'name', type(other).__name__)} "
                f"{getattr(other, 'shape', '')}"
            )
        return other


ObservationFilter = NoFilter | MeanStdFilter


def make_filter(name: str, observation_space: gym.Space) -> ObservationFilter:
    """Builds the filter ``name`` for observations of ``observation_space``.

    Raises:
        ConfigError: If the name is unknown, or MeanStdFilter is asked for a
            space that is not a Box.
    """
    if name == "NoFilter":
        return NoFilter()
    if name == "MeanStdFilter":
        if not isinstance(observation_space, gym.spaces.Box):
            raise ConfigError(
                f"MeanStdFilter needs Box observations, got {observation_space}; "
                "use observation_filter='NoFilter'"
            )
        return MeanStdFilter(observation_space.shape)
    raise ConfigError(f"observation_filter must be one of {FILTER_NAMES}, got {name!r}")
