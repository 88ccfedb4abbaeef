"""Built-in numpy MLP policies: categorical (Discrete) and Gaussian (Box).

The network, its parameter names and layouts, and the sampling rules are
specified in docs/policies.md precisely enough for a worker in another
language to compute the same bits. In short::

    h_0     = encode(obs)                      # float32, (N, D)
    h_{i+1} = act(h_i @ layers.i.weight + layers.i.bias)   # hidden layers
    out     = h_L @ layers.L.weight + layers.L.bias        # logits or mean

The arithmetic (every dense layer, activation and distribution) is one C
kernel, ``rlfleet.policies._mlp_kernel``, which computes exactly what
tests/mlp_reference.py writes out one IEEE operation at a time, row by row:
a row's bits depend on that row and the parameters only, never on the batch.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlfleet._util.compiled import compiled
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies._distributions import normal_draws, row_generators
from rlfleet.policies._observations import ObservationEncoder
from rlfleet.policies._params import checked_params
from rlfleet.policies.base import AgentInfos, ParamDict, Policy, RowDraws

with compiled("MLP kernel", "rlfleet/policies/_mlp_kernel.c"):
    from rlfleet.policies._mlp_kernel import Kernel

#: Hidden-layer activations (their float32 arithmetic: docs/policies.md).
ACTIVATIONS = ("identity", "relu", "tanh")

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
        layers = [(params[weight_name(i)], params[bias_name(i)]) for i in range(self._n_layers)]
        log_std = params.get("log_std")
        kernel = Kernel(layers, self.activation, log_std)
        self._params = params
        self._sample = kernel.categorical if log_std is None else kernel.gaussian

    def __getstate__(self) -> dict[str, Any]:
        # The kernel (C memory) is not picklable: a copy rebuilds its own.
        state = self.__dict__.copy()
        del state["_sample"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._assign(self._params)

    def _run_kernel(
        self, h0: np.ndarray, draws: np.ndarray | None, method: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kernel's (index or actions, log_prob, logits or means) for encoded rows.

        Raises:
            PolicyError: If ``draws`` do not fit the rows, or a row's outputs
                are not finite (naming the first such row).
        """
        try:
            sampled, log_prob, outputs, bad_row = self._sample(h0, draws)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"{type(self).__name__}.{method}: {exc}") from exc
        if bad_row >= 0:
            raise PolicyError(
                f"{type(self).__name__}.{method}: {self._outputs_name} of row {bad_row} are "
                f"not finite ({outputs[bad_row].tolist()}); check that row's observation and "
                "the policy parameters for NaN, inf or overflow"
            )
        return sampled, log_prob, outputs

    #: What the network's outputs are, in error messages.
    _outputs_name = "outputs"


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
        self._start = int(space.start)
        self._dtype = space.dtype
        self._cast = self._dtype != np.int64  # the kernel's indices are int64

    _outputs_name = "logits"

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples one action per observation row (see :class:`Policy`).

        Raises:
            PolicyError: If the observations do not match the space, ``rngs``
                has the wrong length, or the logits are not finite.
        """
        h0 = self._encoder(observations)
        rows = row_generators(rngs, len(h0), self.rng, type(self).__name__)
        u = None if self.deterministic else np.array([rng.random() for rng in rows])
        return self._actions(h0, u, "get_actions")

    def row_draws(self) -> RowDraws | None:
        """One ``random()`` per row per call; none when deterministic."""
        return None if self.deterministic else RowDraws("random", 1)

    def get_actions_from_draws(
        self, observations: Any, draws: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        """:meth:`get_actions` with row i's ``random()`` given as ``draws[i, 0]``.

        Raises:
            PolicyError: If the observations do not match the space, ``draws``
                is not float64 (N, 1), or the logits are not finite.
        """
        u = None if self.deterministic else draws
        return self._actions(self._encoder(observations), u, "get_actions_from_draws")

    def get_actions_batched(
        self, observations: Any, generator: np.random.Generator
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples the batch with ``generator.random(N)``: row i takes the i-th value.

        See :meth:`Policy.get_actions_batched`. The kernel's rows do not
        depend on the batch, so this is :meth:`get_actions` with
        ``[generator] * N``, bit for bit, at the cost of one draw call.

        Raises:
            PolicyError: If the observations do not match the space or the
                logits are not finite.
        """
        h0 = self._encoder(observations)
        u = None if self.deterministic else generator.random(len(h0))
        return self._actions(h0, u, "get_actions_batched")

    def _actions(
        self, h0: np.ndarray, u: np.ndarray | None, method: str
    ) -> tuple[np.ndarray, AgentInfos]:
        index, log_prob, logits = self._run_kernel(h0, u, method)
        if self._start:
            index += self._start
        actions = index.astype(self._dtype) if self._cast else index
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

    _outputs_name = "action means"

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
        h0 = self._encoder(observations)
        rows = row_generators(rngs, len(h0), self.rng, type(self).__name__)
        eps = None if self.deterministic else normal_draws(rows, len(self._log_std))
        return self._actions(h0, eps, "get_actions")

    def row_draws(self) -> RowDraws | None:
        """``standard_normal(d)`` per row per call; none when deterministic."""
        return None if self.deterministic else RowDraws("standard_normal", len(self._log_std))

    def get_actions_from_draws(
        self, observations: Any, draws: np.ndarray
    ) -> tuple[np.ndarray, AgentInfos]:
        """:meth:`get_actions` with row i's ``standard_normal(d)`` given as ``draws[i]``.

        Raises:
            PolicyError: If the observations do not match the space, ``draws``
                is not float64 (N, d), or the means are not finite.
        """
        eps = None if self.deterministic else draws
        return self._actions(self._encoder(observations), eps, "get_actions_from_draws")

    def get_actions_batched(
        self, observations: Any, generator: np.random.Generator
    ) -> tuple[np.ndarray, AgentInfos]:
        """Samples the batch with one ``standard_normal((N, d))`` call.

        See :meth:`Policy.get_actions_batched`: row i takes the i-th d
        values, so this is :meth:`get_actions` with ``[generator] * N``, bit
        for bit (the kernel's rows do not depend on the batch).

        Raises:
            PolicyError: If the observations do not match the space or the
                means are not finite.
        """
        h0 = self._encoder(observations)
        d = len(self._log_std)
        eps = None if self.deterministic else generator.standard_normal((len(h0), d))
        return self._actions(h0, eps, "get_actions_batched")

    def _actions(
        self, h0: np.ndarray, eps: np.ndarray | None, method: str
    ) -> tuple[np.ndarray, AgentInfos]:
        actions, log_prob, mean = self._run_kernel(h0, eps, method)
        n = len(mean)
        batch_shape = (n, *self._shape)
        infos = {
            "log_prob": log_prob,
            "mean": mean.reshape(batch_shape),
            "log_std": np.repeat(self._log_std[None], n, axis=0).reshape(batch_shape),
        }
        return actions.reshape(batch_shape).astype(self._dtype, copy=False), infos


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
