"""Agent updates the checks send: built-in policies with telling parameters.

Parameter names and shapes come from rlfleet's own built-in policies built
for the EnvSpec the worker reported (docs/policies.md defines them for every
language). The values are chosen so that the episodes show whether the
worker really applied them:

* a *pinned* agent always takes one known action (softmax logits 40 apart,
  or a Gaussian with log_std -10): every action of its episodes must be it;
* a *balancing* agent for CartPole-shaped envs keeps the pole up for
  hundreds of steps, which makes batches big enough to need chunking.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.conformance._failure import CheckFailed
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.policies.mlp import bias_name, weight_name
from rlfleet.policies.spec import PolicySpec

#: Hidden layers of the pinned agent: small, yet not a linear policy.
PINNED_HIDDEN_SIZES = (16,)
#: Logit of the pinned action over the others (probability 1 - 4e-18 for two actions).
_LOGIT_GAP = 20.0
#: Gains of a linear CartPole controller on (x, x_dot, theta, theta_dot).
_BALANCE_GAINS = np.array([0.1, 0.5, 3.0, 1.0], dtype=np.float32)
#: Scale of the balancing logits: actions near-deterministic.
_BALANCE_SCALE = 50.0
#: Tolerance of pinned Gaussian actions (log_std -10: std 4.5e-5).
_GAUSSIAN_ATOL = 1e-3


@dataclasses.dataclass(frozen=True)
class Agent:
    """A policy spec and parameters to send in an AgentUpdate.

    Attributes:
        policy: The policy to build (sent as the update's PolicySpec).
        params: Parameter tensors by name (float32).
        action: For pinned agents, the action every step must take.
    """

    policy: PolicySpec
    params: dict[str, np.ndarray]
    action: np.ndarray | None = None

    def off_pin(self, actions: np.ndarray) -> int | None:
        """The first step whose action is not the pinned one, or None."""
        if self.action is None:
            return None
        actions = np.asarray(actions).reshape(len(actions), -1)
        pinned = np.broadcast_to(self.action.reshape(-1), actions.shape)
        close = np.isclose(actions, pinned, rtol=0.0, atol=_GAUSSIAN_ATOL).all(axis=1)
        return None if close.all() else int(np.argmin(close))


def pinned_agent(spec: EnvSpec) -> Agent:
    """An MLP agent that always takes the action space's first action.

    Discrete actions: ``mlp-categorical`` with a zero output weight and a
    bias 20 for action ``start``, -20 for the others. Box actions:
    ``mlp-gaussian`` with a zero output weight, the bias at the space's
    midpoint (0 where unbounded) and log_std -10.

    Raises:
        CheckFailed: If the action space is neither Discrete nor float Box.
    """
    kwargs = {"hidden_sizes": list(PINNED_HIDDEN_SIZES)}
    space = spec.action_space
    last = len(PINNED_HIDDEN_SIZES)
    if isinstance(space, gym.spaces.Discrete):
        params = _params(MLPCategoricalPolicy, spec, kwargs)
        params[weight_name(last)][:] = 0.0
        params[bias_name(last)][:] = -_LOGIT_GAP / 2
        params[bias_name(last)][0] = _LOGIT_GAP / 2
        return Agent(_spec("mlp-categorical", kwargs), params, np.array(space.start))
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        params = _params(MLPGaussianPolicy, spec, kwargs)
        low, high = (
            np.nan_to_num(b.astype(np.float64), posinf=0.0, neginf=0.0)
            for b in (space.low, space.high)
        )
        bounded = np.isfinite(space.low) & np.isfinite(space.high)
        middle = np.where(bounded, (low + high) / 2, 0.0).astype(np.float32).reshape(-1)
        params[weight_name(last)][:] = 0.0
        params[bias_name(last)][:] = middle
        params["log_std"][:] = -10.0
        return Agent(_spec("mlp-gaussian", kwargs), params, middle.reshape(space.shape))
    raise CheckFailed(
        f"the env's action space {space} has no built-in policy (Discrete: mlp-categorical, "
        "float Box: mlp-gaussian); run the kit with an env that has one (--env-id)"
    )


def balancing_agent(spec: EnvSpec) -> Agent | None:
    """A linear mlp-categorical CartPole controller, or None for other envs.

    It fits any env with Box(4,) observations and Discrete(2) actions laid
    out as CartPole's (cart position and velocity, pole angle and angular
    velocity); with CartPole-v1 its episodes run to the 500-step limit.
    """
    obs, act = spec.observation_space, spec.action_space
    if not (
        isinstance(obs, gym.spaces.Box)
        and obs.shape == (4,)
        and isinstance(act, gym.spaces.Discrete)
        and act.n == 2
    ):
        return None
    kwargs: dict[str, Any] = {"hidden_sizes": []}
    params = _params(MLPCategoricalPolicy, spec, kwargs)
    # logit(1) - logit(0) = scale * gains . obs: push the cart under the pole.
    params[weight_name(0)][:] = 0.0
    params[weight_name(0)][:, 1] = _BALANCE_SCALE * _BALANCE_GAINS
    params[bias_name(0)][:] = 0.0
    return Agent(_spec("mlp-categorical", kwargs), params)


def _params(
    cls: type[MLPCategoricalPolicy] | type[MLPGaussianPolicy], spec: EnvSpec, kwargs: dict[str, Any]
) -> dict[str, np.ndarray]:
    try:
        policy = cls(spec, seed=0, **kwargs)
    except ConfigError as exc:
        raise CheckFailed(
            f"cannot build {cls.__name__} for the worker's EnvSpec ({exc}); run the kit with "
            "an env whose spaces the built-in policies support (--env-id)"
        ) from exc
    return {
        name: np.array(value, dtype=np.float32) for name, value in policy.get_param_values().items()
    }


def _spec(name: str, kwargs: dict[str, Any]) -> PolicySpec:
    return PolicySpec(name, kwargs)


__all__ = ["PINNED_HIDDEN_SIZES", "Agent", "balancing_agent", "pinned_agent"]
