"""MultiAgentJointPolicy: one policy per policy id, acting for a joint multi-agent env.

Fleet workers build it by import path, :data:`JOINT_POLICY_PATH` (start them
with ``--import rlfleet.rllib``); its sub-policies must be built-ins, since
the worker's allow-list covers this class and not what its kwargs name.
Its parameters are ``<policy id>/<parameter>``: an agent update is a map
policy id -> parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import Policy, PolicySpec, make_policy
from rlfleet.policies._distributions import row_generators
from rlfleet.policies.base import AgentInfos, ParamDict
from rlfleet.protocol.multi_agent import JOINT_POLICY_PATH
from rlfleet.rllib._envs import AgentEnv
from rlfleet.rllib.multi_agent import JointLayout, make_agent_env

#: Separator of policy id and parameter name in a joint policy's parameters.
SEPARATOR = "/"


class MultiAgentJointPolicy(Policy):
    """One policy per policy id acting for the agents of a :class:`MultiAgentJointEnv`.

    For each policy (in id order), the acting agents mapped to it, row by row
    and in ``possible_agents`` order within a row, get their actions in one
    batched call; row ``b``'s agents draw from ``rngs[b]``, the episode's
    generator. That is the order a local RolloutWorker draws in, so an
    episode gets the same actions on the fleet and locally. Agents that do
    not act get zeros, and agent_infos ``"<agent>/<key>"`` zeros there.

    Args:
        env_spec: The joint env's spaces.
        env: The multi-agent env id (its registered creator gives the agents' spaces).
        env_kwargs: The env's kwargs.
        mapping: Agent id -> policy id, for every agent.
        policies: Policy id -> ``{"name": built-in name, "kwargs": {...}}``.
            Import paths are refused: the worker's allow-list covers this
            class, not what its parameters name.
        seed: Seeds the policies' own generators.

    Raises:
        ConfigError: If an agent is unmapped, maps to an unknown policy,
            agents of one policy have different spaces, or a spec is not built-in.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        env: str,
        env_kwargs: Mapping[str, Any] | None = None,
        mapping: Mapping[str, str],
        policies: Mapping[str, Mapping[str, Any]],
        seed: int | None = None,
    ) -> None:
        super().__init__(env_spec, seed=seed)
        probe = AgentEnv(make_agent_env(env, env_kwargs))
        try:
            self.layout = JointLayout.of(probe)
        finally:
            probe.close()
        layout = self.layout
        if (env_spec.observation_space, env_spec.action_space) != layout.joint_spaces():
            raise ConfigError(
                f"MultiAgentJointPolicy for {env!r}: the env's spaces are not those of the joint "
                "env the worker runs; build both from the same env id and kwargs"
            )
        unmapped = [a for a in layout.agents if a not in mapping]
        if unmapped:
            raise ConfigError(f"MultiAgentJointPolicy: agents {unmapped} map to no policy")
        self.mapping = {a: str(mapping[a]) for a in layout.agents}
        self.policies: dict[str, Policy] = {}
        self._members: dict[str, list[int]] = {}
        for policy_id in sorted(set(self.mapping.values())):
            if policy_id not in policies:
                raise ConfigError(
                    f"MultiAgentJointPolicy: agents map to policy {policy_id!r}, which is not one "
                    f"of {sorted(policies)}"
                )
            members = [i for i, a in enumerate(layout.agents) if self.mapping[a] == policy_id]
            spaces = {
                (repr(layout.observation_spaces[i]), repr(layout.action_spaces[i])) for i in members
            }
            if len(spaces) != 1:
                raise ConfigError(
                    f"MultiAgentJointPolicy: the agents of policy {policy_id!r} have different "
                    f"spaces {sorted(spaces)}; map them to different policies"
                )
            i = members[0]
            spec = policies[policy_id]
            sub_spec = PolicySpec(str(spec.get("name", "")), dict(spec.get("kwargs", {})))
            self.policies[policy_id] = make_policy(
                sub_spec,
                EnvSpec(layout.observation_spaces[i], layout.action_spaces[i]),
                seed=seed,
                allowed_modules=(),
            )
            self._members[policy_id] = members
        self._info_shapes = self._probe_infos()

    def _probe_infos(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        # Every call must return the same agent_info keys, even when no agent of
        # a policy acts: learn each policy's keys, shapes and dtypes once.
        shapes = {}
        for policy_id, members in self._members.items():
            # A sample of the probe env's space: only the infos' shapes are kept.
            first = np.asarray(self.layout.observation_spaces[members[0]].sample())
            _, infos = self.policies[policy_id].get_actions(first[None], [np.random.default_rng(0)])
            for key, value in infos.items():
                for i in members:
                    shapes[f"{self.layout.agents[i]}/{key}"] = (value.shape[1:], value.dtype)
        return shapes

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Joint actions for joint observations (see the class docstring)."""
        joint = np.asarray(observations, dtype=np.float64)
        n = len(joint)
        rows = row_generators(rngs, n, self.rng, type(self).__name__)
        layout = self.layout
        acts = joint[:, layout.mask_start :] > 0.5
        out = np.zeros((n, layout.action_slices[-1][1]), np.float64)
        infos: AgentInfos = {
            key: np.zeros((n, *shape), dtype) for key, (shape, dtype) in self._info_shapes.items()
        }
        for policy_id, members in self._members.items():
            chosen = [(b, i) for b in range(n) for i in members if acts[b, i]]
            if not chosen:
                continue
            batch = np.stack([layout.agent_observation(joint[b], i) for b, i in chosen])
            actions, agent_infos = self.policies[policy_id].get_actions(
                batch, [rows[b] for b, _ in chosen]
            )
            for k, (b, i) in enumerate(chosen):
                layout.write_action(out[b], i, actions[k])
                for key, value in agent_infos.items():
                    infos[f"{layout.agents[i]}/{key}"][b] = value[k]
        return out, infos

    def get_param_values(self) -> ParamDict:
        """Every policy's parameters as ``"<policy id>/<name>"``."""
        return {
            f"{policy_id}{SEPARATOR}{name}": value
            for policy_id, policy in self.policies.items()
            for name, value in policy.get_param_values().items()
        }

    def set_param_values(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets the parameters of the policies named (each policy's whole set).

        Raises:
            PolicyError: For a name of no policy, or a policy's incomplete set;
                nothing is changed then.
        """
        grouped: dict[str, dict[str, np.ndarray]] = {}
        for key, value in params.items():
            policy_id, _, name = key.partition(SEPARATOR)
            if policy_id not in self.policies or not name:
                raise PolicyError(
                    f"MultiAgentJointPolicy: parameter {key!r} names no policy of "
                    f"{sorted(self.policies)}; names are '<policy id>/<parameter>'"
                )
            grouped.setdefault(policy_id, {})[name] = value
        previous = {pid: self.policies[pid].get_param_values() for pid in grouped}
        try:
            for policy_id, values in grouped.items():
                self.policies[policy_id].set_param_values(values)
        except PolicyError:
            for policy_id, values in previous.items():
                self.policies[policy_id].set_param_values(values)
            raise


def joint_policy_spec(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    mapping: Mapping[str, str],
    policies: Mapping[str, PolicySpec],
) -> PolicySpec:
    """The spec fleet workers build a :class:`MultiAgentJointPolicy` from."""
    return PolicySpec(
        JOINT_POLICY_PATH,
        {
            "env": env_id,
            "env_kwargs": dict(env_kwargs),
            "mapping": dict(mapping),
            "policies": {
                pid: {"name": spec.name, "kwargs": dict(spec.kwargs)}
                for pid, spec in policies.items()
            },
        },
    )
