"""PyTorch policies on workers: an ``nn.Module`` built from an import path.

The spec ``PolicySpec("torch", {"module": "pkg.mod:Net", "module_kwargs":
{...}, "distribution": "categorical", "threads": 1})`` makes each worker
import ``Net`` (the module must be among the worker's ``--import``
modules, like any import-path policy), build ``Net(**module_kwargs)`` and
act with it, for inference only: on CPU, in eval mode, under
``torch.inference_mode``, with ``torch.set_num_threads(threads)``.
Parameters travel as named tensors: the module's ``state_dict``, as float32
arrays (:meth:`TorchPolicy.get_param_values`).

The module's contract:

- ``forward(obs)`` takes a float32 tensor (N, obs_dim) of flattened
  observations and returns logits (N, n_actions) for ``"categorical"``, or
  the mean (N, act_dim) for ``"gaussian"``;
- ``"gaussian"`` needs a ``log_std`` parameter of shape (act_dim,);
- an optional ``get_value(obs) -> (N,) or (N, 1)`` adds ``value`` to the
  agent infos.

Agent infos: ``log_prob`` (float32, log-probability of the action taken
under the distribution), ``value`` (float32) when the module has
``get_value``.

**Determinism.** As for the numpy policies (docs/policies.md), episode k's
actions must not depend on which worker, slot or batch ran it. PyTorch's
CPU kernels do not promise that a row's bits are the same in batches of
different sizes, so by default (``batch_invariant=True``) each row is its
own forward pass of batch size 1, and randomness comes only from the row's
own numpy generator (inverse-CDF categorical, Box-Muller-free normal
draws from ``Generator.standard_normal``). So the same seed gives the same
batch for any number of workers and env slots, on one machine type and
torch build with the same thread count. ``batch_invariant=False`` runs one
batched forward pass: faster for many env slots, but actions may then
depend on the batch layout in the last bits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet._util.imports import import_object
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies._params import checked_params
from rlfleet.policies.base import AgentInfos, ParamDict, Policy
from rlfleet.policies.spec import TORCH_POLICY, PolicySpec

#: The distributions a TorchPolicy's module may parameterise.
DISTRIBUTIONS = ("categorical", "gaussian")


class TorchPolicy(Policy):
    """A policy whose distribution parameters come from a torch ``nn.Module``.

    Args:
        env_spec: The spaces: Box observations; Discrete actions
            (``"categorical"``) or float Box actions (``"gaussian"``).
        module: Import path ``"package.module:Class"`` of the ``nn.Module``.
        module_kwargs: JSON keyword arguments of the module's constructor.
        distribution: ``"categorical"`` or ``"gaussian"``.
        threads: If not None, ``torch.set_num_threads(threads)`` (workers: 1).
        batch_invariant: One forward pass per row (see the module docstring).
        seed: Seeds the initial weights (under a forked torch RNG, so the
            global torch random state is untouched) and the policy's own generator.
        deterministic: Act with the mode (argmax / mean) instead of sampling.

    Raises:
        ConfigError: If the module cannot be imported or built, the spaces
            do not fit, or the distribution is unknown.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        module: str,
        module_kwargs: Mapping[str, Any] | None = None,
        distribution: str = "categorical",
        threads: int | None = None,
        batch_invariant: bool = True,
        seed: int | None = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__(env_spec, seed=seed, deterministic=deterministic)
        if distribution not in DISTRIBUTIONS:
            raise ConfigError(
                f"TorchPolicy distribution must be one of {DISTRIBUTIONS}, got {distribution!r}"
            )
        _check_spaces(env_spec, distribution)
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ConfigError(f"TorchPolicy threads must be an int >= 1, got {threads!r}")
            torch.set_num_threads(threads)
        self.module_path = module
        self.module_kwargs = dict(module_kwargs or {})
        self.distribution = distribution
        self.threads = threads
        self.batch_invariant = batch_invariant
        cls = import_object(module, "TorchPolicy module")
        if not callable(cls):
            raise ConfigError(f"TorchPolicy module {module!r} is not callable")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            try:
                self.module: torch.nn.Module = cls(**self.module_kwargs)
            except TypeError as exc:
                raise ConfigError(f"torch module {module!r} rejected its kwargs: {exc}") from exc
        if not isinstance(self.module, torch.nn.Module):
            raise ConfigError(f"{module!r} built a {type(self.module).__name__}, not an nn.Module")
        if distribution == "gaussian" and not isinstance(
            getattr(self.module, "log_std", None), torch.Tensor
        ):
            raise ConfigError(
                f"a gaussian TorchPolicy needs a `log_std` parameter on {module!r}'s module"
            )
        self.module.eval()
        self._has_value = callable(getattr(self.module, "get_value", None))
        self._action_shape = tuple(env_spec.action_space.shape or ())

    @property
    def policy_spec(self) -> PolicySpec:
        """The spec that builds this policy on a worker (parameters travel separately)."""
        kwargs: dict[str, Any] = {
            "module": self.module_path,
            "module_kwargs": self.module_kwargs,
            "distribution": self.distribution,
            "batch_invariant": self.batch_invariant,
        }
        if self.threads is not None:
            kwargs["threads"] = self.threads
        if self.deterministic:
            kwargs["deterministic"] = True
        return PolicySpec(TORCH_POLICY, kwargs)

    def get_param_values(self) -> ParamDict:
        """The ``state_dict`` as float32 numpy arrays (copies), in its order."""
        return {
            name: value.detach().cpu().numpy().astype(np.float32, copy=True)
            for name, value in self.module.state_dict().items()
        }

    def set_param_values(self, params: Mapping[str, np.ndarray]) -> None:
        """Loads named arrays into the module (all of them; nothing changes on error).

        Raises:
            PolicyError: If names or shapes differ or a value is not finite.
        """
        shapes = {name: tuple(value.shape) for name, value in self.module.state_dict().items()}
        checked = checked_params(params, shapes, type(self).__name__)
        self.module.load_state_dict({name: torch.from_numpy(v) for name, v in checked.items()})

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Actions and ``log_prob`` (and ``value``) for a batch of observations."""
        obs = np.asarray(observations, dtype=np.float32)
        n = len(obs)
        obs = obs.reshape(n, int(np.prod(obs.shape[1:])))
        rows = list(rngs) if rngs is not None else [self.rng] * n
        if len(rows) != n:
            raise PolicyError(f"TorchPolicy got {n} observations but {len(rows)} generators")
        if n == 0:
            empty = np.zeros(0, np.float32)
            infos: AgentInfos = {"log_prob": empty, **({"value": empty} if self._has_value else {})}
            shape = (0,) if self.distribution == "categorical" else (0, *self._action_shape)
            dtype = np.int64 if self.distribution == "categorical" else np.float32
            return np.zeros(shape, dtype), infos
        with torch.inference_mode():
            inputs = torch.from_numpy(obs)
            if self.batch_invariant:
                pieces = [self._forward(inputs[i : i + 1]) for i in range(n)]
                outputs = np.concatenate([p[0] for p in pieces])
                values = np.concatenate([p[1] for p in pieces]) if self._has_value else None
            else:
                outputs, values = self._forward(inputs)
        if self.distribution == "categorical":
            actions, log_probs = _categorical(outputs, rows, self.deterministic)
            actions += int(self.env_spec.action_space.start)  # type: ignore[attr-defined]
        else:
            log_std = self.module.log_std.detach().cpu().numpy().astype(np.float64)  # type: ignore[operator]
            actions, log_probs = _gaussian(outputs, log_std, rows, self.deterministic)
        infos = {"log_prob": log_probs.astype(np.float32)}
        if values is not None:
            infos["value"] = values.astype(np.float32)
        return actions, infos

    def _forward(self, inputs: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        outputs = self.module(inputs).detach().numpy().astype(np.float64)
        if not self._has_value:
            return outputs, None
        values = self.module.get_value(inputs)  # type: ignore[operator]
        return outputs, values.detach().numpy().reshape(len(inputs)).astype(np.float64)


def _categorical(
    logits: np.ndarray, rngs: Sequence[np.random.Generator], deterministic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row draws by inverse CDF of softmax(logits); log-probabilities of the draws."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if deterministic:
        actions = log_probs.argmax(axis=1)
    else:
        cdf = np.cumsum(np.exp(log_probs), axis=1)
        draws = np.array([rng.random() for rng in rngs])
        actions = np.minimum((cdf < draws[:, None] * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)
    actions = actions.astype(np.int64)
    return actions, log_probs[np.arange(len(actions)), actions]


def _gaussian(
    mean: np.ndarray, log_std: np.ndarray, rngs: Sequence[np.random.Generator], deterministic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row normal draws around ``mean``; diagonal-Gaussian log-densities of the draws."""
    std = np.exp(log_std)
    if deterministic:
        noise = np.zeros_like(mean)
    else:
        noise = (
            np.stack([rng.standard_normal(mean.shape[1]) for rng in rngs]) if len(mean) else mean
        )
    actions = mean + std * noise
    log_probs = (
        -0.5 * (noise**2).sum(axis=1) - log_std.sum() - 0.5 * np.log(2 * np.pi) * mean.shape[1]
    )
    return actions.astype(np.float32), log_probs


def torch_params(module: torch.nn.Module) -> ParamDict:
    """A module's ``state_dict`` as float32 numpy arrays: the agent update for its workers."""
    return {
        name: value.detach().cpu().numpy().astype(np.float32, copy=True)
        for name, value in module.state_dict().items()
    }


def _check_spaces(env_spec: EnvSpec, distribution: str) -> None:
    if not isinstance(env_spec.observation_space, gym.spaces.Box):
        raise ConfigError(
            f"TorchPolicy reads Box observations, got {env_spec.observation_space}; flatten "
            "them (gymnasium's FlattenObservation)"
        )
    action_space = env_spec.action_space
    if distribution == "categorical" and not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"a categorical TorchPolicy needs Discrete actions, got {action_space}")
    if distribution == "gaussian" and not (
        isinstance(action_space, gym.spaces.Box) and action_space.dtype.kind == "f"
    ):
        raise ConfigError(f"a gaussian TorchPolicy needs float Box actions, got {action_space}")
