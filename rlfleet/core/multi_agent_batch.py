"""MultiAgentEpisodeBatch: one EpisodeBatch per policy (RLlib's ``MultiAgentBatch``).

Each policy's :class:`~rlfleet.core.EpisodeBatch` holds the trajectories of
the agents mapped to that policy: one "episode" row per agent trajectory (or
fragment of one), whose ``episode_infos`` carry ``agent_id`` (the agent's
name, a string array) and ``env_episode`` (the id of the env episode it came
from, unique within the worker that sampled it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import InvalidBatchError

#: The episode_infos keys every policy batch of a MultiAgentEpisodeBatch has.
MULTI_AGENT_INFO_KEYS = ("agent_id", "env_episode")


@dataclass(frozen=True, eq=False)
class MultiAgentEpisodeBatch:
    """Experience of several policies, keyed by policy id.

    Attributes:
        policy_batches: Policy id -> that policy's EpisodeBatch. Each batch's
            ``episode_infos`` has ``agent_id`` and ``env_episode`` arrays.
        env_steps: How many env steps produced the batch (each env step may
            give several agent steps).

    Raises:
        InvalidBatchError: If a policy id is not a string, a batch lacks the
            multi-agent episode infos, or ``env_steps`` is not a non-negative
            int.
    """

    policy_batches: Mapping[str, EpisodeBatch]
    env_steps: int

    def __post_init__(self) -> None:
        """Checks ids, batch types, infos and the step count."""
        object.__setattr__(self, "policy_batches", dict(self.policy_batches))
        for policy_id, batch in self.policy_batches.items():
            where = f"MultiAgentEpisodeBatch.policy_batches[{policy_id!r}]"
            if not isinstance(policy_id, str):
                raise InvalidBatchError(f"{where}: policy ids must be str")
            if not isinstance(batch, EpisodeBatch):
                raise InvalidBatchError(
                    f"{where}: expected an EpisodeBatch, got {type(batch).__name__}"
                )
            missing = [key for key in MULTI_AGENT_INFO_KEYS if key not in batch.episode_infos]
            if missing:
                raise InvalidBatchError(
                    f"{where}: episode_infos lacks {missing}; every policy batch names the "
                    "agent and the env episode of each trajectory"
                )
        if isinstance(self.env_steps, bool) or not isinstance(self.env_steps, int | np.integer):
            raise InvalidBatchError(
                f"MultiAgentEpisodeBatch.env_steps must be an int, got {self.env_steps!r}"
            )
        object.__setattr__(self, "env_steps", int(self.env_steps))
        if self.env_steps < 0:
            raise InvalidBatchError(
                f"MultiAgentEpisodeBatch.env_steps must be >= 0, got {self.env_steps}"
            )

    def __repr__(self) -> str:
        """Policy ids with their episode and step counts."""
        parts = ", ".join(
            f"{pid!r}: {b.n_episodes} trajectories/{b.total_steps} steps"
            for pid, b in self.policy_batches.items()
        )
        return f"MultiAgentEpisodeBatch(env_steps={self.env_steps}, {{{parts}}})"

    def __getitem__(self, policy_id: str) -> EpisodeBatch:
        """The batch of one policy.

        Raises:
            KeyError: If the policy has no batch here; the message lists those that do.
        """
        try:
            return self.policy_batches[policy_id]
        except KeyError:
            # builtin on purpose: the Mapping protocol (get, in, ...) expects a KeyError.
            raise KeyError(
                f"no batch for policy {policy_id!r}; policies here: {sorted(self.policy_batches)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        """Iterates over the policy ids."""
        return iter(self.policy_batches)

    def __len__(self) -> int:
        """Number of policies with a batch."""
        return len(self.policy_batches)

    @property
    def agent_steps(self) -> int:
        """Agent steps over all policies (RLlib's ``agent_steps()``)."""
        return sum(b.total_steps for b in self.policy_batches.values())

    @classmethod
    def concatenate(cls, *batches: MultiAgentEpisodeBatch) -> MultiAgentEpisodeBatch:
        """Concatenates policy-wise; env steps add up.

        Args:
            *batches: At least one batch. A policy missing from some batches
                gets the concatenation of those that have it.

        Returns:
            The concatenation (policies in order of first appearance).

        Raises:
            InvalidBatchError: If no batch is given, or a policy's batches do
                not concatenate (different spaces or info keys).
        """
        if not batches:
            raise InvalidBatchError("MultiAgentEpisodeBatch.concatenate needs at least one batch")
        per_policy: dict[str, list[EpisodeBatch]] = {}
        for batch in batches:
            if not isinstance(batch, MultiAgentEpisodeBatch):
                raise InvalidBatchError(
                    "MultiAgentEpisodeBatch.concatenate takes MultiAgentEpisodeBatch, "
                    f"got {type(batch).__name__}"
                )
            for policy_id, policy_batch in batch.policy_batches.items():
                per_policy.setdefault(policy_id, []).append(policy_batch)
        return cls(
            {pid: EpisodeBatch.concatenate(*parts) for pid, parts in per_policy.items()},
            sum(b.env_steps for b in batches),
        )

    def split(self) -> list[MultiAgentEpisodeBatch]:
        """Splits into one batch per env episode (the inverse of :meth:`concatenate`).

        Returns:
            One batch per distinct ``env_episode``, in order of first
            appearance. Its ``env_steps`` is the longest agent's step count
            in that env episode: in PettingZoo's Parallel API every live
            agent acts at every env step.
        """
        order: list[int] = []
        for batch in self.policy_batches.values():
            for episode in batch.episode_infos["env_episode"].tolist():
                if episode not in order:
                    order.append(episode)
        parts = []
        for episode in order:
            policy_batches = {}
            agent_lengths: dict[str, int] = {}
            for policy_id, batch in self.policy_batches.items():
                rows = np.flatnonzero(batch.episode_infos["env_episode"] == episode)
                if rows.size == 0:
                    continue
                policy_batches[policy_id] = batch.take_episodes(rows)
                for agent, length in zip(
                    batch.episode_infos["agent_id"][rows].tolist(),
                    batch.lengths[rows].tolist(),
                    strict=True,
                ):
                    agent_lengths[agent] = agent_lengths.get(agent, 0) + int(length)
            parts.append(MultiAgentEpisodeBatch(policy_batches, max(agent_lengths.values())))
        return parts
