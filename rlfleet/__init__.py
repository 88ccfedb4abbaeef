"""rlfleet: collect reinforcement-learning experience on a fleet of workers.

The public API, importable from ``rlfleet``:

- Episode data (garage's types): :class:`EpisodeBatch`, :class:`TimeStepBatch`,
  :class:`TimeStep`, :class:`EnvStep`, :class:`StepType`, :class:`EnvSpec`,
  :class:`InOutSpec`.
- Envs and policies: :class:`EnvConfig`, :func:`make_env`, the vector envs,
  :class:`Policy` and the built-in numpy policies, :class:`PolicySpec`.
- Local sampling: :class:`DefaultWorker`, :class:`VecWorker`,
  :class:`StreamReplay` and :class:`StreamBook` (fragment streams moved
  between workers), :class:`LocalSampler`, :func:`rollout`, :func:`truncate_paths`,
  :func:`obtain_evaluation_episodes`, :func:`log_performance`.
- Training (garage's): :class:`Trainer`, :class:`SnapshotConfig`,
  :func:`wrap_experiment`, :class:`ExperimentContext` (``rlfleet.trainer``).
- RLlib's RolloutWorker surface: :class:`RolloutWorker`,
  :class:`MultiAgentEpisodeBatch`, :func:`register_multi_agent_env` (PettingZoo
  envs on the fleet); more in ``rlfleet.rllib`` (docs/rllib.md).
- The fleet: ``rlfleet.client`` (:class:`~rlfleet.client.RemoteSampler`,
  :class:`~rlfleet.client.Fleet`) and ``rlfleet.coordinator``.
- Batch files (``.npz``, what ``rlfleet sample`` writes): :func:`save_batch`,
  :func:`load_batch`.
- Errors: :class:`RlfleetError` and its subclasses in ``rlfleet.errors``.
"""

from rlfleet._version import __version__
from rlfleet.core import (
    EnvSpec,
    EnvStep,
    EpisodeBatch,
    InOutSpec,
    MultiAgentEpisodeBatch,
    StepType,
    TimeStep,
    TimeStepBatch,
    pad_to_last,
    step_type_from_gym,
)
from rlfleet.core.batch_file import load_batch, save_batch
from rlfleet.envs import (
    BaseVectorEnv,
    DummyVectorEnv,
    EnvConfig,
    FailedCall,
    NativeVectorEnv,
    SubprocVectorEnv,
    VectorEnv,
    env_spec_of,
    make_env,
)
from rlfleet.errors import NotSetupError, RlfleetError
from rlfleet.policies import (
    MLPCategoricalPolicy,
    MLPGaussianPolicy,
    Policy,
    PolicySpec,
    RandomPolicy,
    RowDraws,
    default_policy_spec,
    make_policy,
)
from rlfleet.protocol.stream_replay import StreamBook, StreamReplay
from rlfleet.rllib import RolloutWorker, register_multi_agent_env
from rlfleet.sampling import (
    log_multitask_performance,
    log_performance,
    obtain_evaluation_episodes,
    performance_stats,
    rollout,
    truncate_paths,
)
from rlfleet.sampling.local import LocalSampler
from rlfleet.trainer import ExperimentContext, SnapshotConfig, Trainer, wrap_experiment
from rlfleet.worker import DefaultWorker, EpisodeUnit, VecWorker

__all__ = [
    "BaseVectorEnv",
    "DefaultWorker",
    "DummyVectorEnv",
    "EnvConfig",
    "EnvSpec",
    "EnvStep",
    "EpisodeBatch",
    "EpisodeUnit",
    "ExperimentContext",
    "FailedCall",
    "InOutSpec",
    "LocalSampler",
    "MLPCategoricalPolicy",
    "MLPGaussianPolicy",
    "MultiAgentEpisodeBatch",
    "NativeVectorEnv",
    "NotSetupError",
    "Policy",
    "PolicySpec",
    "RandomPolicy",
    "RlfleetError",
    "RolloutWorker",
    "RowDraws",
    "SnapshotConfig",
    "StepType",
    "SubprocVectorEnv",
    "TimeStep",
    "TimeStepBatch",
    "Trainer",
    "StreamBook",
    "StreamReplay",
    "VecWorker",
    "VectorEnv",
    "__version__",
    "default_policy_spec",
    "env_spec_of",
    "load_batch",
    "register_multi_agent_env",
    "log_multitask_performance",
    "log_performance",
    "make_env",
    "make_policy",
    "obtain_evaluation_episodes",
    "pad_to_last",
    "performance_stats",
    "rollout",
    "save_batch",
    "step_type_from_gym",
    "truncate_paths",
    "wrap_experiment",
]
