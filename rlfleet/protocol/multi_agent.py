"""The protocol's names for multi-agent envs, shared by workers, coordinator and client."""

from collections.abc import Iterable

#: Capability of workers that run multi-agent envs (worker.proto Hello).
MULTI_AGENT_CAPABILITY = "rlfleet.multi-agent"
#: Gymnasium namespace of multi-agent env ids (updates.proto EnvUpdate.env_id).
MULTI_AGENT_NAMESPACE = "multi-agent"
#: The import path fleet workers build the joint policy by (rlfleet.rllib.joint_policy).
JOINT_POLICY_PATH = "rlfleet.rllib.joint_policy:MultiAgentJointPolicy"


def is_multi_agent_env(env_id: str) -> bool:
    """Whether an env id names a multi-agent env (``multi-agent/<name>``)."""
    return env_id.startswith(MULTI_AGENT_NAMESPACE + "/")


def can_run_env(env_id: str, capabilities: Iterable[str]) -> bool:
    """Whether a worker with these Hello capabilities may run ``env_id``.

    A multi-agent env needs :data:`MULTI_AGENT_CAPABILITY`; any other env runs anywhere.
    """
    return not is_multi_agent_env(env_id) or MULTI_AGENT_CAPABILITY in capabilities


def can_run_policy(policy_name: str, capabilities: Iterable[str]) -> bool:
    """Whether a worker with these Hello capabilities may build the policy named ``policy_name``.

    The joint policy needs :data:`MULTI_AGENT_CAPABILITY` (a worker without
    it, such as the Node worker, would refuse it); any other policy is the
    worker's to accept or refuse.
    """
    return policy_name != JOINT_POLICY_PATH or MULTI_AGENT_CAPABILITY in capabilities
