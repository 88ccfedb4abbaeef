"""garage's sampling utilities: rollout, truncate_paths, evaluation, logging.

``rollout`` and ``truncate_paths`` work on garage "paths" (dicts of arrays,
one per episode); ``obtain_evaluation_episodes`` and ``log_performance``
work on :class:`~rlfleet.core.EpisodeBatch`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.values import check_int
from rlfleet.core._arrays import episode_starts
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import ConfigError, InvalidValueError
from rlfleet.policies.base import Policy
from rlfleet.worker._episode_buffer import stack_step_infos
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker

logger = logging.getLogger("rlfleet")

#: Seconds between rendered steps of an animated rollout at speedup 1 (garage's).
_FRAME_SECONDS = 0.05
#: Path keys holding one row per step, truncated by ``truncate_paths``.
_PER_STEP_KEYS = frozenset(
    {"observations", "next_observations", "actions", "rewards", "dones", "step_types"}
)
#: Path keys holding nested per-step dicts.
_PER_STEP_INFO_KEYS = frozenset({"env_infos", "agent_infos"})
#: Path keys holding per-episode data, kept as they are.
_PER_EPISODE_KEYS = frozenset({"episode_infos"})
#: The observation after a path's last step (rollout's extra key).
_LAST_OBSERVATION = "last_observation"


def rollout(
    env: gym.Env,
    agent: Any,
    *,
    max_episode_length: float | None = math.inf,
    animated: bool = False,
    speedup: float = 1,
    pause_per_frame: float | None = None,
    deterministic: bool = False,
) -> dict[str, Any]:
    """Samples one episode of ``agent`` in ``env`` (garage 2021.03's ``rollout``).

    Args:
        env: A gymnasium env.
        agent: Anything with ``reset()`` and ``get_action(obs) -> (action,
            agent_info)``, such as a :class:`~rlfleet.policies.Policy`.
        max_episode_length: Stop after this many steps (None or 0: no limit,
            as in garage).
        animated: Call ``env.render()`` after the reset and after each step.
        speedup: When ``animated``, wait ``0.05 / speedup`` seconds after each
            rendered step (garage's pace; ``math.inf``: no wait). Must be > 0.
        pause_per_frame: Seconds to sleep before each step, if not None
            (garage 2021.03's form); it replaces the ``speedup`` wait.
        deterministic: Act deterministically: an rlfleet Policy acts with its
            distribution's mode for this episode; for other agents, garage's
            rule applies (use ``agent_info["mean"]`` when present).

    Returns:
        garage's path dict: ``episode_infos`` (the reset info, a dict),
        ``observations`` (T, O*), ``actions`` (T, A*), ``rewards`` (T,),
        ``agent_infos`` and ``env_infos`` (dicts of stacked arrays; as in
        ``DefaultWorker``, an env info key missing at some step is left
        out, with one warning naming it), and
        ``dones`` (T,) bool: True where the env terminated (gymnasium's
        ``terminated``; a truncated last step is not done). As in garage,
        ``observations`` holds the T observations acted on; unlike garage,
        the observation after the last step is kept, as
        ``last_observation`` (O*), so that ``EpisodeBatch.from_list`` gets
        the true ``last_observations`` instead of repeating the last row.
    """
    if not (isinstance(speedup, int | float) and speedup > 0):
        raise ConfigError(
            f"rollout(speedup={speedup!r}): speedup must be a number > 0 (it divides the "
            f"{_FRAME_SECONDS} s wait between rendered steps; math.inf for no wait)"
        )
    frame_wait = _FRAME_SECONDS / speedup if animated and pause_per_frame is None else 0.0
    limit = max_episode_length or math.inf
    with _acting_deterministically(agent, deterministic):
        observation, episode_infos = env.reset()
        agent.reset()
        observations: list[Any] = []
        actions: list[Any] = []
        rewards: list[Any] = []
        dones: list[bool] = []
        agent_infos: list[Mapping[str, Any]] = []
        env_infos: list[Mapping[str, Any]] = []
        if animated:
            env.render()
        while len(rewards) < limit:
            if pause_per_frame is not None:
                time.sleep(pause_per_frame)
            action, agent_info = agent.get_action(observation)
            if deterministic and not isinstance(agent, Policy) and "mean" in agent_info:
                action = agent_info["mean"]
            next_observation, reward, terminated, truncated, env_info = env.step(action)
            observations.append(observation)
            actions.append(action)
            rewards.append(reward)
            agent_infos.append(agent_info)
            env_infos.append(env_info)
            dones.append(bool(terminated))
            observation = next_observation
            if animated:
                env.render()
            if terminated or truncated:
                break
            if frame_wait:
                time.sleep(frame_wait)
    return {
        "episode_infos": episode_infos,
        "observations": np.array(observations),
        "actions": np.array(actions),
        "rewards": np.array(rewards),
        "agent_infos": stack_tensor_dict_list(agent_infos),
        # DefaultWorker's rule: keys present at every step become columns;
        # the others are dropped with one warning naming them.
        "env_infos": stack_step_infos(env_infos, _env_name(env)),
        "dones": np.array(dones, dtype=bool),
        "last_observation": np.asarray(observation),
    }


def _env_name(env: gym.Env) -> str:
    """The env as warnings name it: its registered id, else its class.

    garage's environments have a ``spec`` too, an ``EnvSpec`` of spaces
    with no ``id``.
    """
    env_id = getattr(getattr(env, "spec", None), "id", None)
    return repr(env_id) if env_id is not None else type(getattr(env, "unwrapped", env)).__name__


@contextmanager
def _acting_deterministically(agent: Any, deterministic: bool) -> Iterator[None]:
    """Sets ``agent.deterministic`` for the block, for rlfleet policies."""
    if not (deterministic and isinstance(agent, Policy)):
        yield
        return
    before = agent.deterministic
    agent.deterministic = True
    try:
        yield
    finally:
        agent.deterministic = before


def stack_tensor_dict_list(dicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stacks a list of dicts of arrays key by key (garage's helper).

    Keys come from the first dict; nested dicts are stacked recursively.

    Returns:
        ``{key: np.array([d[key] for d in dicts])}``; empty for no dicts.
    """
    if not dicts:
        return {}
    stacked: dict[str, Any] = {}
    for key, value in dicts[0].items():
        values = [d[key] for d in dicts]
        stacked[key] = (
            stack_tensor_dict_list(values) if isinstance(value, Mapping) else np.array(values)
        )
    return stacked


def truncate_paths(paths: Sequence[Mapping[str, Any]], max_samples: int) -> list[dict[str, Any]]:
    """Truncates paths so that they hold exactly ``max_samples`` steps (garage).

    Whole paths are kept while the total stays within ``max_samples``; the
    first path that crosses it is shortened (its per-step arrays and nested
    info dicts alike) and later paths are dropped. Step types and dones are
    sliced as they are, never rewritten, as in garage.

    Args:
        paths: garage path dicts. Per-step keys: ``observations`` (T or
            T + 1 rows; with T + 1, one more row is kept),
            ``next_observations``, ``actions``, ``rewards``, ``dones``,
            ``step_types``, ``env_infos`` and ``agent_infos`` (nested);
            per-episode, kept unchanged: ``episode_infos``; and
            ``last_observation``, which becomes the observation after the
            cut when a path is shortened.
        max_samples: The number of steps to keep (>= 0).

    Returns:
        New path dicts (arrays are views of the given ones).

    Raises:
        ConfigError: If ``max_samples`` is negative.
        InvalidValueError: If a path has a key outside those above (garage
            raises for unknown keys too).
    """
    check_int("truncate_paths: max_samples", max_samples, minimum=0)
    kept: list[dict[str, Any]] = []
    remaining = max_samples
    for index, path in enumerate(paths):
        if remaining <= 0:
            break
        length = len(path["rewards"])
        keep = min(length, remaining)
        kept.append(_path_head(path, keep, index) if keep < length else dict(path))
        remaining -= keep
    return kept


def _path_head(path: Mapping[str, Any], length: int, index: int = 0) -> dict[str, Any]:
    """The first ``length`` steps of a garage path.

    Raises:
        InvalidValueError: Naming an unknown key of path ``index``.
    """
    steps = len(path["rewards"])
    head: dict[str, Any] = {}
    for key, value in path.items():
        if key in _PER_STEP_KEYS:
            # Paths may carry T + 1 observations (the last one after the last step).
            extra = 1 if key == "observations" and len(value) == steps + 1 else 0
            head[key] = value[: length + extra]
        elif key in _PER_STEP_INFO_KEYS:
            head[key] = _slice_infos(value, length)
        elif key in _PER_EPISODE_KEYS:
            head[key] = value
        elif key == _LAST_OBSERVATION:
            # A path cut after `length` steps ends before observation `length`.
            head[key] = path["observations"][length] if length < steps else value
        else:
            valid = sorted(
                _PER_STEP_KEYS | _PER_STEP_INFO_KEYS | _PER_EPISODE_KEYS | {_LAST_OBSERVATION}
            )
            raise InvalidValueError(
                f"truncate_paths: path {index} has unexpected key {key!r}; valid keys are {valid}"
            )
    return head


def _slice_infos(infos: Mapping[str, Any], length: int) -> dict[str, Any]:
    return {
        key: _slice_infos(value, length) if isinstance(value, Mapping) else value[:length]
        for key, value in infos.items()
    }


def obtain_evaluation_episodes(
    policy: Policy,
    env: gym.Env,
    max_episode_length: int = 1000,
    num_eps: int = 100,
    deterministic: bool = True,
    *,
    seed: int | None = None,
) -> EpisodeBatch:
    """Samples episodes for evaluation (garage's ``obtain_evaluation_episodes``).

    Episodes are run by a one-env :class:`~rlfleet.worker.VecWorker` on
    ``env`` itself (which is left open), so they carry exact step types,
    last observations and episode_infos.

    Args:
        policy: The policy to evaluate.
        env: The env to evaluate in.
        max_episode_length: Cut episodes off after this many steps.
        num_eps: Number of episodes.
        deterministic: Act with the mode of the policy's distribution.
        seed: Base seed of the episodes' seeds (``episode_seeds(seed, 0,
            k)``); None draws fresh entropy.

    Returns:
        ``num_eps`` episodes, in order.

    Raises:
        ConfigError: If ``num_eps`` < 1.
    """
    check_int("num_eps", num_eps)
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    worker = VecWorker(n_envs=1, max_episode_length=max_episode_length, env=env, policy=policy)
    with _acting_deterministically(policy, deterministic):
        return worker.run(make_units(seed, 0, range(num_eps)))


def discount_cumsum(x: Any, discount: float) -> np.ndarray:
    """Discounted cumulative sums: ``y[t] = sum_k discount**k * x[t + k]``.

    garage's ``discount_cumsum``, vectorised without scipy: within blocks
    short enough that ``discount ** -block`` cannot overflow, ``y`` is a
    scaled reverse cumulative sum; blocks are chained from the end.

    Args:
        x: 1-D array-like.
        discount: In [0, 1].

    Returns:
        float64 array shaped like ``x``.
    """
    values = np.asarray(x, dtype=np.float64)
    if values.ndim != 1:
        raise InvalidValueError(f"discount_cumsum: expected a 1-D array, got shape {values.shape}")
    if not 0.0 <= discount <= 1.0:
        raise InvalidValueError(f"discount_cumsum: discount must be in [0, 1], got {discount}")
    if discount == 0.0:
        return values.copy()
    if discount == 1.0:
        return np.cumsum(values[::-1])[::-1].copy()
    # discount ** -block stays below 1e100: well inside float64's range.
    block = max(1, int(100 / -math.log10(discount)))
    result = np.empty_like(values)
    carry = 0.0
    for stop in range(len(values), 0, -block):
        start = max(0, stop - block)
        chunk = values[start:stop]
        powers = discount ** np.arange(len(chunk), dtype=np.float64)
        sums = np.cumsum((chunk * powers)[::-1])[::-1] / powers
        sums += carry * discount ** (len(chunk) - np.arange(len(chunk)))
        result[start:stop] = sums
        carry = float(sums[0])
    return result


def performance_stats(
    batch: EpisodeBatch, discount: float, itr: int | None = None
) -> dict[str, float]:
    """Statistics of a batch's episodes (garage's ``log_performance`` fields).

    Args:
        batch: The episodes.
        discount: Discount of ``AverageDiscountedReturn``.
        itr: Iteration number, recorded as ``Iteration`` if given.

    Returns:
        ``Iteration`` (if given), ``NumEpisodes``, ``AverageDiscountedReturn``, ``AverageReturn``,
        ``StdReturn``, ``MaxReturn``, ``MinReturn``, ``TerminationRate``
        (fraction of episodes with a TERMINAL step) and, when env_infos has
        ``success``, ``SuccessRate`` (an episode succeeds if any step's
        success is true). NaN statistics for an empty batch.
    """
    head: dict[str, float] = {} if itr is None else {"Iteration": itr}
    returns = episode_returns(batch)
    n = len(returns)
    if n == 0:
        nan = math.nan
        averages = dict.fromkeys(
            ("AverageDiscountedReturn", "AverageReturn", "StdReturn", "MaxReturn", "MinReturn"),
            nan,
        )
        return {**head, "NumEpisodes": 0, **averages, "TerminationRate": nan}
    starts = episode_starts(batch.lengths)
    stats = {
        **head,
        "NumEpisodes": n,
        "AverageDiscountedReturn": float(np.mean(discounted_returns(batch, discount))),
        "AverageReturn": float(np.mean(returns)),
        "StdReturn": float(np.std(returns)),
        "MaxReturn": float(np.max(returns)),
        "MinReturn": float(np.min(returns)),
        "TerminationRate": float(
            np.mean(np.logical_or.reduceat(batch.step_types == StepType.TERMINAL, starts))
        ),
    }
    success = batch.env_infos.get("success")
    if isinstance(success, np.ndarray):
        per_step = success.reshape(len(success), -1).astype(bool).any(axis=1)
        stats["SuccessRate"] = float(np.mean(np.logical_or.reduceat(per_step, starts)))
    return stats


def episode_returns(batch: EpisodeBatch) -> np.ndarray:
    """Undiscounted return of each episode, shape (N,)."""
    if batch.n_episodes == 0:
        return np.zeros(0, dtype=np.float64)
    rewards = batch.rewards.astype(np.float64, copy=False)
    return np.add.reduceat(rewards, episode_starts(batch.lengths))


def discounted_returns(batch: EpisodeBatch, discount: float) -> np.ndarray:
    """Discounted return of each episode from its first step, shape (N,).

    Equal to ``discount_cumsum(episode_rewards, discount)[0]`` per episode,
    computed for all episodes at once.
    """
    if batch.n_episodes == 0:
        return np.zeros(0, dtype=np.float64)
    starts = episode_starts(batch.lengths)
    step_in_episode = np.arange(batch.total_steps) - np.repeat(starts, batch.lengths)
    weights = np.float64(discount) ** step_in_episode
    return np.add.reduceat(batch.rewards.astype(np.float64, copy=False) * weights, starts)


#: Where the log_* functions also record their values: the tabular of the
#: Trainer whose epoch is running (garage records them in its global tabular).
_RECORDER: ContextVar[Callable[[str, float], None] | None] = ContextVar(
    "rlfleet_tabular", default=None
)


@contextmanager
def recording_to(record: Callable[[str, float], None]) -> Iterator[None]:
    """Makes :func:`log_performance` and :func:`log_multitask_performance` also call ``record``.

    ``rlfleet.Trainer`` wraps each epoch in it, so an algorithm written for
    garage, which calls ``log_performance(itr, episodes, discount)``, gets
    its values in the epoch's diagnostics.
    """
    previous = _RECORDER.get()
    _RECORDER.set(record)
    try:
        yield
    finally:
        _RECORDER.set(previous)


def _log(prefix: str, key: str, value: float) -> None:
    logger.info("%s/%s %s", prefix, key, value)
    record = _RECORDER.get()
    if record is not None:
        record(f"{prefix}/{key}", value)


def log_performance(
    itr: int, batch: EpisodeBatch, discount: float, prefix: str = "Evaluation"
) -> np.ndarray:
    """Logs the performance of a batch of episodes (garage's ``log_performance``).

    Logs ``{prefix}/{key} = value`` for ``Iteration`` and every field of
    :func:`performance_stats` at INFO level on the ``rlfleet`` logger and,
    during a :class:`rlfleet.Trainer` epoch, records them in its diagnostics
    (``progress.csv``, TensorBoard) as garage's tabular does.

    Args:
        itr: Iteration number.
        batch: The episodes to evaluate with.
        discount: Discount of the discounted return.
        prefix: Prefix of the logged keys.

    Returns:
        The undiscounted return of each episode, shape (N,).
    """
    for key, value in performance_stats(batch, discount, itr).items():
        _log(prefix, key, value)
    return episode_returns(batch)


def log_multitask_performance(
    itr: int,
    batch: EpisodeBatch,
    discount: float,
    name_map: Mapping[int, str] | None = None,
) -> np.ndarray:
    """Logs the performance of each task of a batch, then of all (garage's).

    An episode's task is ``env_infos["task_name"][0]`` if present, else
    ``name_map.get(task_id, f"Task #{task_id}")`` for ``env_infos["task_id"]``,
    else ``"__unnamed_task__"``. Each task's episodes are logged with
    :func:`log_performance` under the task's name; a task of ``name_map``
    with no episode is logged with ``NumEpisodes`` 0 and NaN statistics.
    Then the whole batch is logged under ``Average``.

    Args:
        itr: Iteration number.
        batch: Episodes of one or more tasks.
        discount: Discount of the discounted return.
        name_map: Task id -> name. If given, exactly its tasks are logged.

    Returns:
        The undiscounted return of each episode of the batch, shape (N,).
    """
    by_name: dict[str, list[EpisodeBatch]] = {}
    for episode in batch.split():
        by_name.setdefault(_task_name(episode, name_map), []).append(episode)
    names = list(by_name) if name_map is None else list(name_map.values())
    for name in names:
        episodes = by_name.get(name)
        if episodes:
            log_performance(itr, EpisodeBatch.concatenate(*episodes), discount, prefix=name)
            continue
        empty = performance_stats(batch.take_episodes(np.zeros(0, dtype=np.int64)), discount, itr)
        for key, value in {**empty, "SuccessRate": math.nan}.items():
            _log(name, key, value)
    return log_performance(itr, batch, discount, prefix="Average")


def _task_name(episode: EpisodeBatch, name_map: Mapping[int, str] | None) -> str:
    if "task_name" in episode.env_infos:
        return str(episode.env_infos["task_name"][0])
    if "task_id" in episode.env_infos:
        task_id = episode.env_infos["task_id"][0]
        return (name_map or {}).get(int(task_id), f"Task #{task_id}")
    return "__unnamed_task__"


__all__ = [
    "discount_cumsum",
    "discounted_returns",
    "episode_returns",
    "log_multitask_performance",
    "log_performance",
    "obtain_evaluation_episodes",
    "performance_stats",
    "rollout",
    "stack_tensor_dict_list",
    "truncate_paths",
]
