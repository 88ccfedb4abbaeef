"""Turns an EpisodeBatch into the float64 arrays a numpy learner trains on."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import ConfigError, InvalidBatchError
from rlfleet.learners._advantages import episode_starts
from rlfleet.policies._observations import ObservationEncoder


@dataclass(frozen=True)
class TrainingArrays:
    """One batch, encoded.

    Attributes:
        features: Encoded observations (S, D), float64, exactly what the
            built-in MLP policies compute on.
        last_features: Encoded observation after each episode's last step (N, D).
        actions: Action indices in [0, n) (S,), int64.
        rewards: Rewards (S,), float64.
        lengths: Episode lengths (N,), int64.
        terminated: Whether each episode ended in a TERMINAL state (N,), bool.
    """

    features: np.ndarray
    last_features: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray


class BatchEncoder:
    """Encodes batches of one env for a categorical-policy learner.

    Args:
        env_spec: Discrete actions; observations any space the built-in MLP
            policies read.
        owner: Who encodes (named in errors).

    Raises:
        ConfigError: If the action space is not Discrete or the observation
            space cannot be encoded.
    """

    def __init__(self, env_spec: EnvSpec, owner: str) -> None:
        space = env_spec.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ConfigError(
                f"{owner} trains categorical policies and needs a Discrete action space, "
                f"got {space}"
            )
        self.owner = owner
        self.env_spec = env_spec
        self.n_actions = int(space.n)
        self._start = int(space.start)
        self._encoder = ObservationEncoder(env_spec.observation_space, owner)
        self.feature_dim = self._encoder.dim

    def encode(self, batch: EpisodeBatch) -> TrainingArrays:
        """Encodes a batch.

        Raises:
            InvalidBatchError: If the batch is of another env, or an action
                lies outside the action space.
        """
        if batch.env_spec.action_space != self.env_spec.action_space:
            raise InvalidBatchError(
                f"{self.owner}: batch actions are {batch.env_spec.action_space}, this learner "
                f"trains for {self.env_spec.action_space}; sample from the env it was built for"
            )
        lengths = np.asarray(batch.lengths, dtype=np.int64)
        last_steps = episode_starts(lengths) + lengths - 1
        return TrainingArrays(
            features=self._features(batch.observations),
            last_features=self._features(batch.last_observations),
            actions=self._action_indices(batch.actions),
            rewards=np.asarray(batch.rewards, dtype=np.float64),
            lengths=lengths,
            terminated=np.asarray(batch.step_types)[last_steps] == StepType.TERMINAL,
        )

    def _features(self, observations: np.ndarray) -> np.ndarray:
        space_shape = self.env_spec.observation_space.shape
        # EpisodeBatch may hold discrete observations already flattened
        # (one-hot), as garage allows; those are the encoding itself.
        if observations.shape[1:] == (self.feature_dim,) and space_shape != (self.feature_dim,):
            return observations.astype(np.float64)
        return self._encoder(observations).astype(np.float64)

    def _action_indices(self, actions: np.ndarray) -> np.ndarray:
        if actions.ndim == 2 and actions.shape[1] == self.n_actions:
            return np.argmax(actions, axis=1)  # one-hot, as garage may store them
        index = actions.reshape(len(actions)).astype(np.int64) - self._start
        bad = (index < 0) | (index >= self.n_actions)
        if bad.any():
            step = int(np.argmax(bad))
            raise InvalidBatchError(
                f"{self.owner}: batch action at step {step} is {actions[step]}, outside "
                f"{self.env_spec.action_space}; the batch was not sampled in this action space"
            )
        return index
