"""RolloutEpisodeBatch: the EpisodeBatch a RolloutWorker returns, readable by RLlib's keys.

RLlib code reads a ``SampleBatch`` by column name (``batch["obs"]``,
``batch["rewards"]``). A :class:`RolloutEpisodeBatch` is an
:class:`~rlfleet.core.EpisodeBatch` holding the very same arrays (no copy is
made to build it) that also answers those keys: a column rlfleet stores is
returned as the stored array itself (``batch["obs"] is
batch.observations``), and a column rlfleet derives (``new_obs``,
``terminateds``, ``eps_id``, ...) is computed when read. docs/rllib.md
lists the keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rlfleet.core._arrays import values_equal
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import BatchKeyError


def _per_step(batch: EpisodeBatch, per_episode: np.ndarray) -> np.ndarray:
    return np.repeat(per_episode, batch.lengths)


def _episode_info(batch: EpisodeBatch, key: str) -> np.ndarray:
    if key in batch.episode_infos:
        return _per_step(batch, np.asarray(batch.episode_infos[key]))
    return _per_step(batch, np.arange(batch.n_episodes))


def _terminateds(batch: EpisodeBatch) -> np.ndarray:
    return np.asarray(batch.step_types) == StepType.TERMINAL


def _truncateds(batch: EpisodeBatch) -> np.ndarray:
    return np.asarray(batch.step_types) == StepType.TIMEOUT


def _agent_index(batch: RolloutEpisodeBatch) -> np.ndarray:
    ids = batch.episode_infos.get("agent_id")
    if ids is None:
        return np.zeros(batch.total_steps, dtype=np.int64)
    order = list(batch.agent_order) or sorted({str(a) for a in np.asarray(ids)})
    index = {agent: i for i, agent in enumerate(order)}
    return _per_step(batch, np.array([index.get(str(a), -1) for a in np.asarray(ids)]))


def _t(batch: EpisodeBatch) -> np.ndarray:
    starts = np.repeat(np.cumsum(batch.lengths) - batch.lengths, batch.lengths)
    return np.arange(batch.total_steps) - starts


def _dist_inputs(batch: EpisodeBatch) -> np.ndarray:
    infos = batch.agent_infos
    if "logits" in infos:
        return np.asarray(infos["logits"])
    if "mean" in infos and "log_std" in infos:
        return np.concatenate([infos["mean"], infos["log_std"]], axis=-1)
    raise BatchKeyError(
        "action_dist_inputs: the policy recorded neither 'logits' nor 'mean' and 'log_std' "
        f"in agent_infos (it has {sorted(infos)})"
    )


def _infos(batch: EpisodeBatch) -> np.ndarray:
    rows = np.empty(batch.total_steps, dtype=object)
    for i in range(batch.total_steps):
        rows[i] = {key: value[i] for key, value in batch.env_infos.items()}
    return rows


#: RLlib's SampleBatch columns and how each is read from an EpisodeBatch.
#: Stored columns are returned as they are (the batch's own arrays).
COLUMNS: dict[str, Callable[[Any], Any]] = {
    "obs": lambda b: b.observations,
    "new_obs": lambda b: b.next_observations,
    "actions": lambda b: b.actions,
    "rewards": lambda b: b.rewards,
    "terminateds": _terminateds,
    "truncateds": _truncateds,
    "dones": lambda b: _terminateds(b) | _truncateds(b),
    "eps_id": lambda b: _episode_info(b, "env_episode"),
    "env_id": lambda b: _episode_info(b, "env_index"),
    "unroll_id": lambda b: _episode_info(b, "fragment"),
    "agent_index": _agent_index,
    "t": _t,
    "action_logp": lambda b: b.agent_infos["log_prob"],
    "action_prob": lambda b: np.exp(b.agent_infos["log_prob"]),
    "action_dist_inputs": _dist_inputs,
    "infos": _infos,
    "seq_lens": lambda b: b.lengths,
}


class RolloutEpisodeBatch(EpisodeBatch):
    """An EpisodeBatch that also reads like RLlib's SampleBatch (see the module docstring).

    ``batch[key]`` takes a key of :data:`COLUMNS`, or a key of
    ``agent_infos`` (RLlib keeps a policy's extra outputs as columns);
    ``keys()``, ``in``, ``get`` and iteration work as on a dict. It equals
    an EpisodeBatch with the same fields.
    """

    agent_order: tuple[str, ...] = ()

    @classmethod
    def view_of(cls, batch: EpisodeBatch, agent_order: Sequence[str] = ()) -> RolloutEpisodeBatch:
        """The same batch, readable by RLlib's keys: the same arrays, nothing copied.

        Args:
            batch: The batch.
            agent_order: The env's agent ids in order (``agent_index`` is a
                position in it); empty for a single agent.
        """
        view = object.__new__(cls)
        for field in dataclasses.fields(EpisodeBatch):
            object.__setattr__(view, field.name, getattr(batch, field.name))
        object.__setattr__(view, "agent_order", tuple(agent_order))
        return view

    def __getitem__(self, key: str) -> Any:
        """The column ``key`` (RLlib's name), stored or derived.

        Raises:
            BatchKeyError: (a KeyError) If the batch has no such column.
        """
        column = COLUMNS.get(key)
        if column is not None:
            try:
                return column(self)
            except KeyError as missing:
                raise BatchKeyError(
                    f"{key!r}: this batch has no {missing} (the policy or env did not record it)"
                ) from None
        if key in self.agent_infos:
            return self.agent_infos[key]
        raise BatchKeyError(f"{key!r} is not a column of this batch; it has {list(self.keys())}")

    def keys(self) -> list[str]:
        """The columns this batch can give."""
        derived = [key for key in COLUMNS if self._has(key)]
        return derived + [key for key in self.agent_infos if key not in COLUMNS]

    def _has(self, key: str) -> bool:
        if key in ("action_logp", "action_prob"):
            return "log_prob" in self.agent_infos
        if key == "action_dist_inputs":
            return "logits" in self.agent_infos or {"mean", "log_std"} <= set(self.agent_infos)
        return True

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is a column of this batch."""
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        """The column names, as iterating a SampleBatch (a dict) gives."""
        return iter(self.keys())

    def get(self, key: str, default: Any = None) -> Any:
        """``batch[key]``, or ``default`` if there is no such column."""
        if key not in self:
            return default
        return self[key]

    @property
    def count(self) -> int:
        """RLlib's ``SampleBatch.count``: the number of steps."""
        return self.total_steps

    def env_steps(self) -> int:
        """RLlib's ``SampleBatch.env_steps()``: the number of steps."""
        return self.total_steps

    def agent_steps(self) -> int:
        """RLlib's ``SampleBatch.agent_steps()``: the number of steps."""
        return self.total_steps

    def __eq__(self, other: object) -> bool:
        """Equal to any EpisodeBatch with the same fields (the view adds no data)."""
        if not isinstance(other, EpisodeBatch):
            return NotImplemented
        return all(
            values_equal(getattr(self, field.name), getattr(other, field.name))
            for field in dataclasses.fields(EpisodeBatch)
        )

    __hash__ = None  # type: ignore[assignment]


__all__ = ["COLUMNS", "RolloutEpisodeBatch"]
