"""A synthetic worker's result bytes, serialized once and rewritten in place.

Both shapes of synthetic result (whole episodes, :mod:`benchmarks.capacity_workers`;
fragment windows, :mod:`benchmarks.capacity_windows`) are a batch of zeros of
the env's spaces, serialized once, whose int64 episode_infos columns are then
written in the serialized bytes for each task, with no encoding per result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.wire import decode_batch, encode_batch


class ZerosPayload:
    """A batch of zeros of ``spec``'s spaces (which every space used here
    contains), with the given episode_infos, step types and lengths, serialized.

    Attributes:
        batch: The batch.
        payload: Its serialized bytes (no env spec).
        columns: The episode_infos named by ``written``, as writable int64 views
            of ``payload``: what a task's values are written into.
    """

    def __init__(
        self,
        spec: EnvSpec,
        episode_infos: Mapping[str, np.ndarray],
        step_types: np.ndarray,
        lengths: np.ndarray,
        written: Sequence[str],
    ) -> None:
        obs_space, act_space = spec.observation_space, spec.action_space
        assert obs_space.shape is not None and act_space.shape is not None  # Box, Discrete
        total, count = len(step_types), len(lengths)
        self.batch = EpisodeBatch(
            env_spec=spec,
            episode_infos=dict(episode_infos),
            observations=np.zeros((total, *obs_space.shape), obs_space.dtype),
            last_observations=np.zeros((count, *obs_space.shape), obs_space.dtype),
            actions=np.zeros((total, *act_space.shape), act_space.dtype),
            rewards=np.ones(total, np.float32),
            env_infos={},
            agent_infos={},
            step_types=step_types,
            lengths=lengths,
        )
        self.payload = bytearray(encode_batch(self.batch, include_env_spec=False))
        base = np.frombuffer(self.payload, np.uint8).ctypes.data
        decoded = decode_batch(self.payload, env_spec=spec, kind=EpisodeBatch)
        self.columns = {
            key: np.frombuffer(
                self.payload,
                "<i8",
                count=count,
                offset=np.asarray(decoded.episode_infos[key]).ctypes.data - base,
            )
            for key in written
        }
