"""EnvSpec: what an environment looks like (garage's ``EnvSpec``)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from rlfleet.core.in_out_spec import InOutSpec


@dataclass(frozen=True, eq=True)
class EnvSpec(InOutSpec):
    """Describes the spaces of an environment and its episode length limit.

    As in garage, an EnvSpec is an :class:`InOutSpec` whose input is the
    observation space and whose output is the action space.

    Args:
        observation_space: The gymnasium space of observations.
        action_space: The gymnasium space of actions.
        max_episode_length: Steps after which an episode is cut off with
            ``StepType.TIMEOUT``; None for no limit.

    Raises:
        ConfigError: If a space is not a gymnasium space or the limit is < 1.
    """

    observation_space: gym.Space
    action_space: gym.Space
    max_episode_length: int | None = None

    @property
    def input_space(self) -> gym.Space:
        """The observation space (garage's InOutSpec view)."""
        return self.observation_space

    @property
    def output_space(self) -> gym.Space:
        """The action space (garage's InOutSpec view)."""
        return self.action_space

    def __post_init__(self) -> None:
        from rlfleet.errors import ConfigError

        for name in ("observation_space", "action_space"):
            if not isinstance(getattr(self, name), gym.Space):
                raise ConfigError(
                    f"EnvSpec.{name} must be a gymnasium.Space, "
                    f"got {type(getattr(self, name)).__name__}"
                )
        if self.max_episode_length is not None and (
            isinstance(self.max_episode_length, bool)
            or not isinstance(self.max_episode_length, int)
            or self.max_episode_length < 1
        ):
            raise ConfigError(
                "EnvSpec.max_episode_length must be a positive int or None, "
                f"got {self.max_episode_length!r}"
            )

    @classmethod
    def from_env(cls, env: gym.Env, max_episode_length: int | None = None) -> EnvSpec:
        """Builds the spec of a gymnasium env.

        Args:
            env: The environment.
            max_episode_length: Overrides the env's own ``spec.max_episode_steps``.

        Returns:
            The EnvSpec.
        """
        if max_episode_length is None and env.spec is not None:
            max_episode_length = env.spec.max_episode_steps
        return cls(env.observation_space, env.action_space, max_episode_length)
