"""RolloutWorker: RLlib's ``RolloutWorker`` surface, local, on rlfleet's types.

::

    worker = RolloutWorker(
        env_creator=lambda ctx: gym.make("CartPole-v1"),
        policy_spec=VPG(EnvConfig("CartPole-v1").env_spec()),
    )
    batch = worker.sample()            # an rlfleet EpisodeBatch
    info = worker.learn_on_batch(batch)
    state = worker.save()              # versioned bytes, no pickle

A gymnasium env gives :class:`~rlfleet.core.EpisodeBatch` samples; a
PettingZoo env (Parallel, or AEC through PettingZoo's ``aec_to_parallel``)
or a dict ``policy_spec`` gives a
:class:`~rlfleet.core.MultiAgentEpisodeBatch`. docs/rllib.md maps the
arguments and fields onto RLlib's.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from collections.abc import Callable, Container, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._util.values import check_int
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.multi_agent_batch import MultiAgentEpisodeBatch
from rlfleet.errors import ConfigError, PolicyIdError, UsageError
from rlfleet.policies import Policy
from rlfleet.rllib._collector import EnvSlot, RolloutCollector, SamplingSettings
from rlfleet.rllib._envs import AgentEnv
from rlfleet.rllib._policies import (
    DEFAULT_POLICY_ID,
    IsPolicyToTrain,
    PolicyEntry,
    PolicyMappingFn,
    build_entry,
    is_to_train_fn,
    mapping_fn,
)
from rlfleet.rllib.arguments import (
    IgnoredArgumentWarning,
    check_against_envs,
    check_arguments,
    is_atari,
)
from rlfleet.rllib.callbacks import DefaultCallbacks, Episode, RolloutMetrics, make_callbacks
from rlfleet.rllib.filters import ObservationFilter
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch
from rlfleet.rllib.state import WorkerState, check_same_policies, dump_state, load_state

SampleBatchType = EpisodeBatch | MultiAgentEpisodeBatch
#: What sample() returns: batches that also read like RLlib's SampleBatch.
SampledBatch = RolloutEpisodeBatch | MultiAgentEpisodeBatch

_BATCH_MODES = ("truncate_episodes", "complete_episodes")
_COUNT_MODES = ("env_steps", "agent_steps")


class EnvContext(dict[str, Any]):
    """The ``env_config`` dict handed to ``env_creator``, plus where the env runs.

    Attributes:
        worker_index: The worker's index (0: the local worker).
        vector_index: The env's index within the worker.
        num_workers: How many remote workers there are.
        remote: Whether the env runs in another process.
    """

    def __init__(
        self,
        env_config: Mapping[str, Any],
        *,
        worker_index: int,
        vector_index: int,
        num_workers: int,
        remote: bool = False,
    ) -> None:
        super().__init__(env_config)
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.num_workers = num_workers
        self.remote = remote


class RolloutWorker:
    """Collects experience from local envs with local policies (RLlib's names).

    All arguments are keyword-only. Every argument of RLlib's
    RolloutWorker is accepted: those that apply are parameters here, and
    the others go through :mod:`rlfleet.rllib.arguments`, the one table of
    what rlfleet does with each (docs/rllib.md lists it).

    Raises:
        ConfigError: For an RLlib argument whose value would change the data
            if it were ignored (the message says why and what to do
            instead), an unknown argument, or an invalid value.
    """

    def __init__(
        self,
        *,
        env_creator: Callable[[EnvContext], Any],
        validate_env: Callable[[Any, EnvContext], None] | None = None,
        policy_spec: Any = None,
        policy_mapping_fn: PolicyMappingFn | str | None = None,
        policies_to_train: Container[str] | IsPolicyToTrain | None = None,
        rollout_fragment_length: int = 100,
        count_steps_by: str = "env_steps",
        batch_mode: str = "truncate_episodes",
        episode_horizon: int | None = None,
        num_envs: int = 1,
        observation_filter: str = "NoFilter",
        clip_rewards: bool | float | None = None,
        normalize_actions: bool = True,
        clip_actions: bool = False,
        env_config: Mapping[str, Any] | None = None,
        worker_index: int = 0,
        num_workers: int = 0,
        callbacks: type[DefaultCallbacks] | str | None = None,
        soft_horizon: bool = False,
        no_done_at_end: bool = False,
        seed: int | None = None,
        disable_env_checking: bool = False,
        recreated_worker: bool = False,
        log_level: str | int | None = None,
        extra_python_environs: Mapping[str, Any] | None = None,
        spaces: Mapping[str, tuple[gym.Space, gym.Space]] | None = None,
        policy: Any = None,
        **rllib_arguments: Any,
    ) -> None:
        check_arguments(rllib_arguments)
        if policy is not None:
            if policy_spec is not None:
                raise ConfigError(
                    "RolloutWorker got policy_spec and policy, RLlib's obsolete name for it; "
                    "give policy_spec only"
                )
            warnings.warn(
                "RolloutWorker(policy=...) is RLlib's obsolete name for policy_spec; use "
                "policy_spec",
                IgnoredArgumentWarning,
                stacklevel=2,
            )
            policy_spec, policy = policy, None  # creation_args() name it once
        check_int("RolloutWorker rollout_fragment_length", rollout_fragment_length)
        check_int("RolloutWorker num_envs", num_envs)
        if episode_horizon is not None:
            check_int("RolloutWorker episode_horizon", episode_horizon)
        _check_choice("batch_mode", batch_mode, _BATCH_MODES)
        _check_choice("count_steps_by", count_steps_by, _COUNT_MODES)
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise ConfigError(
                f"RolloutWorker seed must be a non-negative int or None, got {seed!r}"
            )
        self._creation_args: dict[str, Any] = {
            k: v for k, v in locals().items() if k not in ("self", "rllib_arguments", "__class__")
        }
        self._creation_args.update(rllib_arguments)
        if log_level is not None:
            logging.getLogger("rlfleet").setLevel(log_level)  # RLlib sets its own logger's
        for name, value in (extra_python_environs or {}).items():
            os.environ[str(name)] = str(value)  # before the envs are built, as in RLlib
        self.recreated_worker = recreated_worker
        self._spaces = dict(spaces or {})
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.env_config = dict(env_config or {})
        self.global_vars: dict[str, Any] = {}
        self._filter_name = observation_filter
        self._seed = seed
        # Episodes take fleet-style stream seeds; without a seed, a base drawn once.
        self._stream_seed = (
            seed
            if seed is not None
            else int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0] >> 1)
        )
        self._callbacks = make_callbacks(callbacks)

        slots = []
        for vector_index in range(num_envs):
            context = EnvContext(
                self.env_config,
                worker_index=worker_index,
                vector_index=vector_index,
                num_workers=num_workers,
            )
            raw = env_creator(context)
            if vector_index == 0 and validate_env is not None:
                validate_env(raw, context)
            env = AgentEnv(raw)
            if not disable_env_checking and not env.multi_agent:
                _check_gym_env(raw)
            slots.append(
                EnvSlot(
                    vector_index,
                    env,
                    context,
                    stream=worker_index * num_envs + vector_index,
                    base_seed=self._stream_seed,
                )
            )
        self._envs = slots
        check_against_envs(rllib_arguments, [slot.env.env for slot in slots])
        if clip_rewards is None and any(is_atari(slot.env.env) for slot in slots):
            clip_rewards = True  # RLlib's None: clip for Atari only
        first = slots[0].env
        self.multi_agent = first.multi_agent or isinstance(policy_spec, dict)
        self._policies: dict[str, PolicyEntry] = {}
        self._policy_mapping_fn = mapping_fn(policy_mapping_fn, lambda: list(self._policies))
        specs = policy_spec if isinstance(policy_spec, dict) else {DEFAULT_POLICY_ID: policy_spec}
        for index, (policy_id, value) in enumerate(specs.items()):
            self._policies[policy_id] = build_entry(
                policy_id,
                value,
                self._spaces_of(policy_id, specs),
                filter_name=observation_filter,
                seed=self._derived_seed(10_000 + index),
            )
        self._is_policy_to_train = is_to_train_fn(policies_to_train)
        # With clip_rewards as decided above (RLlib's None clips Atari rewards).
        self._settings = SamplingSettings.of({**self._creation_args, "clip_rewards": clip_rewards})
        self._collector = RolloutCollector(
            slots,
            self._settings,
            entries=lambda: self._policies,
            map_agent=self._map_agent,
            callbacks=self._callbacks,
            worker=self,
        )
        self._count_steps_by = count_steps_by

    # ------------------------------------------------------------- sampling

    def sample(self) -> SampledBatch:
        """Samples one batch (``rollout_fragment_length * num_envs`` steps, see ``batch_mode``).

        Returns:
            An EpisodeBatch (single agent) or a MultiAgentEpisodeBatch of
            them, each a :class:`~rlfleet.rllib.sample_batch.RolloutEpisodeBatch`:
            it also reads like RLlib's SampleBatch (``batch["obs"]``), with
            nothing copied.
        """
        return self.sample_with_count()[0]

    def sample_with_count(self) -> tuple[SampledBatch, int]:
        """Like :meth:`sample`, with the batch's size counted by ``count_steps_by``."""
        batches, env_steps, agent_steps = self._collector.collect()
        order = self._envs[0].env.agents_seen if self.multi_agent else ()
        views = {pid: RolloutEpisodeBatch.view_of(b, order) for pid, b in batches.items()}
        samples: SampledBatch
        if self.multi_agent:
            samples = MultiAgentEpisodeBatch(views, env_steps)
        else:
            samples = views[DEFAULT_POLICY_ID]
        self._callbacks.on_sample_end(worker=self, samples=samples)
        return samples, env_steps if self._count_steps_by == "env_steps" else agent_steps

    # ----------------------------------------------------- weights and vars

    def get_weights(
        self, policies: Container[str] | None = None
    ) -> dict[str, dict[str, np.ndarray]]:
        """Each policy's parameters, keyed by policy id (all policies for None)."""
        return {
            pid: e.policy.get_param_values()
            for pid, e in self._policies.items()
            if policies is None or pid in policies
        }

    def set_weights(
        self,
        weights: Mapping[str, Mapping[str, np.ndarray]],
        global_vars: Mapping[str, Any] | None = None,
    ) -> None:
        """Sets parameters of the policies named in ``weights`` (and the global vars).

        Raises:
            ConfigError: If a policy id is unknown.
            PolicyError: If names or shapes do not fit; that policy is unchanged.
        """
        for policy_id, params in weights.items():
            entry = self._entry(policy_id)
            entry.policy.set_param_values(params)
            if entry.learner is not None:
                entry.learner.set_params(params)
        if global_vars is not None:
            self.set_global_vars(global_vars)

    def get_global_vars(self) -> dict[str, Any]:
        """A copy of the global vars (e.g. ``{"timestep": 4242}``)."""
        return dict(self.global_vars)

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Updates the global vars and tells policies that listen (``on_global_var_update``)."""
        self.global_vars.update(global_vars)
        for entry in self._policies.values():
            hook = getattr(entry.policy, "on_global_var_update", None)
            if callable(hook):
                hook(self.get_global_vars())

    # ------------------------------------------------------------------ envs

    def foreach_env(self, func: Callable[[Any], Any]) -> list[Any]:
        """``[func(env) for env in envs]``; PettingZoo AEC envs appear in their parallel form."""
        return [func(slot.env.env) for slot in self._envs]

    def foreach_env_with_context(self, func: Callable[[Any, EnvContext], Any]) -> list[Any]:
        """``[func(env, env_context) for env in envs]``."""
        return [func(slot.env.env, slot.context) for slot in self._envs]

    # -------------------------------------------------------------- policies

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy | None:
        """The acting policy with that id, or None."""
        entry = self._policies.get(policy_id)
        return entry.policy if entry else None

    def add_policy(
        self,
        *,
        policy_id: str,
        policy_cls: Any = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        config: Mapping[str, Any] | None = None,
        policy_state: Mapping[str, np.ndarray] | None = None,
        policy_mapping_fn: PolicyMappingFn | str | None = None,
        policies_to_train: Container[str] | IsPolicyToTrain | None = None,
        policy_spec: Any = None,
    ) -> Policy:
        """Adds a policy (RLlib's arguments).

        Args:
            policy_id: A new id.
            policy_cls: The entry, as in ``policy_spec`` of the constructor:
                a Policy subclass or learner class (RLlib's policy class), a
                PolicySpec, name, import path, learner, or None.
            observation_space: With ``action_space``: the policy's spaces
                (default: those of the agents mapped to it).
            action_space: See ``observation_space``.
            config: Keyword arguments of the policy's (or learner's)
                constructor, as a 4-tuple entry's config.
            policy_state: Parameters to set right away.
            policy_mapping_fn: A new mapping (running episodes keep theirs).
            policies_to_train: A new choice of trained policies.
            policy_spec: rlfleet's name for ``policy_cls``.

        Returns:
            The new acting policy.

        Raises:
            PolicyIdError: (a KeyError, as RLlib's) If the id exists.
            ConfigError: If the entry cannot be built.
        """
        if policy_id in self._policies:
            raise PolicyIdError(
                f"RolloutWorker.add_policy: policy {policy_id!r} exists already; remove it "
                "first or choose another id"
            )
        if policy_cls is not None and policy_spec is not None:
            raise ConfigError(
                "RolloutWorker.add_policy got policy_cls and policy_spec, two names for one "
                "argument; give one"
            )
        if policy_mapping_fn is not None:
            self.set_policy_mapping_fn(policy_mapping_fn)
        value = policy_spec if policy_cls is None else policy_cls
        if observation_space is not None or action_space is not None or config:
            value = (value, observation_space, action_space, config)
        entry = build_entry(
            policy_id,
            value,
            self._spaces_of(policy_id, {**{p: None for p in self._policies}, policy_id: None}),
            filter_name=self._filter_name,
            seed=self._derived_seed(10_000 + len(self._policies)),
        )
        if policy_state is not None:
            entry.policy.set_param_values(policy_state)
            if entry.learner is not None:
                entry.learner.set_params(policy_state)
        self._policies[policy_id] = entry
        if policies_to_train is not None:
            self.set_is_policy_to_train(policies_to_train)
        return entry.policy

    def remove_policy(
        self,
        *,
        policy_id: str = DEFAULT_POLICY_ID,
        policy_mapping_fn: PolicyMappingFn | str | None = None,
        policies_to_train: Container[str] | IsPolicyToTrain | None = None,
    ) -> None:
        """Removes a policy.

        Raises:
            ConfigError: If the id is unknown, or an agent of a running
                episode is bound to it.
        """
        self._entry(policy_id)
        for slot in self._envs:
            if slot.episode is not None and policy_id in slot.episode.policy_for_agent.values():
                raise ConfigError(
                    f"RolloutWorker.remove_policy: an agent of the running episode in env "
                    f"{slot.index} is bound to {policy_id!r}; call it between samples in "
                    "batch_mode='complete_episodes', or keep the policy until that episode ends"
                )
        del self._policies[policy_id]
        if policy_mapping_fn is not None:
            self.set_policy_mapping_fn(policy_mapping_fn)
        if policies_to_train is not None:
            self.set_is_policy_to_train(policies_to_train)

    def set_policy_mapping_fn(self, policy_mapping_fn: PolicyMappingFn | str | None = None) -> None:
        """Replaces the mapping function (None keeps it); running episodes keep their bindings."""
        if policy_mapping_fn is not None:
            self._policy_mapping_fn = mapping_fn(policy_mapping_fn, lambda: list(self._policies))

    def set_is_policy_to_train(self, is_policy_to_train: Container[str] | IsPolicyToTrain) -> None:
        """Replaces the choice of policies to train (ids, or ``fn(policy_id, batch)``)."""
        self._is_policy_to_train = is_to_train_fn(is_policy_to_train)

    def is_policy_to_train(self, policy_id: str, batch: SampleBatchType | None = None) -> bool:
        """Whether the policy is trained (given an optional batch)."""
        return bool(self._is_policy_to_train(policy_id, batch))

    def get_policies_to_train(self, batch: SampleBatchType | None = None) -> set[str]:
        """The ids of the policies that are trained."""
        return {pid for pid in self._policies if self.is_policy_to_train(pid, batch)}

    def for_policy(
        self, func: Callable[..., Any], policy_id: str = DEFAULT_POLICY_ID, **kwargs: Any
    ) -> Any:
        """``func(policy, **kwargs)`` for one policy."""
        return func(self._entry(policy_id).policy, **kwargs)

    def foreach_policy(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """``[func(policy, policy_id, **kwargs)]`` for every policy."""
        return [func(e.policy, pid, **kwargs) for pid, e in self._policies.items()]

    def foreach_policy_to_train(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """Like :meth:`foreach_policy`, for the policies that are trained."""
        return [
            func(e.policy, pid, **kwargs)
            for pid, e in self._policies.items()
            if self.is_policy_to_train(pid)
        ]

    # -------------------------------------------------------------- learning

    def learn_on_batch(self, samples: SampleBatchType) -> dict[str, Any]:
        """Updates the trained policies from a batch.

        Returns:
            The learner's statistics (single agent), or policy id ->
            statistics (multi-agent).

        Raises:
            UsageError: If a policy to train has no learner.
        """
        infos = {}
        for policy_id, batch in self._trainable_batches(samples).items():
            entry = self._learner_entry(policy_id, "train_step")
            infos[policy_id] = entry.learner.train_step(batch)
            entry.sync_from_learner()
        return infos if self.multi_agent else infos.get(DEFAULT_POLICY_ID, {})

    def compute_gradients(self, samples: SampleBatchType) -> tuple[Any, dict[str, Any]]:
        """Gradients of the trained policies' losses, without changing them.

        Returns:
            ``(grads, info)``; multi-agent: dicts keyed by policy id.
        """
        grads, infos = {}, {}
        for policy_id, batch in self._trainable_batches(samples).items():
            learner = self._learner_entry(policy_id, "compute_gradients").learner
            grads[policy_id], infos[policy_id] = learner.compute_gradients(batch)
        if self.multi_agent:
            return grads, infos
        return grads.get(DEFAULT_POLICY_ID, {}), infos.get(DEFAULT_POLICY_ID, {})

    def apply_gradients(self, grads: Any) -> None:
        """Applies what :meth:`compute_gradients` returned (here or on another worker)."""
        per_policy = grads if self.multi_agent else {DEFAULT_POLICY_ID: grads}
        for policy_id, policy_grads in per_policy.items():
            entry = self._learner_entry(policy_id, "apply_gradients")
            entry.learner.apply_gradients(policy_grads)
            entry.sync_from_learner()

    # ------------------------------------------------------- filters, metrics

    def get_filters(self, flush_after: bool = False) -> dict[str, ObservationFilter]:
        """Copies of the observation filters by policy id (with their deltas).

        Args:
            flush_after: Clear each filter's delta after copying it (the
                driver merges the copies' deltas).
        """
        copies = {pid: e.obs_filter.copy() for pid, e in self._policies.items()}
        if flush_after:
            for entry in self._policies.values():
                entry.obs_filter.clear_buffer()
        return copies

    def sync_filters(self, new_filters: Mapping[str, ObservationFilter]) -> None:
        """Takes the driver's merged filters, keeping the delta gathered since the last flush."""
        for policy_id, new in new_filters.items():
            self._entry(policy_id).obs_filter.rebase(new)

    def get_metrics(self) -> list[RolloutMetrics]:
        """Episodes finished since the last call: lengths, returns, custom metrics."""
        return self._collector.take_metrics()

    # ----------------------------------------------------------------- state

    def save(self) -> bytes:
        """The worker's state (weights, filters, global vars) as versioned bytes; no pickle."""
        return dump_state(
            WorkerState(
                policy_specs={pid: e.spec.to_json() for pid, e in self._policies.items()},
                weights=self.get_weights(),
                filter_names={pid: e.obs_filter.name for pid, e in self._policies.items()},
                filters={pid: e.obs_filter.get_state() for pid, e in self._policies.items()},
                global_vars=self.get_global_vars(),
            )
        )

    def restore(self, objs: bytes) -> None:
        """Restores what :meth:`save` returned, on a worker with the same policies.

        Raises:
            ConfigError: If the bytes are not a state of this format, or the
                policies or filters differ.
        """
        state = load_state(objs)
        check_same_policies(state, self._policies)
        for policy_id, name in state.filter_names.items():
            if self._policies[policy_id].obs_filter.name != name:
                raise ConfigError(
                    f"RolloutWorker.restore: policy {policy_id!r} was saved with a {name}, this "
                    f"worker uses {self._policies[policy_id].obs_filter.name}"
                )
        self.set_weights(state.weights)
        for policy_id, filter_state in state.filters.items():
            self._policies[policy_id].obs_filter.set_state(filter_state)
        self.global_vars = {}
        self.set_global_vars(state.global_vars)

    # ------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        """Closes the envs."""
        for slot in self._envs:
            slot.env.close()

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)``."""
        return func(self, *args, **kwargs)

    def creation_args(self) -> dict[str, Any]:
        """The keyword arguments this worker was built with."""
        return dict(self._creation_args)

    def get_host(self) -> str:
        """The host name of this process's machine."""
        return socket.gethostname()

    # --------------------------------------------------------------- helpers

    def _map_agent(self, agent_id: str, episode: Any) -> str:
        return str(self._policy_mapping_fn(agent_id, episode, worker=self))

    def _entry(self, policy_id: str) -> PolicyEntry:
        try:
            return self._policies[policy_id]
        except KeyError:
            raise PolicyIdError(
                f"RolloutWorker has no policy {policy_id!r}; it has {sorted(self._policies)}"
            ) from None

    def _learner_entry(self, policy_id: str, method: str) -> PolicyEntry:
        entry = self._entry(policy_id)
        if entry.learner is None or not callable(getattr(entry.learner, method, None)):
            raise UsageError(
                f"policy {policy_id!r} ({entry.spec.name}) cannot {method}: give a learner such "
                "as rlfleet.learners.VPG as its policy_spec"
            )
        return entry

    def _trainable_batches(self, samples: SampleBatchType) -> dict[str, EpisodeBatch]:
        if isinstance(samples, MultiAgentEpisodeBatch):
            per_policy = dict(samples.policy_batches)
        elif isinstance(samples, EpisodeBatch):
            per_policy = {DEFAULT_POLICY_ID: samples}
        else:
            raise ConfigError(
                "expected an EpisodeBatch or a MultiAgentEpisodeBatch, got "
                f"{type(samples).__name__}"
            )
        return {
            pid: batch for pid, batch in per_policy.items() if self.is_policy_to_train(pid, samples)
        }

    def _spaces_of(
        self, policy_id: str, specs: Mapping[str, Any]
    ) -> tuple[gym.Space, gym.Space] | None:
        """The spaces of the first agent the mapping binds to the policy.

        RLlib's ``spaces`` argument, if it names the policy, comes first. If
        the mapping binds no agent to it (yet), the spaces all agents share,
        if they share one pair; else None.
        """
        if policy_id in self._spaces:
            return self._spaces[policy_id]
        env = self._envs[0].env
        pairs = [(env.observation_space(a), env.action_space(a)) for a in env.agents_seen]
        for agent, pair in zip(env.agents_seen, pairs, strict=True):
            if len(specs) == 1 or self._probe_mapping(agent) == policy_id:
                return pair
        return pairs[0] if all(pair == pairs[0] for pair in pairs) else None

    def _probe_mapping(self, agent: str) -> str | None:
        try:
            return self._map_agent(agent, Episode(-1, -1))
        except ConfigError:
            return None

    def _derived_seed(self, index: int) -> int | None:
        if self._seed is None:
            return None
        state = np.random.SeedSequence([self._seed, self.worker_index, index]).generate_state(1)
        return int(state[0])


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"RolloutWorker {name} must be one of {choices}, got {value!r}")


def _check_gym_env(env: gym.Env) -> None:
    from gymnasium.utils.env_checker import check_env

    try:
        with warnings.catch_warnings():
            # The checker's advice (e.g. "infinite Box bounds") is not a failure.
            warnings.simplefilter("ignore", UserWarning)
            check_env(env.unwrapped, skip_render_check=True)
    except Exception as exc:
        raise ConfigError(
            f"env check failed for {env}: {type(exc).__name__}: {exc}; fix the env or pass "
            "disable_env_checking=True"
        ) from exc
