"""FilteredPolicy: a policy behind a frozen MeanStdFilter, for fleet workers.

On the fleet, a worker's observation filter must not move while it samples:
episodes must get the same actions whichever worker runs them (docs/architecture.md,
Determinism). So fleet workers run the filter as *parameters* of this
policy (``filter.n``, ``filter.mean``, ``filter.m2``), set by agent updates;
the driver (:class:`~rlfleet.rllib.RolloutWorkerGroup`) computes each
worker's delta from the observations it returned, merges the deltas and
pushes the merged state, as RLlib's ``FilterManager`` does.

Workers build it by import path, ``rlfleet.rllib.filtered_policy:FilteredPolicy``
(start them with ``--import rlfleet.rllib``); nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import Policy, PolicySpec, make_policy
from rlfleet.policies.base import AgentInfos, ParamDict
from rlfleet.rllib.filters import MeanStdFilter, RunningStat

#: The import path fleet workers build this policy by.
FILTERED_POLICY_PATH = "rlfleet.rllib.filtered_policy:FilteredPolicy"
_INNER = "policy."
_FILTER_KEYS = ("filter.n", "filter.mean", "filter.m2")


class FilteredPolicy(Policy):
    """Normalises observations with a fixed MeanStdFilter state, then asks the inner policy.

    Args:
        env_spec: The env's spaces (Box observations).
        policy: The inner policy's spec as ``{"name": ..., "kwargs": {...}}``.
        clip: The filter's clip bound (None: no clip).
        seed: Seeds the inner policy.

    Raises:
        ConfigError: If observations are not a Box or the inner spec is invalid.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        policy: Mapping[str, Any],
        clip: float | None = 10.0,
        seed: int | None = None,
    ) -> None:
        if not isinstance(env_spec.observation_space, gym.spaces.Box):
            raise ConfigError(
                f"FilteredPolicy needs Box observations, got {env_spec.observation_space}"
            )
        super().__init__(env_spec, seed=seed)
        self.inner_spec = PolicySpec(policy["name"], policy.get("kwargs", {}))
        self.inner = make_policy(self.inner_spec, env_spec, seed=seed)
        self.obs_filter = MeanStdFilter(env_spec.observation_space.shape, clip=clip)

    @classmethod
    def spec(cls, inner: PolicySpec, clip: float | None = 10.0) -> PolicySpec:
        """The PolicySpec that builds a FilteredPolicy around ``inner``."""
        return PolicySpec(
            FILTERED_POLICY_PATH,
            {"policy": {"name": inner.name, "kwargs": inner.kwargs}, "clip": clip},
        )

    def seed(self, seed: int | None) -> None:
        """Reseeds this policy and the inner one."""
        super().seed(seed)
        self.inner.seed(seed)

    def get_actions(
        self,
        observations: Any,
        rngs: Sequence[np.random.Generator] | None = None,
    ) -> tuple[np.ndarray, AgentInfos]:
        """The inner policy's actions for the filtered observations (row by row)."""
        self.inner.deterministic = self.deterministic
        return self.inner.get_actions(self.obs_filter(observations, update=False), rngs)

    def reset(self, do_resets: Sequence[bool] | np.ndarray | None = None) -> None:
        """Resets the inner policy."""
        self.inner.reset(do_resets)

    def get_param_values(self) -> ParamDict:
        """The inner parameters as ``policy.<name>`` and the filter state as ``filter.*``."""
        params = {_INNER + k: v for k, v in self.inner.get_param_values().items()}
        running = self.obs_filter.running
        params["filter.n"] = np.array(running.n, dtype=np.int64)
        params["filter.mean"] = running.mean.copy()
        params["filter.m2"] = running.m2.copy()
        return params

    def set_param_values(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets the named parameters (a subset is fine, e.g. only ``filter.*``).

        Raises:
            PolicyError: If a name is unknown, or the filter keys come partly
                or with wrong shapes; nothing is changed then.
        """
        unknown = [k for k in params if not k.startswith(_INNER) and k not in _FILTER_KEYS]
        if unknown:
            raise PolicyError(
                f"FilteredPolicy has no parameters {sorted(unknown)}; its names are "
                f"'policy.<inner name>' and {list(_FILTER_KEYS)}"
            )
        given = [k for k in _FILTER_KEYS if k in params]
        running = None
        if given:
            if len(given) != len(_FILTER_KEYS):
                raise PolicyError(f"FilteredPolicy needs all of {list(_FILTER_KEYS)}, got {given}")
            shape = self.obs_filter.shape
            mean, m2 = (np.asarray(params[k], dtype=np.float64) for k in _FILTER_KEYS[1:])
            n = np.asarray(params["filter.n"])
            if mean.shape != shape or m2.shape != shape or n.shape != () or int(n) < 0:
                raise PolicyError(
                    f"FilteredPolicy filter state must be a count and two arrays of shape "
                    f"{shape}, got n{n.shape}, mean{mean.shape}, m2{m2.shape}"
                )
            running = RunningStat(int(n), mean.copy(), m2.copy())
        inner = {k[len(_INNER) :]: v for k, v in params.items() if k.startswith(_INNER)}
        if inner:
            self.inner.set_param_values(inner)
        if running is not None:
            self.obs_filter.running = running
