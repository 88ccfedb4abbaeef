"""rlfleet's core data types (garage's, on numpy and gymnasium spaces only)."""

from rlfleet.core._arrays import pad_batch_array, pad_to_last
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.in_out_spec import InOutSpec
from rlfleet.core.multi_agent_batch import MultiAgentEpisodeBatch
from rlfleet.core.step_type import StepType, get_step_type, step_type_from_gym
from rlfleet.core.time_step import EnvStep, TimeStep
from rlfleet.core.time_step_batch import TimeStepBatch

__all__ = [
    "EnvSpec",
    "EnvStep",
    "EpisodeBatch",
    "InOutSpec",
    "MultiAgentEpisodeBatch",
    "StepType",
    "TimeStep",
    "TimeStepBatch",
    "get_step_type",
    "pad_batch_array",
    "pad_to_last",
    "step_type_from_gym",
]
