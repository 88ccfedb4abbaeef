"""Losses of the policy-gradient learner, with their exact gradients.

Each function returns the loss and d loss / d parameter, computed by
backpropagating the closed-form gradient w.r.t. the network outputs through
:class:`~rlfleet.learners._mlp.MLP`. tests/test_vpg.py checks both against
central finite differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlfleet.learners._mlp import MLP, ParamDict


@dataclass(frozen=True)
class PolicyLossResult:
    """A policy loss evaluation.

    Attributes:
        loss: ``-mean(weights * log pi(a|s)) - entropy_coef * mean(H)``.
        grads: d loss / d parameter.
        log_probs: log pi(a_t|s_t) of the taken actions (S,).
        entropy: Mean entropy of the action distributions.
    """

    loss: float
    grads: ParamDict
    log_probs: np.ndarray
    entropy: float


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, stable for large logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def categorical_policy_loss(
    net: MLP,
    features: np.ndarray,
    actions: np.ndarray,
    weights: np.ndarray,
    *,
    entropy_coef: float = 0.0,
) -> PolicyLossResult:
    """The REINFORCE surrogate loss of a softmax policy and its gradient.

    Minimising ``-mean(w_t log pi(a_t|s_t))`` follows the policy gradient
    when ``w_t`` estimates the advantage of ``a_t``. With logits z and
    probabilities p, ``d(-w log p_a)/dz = -w (onehot(a) - p)`` and the
    entropy H has ``dH/dz_k = -p_k (log p_k + H)``.

    Args:
        net: The policy network (outputs are logits).
        features: Encoded observations (S, D).
        actions: Action indices in [0, n) (S,).
        weights: Advantage estimates (S,).
        entropy_coef: Weight of the entropy bonus.

    Returns:
        The loss, its gradients, the log-probabilities and the entropy.
    """
    n = len(actions)
    rows = np.arange(n)
    logits, inputs = net.forward(features)
    log_p = log_softmax(logits)
    p = np.exp(log_p)
    log_p_taken = log_p[rows, actions]
    entropy = -(p * log_p).sum(axis=1)
    loss = -float(np.mean(weights * log_p_taken)) - entropy_coef * float(entropy.mean())

    scaled = weights / n
    grad_logits = p * scaled[:, None]
    grad_logits[rows, actions] -= scaled
    if entropy_coef:
        grad_logits += (entropy_coef / n) * p * (log_p + entropy[:, None])
    return PolicyLossResult(
        loss=loss,
        grads=net.backward(inputs, grad_logits),
        log_probs=log_p_taken,
        entropy=float(entropy.mean()),
    )


def value_loss(net: MLP, features: np.ndarray, targets: np.ndarray) -> tuple[float, ParamDict]:
    """Half the mean squared error of a value network, and its gradient.

    Args:
        net: The value network (one output).
        features: Encoded observations (S, D).
        targets: Regression targets (S,).

    Returns:
        The loss and d loss / d parameter.
    """
    predictions, inputs = net.forward(features)
    errors = predictions[:, 0] - targets
    loss = 0.5 * float(np.mean(errors * errors))
    return loss, net.backward(inputs, (errors / len(errors))[:, None])
