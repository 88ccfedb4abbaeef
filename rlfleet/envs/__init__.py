"""Environments: env configs (id + JSON kwargs) and local vector envs.

:class:`EnvConfig` is how an env travels to a worker (no code over the wire)
and, being picklable and callable, the factory the vector envs take.
:class:`DummyVectorEnv` and :class:`SubprocVectorEnv` follow tianshou's
``BaseVectorEnv`` API, async mode included; ``VectorEnv`` is the in-process
one under tianshou's other name; :class:`NativeVectorEnv` is a gymnasium
native vector env (``vector_entry_point``) or envpool behind the same API,
the backend of native workers. A new backend subclasses
:class:`BaseVectorEnv` (``_send``/``_receive``, answering failures with
:class:`FailedCall`). Small fault-injecting test envs live in
:mod:`rlfleet.envs.testing` (imported on demand: importing it registers them).
Importing this package registers :data:`FLEET_ENV_ID` (``rlfleet/Fleet-v0``),
whose ``gymnasium.make_vec`` builds a vector env on a fleet
(:mod:`rlfleet.envs.fleet_id`).
"""

from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.commands import FailedCall
from rlfleet.envs.config import EnvConfig, env_spec_of, make_env
from rlfleet.envs.dummy import DummyVectorEnv, VectorEnv
from rlfleet.envs.fleet_id import FLEET_ENV_ID
from rlfleet.envs.native import NativeVectorEnv
from rlfleet.envs.subproc import SubprocVectorEnv

__all__ = [
    "FLEET_ENV_ID",
    "BaseVectorEnv",
    "DummyVectorEnv",
    "EnvConfig",
    "FailedCall",
    "NativeVectorEnv",
    "SubprocVectorEnv",
    "VectorEnv",
    "env_spec_of",
    "make_env",
]
