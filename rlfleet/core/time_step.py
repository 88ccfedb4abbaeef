"""Single-step records: EnvStep (what an env returns) and TimeStep (SARS).

Both follow garage 2021.03 (``garage.EnvStep``, ``garage.TimeStep``): they
take their fields positionally in garage's order or by keyword, and compare
by value (arrays by contents). They are frozen: built once per step by
workers, never mutated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, SupportsFloat

from rlfleet.core import _validation as v
from rlfleet.core._arrays import ValueEquality
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError


class _StepTypeFlags(ValueEquality):
    """The first/mid/terminal/timeout/last properties, from ``step_type``."""

    step_type: StepType

    @property
    def first(self) -> bool:
        """Whether this step is the first of its episode."""
        return self.step_type == StepType.FIRST

    @property
    def mid(self) -> bool:
        """Whether this step is neither the first nor the last of its episode."""
        return self.step_type == StepType.MID

    @property
    def terminal(self) -> bool:
        """Whether the episode reached a terminal state at this step."""
        return self.step_type == StepType.TERMINAL

    @property
    def timeout(self) -> bool:
        """Whether the episode was cut off (time limit, truncation) at this step."""
        return self.step_type == StepType.TIMEOUT

    @property
    def last(self) -> bool:
        """Whether this step is the last of its episode (TERMINAL or TIMEOUT)."""
        return self.step_type in (StepType.TERMINAL, StepType.TIMEOUT)

    def _coerce_step_type(self, owner: str) -> None:
        # Workers often hold step types as numpy ints; store the enum so
        # identity comparisons (garage style `is StepType.FIRST`) keep working.
        try:
            step_type = StepType(self.step_type)
        except (ValueError, TypeError):
            raise InvalidBatchError(
                "step_type must be dtype garage.StepType, but got dtype "
                f"{type(self.step_type)} instead. "
                f"{owner}.step_type: expected a StepType (0..3), got {self.step_type!r}"
            ) from None
        object.__setattr__(self, "step_type", step_type)


@dataclass(frozen=True, eq=False)
class EnvStep(_StepTypeFlags):
    """The result of one environment step (garage's ``EnvStep``).

    Attributes:
        env_spec: The spaces of the environment.
        action: The action that was taken, an element of ``action_space``
            (or its flattened form).
        reward: The reward for taking ``action``.
        observation: The observation after taking ``action``.
        env_info: Environment information for this step.
        step_type: Where this step sits in its episode.

    Raises:
        InvalidBatchError: If a field does not fit the spaces or its type.
    """

    env_spec: EnvSpec
    action: Any
    reward: SupportsFloat
    observation: Any
    env_info: dict[str, Any]
    step_type: StepType

    def __post_init__(self) -> None:
        """Checks the fields against the env spec (shapes only, cheap)."""
        owner = "EnvStep"
        v.check_env_spec(owner, self.env_spec)
        spec = self.env_spec
        v.check_element(f"{owner}.action", self.action, spec.action_space, "action_space")
        v.check_reward(f"{owner}.reward", self.reward)
        v.check_element(
            f"{owner}.observation", self.observation, spec.observation_space, "observation_space"
        )
        v.check_mapping(f"{owner}.env_info", self.env_info)
        self._coerce_step_type(owner)


@dataclass(frozen=True, eq=False)
class TimeStep(_StepTypeFlags):
    """One (observation, action, reward, next observation) transition.

    garage's ``TimeStep``.

    Attributes:
        env_spec: The spaces of the environment.
        episode_info: Information about the whole episode (e.g. its goal,
            seed or agent version), one value per key.
        observation: The observation before taking ``action``.
        action: The action taken.
        reward: The reward for taking ``action`` in ``observation``.
        next_observation: The observation after taking ``action``.
        env_info: Environment information for this step.
        agent_info: Agent information for this step (e.g. log-probabilities,
            RNN state).
        step_type: Where this step sits in its episode.

    Raises:
        InvalidBatchError: If a field does not fit the spaces or its type.
    """

    env_spec: EnvSpec
    episode_info: dict[str, Any]
    observation: Any
    action: Any
    reward: SupportsFloat
    next_observation: Any
    env_info: dict[str, Any]
    agent_info: dict[str, Any]
    step_type: StepType

    def __post_init__(self) -> None:
        """Checks the fields against the env spec (shapes only, cheap)."""
        owner = "TimeStep"
        v.check_env_spec(owner, self.env_spec)
        spec = self.env_spec
        for field in ("observation", "next_observation"):
            value = getattr(self, field)
            v.check_element(f"{owner}.{field}", value, spec.observation_space, "observation_space")
        v.check_element(f"{owner}.action", self.action, spec.action_space, "action_space")
        v.check_reward(f"{owner}.reward", self.reward)
        for field in ("episode_info", "env_info", "agent_info"):
            v.check_mapping(f"{owner}.{field}", getattr(self, field))
        self._coerce_step_type(owner)

    @classmethod
    def from_env_step(
        cls,
        env_step: EnvStep,
        last_observation: Any,
        agent_info: dict[str, Any],
        episode_info: dict[str, Any],
    ) -> TimeStep:
        """Builds a TimeStep from an EnvStep and what the agent knew.

        Args:
            env_step: The step the environment returned.
            last_observation: The observation the agent acted on (before
                ``env_step.action``).
            agent_info: Agent information for this step.
            episode_info: Information about the whole episode.

        Returns:
            The TimeStep; its ``next_observation`` is ``env_step.observation``.
        """
        return cls(
            env_spec=env_step.env_spec,
            episode_info=episode_info,
            observation=last_observation,
            action=env_step.action,
            reward=env_step.reward,
            next_observation=env_step.observation,
            env_info=env_step.env_info,
            agent_info=agent_info,
            step_type=env_step.step_type,
        )
