"""Splitting a fleet batch of a joint multi-agent env into one EpisodeBatch per policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.multi_agent_batch import MultiAgentEpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import InvalidBatchError
from rlfleet.rllib._collector import ROLLOUT_INFO_KEYS
from rlfleet.rllib.multi_agent import (
    AGENT_INFO,
    AGENT_STEPS,
    REWARDS,
    TERMINATED,
    TRUNCATED,
    JointLayout,
)
from rlfleet.worker._episode_buffer import Segment, build_batch


def split_joint_batch(
    joint: EpisodeBatch,
    layout: JointLayout,
    mapping: Mapping[str, str],
    env_specs: Mapping[str, EnvSpec],
) -> MultiAgentEpisodeBatch:
    """One EpisodeBatch per policy from a fleet batch of a :class:`MultiAgentJointEnv`.

    Each row of a policy's batch is one agent's trajectory within one row
    (episode or fragment) of ``joint``, in joint-row then
    ``possible_agents`` order, with the step types, rewards and last
    observations a local RolloutWorker gives it. ``episode_infos`` carry
    ``agent_id``, ``env_episode`` (``stream << 32 | episode`` for fragments),
    ``fragment``, ``env_index`` (the stream, -1 for whole episodes) and the
    joint row's own labels (``worker``, ``agent_version``, seeds).

    Args:
        joint: The fleet's batch.
        layout: The joint env's layout.
        mapping: Agent id -> policy id.
        env_specs: Policy id -> the spaces its batch is in.
    """
    infos = joint.episode_infos
    labels = [k for k in ("worker", "agent_version", "env_seed", "policy_seed") if k in infos]
    keys = (*ROLLOUT_INFO_KEYS, *labels)
    starts = np.concatenate([[0], np.cumsum(joint.lengths)[:-1]]).astype(np.int64)
    segments: dict[str, list[tuple[str, Segment]]] = {}
    for row in range(joint.n_episodes):
        try:
            _split_row(
                joint,
                row,
                start=int(starts[row]),
                layout=layout,
                mapping=mapping,
                env_specs=env_specs,
                labels=labels,
                segments=segments,
            )
        except ValueError as exc:  # gymnasium's unflatten: not a valid one-hot, ...
            raise InvalidBatchError(
                f"row {row} of a joint multi-agent batch does not fit the layout of "
                f"{list(layout.agents)}: {exc}"
            ) from exc
    batches = {}
    for policy_id, members in segments.items():
        batch = build_batch(env_specs[policy_id], [s for _, s in members], keys)
        batches[policy_id] = batch.with_episode_infos(
            agent_id=np.array([agent for agent, _ in members])
        )
    return MultiAgentEpisodeBatch(batches, int(joint.lengths.sum()))


def _split_row(
    joint: EpisodeBatch,
    row: int,
    *,
    start: int,
    layout: JointLayout,
    mapping: Mapping[str, str],
    env_specs: Mapping[str, EnvSpec],
    labels: Sequence[str],
    segments: dict[str, list[tuple[str, Segment]]],
) -> None:
    """Appends row ``row``'s agent trajectories to ``segments``, by policy id."""
    infos, env_infos = joint.episode_infos, joint.env_infos
    fragments = "stream" in infos
    length = int(joint.lengths[row])
    stop = start + length
    observations = joint.observations[start:stop]
    acts = observations[:, layout.mask_start :] > 0.5
    following = np.concatenate([observations[1:], joint.last_observations[row][None]])
    joint_end = int(joint.step_types[stop - 1])
    episode = int(infos["episode_index"][row])
    stream = int(infos["stream"][row]) if fragments else -1
    fragment = int(infos["fragment_index"][row]) if fragments else 0
    row_labels = tuple(int(infos[k][row]) for k in labels)
    for i, agent in enumerate(layout.agents):
        steps = np.flatnonzero(acts[:, i])
        if not len(steps):
            continue
        last = int(steps[-1])
        rows = start + steps
        terminated = bool(env_infos[TERMINATED][start + last, i])
        truncated = bool(env_infos[TRUNCATED][start + last, i])
        ended = last == length - 1 and joint_end in (StepType.TERMINAL, StepType.TIMEOUT)
        kind: int | None = None
        if terminated:
            kind = int(StepType.TERMINAL)
        elif truncated or ended:
            kind = int(StepType.TIMEOUT)
        policy_id = mapping[agent]
        prefix = f"{AGENT_INFO}{agent}/"
        segments.setdefault(policy_id, []).append(
            (
                agent,
                Segment(
                    key=(row, i),
                    infos=(
                        (stream << 32) | episode if fragments else episode,
                        fragment,
                        stream,
                        *row_labels,
                    ),
                    observations=np.stack(
                        [layout.agent_observation(o, i) for o in observations[steps]]
                    ),
                    last_observation=layout.agent_observation(following[last], i),
                    actions=np.stack([layout.agent_action(a, i) for a in joint.actions[rows]]),
                    rewards=np.asarray(env_infos[REWARDS][rows, i], dtype=np.float64),
                    agent_infos={
                        key[len(agent) + 1 :]: value[rows]
                        for key, value in joint.agent_infos.items()
                        if key.startswith(agent + "/")
                    },
                    env_infos={
                        key[len(prefix) :]: value[rows]
                        for key, value in env_infos.items()
                        if key.startswith(prefix)
                    },
                    first=int(env_infos[AGENT_STEPS][rows[0], i]) == 1,
                    last=kind,
                    env_spec=env_specs[policy_id],
                ),
            )
        )
