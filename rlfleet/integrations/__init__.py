"""Adapters that make any rlfleet vector env usable by other RL libraries.

* :mod:`rlfleet.integrations.gymnasium`: ``FleetVectorEnv``, a
  ``gymnasium.vector.VectorEnv`` (CleanRL-style scripts, gymnasium's vector
  wrappers).
* :mod:`rlfleet.integrations.sb3`: ``FleetVecEnv``, a Stable-Baselines3
  ``VecEnv`` (extra ``rlfleet[sb3]``).

Each takes a :class:`~rlfleet.envs.BaseVectorEnv` instance (Dummy, Subproc
or Remote), so the same script runs on local processes or on the fleet.
They are imported on demand: SB3 pulls in torch.
"""
