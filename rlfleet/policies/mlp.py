"""Built-in numpy MLP policies: categorical (Discrete) and Gaussian (Box).

The network, its parameter names and layouts, and the sampling rules are
specified in docs/policies.md precisely enough for a worker in another
language to compute the same logits and means. In short::

    h_0     = encode(obs)                      # float32, (N, D)
    h_{i+1} = act(h_i @ layers.i.weight + layers.i.bias)   # hidden layers
    out     = h_L @ layers.L.weight + layers.L.bias        # logits or mean

Every dense layer goes through ``row_stable_matmul`` so a row's output bits
do not depend on the rest of the batch.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlfleet._numeric import row_stable_matmul
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies._distributions import (
    categorical,
    check_finite,
    gaussian,
    normal_draws,
    row_generators,
)
from rlfleet.policies._observations import ObservationEncoder
from rlfleet.policies._params import checked_params
from rlfleet.policies.base import AgentInfos, ParamDict, Policy, RowDraws

Matmul = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _tanh(x: np.ndarray) -> None:
    np.tanh(x, out=x)


def _relu(x: np.ndarray) -> None:
    np.maximum(x, np.float32(0.0), out=x)


def _identity(x: np.ndarray) -> None:
    del x


#: Hidden-layer activations by name, applied elementwise in place (float32).
ACTIVATIONS: Mapping[str, Callable[[np.ndarray], None]] = {
    "tanh": _tanh,
    "relu": _relu,
    "identity": _identity,
}

# He-style gain for ReLU keeps hidden activations from shrinking layer by
# layer; tanh and identity are near-linear at initialisation.
_HIDDEN_GAIN = {"tanh": 1.0, "relu": math.sqrt(2.0), "identity": 1.0}

#: Scale of the output layer at initialisation: near-uniform categorical
#: probabilities and near-zero Gaussian means, so early exploration is not
#: dominated by the random weights (common practice in PPO implementations).
OUTPUT_GAIN = 0.01


def weight_name(layer: int) -> str:
    """Name of a dense layer's weight, shape (in, out)."""
    return f"layers.{layer}.weight"


def bias_name(layer: int) -> str:
    """Name of a dense layer's bias, shape (out,)."""
    return f"layers.{layer}.bias"


class _MLPPolicy(Policy):
    """An MLP from encoded observations to ``out_dim`` outputs.

    Subclasses turn the outputs into a distribution and may add parameters
    (``extra_params``), which then go through the same validation.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        out_dim: int,
        hidden_sizes: Sequence[int],
        activation: str,
        seed: int | None,
        deterministic: bool,
        extra_params: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        owner = type(self).__name__
        if not isinstance(deterministic, bool):
            raise ConfigError(f"{owner} deterministic must be true or false, got {deterministic!r}")
        super().__init__(env_spec, seed=seed, deterministic=deterministic)
        self._encoder = ObservationEncoder(env_spec.observation_space, owner)
        self.hidden_sizes = _checked_hidden_sizes(hidden_sizes, owner)
        self.activation = _checked_activation(activation, owner)
        self._act = ACTIVATIONS[self.activation]
        sizes = (self._encoder.dim, *self.hidden_sizes, out_dim)
        # A child of the seed's SeedSequence: the initial weights are a pure
        # function of the seed, yet independent of the sampling stream.
        init_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        params = _initial_layers(sizes, _HIDDEN_GAIN[self.activation], init_rng)
        params.update(extra_params or {})
        self._n_layers = len(sizes) - 1
        self._assign(params)

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every parameter, in the canonical order."""
        return {name: value.shape for name, value in self._params.items()}

    def get_param_values(self) -> ParamDict:
        """Returns float32 copies of the parameters, by name (see docs/policies.md)."""
        return {name: value.copy() for name, value in self._params.items()}

    def set_param_values(self, params: Mapping[str, npt.ArrayLike]) -> None:
        """Replaces every parameter.

        Args:
            params: Exactly the names of :meth:`get_param_values`, each an
                array of the same shape holding finite real numbers (cast to
                float32; the caller's arrays are copied, never kept).

        Raises:
            PolicyError: Naming the parameter and expected vs actual shape or
                the bad value. Nothing is changed in that case.
        """
        self._assign(checked_params(params, self.param_shapes, type(self).__name__))

    def _assign(self, params: dict[str, np.ndarray]) -> None:
        self._params = params
        layers = [(params[weight_name(i)], params[bias_name(i)]) for i in range(self._n_layers)]
        self._hidden, self._output = layers[:-1], layers[-1]

    def _forward(self, observations: Any, matmul: Matmul = row_stable_matmul) -> np.ndarray:
        """Returns the float32 network outputs (N, out_dim).

        ``matmul`` is ``row_stable_matmul`` for per-row batches, and
        ``np.matmul`` (one gemm per layer) for a batch sampled as a whole.
        """
        h = self._encoder(observations)
        act = self._act
        for weight, bias in self._hidden:
            h = matmul(h, weight)
            h += bias
            act(h)
        weight, bias = self._output
        h = matmul(h, weight)
        h += bias
        return h


class MLPCategoricalPolicy(_MLPPolicy):
    """An MLP giving softmax probabilities over a Discrete action space.

    Parameters: ``layers.{i}.weight`` (in, out) and ``layers.{i}.bias``
    (out,) for i = 0 .. len(hidden_sizes), the last layer giving the n
    logits. ``get_actions`` returns actions ``start + index`` and
    agent_infos ``log_prob`` (N,) and ``logits`` (N, n), float32.

    Args:
        env_spec: Discrete actions; Box, Discrete, MultiDiscrete or
            MultiBinary observations.
        hidden_sizes: Widths of the hidden layers (may be empty: linear).
        activation: Hidden activation: ``"tanh"``, ``"relu"`` or ``"identity"``.
        seed: Seeds the initial weights and the policy's own generator.
        deterministic: Act with the most probable action (first on ties).

    Raises:
        ConfigError: If a space is unsupported or an argument is invalid.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        hidden_sizes: Sequence[int] = (32, 32),
        activation: str = "tanh",
        seed: int | None = None,
        deterministic: bool = False,
    ) -> None:
        space = env_spec.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ConfigError(
                f"MLPCategoricalPolicy needs a Discrete action space, got {space}; "
                "use 'mlp-gaussian' for Box actions or plug in your own Policy class"
            )
        super().__init__(
            env_spec,
            out_dim=int(space.n),
            hidden_sizes=hidden_sizes,
            activation=activation,
            seed=seed,
            deterministic=deterministic,
        )
        self._start = np.int64(space.start)
        self._dtype = space.dtype

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples one action per observation row (see :class:`Policy`).

        Raises:
            PolicyError: If the observations do not match the space, ``rngs``
                has the wrong length, or the logits are not finite.
        """
        owner = type(self).__name__
        logits = self._forward(observations)
        check_finite(logits, "logits", owner)
        rows = row_generators(rngs, len(logits), self.rng, owner)
        draws = None if self.deterministic else [rng.random() for rng in rows]
        index, log_prob = categorical(logits, draws)
        return self._actions(index, log_prob, logits)

    def row_draws(self) -> RowDraws | None:
        """One ``random()`` per row per call; none when deterministic."""
        return None if self.deterministic else RowDraws("random", 1)

    def get_actions_from_draws(
        self, observations: Any, draws: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        """:meth:`get_actions` with row i's ``random()`` given as ``draws[i, 0]``.

        Raises:
            PolicyError: If the observations do not match the space, ``draws``
                is not one value per row, or the logits are not finite.
        """
        logits = self._forward(observations)
        check_finite(logits, "logits", type(self).__name__)
        u = None if self.deterministic else _draws_of(draws, logits, 1)[:, 0]
        index, log_prob = categorical(logits, u)
        return self._actions(index, log_prob, logits)

    def get_actions_batched(
        self, observations: Any, generator: np.random.Generator
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples the batch with one matmul per layer and ``generator.random(N)``.

        See :meth:`Policy.get_actions_batched`: the same formulas as
        :meth:`get_actions`, rows drawing from ``generator`` in row order.

        Raises:
            PolicyError: If the observations do not match the space or the
                logits are not finite.
        """
        logits = self._forward(observations, np.matmul)
        check_finite(logits, "logits", type(self).__name__)
        u = None if self.deterministic else generator.random(len(logits))
        index, log_prob = categorical(logits, u)
        return self._actions(index, log_prob, logits)

    def _actions(
        self, index: np.ndarray, log_prob: np.ndarray, logits: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        if self._start:
            index += self._start
        actions = index.astype(self._dtype, copy=False)
        return actions, {"log_prob": log_prob, "logits": logits}


class MLPGaussianPolicy(_MLPPolicy):
    """An MLP mean with a state-independent diagonal std, for Box actions.

    Parameters: ``layers.{i}.weight`` (in, out), ``layers.{i}.bias`` (out,)
    and ``log_std`` (d,), d the number of action elements. Actions are
    ``mean + exp(log_std) * eps``, eps ~ N(0, I), not clipped to the Box
    bounds (as in garage: clip in the env or a wrapper if needed).
    agent_infos: ``log_prob`` (N,), ``mean`` and ``log_std`` (N, *shape).

    Args:
        env_spec: Float Box actions; Box, Discrete, MultiDiscrete or
            MultiBinary observations.
        hidden_sizes: Widths of the hidden layers (may be empty: linear).
        activation: Hidden activation: ``"tanh"``, ``"relu"`` or ``"identity"``.
        init_log_std: Initial value of every ``log_std`` element.
        seed: Seeds the initial weights and the policy's own generator.
        deterministic: Act with the mean.

    Raises:
        ConfigError: If a space is unsupported or an argument is invalid.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        hidden_sizes: Sequence[int] = (32, 32),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        seed: int | None = None,
        deterministic: bool = False,
    ) -> None:
        space = env_spec.action_space
        if not (isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"):
            raise ConfigError(
                f"MLPGaussianPolicy needs a float Box action space, got {space}; "
                "use 'mlp-categorical' for Discrete actions or plug in your own Policy class"
            )
        if (
            isinstance(init_log_std, bool)
            or not isinstance(init_log_std, numbers.Real)
            or not abs(float(init_log_std)) <= np.finfo(np.float32).max
        ):
            raise ConfigError(
                f"MLPGaussianPolicy init_log_std must be a finite number, got {init_log_std!r}"
            )
        self._shape: tuple[int, ...] = tuple(space.shape)
        self._dtype: np.dtype[Any] = space.dtype
        dim = int(np.prod(self._shape, dtype=np.int64))
        super().__init__(
            env_spec,
            out_dim=dim,
            hidden_sizes=hidden_sizes,
            activation=activation,
            seed=seed,
            deterministic=deterministic,
            extra_params={"log_std": np.full(dim, init_log_std, dtype=np.float32)},
        )

    def _assign(self, params: dict[str, np.ndarray]) -> None:
        super()._assign(params)
        self._log_std = params["log_std"]

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples one action per observation row (see :class:`Policy`).

        Raises:
            PolicyError: If the observations do not match the space, ``rngs``
                has the wrong length, or the means are not finite.
        """
        owner = type(self).__name__
        mean = self._forward(observations)
        check_finite(mean, "action means", owner)
        rows = row_generators(rngs, len(mean), self.rng, owner)
        draws = None if self.deterministic else normal_draws(rows, mean.shape[1])
        actions, log_prob = gaussian(mean, self._log_std, draws)
        return self._actions(mean, actions, log_prob)

    def row_draws(self) -> RowDraws | None:
        """``standard_normal(d)`` per row per call; none when deterministic."""
        return None if self.deterministic else RowDraws("standard_normal", len(self._log_std))

    def get_actions_from_draws(
        self, observations: Any, draws: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        """:meth:`get_actions` with row i's ``standard_normal(d)`` given as ``draws[i]``.

        Raises:
            PolicyError: If the observations do not match the space, ``draws``
                is not (N, d), or the means are not finite.
        """
        mean = self._forward(observations)
        check_finite(mean, "action means", type(self).__name__)
        eps = None if self.deterministic else _draws_of(draws, mean, mean.shape[1])
        actions, log_prob = gaussian(mean, self._log_std, eps)
        return self._actions(mean, actions, log_prob)

    def get_actions_batched(
        self, observations: Any, generator: np.random.Generator
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples the batch with one matmul per layer and one ``standard_normal`` call.

        See :meth:`Policy.get_actions_batched`: the same formulas as
        :meth:`get_actions`, rows drawing from ``generator`` in row order.

        Raises:
            PolicyError: If the observations do not match the space or the
                means are not finite.
        """
        mean = self._forward(observations, np.matmul)
        check_finite(mean, "action means", type(self).__name__)
        eps = None if self.deterministic else generator.standard_normal(mean.shape)
        actions, log_prob = gaussian(mean, self._log_std, eps)
        return self._actions(mean, actions, log_prob)

    def _actions(
        self, mean: np.ndarray, actions: np.ndarray, log_prob: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        n = len(mean)
        batch_shape = (n, *self._shape)
        infos = {
            "log_prob": log_prob,
            "mean": mean.reshape(batch_shape),
            "log_std": np.repeat(self._log_std[None], n, axis=0).reshape(batch_shape),
        }
        return actions.reshape(batch_shape).astype(self._dtype, copy=False), infos


def _draws_of(draws: np.ndarray, outputs: np.ndarray, count: int) -> np.ndarray:
    """``draws``, checked to be float64 (N, count) for ``outputs`` of N rows.

    Raises:
        PolicyError: If ``draws`` does not have that shape and dtype.
    """
    if (
        not isinstance(draws, np.ndarray)
        or draws.dtype != np.float64
        or draws.shape != (len(outputs), count)
    ):
        raise PolicyError(
            f"get_actions_from_draws needs float64 draws of shape {(len(outputs), count)}, "
            f"got {getattr(draws, 'dtype', type(draws).__name__)} {np.shape(draws)}"
        )
    return draws


def _initial_layers(
    sizes: Sequence[int], hidden_gain: float, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Scaled-normal weights (gain / sqrt(fan_in)) and zero biases, layer by layer."""
    params: dict[str, np.ndarray] = {}
    last = len(sizes) - 2
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        gain = OUTPUT_GAIN if i == last else hidden_gain
        scale = gain / math.sqrt(max(fan_in, 1))
        params[weight_name(i)] = (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32)
        params[bias_name(i)] = np.zeros(fan_out, dtype=np.float32)
    return params


def _checked_hidden_sizes(hidden_sizes: Any, owner: str) -> tuple[int, ...]:
    if isinstance(hidden_sizes, str | bytes) or not isinstance(hidden_sizes, Sequence):
        raise ConfigError(
            f"{owner} hidden_sizes must be a list of layer widths, got {hidden_sizes!r}"
        )
    for width in hidden_sizes:
        if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
            raise ConfigError(
                f"{owner} hidden_sizes must hold positive ints, got {list(hidden_sizes)!r}"
            )
    return tuple(int(width) for width in hidden_sizes)


def _checked_activation(activation: Any, owner: str) -> str:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ConfigError(
            f"{owner} activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
        )
    return activation
