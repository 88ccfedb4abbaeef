"""Rollout callbacks and the per-episode record they see (RLlib's ``DefaultCallbacks``).

Subclass :class:`DefaultCallbacks` and override the hooks you need. A worker
builds one instance; hooks receive keyword arguments only, so new ones can
be added without breaking overrides that take ``**kwargs``. On a fleet the
class is named by an import path (``"package.module:Class"``) installed on
the workers, never sent as code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlfleet._util.imports import import_object
from rlfleet.errors import ConfigError

if TYPE_CHECKING:
    from rlfleet.rllib.rollout_worker import RolloutWorker


@dataclass
class Episode:
    """What a worker knows of one env episode while it runs.

    Attributes:
        episode_id: Unique within the worker (``env_episode`` in batches).
        env_index: The vector index of the env that runs it.
        length: Env steps so far.
        total_reward: Sum of all agents' raw (unclipped) rewards so far.
        agent_rewards: ``(agent_id, policy_id) -> raw reward`` so far.
        custom_metrics: Scalars a callback sets; reported by ``get_metrics()``.
        hist_data: Lists of values a callback sets; reported likewise.
        user_data: Free space for callbacks, not reported.
        policy_for_agent: ``agent_id -> policy_id``, fixed when the agent
            first appears (as RLlib binds agents for the whole episode).
    """

    episode_id: int
    env_index: int
    length: int = 0
    total_reward: float = 0.0
    agent_rewards: dict[tuple[str, str], float] = field(default_factory=dict)
    custom_metrics: dict[str, float] = field(default_factory=dict)
    hist_data: dict[str, list[float]] = field(default_factory=dict)
    user_data: dict[str, Any] = field(default_factory=dict)
    policy_for_agent: dict[str, str] = field(default_factory=dict)

    def policy_for(self, agent_id: str) -> str:
        """The policy id the agent is bound to in this episode.

        Raises:
            KeyError: If the agent has not appeared in this episode.
        """
        return self.policy_for_agent[agent_id]


@dataclass(frozen=True)
class RolloutMetrics:
    """One finished episode, as ``RolloutWorker.get_metrics()`` reports it.

    Attributes:
        episode_length: Env steps.
        episode_reward: Sum of all agents' raw rewards.
        agent_rewards: ``(agent_id, policy_id) -> raw reward``.
        custom_metrics: What callbacks put in ``episode.custom_metrics``.
        hist_data: What callbacks put in ``episode.hist_data``.
        episode_id: The episode's id in its worker.
        worker_index: The worker that ran it.
    """

    episode_length: int
    episode_reward: float
    agent_rewards: dict[tuple[str, str], float]
    custom_metrics: dict[str, float]
    hist_data: dict[str, list[float]]
    episode_id: int
    worker_index: int


class DefaultCallbacks:
    """Hooks called by a RolloutWorker while it samples; each does nothing here."""

    def on_episode_start(
        self, *, worker: RolloutWorker, env: Any, episode: Episode, env_index: int, **kwargs: Any
    ) -> None:
        """Called after an env was reset, before the first action."""

    def on_episode_step(
        self, *, worker: RolloutWorker, env: Any, episode: Episode, env_index: int, **kwargs: Any
    ) -> None:
        """Called after each env step of an episode (the last one included)."""

    def on_episode_end(
        self, *, worker: RolloutWorker, env: Any, episode: Episode, env_index: int, **kwargs: Any
    ) -> None:
        """Called when an episode ended, before its metrics are recorded."""

    def on_sample_end(self, *, worker: RolloutWorker, samples: Any, **kwargs: Any) -> None:
        """Called with each batch ``sample()`` returns."""


def make_callbacks(callbacks: type[DefaultCallbacks] | str | None) -> DefaultCallbacks:
    """Builds the callbacks object from a class, an import path or None.

    Raises:
        ConfigError: If the class or path does not name a DefaultCallbacks
            subclass, or its constructor needs arguments.
    """
    if callbacks is None:
        return DefaultCallbacks()
    target: Any = import_object(callbacks, "callbacks") if isinstance(callbacks, str) else callbacks
    if not (isinstance(target, type) and issubclass(target, DefaultCallbacks)):
        raise ConfigError(
            f"callbacks must be a subclass of rlfleet.rllib.DefaultCallbacks (or its import "
            f"path), got {target!r}"
        )
    try:
        return target()
    except TypeError as exc:
        raise ConfigError(
            f"callbacks {target.__qualname__}() must take no arguments: {exc}"
        ) from exc
