"""RLlib's RolloutWorker surface on rlfleet: local workers and the fleet.

- :class:`RolloutWorker`: RLlib's names and semantics, local, no Ray, no pickle.
- :class:`DefaultCallbacks`, :class:`Episode`, :class:`RolloutMetrics`.
- Filters: :class:`NoFilter`, :class:`MeanStdFilter`.
- :class:`RolloutWorkerGroup`: the same settings on the fleet (RLlib's ``WorkerSet``).
- :class:`FilteredPolicy`: the fleet workers' frozen MeanStdFilter.
- :class:`EnvContext`, :data:`DEFAULT_POLICY_ID`.
- :class:`RolloutEpisodeBatch`: what ``sample()`` returns, readable by
  RLlib's SampleBatch keys; :class:`IgnoredArgumentWarning` (see
  :mod:`rlfleet.rllib.arguments`, the table of RLlib's arguments).
- Multi-agent on the fleet: :func:`register_multi_agent_env` (in the
  workers' ``--import`` module), :class:`MultiAgentJointEnv`,
  :class:`MultiAgentJointPolicy`.

docs/rllib.md says how RLlib's arguments and SampleBatch fields map here.
"""

from typing import Any

from rlfleet._util.imports import LazyNames
from rlfleet.rllib._policies import DEFAULT_POLICY_ID
from rlfleet.rllib.arguments import IgnoredArgumentWarning
from rlfleet.rllib.callbacks import DefaultCallbacks, Episode, RolloutMetrics
from rlfleet.rllib.filtered_policy import FilteredPolicy
from rlfleet.rllib.filters import MeanStdFilter, NoFilter, RunningStat
from rlfleet.rllib.joint_policy import MultiAgentJointPolicy
from rlfleet.rllib.multi_agent import MultiAgentJointEnv, register_multi_agent_env
from rlfleet.rllib.rollout_worker import EnvContext, RolloutWorker
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch

__all__ = [
    "DEFAULT_POLICY_ID",
    "DefaultCallbacks",
    "EnvContext",
    "Episode",
    "FilteredPolicy",
    "IgnoredArgumentWarning",
    "MeanStdFilter",
    "MultiAgentJointEnv",
    "MultiAgentJointPolicy",
    "NoFilter",
    "RolloutEpisodeBatch",
    "RolloutMetrics",
    "RolloutWorker",
    "RolloutWorkerGroup",
    "RunningStat",
    "register_multi_agent_env",
]


# The group needs the gRPC client; importing it lazily keeps `import rlfleet`
# free of gRPC for local-only users.
_LAZY = LazyNames(__name__, {"RolloutWorkerGroup": "rlfleet.rllib.worker_group"})


def __getattr__(name: str) -> Any:
    return _LAZY(name)
