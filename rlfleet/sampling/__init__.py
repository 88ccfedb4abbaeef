"""Sampling on this machine: the local sampler and garage's sampling utilities.

* :class:`~rlfleet.sampling.local.LocalSampler`: the fleet's request logic
  (``rlfleet.scheduling``) driving :class:`~rlfleet.worker.VecWorker` in
  this process, with the same answers as a fleet.
* :mod:`rlfleet.sampling.utils`: ``rollout``, ``truncate_paths``,
  evaluation episodes and performance logging (garage's ``garage._functions``).
"""

from rlfleet.sampling.local import LocalSampler
from rlfleet.sampling.utils import (
    discount_cumsum,
    discounted_returns,
    episode_returns,
    log_multitask_performance,
    log_performance,
    obtain_evaluation_episodes,
    performance_stats,
    recording_to,
    rollout,
    stack_tensor_dict_list,
    truncate_paths,
)

__all__ = [
    "LocalSampler",
    "discount_cumsum",
    "discounted_returns",
    "episode_returns",
    "log_multitask_performance",
    "log_performance",
    "obtain_evaluation_episodes",
    "performance_stats",
    "recording_to",
    "rollout",
    "stack_tensor_dict_list",
    "truncate_paths",
]
