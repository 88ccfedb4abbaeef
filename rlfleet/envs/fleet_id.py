"""The gymnasium id whose ``gym.make_vec`` builds a vector env on a fleet.

Importing rlfleet registers :data:`FLEET_ENV_ID` with a
``vector_entry_point`` only (no single-env entry point), so that anything
that builds its envs with ``gymnasium.make_vec`` (RLlib's new-stack
``SingleAgentEnvRunner``, for one) gets a
:class:`~rlfleet.integrations.gymnasium.FleetVectorEnv` over a
:class:`~rlfleet.client.RemoteVectorEnv`::

    envs = gym.make_vec(
        "rlfleet/Fleet-v0", num_envs=8, vectorization_mode="vector_entry_point",
        fleet="coordinator-host:50051", env="CartPole-v1",
    )

The arguments are :func:`~rlfleet.integrations.gymnasium.make_fleet_vector_env`'s,
given as ``make_vec``'s keyword arguments (gymnasium hands those to a
vector entry point; it refuses ``vector_kwargs`` in this mode). The entry
point is a string, so the fleet client is imported only when used.
"""

from __future__ import annotations

import gymnasium as gym

FLEET_ENV_ID = "rlfleet/Fleet-v0"


def register() -> None:
    """Registers :data:`FLEET_ENV_ID` with gymnasium (a second call is a no-op)."""
    if FLEET_ENV_ID in gym.registry:
        return
    gym.register(
        id=FLEET_ENV_ID,
        vector_entry_point="rlfleet.integrations.gymnasium:make_fleet_vector_env",
    )


register()

__all__ = ["FLEET_ENV_ID", "register"]
