"""``rlfleet/CartPoleJS-v0`` for Python workers: the id the Node worker serves.

The Node worker (clients/node) runs its own port of CartPole-v1 under its
own id, ``rlfleet/CartPoleJS-v0``, so that an id never names two
implementations by accident. For a fleet that mixes Python and Node workers
on that env, importing this module registers the same id in gymnasium:
gymnasium's own ``CartPoleEnv`` with the same spaces, dynamics and 500-step
limit as the port. Both sides then report equal EnvSpecs and produce
episodes of the same distribution; bit-identical trajectories across
languages are not promised (libm's sin and cos may round differently).

Start Python workers with ``rlfleet worker --import rlfleet.envs.cartpole_js``.
"""

from __future__ import annotations

import gymnasium as gym

#: The env id, shared with clients/node/src/envs/registry.js.
ENV_ID = "rlfleet/CartPoleJS-v0"
#: Episode limit (TIMEOUT), as CartPole-v1's.
MAX_EPISODE_STEPS = 500


def register() -> None:
    """Registers :data:`ENV_ID` with gymnasium (again on a second call: a no-op)."""
    if ENV_ID in gym.registry:
        return
    gym.register(
        id=ENV_ID,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=MAX_EPISODE_STEPS,
        reward_threshold=475.0,
    )


register()

__all__ = ["ENV_ID", "MAX_EPISODE_STEPS", "register"]
