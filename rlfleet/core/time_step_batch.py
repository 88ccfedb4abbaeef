"""TimeStepBatch: a batch of independent transitions (garage's ``TimeStepBatch``).

The data type of off-policy algorithms, imitation learning and batch RL.
Unlike :class:`~rlfleet.core.episode_batch.EpisodeBatch`, rows need not
form whole episodes, so every field, ``episode_infos`` included, has one
row per step (garage's convention). Observation and action layouts follow
EpisodeBatch's (Dict and Tuple elements flattened).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.core import _validation as v
from rlfleet.core._arrays import (
    NestedArrays,
    ValueEquality,
    batch_repr,
    concat_fields,
    slice_nested,
)
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError

_STEPS = "one row per reward"
_INFO_FIELDS = ("episode_infos", "env_infos", "agent_infos")
_ARRAY_FIELDS = ("observations", "actions", "rewards", "next_observations", "step_types")


@dataclass(frozen=True, eq=False, repr=False)
class TimeStepBatch(ValueEquality):
    """A batch of B transitions.

    Attributes:
        env_spec: The spaces the transitions were sampled in.
        episode_infos: Information about each transition's episode, one row
            per step: arrays, or nested dicts of arrays, of shape (B, S*).
        observations: Shape (B, O*): what the agent saw.
        actions: Shape (B, A*): what it did.
        rewards: Shape (B,).
        next_observations: Shape (B, O*): what it saw after acting.
        env_infos: Per-step environment information, values of shape (B, S*).
        agent_infos: Per-step agent information, values of shape (B, S*).
        step_types: Shape (B,), integer :class:`StepType` values.

    Raises:
        InvalidBatchError: (a ``ValueError``) naming the field and the
            expected and actual shapes when the fields do not fit together.
    """

    env_spec: EnvSpec
    episode_infos: NestedArrays
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    env_infos: NestedArrays
    agent_infos: NestedArrays
    step_types: np.ndarray

    def __post_init__(self) -> None:
        """Checks that the fields fit the env spec and each other."""
        owner = "TimeStepBatch"
        v.check_env_spec(owner, self.env_spec)
        rewards = v.require_array(f"{owner}.rewards", self.rewards)
        if rewards.ndim != 1:
            raise InvalidBatchError(
                f"rewards has shape {rewards.shape} but must have shape (B,), one reward per "
                f"step. {owner}.rewards: expected shape (B,) (one reward per step), got "
                f"{rewards.shape}"
            )
        size = len(rewards)
        v.check_rewards(f"{owner}.rewards", rewards, size, _STEPS)
        spec = self.env_spec

        obs = v.check_leading_dim(f"{owner}.observations", self.observations, size, _STEPS)
        v.check_per_step_space(
            f"{owner}.observations", obs, spec.observation_space, "observation_space"
        )
        v.check_leading_dim(f"{owner}.next_observations", self.next_observations, size, _STEPS)
        v.check_shape(
            f"{owner}.next_observations",
            self.next_observations,
            obs.shape,
            "shaped like observations",
            spec.observation_space,
        )
        actions = v.check_leading_dim(f"{owner}.actions", self.actions, size, _STEPS)
        v.check_per_step_space(f"{owner}.actions", actions, spec.action_space, "action_space")
        # An object array (garage's dtype=StepType under numpy 2) comes back as int64.
        object.__setattr__(
            self,
            "step_types",
            v.check_step_types(f"{owner}.step_types", self.step_types, size, _STEPS),
        )
        for field in _INFO_FIELDS:
            v.check_infos(f"{owner}.{field}", getattr(self, field), size, _STEPS)

    def __repr__(self) -> str:
        """A summary of shapes and dtypes (the arrays themselves can be huge)."""
        return batch_repr(self, f"total_steps={self.total_steps}", _ARRAY_FIELDS + _INFO_FIELDS)

    @property
    def total_steps(self) -> int:
        """Number of transitions B."""
        return len(self.rewards)

    @property
    def terminals(self) -> np.ndarray:
        """Boolean array (B,): True where the step is TERMINAL."""
        return self.step_types == StepType.TERMINAL

    def _rows(self, start: int, stop: int) -> dict[str, Any]:
        """Fields of rows ``start:stop`` (views), keyed like the constructor."""
        rows: dict[str, Any] = {field: getattr(self, field)[start:stop] for field in _ARRAY_FIELDS}
        for field in _INFO_FIELDS:
            rows[field] = slice_nested(getattr(self, field), start, stop)
        return rows

    @classmethod
    def concatenate(cls, *batches: TimeStepBatch) -> TimeStepBatch:
        """Concatenates batches (one ``np.concatenate`` per field).

        Args:
            *batches: Batches of the same env (same spaces) with the same
                info keys; the result has the first batch's env spec.

        Returns:
            The concatenation; a single batch is returned unchanged.

        Raises:
            InvalidBatchError: If no batch is given, the spaces differ, or
                the info keys or trailing shapes differ.
        """
        v.check_concatenable("TimeStepBatch", batches)
        if len(batches) == 1:
            return batches[0]
        return cls(
            env_spec=batches[0].env_spec,
            **concat_fields("TimeStepBatch.concatenate", batches, _ARRAY_FIELDS + _INFO_FIELDS),
        )

    def split(self) -> list[TimeStepBatch]:
        """Splits into one single-step batch per transition (views).

        Returns:
            B batches of one transition each; :meth:`concatenate` inverts it.
        """
        return [
            TimeStepBatch(env_spec=self.env_spec, **self._rows(i, i + 1))
            for i in range(self.total_steps)
        ]

    def to_time_step_list(self) -> list[dict[str, Any]]:
        """Converts to a list of single-transition dicts (garage's format).

        Returns:
            B dicts with keys ``episode_infos``, ``observations``,
            ``actions``, ``rewards``, ``next_observations``, ``env_infos``,
            ``agent_infos`` and ``step_types``, every array keeping a leading
            dimension of 1 (as garage). :meth:`from_time_step_list` inverts it.
        """
        return [self._rows(i, i + 1) for i in range(self.total_steps)]

    @classmethod
    def from_time_step_list(
        cls, env_spec: EnvSpec, ts_samples: Sequence[Mapping[str, Any]]
    ) -> TimeStepBatch:
        """Builds a batch from dicts shaped like :meth:`to_time_step_list`'s.

        Each dict may hold any number of rows. ``episode_infos``,
        ``env_infos`` and ``agent_infos`` may be left out when empty.

        Args:
            env_spec: The spaces the transitions were sampled in.
            ts_samples: The dicts, at least one.

        Returns:
            The concatenated batch.

        Raises:
            InvalidBatchError: If there are no dicts or they do not form a
                valid batch.
        """
        if not ts_samples:
            raise InvalidBatchError(
                "TimeStepBatch.from_time_step_list: expected at least one dict, got none"
            )
        samples = [{**{field: {} for field in _INFO_FIELDS}, **sample} for sample in ts_samples]
        return cls(
            env_spec=env_spec,
            **concat_fields(
                "TimeStepBatch.from_time_step_list",
                samples,
                _ARRAY_FIELDS + _INFO_FIELDS,
                operator.getitem,
            ),
        )

    @classmethod
    def from_episode_batch(cls, batch: EpisodeBatch) -> TimeStepBatch:
        """Flattens an EpisodeBatch into its transitions.

        ``episode_infos`` is repeated for every step of its episode, and
        ``next_observations`` is derived from the observations and last
        observations. The other arrays are shared, not copied.

        Args:
            batch: The episodes.

        Returns:
            The batch of its ``batch.total_steps`` transitions.
        """
        return cls(
            env_spec=batch.env_spec,
            episode_infos=batch.episode_infos_by_step,
            observations=batch.observations,
            actions=batch.actions,
            rewards=batch.rewards,
            next_observations=batch.next_observations,
            env_infos=batch.env_infos,
            agent_infos=batch.agent_infos,
            step_types=batch.step_types,
        )
