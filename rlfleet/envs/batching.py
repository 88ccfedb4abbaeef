"""Batching a vector env's per-env values: ids, seeds, actions, results.

Pure functions shared by :class:`~rlfleet.envs.BaseVectorEnv` and the
backends: they turn tianshou's ``id``/``seed``/``action`` arguments into
one value per env, and per-env answers into batched arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from rlfleet.envs.commands import FailedCall
from rlfleet.errors import InvalidValueError, OutOfRangeError

#: Which envs a call applies to: None (all), one index, or a sequence of indices.
EnvIds: TypeAlias = int | np.integer | Sequence[int] | np.ndarray | None
Seeds: TypeAlias = int | np.integer | Sequence[int | None] | None
#: What :meth:`BaseVectorEnv.step_envs` returns: observations, rewards, ended, infos, failures.
EnvRows: TypeAlias = tuple[
    list[Any],
    list[Any],
    list[tuple[int, bool, bool]],
    list[tuple[int, Any]],
    list[tuple[int, Exception]],
]


def env_ids(id: EnvIds, env_num: int, *, allow_empty: bool = False) -> list[int]:
    """Normalises ``id`` to a list of distinct, valid env indices (None: all ``env_num``)."""
    if id is None:
        return list(range(env_num))
    if type(id) is list and id and all(type(i) is int for i in id):
        # The common case (the ids a step returned, as ints): no numpy round trip.
        ids = list(id)
        if min(ids) >= 0 and max(ids) < env_num and len(set(ids)) == len(ids):
            return ids
    array = np.asarray(id)
    if allow_empty and array.size == 0 and array.ndim == 1:
        return []
    if array.ndim > 1 or array.size == 0 or array.dtype.kind not in "iu":
        raise InvalidValueError(
            f"id must be None, an env index or a 1-D sequence of them, got {id!r}"
        )
    ids = [int(i) for i in array.reshape(-1)]
    bad = [i for i in ids if not 0 <= i < env_num]
    if bad:
        raise OutOfRangeError(f"env ids {bad} out of range; there are {env_num} envs")
    if len(set(ids)) != len(ids):
        raise InvalidValueError(f"env ids must be distinct, got {ids}")
    return ids


def step_each(envs: Any, ids: list[int], actions: Sequence[Any] | np.ndarray) -> EnvRows:
    """Calls ``envs[ids[k]].step(actions[k])`` for each k: :meth:`BaseVectorEnv.step_envs`'s rows.

    The loop is a worker's hot path: per env, the ``step`` call, two
    appends and two tests; nothing is stored for an empty info dict.

    Args:
        envs: Indexable by env index: gymnasium envs, or anything with
            their ``step``.
        ids: The envs to step.
        actions: One action per env of ``ids``.

    Returns:
        As :meth:`BaseVectorEnv.step_envs`; a failure holds what ``step`` raised.
    """
    observations: list[Any] = []
    rewards: list[Any] = []
    add_observation, add_reward = observations.append, rewards.append
    ended: list[tuple[int, bool, bool]] = []
    infos: list[tuple[int, Any]] = []
    failures: list[tuple[int, Exception]] = []
    # strict=False: the caller gives one action per id.
    for i, action in zip(ids, actions, strict=False):
        try:
            observation, reward, terminated, truncated, info = envs[i].step(action)
        except Exception as exc:
            failures.append((i, exc))
            add_observation(None)
            add_reward(0.0)
            continue
        add_observation(observation)
        add_reward(reward)
        if info:
            infos.append((i, info))
        if terminated or truncated:
            ended.append((i, bool(terminated), bool(truncated)))
    return observations, rewards, ended, infos, failures


class Answered:
    """A step answer received from a backend, in the shape of an env whose step gives it."""

    __slots__ = ("_answer",)

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def step(self, action: Any) -> Any:
        if isinstance(self._answer, FailedCall):
            raise self._answer.error
        return self._answer


def stack_observations(items: Sequence[Any]) -> Any:
    """Batches the envs' observations as tianshou's vector envs do.

    Dict observations give a 1-D object array holding each env's dict
    (tianshou's ``np.stack`` of dicts); everything else as :func:`stack_batch`.
    """
    if isinstance(items[0], Mapping):
        batch = np.empty(len(items), dtype=object)
        for row, item in enumerate(items):
            batch[row] = item
        return batch
    return stack_batch(items)


def stack_batch(items: Sequence[Any]) -> Any:
    """Stacks per-env values into a batch (dicts and tuples element-wise).

    Always copies, so the batch never aliases an env's (or a shared-memory)
    buffer.
    """
    first = items[0]
    if isinstance(first, Mapping):
        return {key: stack_batch([item[key] for item in items]) for key in first}
    if isinstance(first, tuple):
        return tuple(stack_batch([item[j] for item in items]) for j in range(len(first)))
    try:
        if isinstance(first, np.ndarray) and first.dtype != object:
            # Rows of one shape: np.array copies them as np.stack does, at a
            # third of its cost for small rows; differing shapes raise ValueError too.
            return np.array(items)
        return np.stack(items)
    except ValueError:
        # Shapes differ (tianshou does the same): keep the rows as objects.
        ragged = np.empty(len(items), dtype=object)
        for row, item in enumerate(items):
            ragged[row] = np.array(item, copy=True)
        return ragged


def info_array(infos: Sequence[Mapping[str, Any]], ids: list[int]) -> np.ndarray:
    array = np.empty(len(ids), dtype=object)
    for row, (info, env_index) in enumerate(zip(infos, ids, strict=True)):
        array[row] = {**info, "env_id": env_index}
    return array


def action_rows(action: Any, ids: list[int]) -> Sequence[Any]:
    """Splits a batched action into one action per env of ``ids``."""
    try:
        count = len(action)
    except TypeError:
        raise InvalidValueError(
            f"action must have one row per env stepped ({len(ids)} for ids {ids}), "
            f"got a {type(action).__name__} without rows"
        ) from None
    if count != len(ids):
        raise InvalidValueError(
            f"action has {count} rows but {len(ids)} envs are stepped (ids {ids})"
        )
    if isinstance(action, np.ndarray):
        # Its rows are action[k] already; a remote backend encodes it whole
        # (per-row numpy scalars cost ~1 us each to make and to pack again).
        return action  # type: ignore[return-value]  # a sequence of rows, not to mypy
    return [action[row] for row in range(count)]


def expand_seeds(seed: Seeds, count: int, where: str) -> list[int | None]:
    """Turns None / an int / a sequence into one seed (or None) per env."""
    if seed is None:
        return [None] * count
    if isinstance(seed, int | np.integer):
        start = as_seed(seed, where)
        return [start + k for k in range(count)]
    if isinstance(seed, str | bytes) or not isinstance(seed, Sequence | np.ndarray):
        raise InvalidValueError(
            f"{where}: seed must be None, an int or a list of ints, got {seed!r}"
        )
    seeds = list(seed)
    if len(seeds) != count:
        raise InvalidValueError(f"{where}: got {len(seeds)} seeds for {count} envs")
    return [None if item is None else as_seed(item, where) for item in seeds]


def as_seed(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidValueError(f"{where}: seeds must be ints >= 0 (or None), got {value!r}")
    return int(value)


__all__ = [
    "EnvIds",
    "EnvRows",
    "Seeds",
    "action_rows",
    "Answered",
    "env_ids",
    "expand_seeds",
    "info_array",
    "stack_batch",
    "stack_observations",
    "step_each",
]
