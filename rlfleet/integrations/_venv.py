"""What both adapters need from a BaseVectorEnv: checks, spaces and batch rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, SubprocVectorEnv
from rlfleet.errors import ConfigError


def local_vector_env(
    env_fns: Sequence[Callable[[], gym.Env]], subprocess: bool, **kwargs: Any
) -> BaseVectorEnv:
    """The adapters' ``from_env_fns``: a SubprocVectorEnv, or a DummyVectorEnv."""
    if subprocess:
        return SubprocVectorEnv(env_fns, **kwargs)
    return DummyVectorEnv(env_fns, **kwargs)


def common_spaces(venv: BaseVectorEnv, adapter: str) -> tuple[gym.Space, gym.Space]:
    """Checks that ``venv`` can back a synchronous adapter; returns its one env's spaces.

    Raises:
        ConfigError: If ``venv`` is not a BaseVectorEnv, is closed, steps
            asynchronously, or its envs do not all share one observation and
            one action space.
    """
    if not isinstance(venv, BaseVectorEnv):
        raise ConfigError(
            f"{adapter} wraps an rlfleet BaseVectorEnv (DummyVectorEnv, SubprocVectorEnv, "
            f"RemoteVectorEnv), got {type(venv).__name__}"
        )
    if venv.closed:
        raise ConfigError(f"{adapter}: the vector env is closed")
    if venv.is_async:
        raise ConfigError(
            f"{adapter} steps every env at every step: build the vector env without "
            f"wait_num/timeout (it has wait_num={venv.wait_num}, timeout={venv.timeout})"
        )
    spaces = []
    for name in ("observation_space", "action_space"):
        per_env = venv.get_env_attr(name)
        odd = [k for k, space in enumerate(per_env) if space != per_env[0]]
        if odd:
            raise ConfigError(
                f"{adapter} needs one {name} for all envs; env {odd[0]} has {per_env[odd[0]]}, "
                f"env 0 has {per_env[0]}"
            )
        spaces.append(per_env[0])
    return spaces[0], spaces[1]


def batch_row(batch: Any, row: int) -> Any:
    """Row ``row`` of a batch from ``BaseVectorEnv`` (dicts and tuples element-wise)."""
    if isinstance(batch, Mapping):
        return {key: batch_row(value, row) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(batch_row(value, row) for value in batch)
    return batch[row]


def set_batch_rows(batch: Any, rows: Sequence[int], values: Any) -> None:
    """Writes the rows of batch ``values`` over rows ``rows`` of ``batch``, in place."""
    if isinstance(batch, Mapping):
        for key in batch:
            set_batch_rows(batch[key], rows, values[key])
    elif isinstance(batch, tuple):
        for part, value in zip(batch, values, strict=True):
            set_batch_rows(part, rows, value)
    else:
        for k, row in enumerate(rows):
            batch[row] = values[k]


def plain_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """An env's own info: the dict BaseVectorEnv returned, without its ``env_id``."""
    return {key: value for key, value in info.items() if key != "env_id"}


def env_indices(indices: int | Iterable[int] | None) -> list[int] | None:
    """SB3/gymnasium-style indices (None, an int or a sequence) as a list, None for all."""
    if indices is None:
        return None
    if isinstance(indices, int | np.integer):
        return [int(indices)]
    return [int(i) for i in indices]
