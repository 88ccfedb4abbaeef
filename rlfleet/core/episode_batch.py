r"""EpisodeBatch: a batch of whole episodes (garage 2021.03's ``EpisodeBatch``).

Notation: N episodes of lengths [T]; N•[T] is the flattened time axis of
``lengths.sum()`` steps; O* and A* are the per-step observation and action
shapes.

Observations and actions are arrays. Elements of Box, Discrete,
MultiDiscrete and MultiBinary spaces may be stored in the space's own shape
or flattened (one-hot for discrete spaces, as garage allows); elements of
Dict, Tuple and other composite spaces must be flattened with
``gymnasium.spaces.flatten`` (garage requires the same).

Construction checks shapes and dtypes and never copies: the arrays given are
the arrays kept. Batches are immutable by convention; do not write into
their arrays.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet._util.prebuilt import prebuilt
from rlfleet.core import _validation as v
from rlfleet.core._arrays import (
    NestedArrays,
    ValueEquality,
    batch_repr,
    concat_fields,
    episode_starts,
    map_nested,
    pad_batch_array,
    repeat_nested,
    slice_nested,
    take_nested,
)
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError

_STEPS = "sum of lengths"
_EPISODES = "number of episodes"

_INFO_FIELDS = ("episode_infos", "env_infos", "agent_infos")
_ARRAY_FIELDS = (
    "observations",
    "last_observations",
    "actions",
    "rewards",
    "step_types",
    "lengths",
)


@dataclass(frozen=True, eq=False, repr=False)
class EpisodeBatch(ValueEquality):
    r"""A batch of whole episodes, flattened along time.

    Attributes:
        env_spec: The spaces the episodes were sampled in.
        episode_infos: Per-episode information (e.g. agent version, env
            seed, episode index, worker): arrays, or nested dicts of arrays,
            of shape (N, S*). garage calls this ``episode_infos_by_episode``;
            the per-step expansion is :attr:`episode_infos_by_step`.
        observations: Shape (N•[T], O*). ``observations[i]`` is what the
            agent saw when it chose ``actions[i]``.
        last_observations: Shape (N, O*): the observation after each
            episode's last action (there is one more observation than actions).
        actions: Shape (N•[T], A*).
        rewards: Shape (N•[T],).
        env_infos: Per-step environment information: arrays, or nested dicts
            of arrays, of shape (N•[T], S*).
        agent_infos: Per-step agent information, shaped like ``env_infos``.
        step_types: Shape (N•[T],), integer :class:`StepType` values.
        lengths: Shape (N,), integer, each >= 1: the length of each episode.

    Raises:
        InvalidBatchError: (a ``ValueError``) naming the field and the
            expected and actual shapes when the fields do not fit together.
    """

    env_spec: EnvSpec
    episode_infos: NestedArrays
    observations: np.ndarray
    last_observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    env_infos: NestedArrays
    agent_infos: NestedArrays
    step_types: np.ndarray
    lengths: np.ndarray

    def __post_init__(self) -> None:
        """Checks that the fields fit the env spec and each other."""
        owner = "EpisodeBatch"
        v.check_env_spec(owner, self.env_spec)
        lengths = v.check_lengths(f"{owner}.lengths", self.lengths)
        n_episodes, total = len(lengths), int(lengths.sum())
        spec = self.env_spec

        obs = v.check_leading_dim(f"{owner}.observations", self.observations, total, _STEPS)
        v.check_per_step_space(
            f"{owner}.observations", obs, spec.observation_space, "observation_space"
        )
        v.check_shape(
            f"{owner}.last_observations",
            self.last_observations,
            (n_episodes, *obs.shape[1:]),
            "one per episode, shaped like observations",
        )
        actions = v.check_leading_dim(f"{owner}.actions", self.actions, total, _STEPS)
        v.check_per_step_space(f"{owner}.actions", actions, spec.action_space, "action_space")
        v.check_rewards(f"{owner}.rewards", self.rewards, total, _STEPS)
        # An object array (garage's dtype=StepType under numpy 2) comes back as int64.
        object.__setattr__(
            self,
            "step_types",
            v.check_step_types(f"{owner}.step_types", self.step_types, total, _STEPS),
        )
        v.check_infos(f"{owner}.env_infos", self.env_infos, total, _STEPS)
        v.check_infos(f"{owner}.agent_infos", self.agent_infos, total, _STEPS)
        v.check_infos(f"{owner}.episode_infos", self.episode_infos, n_episodes, _EPISODES)

    @classmethod
    def prechecked(
        cls,
        *,
        env_spec: EnvSpec,
        episode_infos: NestedArrays,
        observations: np.ndarray,
        last_observations: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        env_infos: NestedArrays,
        agent_infos: NestedArrays,
        step_types: np.ndarray,
        lengths: np.ndarray,
        check_actions: bool,
    ) -> EpisodeBatch:
        """Builds a batch whose fields fit by construction, without re-checking them.

        For builders that guarantee every check of construction: rlfleet's
        worker engine, whose ring has the spaces' shapes and dtypes and whose
        batches are assembled from it (``rlfleet/worker/_episode_buffer.py``).
        Batches that arrive from elsewhere (the network, users) are always
        checked: use the constructor.

        Args:
            env_spec: As the constructor's; the other fields too.
            check_actions: Check the actions against the action space all
                the same (for actions nobody checked while stepping).

        Raises:
            InvalidBatchError: If ``check_actions`` and the actions do not fit.
        """
        if check_actions:
            v.check_per_step_space(
                "EpisodeBatch.actions", actions, env_spec.action_space, "action_space"
            )
        return prebuilt(
            cls,
            env_spec=env_spec,
            episode_infos=episode_infos,
            observations=observations,
            last_observations=last_observations,
            actions=actions,
            rewards=rewards,
            env_infos=env_infos,
            agent_infos=agent_infos,
            step_types=step_types,
            lengths=lengths,
        )

    def with_episode_infos(self, **columns: Any) -> EpisodeBatch:
        """This batch with ``episode_infos`` columns added or replaced.

        The other fields are shared, not copied, and not checked again (they
        were when this batch was built); the episode_infos are.

        Raises:
            InvalidBatchError: If a column does not hold one row per episode.
        """
        infos = {**self.episode_infos, **columns}
        v.check_infos("EpisodeBatch.episode_infos", infos, len(self.lengths), _EPISODES)
        batch = copy.copy(self)
        object.__setattr__(batch, "episode_infos", infos)
        return batch

    def __repr__(self) -> str:
        """A summary of shapes and dtypes (the arrays themselves can be huge)."""
        sizes = f"n_episodes={self.n_episodes}, total_steps={self.total_steps}"
        return batch_repr(self, sizes, _ARRAY_FIELDS + _INFO_FIELDS)

    # ----------------------------------------------------------------- sizes

    @property
    def n_episodes(self) -> int:
        """Number of episodes N."""
        return len(self.lengths)

    @property
    def total_steps(self) -> int:
        """Number of steps N•[T] (the sum of lengths)."""
        return int(self.lengths.sum())

    def _episode_ranges(self) -> list[tuple[int, int]]:
        """(start, stop) of each episode in the flattened time axis."""
        starts = episode_starts(self.lengths)
        return list(zip(starts.tolist(), (starts + self.lengths).tolist(), strict=True))

    # ------------------------------------------------------- combine / split

    @classmethod
    def concatenate(cls, *batches: EpisodeBatch) -> EpisodeBatch:
        """Concatenates batches episode-wise (one ``np.concatenate`` per field).

        Args:
            *batches: Batches of the same env (same spaces) with the same
                info keys. ``max_episode_length`` may differ; the result has
                the first batch's env spec.

        Returns:
            The concatenation; a single batch is returned unchanged.

        Raises:
            InvalidBatchError: If no batch is given, the spaces differ, or
                the info keys or trailing shapes differ.
        """
        v.check_concatenable("EpisodeBatch", batches)
        if len(batches) == 1:
            return batches[0]

        return cls(
            env_spec=batches[0].env_spec,
            **concat_fields("EpisodeBatch.concatenate", batches, _ARRAY_FIELDS + _INFO_FIELDS),
        )

    def take_episodes(self, order: Sequence[int] | np.ndarray) -> EpisodeBatch:
        """Returns the episodes at positions ``order``, in that order.

        Args:
            order: Episode positions (0..N-1); may repeat or leave some out.

        Returns:
            A new batch (its arrays are copies), or ``self`` when ``order``
            is 0..N-1.

        Raises:
            InvalidBatchError: If a position is out of range.
        """
        order = np.asarray(order, dtype=np.int64).reshape(-1)
        n = len(self.lengths)
        if order.size and (order.min() < 0 or order.max() >= n):
            raise InvalidBatchError(
                f"EpisodeBatch.take_episodes: positions must be in 0..{n - 1}, got {order.tolist()}"
            )
        if order.size == n and np.array_equal(order, np.arange(n)):
            return self
        lengths = self.lengths[order]
        old_starts = episode_starts(self.lengths)
        new_starts = np.cumsum(lengths) - lengths
        steps = np.arange(int(lengths.sum())) + np.repeat(old_starts[order] - new_starts, lengths)
        return EpisodeBatch(
            env_spec=self.env_spec,
            episode_infos=map_nested(lambda a: a[order], self.episode_infos),
            observations=self.observations[steps],
            last_observations=self.last_observations[order],
            actions=self.actions[steps],
            rewards=self.rewards[steps],
            env_infos=map_nested(lambda a: a[steps], self.env_infos),
            agent_infos=map_nested(lambda a: a[steps], self.agent_infos),
            step_types=self.step_types[steps],
            lengths=lengths,
        )

    def split(self) -> list[EpisodeBatch]:
        """Splits into one batch per episode (the inverse of :meth:`concatenate`).

        Returns:
            N single-episode batches whose arrays are views of this one's.
        """
        return [
            EpisodeBatch(
                env_spec=self.env_spec,
                episode_infos=slice_nested(self.episode_infos, i, i + 1),
                observations=self.observations[start:stop],
                last_observations=self.last_observations[i : i + 1],
                actions=self.actions[start:stop],
                rewards=self.rewards[start:stop],
                env_infos=slice_nested(self.env_infos, start, stop),
                agent_infos=slice_nested(self.agent_infos, start, stop),
                step_types=self.step_types[start:stop],
                lengths=self.lengths[i : i + 1],
            )
            for i, (start, stop) in enumerate(self._episode_ranges())
        ]

    def to_list(self) -> list[dict[str, Any]]:
        """Converts to a list of garage episode dicts, one per episode.

        Returns:
            Dicts with keys ``episode_infos`` (each value of shape S*, i.e.
            this episode's row), ``observations`` (T, O*),
            ``next_observations`` (T, O*), ``actions`` (T, A*), ``rewards``
            (T,), ``env_infos`` and ``agent_infos`` (values (T, S*)) and
            ``step_types`` (T,). Arrays are views except
            ``next_observations``. :meth:`from_list` inverts this exactly.
        """
        next_observations = self.next_observations
        return [
            {
                "episode_infos": take_nested(self.episode_infos, i),
                "observations": self.observations[start:stop],
                "next_observations": next_observations[start:stop],
                "actions": self.actions[start:stop],
                "rewards": self.rewards[start:stop],
                "env_infos": slice_nested(self.env_infos, start, stop),
                "agent_infos": slice_nested(self.agent_infos, start, stop),
                "step_types": self.step_types[start:stop],
            }
            for i, (start, stop) in enumerate(self._episode_ranges())
        ]

    @classmethod
    def from_list(cls, env_spec: EnvSpec, paths: Sequence[Mapping[str, Any]]) -> EpisodeBatch:
        """Builds a batch from garage episode dicts ("paths").

        Each path has ``rewards`` (T,), ``actions`` (T, A*), ``observations``
        and optionally ``episode_infos`` (values of shape S*, stacked to
        (N, S*)), ``env_infos``, ``agent_infos`` and ``step_types``; without
        ``step_types``, a ``dones`` array gives TERMINAL where done and MID
        elsewhere (garage's fallback). The last observation of each path is
        taken from the first form that applies:

        1. ``observations`` of length T + 1: the last row;
        2. ``last_observation`` (O*), which :func:`rlfleet.rollout` returns;
        3. ``next_observations`` (T, O*): its last row;
        4. otherwise the last of the T ``observations`` is repeated (garage
           is lenient here: the true last observation was lost).

        garage decides between form 1 and the others for all paths at once;
        here each path is read on its own, which gives the same result
        whenever garage's does.

        Args:
            env_spec: The spaces the episodes were sampled in.
            paths: The episodes, at least one.

        Returns:
            The batch.

        Raises:
            InvalidBatchError: If there are no paths, a path's observations
                are neither T nor T + 1 long, or the stacked arrays do not
                form a valid batch.
        """
        if not paths:
            raise InvalidBatchError("EpisodeBatch.from_list: expected at least one path, got none")
        episodes = [_normalize_path(i, path) for i, path in enumerate(paths)]
        return cls(
            env_spec=env_spec,
            **concat_fields(
                "EpisodeBatch.from_list", episodes, _ARRAY_FIELDS + _INFO_FIELDS, operator.getitem
            ),
        )

    # ------------------------------------------------------------- views

    @property
    def episode_infos_by_episode(self) -> NestedArrays:
        """garage's name for :attr:`episode_infos` (values of shape (N, S*))."""
        return self.episode_infos

    @property
    def episode_infos_by_step(self) -> NestedArrays:
        """episode_infos repeated for every step: values of shape (N•[T], S*).

        This is what garage's ``EpisodeBatch.episode_infos`` property returns
        and what ``TimeStepBatch.episode_infos`` holds.
        """
        return repeat_nested(self.episode_infos, self.lengths)

    @property
    def next_observations(self) -> np.ndarray:
        """The observation after each action, shape (N•[T], O*) (a new array)."""
        next_obs = np.empty_like(self.observations)
        next_obs[:-1] = self.observations[1:]
        # The step after an episode's last action is in last_observations,
        # not in the next episode's first row.
        next_obs[episode_starts(self.lengths) + self.lengths - 1] = self.last_observations
        return next_obs

    @property
    def observations_list(self) -> list[np.ndarray]:
        """Observations split per episode (views), each (T_i, O*)."""
        return np.split(self.observations, episode_starts(self.lengths)[1:])

    @property
    def actions_list(self) -> list[np.ndarray]:
        """Actions split per episode (views), each (T_i, A*)."""
        return np.split(self.actions, episode_starts(self.lengths)[1:])

    # ------------------------------------------------------------ padding

    def _max_length(self, what: str) -> int:
        max_length = self.env_spec.max_episode_length
        if max_length is None:
            raise InvalidBatchError(
                f"EpisodeBatch.{what}: env_spec.max_episode_length is None, so there is no "
                "length to pad to; set it on the EnvSpec, or call "
                "pad_batch_array(array, batch.lengths) to pad to the longest episode"
            )
        return max_length

    def _pad(self, array: np.ndarray, what: str) -> np.ndarray:
        return pad_batch_array(array, self.lengths, self._max_length(what))

    def _pad_infos(self, infos: NestedArrays, what: str) -> NestedArrays:
        max_length = self._max_length(what)
        return map_nested(lambda array: pad_batch_array(array, self.lengths, max_length), infos)

    def pad_to_last(self, input_array: np.ndarray) -> np.ndarray:
        """Zero-pads a flattened per-step array to (N, max_episode_length, S*) (garage's).

        Args:
            input_array: Shape (N•[T],) or (N•[T], S*), one row per step.

        Returns:
            Shape (N, max_episode_length) or (N, max_episode_length, S*).

        Raises:
            ValueError: If the array does not have one row per step, or the
                env spec has no max episode length.
        """
        return self._pad(np.asarray(input_array), "pad_to_last")

    @property
    def padded_observations(self) -> np.ndarray:
        """Observations zero-padded to (N, max_episode_length, O*)."""
        return self._pad(self.observations, "padded_observations")

    @property
    def padded_next_observations(self) -> np.ndarray:
        """Next observations zero-padded to (N, max_episode_length, O*)."""
        return self._pad(self.next_observations, "padded_next_observations")

    @property
    def padded_actions(self) -> np.ndarray:
        """Actions zero-padded to (N, max_episode_length, A*)."""
        return self._pad(self.actions, "padded_actions")

    @property
    def padded_rewards(self) -> np.ndarray:
        """Rewards zero-padded to (N, max_episode_length)."""
        return self._pad(self.rewards, "padded_rewards")

    @property
    def padded_step_types(self) -> np.ndarray:
        """Step types zero-padded (i.e. FIRST) to (N, max_episode_length)."""
        return self._pad(self.step_types, "padded_step_types")

    @property
    def padded_agent_infos(self) -> NestedArrays:
        """Agent infos, each zero-padded to (N, max_episode_length, S*)."""
        return self._pad_infos(self.agent_infos, "padded_agent_infos")

    @property
    def padded_env_infos(self) -> NestedArrays:
        """Env infos, each zero-padded to (N, max_episode_length, S*)."""
        return self._pad_infos(self.env_infos, "padded_env_infos")

    @property
    def valids(self) -> np.ndarray:
        """1 where a padded array holds a real step, else 0: (N, max_episode_length).

        The dtype is the rewards' dtype, as in garage.
        """
        return self._pad(np.ones_like(self.rewards), "valids")


def _normalize_path(index: int, path: Mapping[str, Any]) -> dict[str, Any]:
    """One garage path as the fields of a one-episode batch."""
    for key in ("observations", "actions", "rewards"):
        if key not in path:
            raise InvalidBatchError(f"EpisodeBatch.from_list: path {index} has no {key!r}")
    length = len(path["rewards"])
    observations, last_observation = _split_path_observations(index, path, length)
    return {
        "observations": observations,
        "last_observations": np.asarray(last_observation)[np.newaxis],
        "actions": path["actions"],
        "rewards": path["rewards"],
        "step_types": _path_step_types(index, path),
        "lengths": np.array([length], dtype=np.int64),
        # A path holds one row per episode_infos key; give it its episode axis.
        "episode_infos": map_nested(
            lambda value: np.asarray(value)[np.newaxis], path.get("episode_infos", {})
        ),
        "env_infos": path.get("env_infos", {}),
        "agent_infos": path.get("agent_infos", {}),
    }


def _split_path_observations(index: int, path: Mapping[str, Any], length: int) -> tuple[Any, Any]:
    """(observations of length T, last observation) of one garage path."""
    observations = path["observations"]
    if len(observations) == length + 1:
        return observations[:-1], observations[-1]
    if len(observations) != length:
        raise InvalidBatchError(
            f"EpisodeBatch.from_list: path {index} has {len(observations)} observations, "
            f"expected {length} (T = len(rewards)) or {length + 1} (T + 1)"
        )
    if "last_observation" in path:  # rlfleet's rollout() keeps it here
        return observations, path["last_observation"]
    next_observations = path.get("next_observations")
    if next_observations is not None:
        return observations, next_observations[-1]
    return observations, observations[-1]


def _path_step_types(index: int, path: Mapping[str, Any]) -> np.ndarray:
    """A path's step types, or garage's TERMINAL-if-done-else-MID fallback."""
    if "step_types" in path:
        return np.asarray(path["step_types"])
    if "dones" in path:
        dones = np.asarray(path["dones"], dtype=bool)
        return np.where(dones, StepType.TERMINAL.value, StepType.MID.value).astype(np.int64)
    raise InvalidBatchError(
        f"EpisodeBatch.from_list: path {index} has neither step_types nor dones"
    )
