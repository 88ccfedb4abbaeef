"""A float64 numpy MLP with manual, vectorised backpropagation.

The layout is the built-in policies' (docs/policies.md): parameters
``layers.{i}.weight`` of shape (in, out) and ``layers.{i}.bias`` of shape
(out,), hidden layers ``h = act(h @ W + b)``, a linear output layer. The
learner keeps its master copy in float64 so that Adam's small steps are not
lost to float32 rounding; workers receive float32 copies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rlfleet.errors import ConfigError
from rlfleet.policies.mlp import bias_name, weight_name

ParamDict = dict[str, np.ndarray]

# Each activation with its derivative written in terms of its OUTPUT, which
# is what the forward pass keeps (tanh' = 1 - tanh^2, relu' = [y > 0]).
_ACTIVATIONS: Mapping[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[..., np.ndarray]]] = {
    "tanh": (np.tanh, lambda y: 1.0 - y * y),
    "relu": (lambda x: np.maximum(x, 0.0), lambda y: (y > 0.0).astype(y.dtype)),
    "identity": (lambda x: x, np.ones_like),
}


class MLP:
    """A dense network whose gradients are computed by hand.

    Args:
        params: ``layers.{i}.weight`` / ``layers.{i}.bias`` for i = 0..L-1;
            copied to float64.
        activation: Hidden activation: ``"tanh"``, ``"relu"`` or ``"identity"``.

    Raises:
        ConfigError: If the activation is unknown or the layers do not chain.
    """

    def __init__(self, params: Mapping[str, np.ndarray], activation: str) -> None:
        if activation not in _ACTIVATIONS:
            raise ConfigError(
                f"MLP activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.activation = activation
        self._act, self._act_grad = _ACTIVATIONS[activation]
        self.params: ParamDict = {
            name: np.array(value, dtype=np.float64) for name, value in params.items()
        }
        self.n_layers = _count_layers(self.params)

    @classmethod
    def initial(
        cls,
        sizes: Sequence[int],
        activation: str,
        rng: np.random.Generator,
        *,
        output_gain: float = 1.0,
    ) -> MLP:
        """Builds a network with scaled-normal weights and zero biases.

        Args:
            sizes: Input width, hidden widths, output width.
            activation: Hidden activation name.
            rng: Source of the random weights.
            output_gain: Scale of the last layer relative to 1/sqrt(fan_in).

        Returns:
            The new network.
        """
        params: ParamDict = {}
        last = len(sizes) - 2
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            scale = (output_gain if i == last else 1.0) / math.sqrt(max(fan_in, 1))
            params[weight_name(i)] = rng.standard_normal((fan_in, fan_out)) * scale
            params[bias_name(i)] = np.zeros(fan_out)
        return cls(params, activation)

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Computes the outputs of a batch.

        Args:
            x: Inputs (N, in).

        Returns:
            The outputs (N, out) and the input of every layer (what
            :meth:`backward` needs).
        """
        inputs = [np.asarray(x, dtype=np.float64)]
        h = inputs[0]
        for i in range(self.n_layers):
            h = h @ self.params[weight_name(i)] + self.params[bias_name(i)]
            if i < self.n_layers - 1:
                h = self._act(h)
                inputs.append(h)
        return h, inputs

    def backward(self, inputs: Sequence[np.ndarray], grad_out: np.ndarray) -> ParamDict:
        """Backpropagates the gradient of a scalar loss w.r.t. the outputs.

        Args:
            inputs: The layer inputs returned by :meth:`forward`.
            grad_out: d loss / d outputs, shape (N, out).

        Returns:
            d loss / d parameter, by parameter name.
        """
        grads: ParamDict = {}
        g = grad_out
        for i in reversed(range(self.n_layers)):
            grads[weight_name(i)] = inputs[i].T @ g
            grads[bias_name(i)] = g.sum(axis=0)
            if i > 0:
                g = (g @ self.params[weight_name(i)].T) * self._act_grad(inputs[i])
        return grads


def _count_layers(params: Mapping[str, np.ndarray]) -> int:
    n_layers = len(params) // 2
    expected = {name for i in range(n_layers) for name in (weight_name(i), bias_name(i))}
    if n_layers == 0 or set(params) != expected:
        raise ConfigError(
            f"MLP parameters must be layers.{{i}}.weight/bias for i = 0..L-1, got {sorted(params)}"
        )
    for i in range(n_layers):
        weight, bias = params[weight_name(i)], params[bias_name(i)]
        if weight.ndim != 2 or bias.shape != weight.shape[1:]:
            raise ConfigError(
                f"MLP layer {i}: weight {weight.shape} and bias {bias.shape} do not fit "
                "(need (in, out) and (out,))"
            )
        if i > 0 and weight.shape[0] != params[weight_name(i - 1)].shape[1]:
            raise ConfigError(
                f"MLP layer {i} takes {weight.shape[0]} inputs but layer {i - 1} gives "
                f"{params[weight_name(i - 1)].shape[1]}"
            )
    return n_layers
