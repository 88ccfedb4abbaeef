"""VPG: vanilla policy gradient for the built-in ``mlp-categorical`` policy.

The learner side of the fleet in a few hundred lines of numpy: it owns the
parameters of an :class:`~rlfleet.policies.MLPCategoricalPolicy` (pushed to
workers as agent updates) and of a value network, and improves them from
sampled :class:`~rlfleet.core.EpisodeBatch` es::

    vpg = VPG(env_spec, seed=0)
    with Fleet.local(workers=2, env="CartPole-v1", policy=vpg.policy_spec) as sampler:
        for itr in range(100):
            batch = sampler.obtain_samples(itr, 4000, agent_update=vpg.get_params())
            stats = vpg.train_step(batch)

Each step: advantages by GAE(lambda) over a learned value baseline,
normalised per batch; one Adam step on the REINFORCE loss
``-mean(A_t log pi(a_t|s_t))``; then a few epochs of minibatch Adam on the
value network's squared error to the TD(lambda) returns.

VPG is also a garage algorithm for :class:`rlfleet.Trainer`:
``trainer.setup(vpg, env, sampler_cls=Fleet.local)`` then
``trainer.train(n_epochs, batch_size)`` runs :meth:`VPG.train`, which
records garage's ``Evaluation/*`` keys, and snapshots its whole state
(:meth:`VPG.snapshot_state`) so a run resumes exactly.

Episode ends (the choice bootstrapping makes): an episode that ends
TERMINAL has no future, its last delta is ``r - V(s)``. One that ends
TIMEOUT (time limit) or MID (a fragment cut) was interrupted, so the value
of its last observation is bootstrapped, ``r + gamma V(s_T) - V(s)``.
Treating CartPole's 500-step limit as a failure would teach the critic that
states near step 500 are bad and push the policy off its best behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet._util.values import check_int
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.learners._adam import Adam
from rlfleet.learners._advantages import gae, undiscounted_returns
from rlfleet.learners._inputs import BatchEncoder, TrainingArrays
from rlfleet.learners._losses import categorical_policy_loss, log_softmax, value_loss
from rlfleet.learners._mlp import MLP
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.policies.spec import PolicySpec
from rlfleet.sampling import log_performance

if TYPE_CHECKING:
    from rlfleet.trainer import Trainer

#: Keys of the dict :meth:`VPG.train_step` returns.
STAT_KEYS = (
    "Iteration",
    "NumEpisodes",
    "NumSteps",
    "AverageReturn",
    "StdReturn",
    "MaxReturn",
    "MinReturn",
    "PolicyLoss",
    "ValueLoss",
    "Entropy",
    "KL",
    "ExplainedVariance",
    "GradNorm",
)


class VPG:
    """Vanilla policy gradient with a value baseline, in numpy.

    Args:
        env_spec: The env's spaces: Discrete actions and observations the
            built-in MLP policies read.
        hidden_sizes: Hidden widths of both the policy and the value network.
        activation: Hidden activation (``"tanh"``, ``"relu"``, ``"identity"``).
        lr: Adam step size of the policy (one step per batch).
        value_lr: Adam step size of the value network.
        value_epochs: Passes over each batch to fit the value network.
        value_minibatch_size: Steps per value-network Adam step.
        discount: Discount factor gamma.
        gae_lambda: GAE lambda (1.0: Monte-Carlo returns minus the baseline).
        entropy_coef: Weight of the entropy bonus in the policy loss.
        max_grad_norm: Clip the policy gradient's global norm (None: no clip).
        seed: Seeds the initial weights (the policy's exactly as
            ``MLPCategoricalPolicy(seed=seed)``) and the minibatch order.

    Raises:
        ConfigError: If a space is unsupported or a hyperparameter is out of
            range.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        hidden_sizes: Sequence[int] = (32, 32),
        *,
        activation: str = "tanh",
        lr: float = 0.01,
        value_lr: float = 0.003,
        value_epochs: int = 5,
        value_minibatch_size: int = 256,
        discount: float = 0.99,
        gae_lambda: float = 0.97,
        entropy_coef: float = 0.0,
        max_grad_norm: float | None = 1.0,
        seed: int = 0,
    ) -> None:
        _check_range("discount", discount, 0.0, 1.0)
        _check_range("gae_lambda", gae_lambda, 0.0, 1.0)
        for name, value in (("lr", lr), ("value_lr", value_lr)):
            if not value > 0:
                raise ConfigError(f"VPG {name} must be > 0, got {value!r}")
        for name, count in (
            ("value_epochs", value_epochs),
            ("value_minibatch_size", value_minibatch_size),
        ):
            check_int(f"VPG {name}", count)
        self.env_spec = env_spec
        self.discount = discount
        self.gae_lambda = gae_lambda
        self.entropy_coef = entropy_coef
        self.value_epochs = value_epochs
        self.value_minibatch_size = value_minibatch_size
        self.iteration = 0
        self.max_episode_length = env_spec.max_episode_length
        self._encoder = BatchEncoder(env_spec, "VPG")
        # Built through the real policy so the initial weights, names and
        # shapes are by construction those of the spec the workers build.
        policy = MLPCategoricalPolicy(
            env_spec, hidden_sizes=hidden_sizes, activation=activation, seed=seed
        )
        self.policy_spec = PolicySpec(
            "mlp-categorical",
            {"hidden_sizes": list(policy.hidden_sizes), "activation": policy.activation},
        )
        self._policy = MLP(policy.get_param_values(), activation)
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
        sizes = (self._encoder.feature_dim, *policy.hidden_sizes, 1)
        self._value = MLP.initial(sizes, activation, rng)
        self._rng = rng
        self._policy_opt = Adam(self._policy.params, lr, max_grad_norm=max_grad_norm)
        self._value_opt = Adam(self._value.params, value_lr)

    def get_params(self) -> dict[str, np.ndarray]:
        """The policy parameters as float32 arrays: the agent update to push.

        Returns:
            ``layers.{i}.weight`` / ``layers.{i}.bias`` of the
            ``mlp-categorical`` policy :attr:`policy_spec` describes.
        """
        return {name: value.astype(np.float32) for name, value in self._policy.params.items()}

    def make_policy(self, seed: int | None = None) -> MLPCategoricalPolicy:
        """Builds a local policy with the current parameters (e.g. to evaluate)."""
        policy = MLPCategoricalPolicy(self.env_spec, **self.policy_spec.kwargs, seed=seed)
        policy.set_param_values(self.get_params())
        return policy

    @property
    def policy(self) -> MLPCategoricalPolicy:
        """A policy with the current parameters (what :class:`~rlfleet.Trainer` samples with)."""
        return self.make_policy()

    def train(self, trainer: Trainer) -> float:
        """garage's algorithm loop: one batch and one :meth:`train_step` per epoch.

        Records ``Evaluation/*`` (garage's ``log_performance`` keys),
        ``policy/*`` and ``ValueFunction/*`` in ``trainer.tabular``.

        Args:
            trainer: The trainer that samples and snapshots.

        Returns:
            The average return of the last epoch's batch (NaN if no epoch ran).
        """
        last_return = float("nan")
        for _ in trainer.step_epochs():
            batch = trainer.obtain_episodes(trainer.step_itr)
            trainer.step_episode = batch
            stats = self.train_step(batch)
            log_performance(trainer.step_itr, batch, self.discount)  # garage's Evaluation/*
            trainer.tabular.record_many(
                {key: stats[key] for key in ("PolicyLoss", "Entropy", "KL", "GradNorm")},
                prefix="policy",
            )
            trainer.tabular.record_many(
                {"Loss": stats["ValueLoss"], "ExplainedVariance": stats["ExplainedVariance"]},
                prefix="ValueFunction",
            )
            last_return = stats["AverageReturn"]
            trainer.step_itr += 1
        return last_return

    def snapshot_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Everything training depends on, as named arrays and JSON.

        Returns:
            Tensors ``policy/*``, ``value/*`` and the two Adam optimizers'
            moments (``policy_opt/*``, ``value_opt/*``); JSON with the
            iteration, the Adam step counts and the minibatch generator's state.
        """
        tensors: dict[str, np.ndarray] = {}
        steps = {}
        for prefix, params, opt in (
            ("policy", self._policy.params, self._policy_opt),
            ("value", self._value.params, self._value_opt),
        ):
            tensors.update({f"{prefix}/{name}": value for name, value in params.items()})
            moments, steps[prefix] = opt.state()
            tensors.update({f"{prefix}_opt/{name}": value for name, value in moments.items()})
        metadata = {
            "iteration": self.iteration,
            "policy_opt_steps": steps["policy"],
            "value_opt_steps": steps["value"],
            "rng": self._rng.bit_generator.state,
        }
        return tensors, metadata

    def restore_state(self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> None:
        """Takes back a :meth:`snapshot_state` of a VPG built with the same arguments.

        Raises:
            ConfigError: If a tensor is missing or has another shape.
        """
        for prefix, params, opt in (
            ("policy", self._policy.params, self._policy_opt),
            ("value", self._value.params, self._value_opt),
        ):
            for name, value in params.items():
                saved = tensors.get(f"{prefix}/{name}")
                if saved is None or saved.shape != value.shape:
                    raise ConfigError(
                        f"VPG snapshot has no {prefix}/{name} of shape {value.shape}: was it "
                        "taken of a VPG with other hidden sizes?"
                    )
                np.copyto(value, saved)
            opt.load_state(
                {
                    name[len(prefix) + 5 :]: value
                    for name, value in tensors.items()
                    if name.startswith(f"{prefix}_opt/")
                },
                metadata[f"{prefix}_opt_steps"],
            )
        self.iteration = int(metadata["iteration"])
        self._rng.bit_generator.state = dict(metadata["rng"])

    def train_step(self, batch: EpisodeBatch) -> dict[str, float]:
        """Improves the policy and the value network from one batch.

        Args:
            batch: Episodes sampled with the current parameters (complete
                episodes, or fragments whose cut ends are MID steps).

        Returns:
            Statistics, keys :data:`STAT_KEYS`: returns of the batch's
            episodes (undiscounted, as sampled, i.e. before this update),
            the losses, entropy, KL(old || new) of the update on the batch,
            explained variance of the value baseline and the gradient norm.

        Raises:
            InvalidBatchError: If the batch does not belong to this env.
        """
        data = self._encoder.encode(batch)
        advantages, value_targets, values = self._advantages_and_targets(data)
        normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        result = categorical_policy_loss(
            self._policy, data.features, data.actions, normalised, entropy_coef=self.entropy_coef
        )
        grad_norm = self._policy_opt.step(self._policy.params, result.grads)
        new_log_probs = log_softmax(self._policy.forward(data.features)[0])
        kl = float(
            np.mean(result.log_probs - new_log_probs[np.arange(len(data.actions)), data.actions])
        )
        fitted_loss = self._fit_values(data, value_targets)

        self.iteration += 1
        returns = undiscounted_returns(data.rewards, data.lengths)
        stats: dict[str, Any] = {
            "Iteration": self.iteration,
            "NumEpisodes": len(data.lengths),
            "NumSteps": len(data.rewards),
            "AverageReturn": returns.mean(),
            "StdReturn": returns.std(),
            "MaxReturn": returns.max(),
            "MinReturn": returns.min(),
            "PolicyLoss": result.loss,
            "ValueLoss": fitted_loss,
            "Entropy": result.entropy,
            "KL": kl,
            "ExplainedVariance": _explained_variance(values, value_targets),
            "GradNorm": grad_norm,
        }
        return {key: float(value) for key, value in stats.items()}

    def set_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replaces the policy parameters (e.g. weights restored or sent by another learner).

        Args:
            params: Every name :meth:`get_params` returns, with the same shapes.

        Raises:
            PolicyError: If names or shapes differ; nothing is changed then.
        """
        current = self._policy.params
        if set(params) != set(current):
            raise PolicyError(
                f"VPG.set_params: expected parameters {sorted(current)}, got {sorted(params)}"
            )
        for name, value in params.items():
            if np.shape(value) != current[name].shape:
                raise PolicyError(
                    f"VPG.set_params: {name} has shape {np.shape(value)}, "
                    f"expected {current[name].shape}"
                )
        for name, value in params.items():
            current[name][...] = value  # in place: the optimiser's moments stay keyed to it

    def compute_gradients(
        self, batch: EpisodeBatch
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float]]:
        """The gradients :meth:`train_step` would follow, without changing anything.

        Unlike :meth:`train_step`, the value network gets one full-batch
        gradient rather than several epochs of minibatches.

        Returns:
            ``({"policy": grads, "value": grads}, {"PolicyLoss", "ValueLoss", "Entropy"})``.
        """
        data = self._encoder.encode(batch)
        advantages, value_targets, _ = self._advantages_and_targets(data)
        normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        result = categorical_policy_loss(
            self._policy, data.features, data.actions, normalised, entropy_coef=self.entropy_coef
        )
        loss, value_grads = value_loss(self._value, data.features, value_targets)
        info = {"PolicyLoss": float(result.loss), "ValueLoss": float(loss)}
        info["Entropy"] = float(result.entropy)
        return {"policy": result.grads, "value": value_grads}, info

    def apply_gradients(self, grads: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Takes one Adam step each on what :meth:`compute_gradients` returned.

        Raises:
            PolicyError: If ``grads`` lacks ``"policy"`` or ``"value"``.
        """
        if set(grads) != {"policy", "value"}:
            raise PolicyError(
                f"VPG.apply_gradients: expected keys ['policy', 'value'], got {sorted(grads)}"
            )
        self._policy_opt.step(self._policy.params, grads["policy"])
        self._value_opt.step(self._value.params, grads["value"])
        self.iteration += 1

    def _advantages_and_targets(
        self, data: TrainingArrays
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """GAE advantages, TD(lambda) value targets and the baseline values."""
        values = self._predict_values(data.features)
        # Only a TERMINAL end has no future; see the module docstring.
        bootstrap = np.where(data.terminated, 0.0, self._predict_values(data.last_features))
        advantages = gae(
            data.rewards,
            values,
            bootstrap,
            data.lengths,
            discount=self.discount,
            gae_lambda=self.gae_lambda,
        )
        return advantages, advantages + values, values

    def _predict_values(self, features: np.ndarray) -> np.ndarray:
        predictions: np.ndarray = self._value.forward(features)[0][:, 0]
        return predictions

    def _fit_values(self, data: TrainingArrays, targets: np.ndarray) -> float:
        """Minibatch Adam on the value loss; returns the loss after fitting."""
        n = len(targets)
        for _ in range(self.value_epochs):
            order = self._rng.permutation(n)
            for start in range(0, n, self.value_minibatch_size):
                rows = order[start : start + self.value_minibatch_size]
                _, grads = value_loss(self._value, data.features[rows], targets[rows])
                self._value_opt.step(self._value.params, grads)
        return value_loss(self._value, data.features, targets)[0]


def _explained_variance(predictions: np.ndarray, targets: np.ndarray) -> float:
    """1 - Var[targets - predictions] / Var[targets] (1 is perfect, <= 0 useless)."""
    variance = float(np.var(targets))
    if variance == 0.0:
        return float("nan")
    return 1.0 - float(np.var(targets - predictions)) / variance


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"VPG {name} must be in [{low}, {high}], got {value!r}")
