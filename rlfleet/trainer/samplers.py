"""The samplers a Trainer builds: LocalSampler, RemoteSampler or a fleet of its own.

garage's ``make_sampler`` takes a sampler class, a worker class and their
arguments; :func:`build_sampler` turns them into one of rlfleet's samplers
for the set-up algorithm's policy and env, and says how to stop what it
started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.policies.base import Policy
from rlfleet.policies.spec import PolicySpec


def build_sampler(
    sampler_cls: Any,
    *,
    algo: Any,
    env: Any,
    seed: int,
    n_workers: int,
    max_episode_length: int | None,
    worker_class: type | None,
    sampler_args: Mapping[str, Any] | None,
    worker_args: Mapping[str, Any] | None,
) -> tuple[Any, Callable[[], None] | None]:
    """``Trainer.make_sampler`` for ``algo`` and ``env``.

    Returns:
        The sampler, and what stops it with what it started (a fleet), or
        None when the sampler is stopped by its own ``close``.

    Raises:
        ConfigError: As ``Trainer.make_sampler``.
    """
    if not hasattr(algo, "policy"):
        raise ConfigError(
            "If the trainer is used to construct a sampler, the algorithm must have a "
            f"`policy` field. (algorithm: {type(algo).__name__})"
        )
    if max_episode_length is None:
        max_episode_length = getattr(algo, "max_episode_length", None)
    if max_episode_length is None:
        raise ConfigError(
            "If `sampler_cls` is specified in trainer.setup, the algorithm must have a "
            f"`max_episode_length` field. (algorithm: {type(algo).__name__}; or pass "
            "max_episode_length= to make_sampler)"
        )
    envs_per_worker = _envs_per_worker(worker_class, worker_args)
    # Imported here: the fleet pulls in gRPC, which the rest of the
    # trainer (and a LocalSampler user) does not need.
    from rlfleet.client import Fleet, RemoteSampler
    from rlfleet.sampling.local import LocalSampler

    args = dict(sampler_args or {})
    policy = algo.policy
    if sampler_cls is LocalSampler:
        local = LocalSampler(
            env,
            _spec_or_policy(policy),
            n_workers=n_workers,
            envs_per_worker=envs_per_worker,
            seed=seed,
            max_episode_length=max_episode_length,
            **args,
        )
        return local, None
    config = _env_config(env, max_episode_length)
    if sampler_cls == Fleet.local or sampler_cls is Fleet:
        fleet = Fleet.local(
            workers=n_workers,
            envs_per_worker=envs_per_worker,
            env=config,
            policy=_fleet_agent(policy),
            seed=seed,
            max_episode_length=max_episode_length,
            **args,
        )
        return fleet.sampler, fleet.close
    if sampler_cls is RemoteSampler:
        if "address" not in args:
            raise ConfigError(
                "make_sampler(RemoteSampler) needs sampler_args={'address': 'HOST:PORT'}"
            )
        remote = RemoteSampler(args.pop("address"), seed=seed, **args)
        remote.update_env(config)
        remote.update_agent(_fleet_agent(policy))
        return remote, remote.close
    raise ConfigError(
        f"sampler_cls must be LocalSampler, RemoteSampler or Fleet.local, got {sampler_cls!r}"
    )


def _envs_per_worker(worker_class: type | None, worker_args: Mapping[str, Any] | None) -> int:
    from rlfleet.worker import DefaultWorker, VecWorker

    args = dict(worker_args or {})
    if worker_class not in (None, DefaultWorker, VecWorker):
        raise ConfigError(
            f"worker_class must be None, DefaultWorker or VecWorker, got {worker_class!r}: "
            "fleet workers are rlfleet's own processes"
        )
    n_envs = args.pop("n_envs", 1)
    if args:
        raise ConfigError(f"worker_args may only hold 'n_envs', got {sorted(args)}")
    if worker_class is DefaultWorker and n_envs != 1:
        raise ConfigError(f"DefaultWorker runs one env; got worker_args n_envs={n_envs!r}")
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ConfigError(f"worker_args n_envs must be an int >= 1, got {n_envs!r}")
    return n_envs


def _env_config(env: Any, max_episode_length: int | None) -> EnvConfig:
    """The EnvConfig a fleet is given: workers build envs from ids, not objects."""
    if isinstance(env, str):
        env = EnvConfig(env)
    if not isinstance(env, EnvConfig):
        raise ConfigError(
            f"a fleet builds its envs from an EnvConfig or a gymnasium id, got {env!r}; "
            "use LocalSampler for env objects"
        )
    return EnvConfig(env.id, env.kwargs, max_episode_length, env.imports)


def _spec_or_policy(policy: Any) -> Any:
    """LocalSampler's ``policy``: a Policy, a spec or a name as is, else the policy's spec."""
    if isinstance(policy, Policy | PolicySpec | str):
        return policy
    spec = getattr(policy, "policy_spec", None)
    if isinstance(spec, PolicySpec):
        return spec
    raise ConfigError(
        f"algo.policy must be a Policy, a PolicySpec or have a `policy_spec`, got {policy!r}"
    )


def _fleet_agent(policy: Any) -> Any:
    """The first agent update of a fleet: a spec or name, else its spec and parameters."""
    if isinstance(policy, PolicySpec | str):
        return policy
    if isinstance(getattr(policy, "policy_spec", None), PolicySpec):
        return (policy.policy_spec, policy.get_param_values())
    return _spec_or_policy(policy)
