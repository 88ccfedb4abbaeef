"""Adam (Kingma & Ba, 2015) over a dict of numpy parameters."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlfleet.errors import ConfigError


class Adam:
    """Adam with bias correction, updating parameter arrays in place.

    Args:
        params: The parameters it will update (their shapes fix the moments).
        lr: Step size.
        betas: Decay rates of the first and second moment estimates.
        eps: Added to the denominator for numerical stability.
        max_grad_norm: If not None, gradients are rescaled so that their
            global L2 norm is at most this (guards against a rare huge batch
            gradient throwing the policy off a cliff).
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        lr: float,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        max_grad_norm: float | None = None,
    ) -> None:
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.max_grad_norm = max_grad_norm
        self._m = {name: np.zeros_like(value) for name, value in params.items()}
        self._v = {name: np.zeros_like(value) for name, value in params.items()}
        self._t = 0

    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> float:
        """Applies one update.

        Args:
            params: The parameters, updated in place.
            grads: Gradients of the loss to minimise, by parameter name.

        Returns:
            The global L2 norm of the gradients before clipping.
        """
        norm = float(np.sqrt(sum(float(np.vdot(g, g)) for g in grads.values())))
        scale = 1.0
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            scale = self.max_grad_norm / norm
        self._t += 1
        # Folding both bias corrections into the step size is the paper's
        # "more efficient" form of Algorithm 1.
        step_size = self.lr * np.sqrt(1.0 - self.beta2**self._t) / (1.0 - self.beta1**self._t)
        for name, grad in grads.items():
            g = grad * scale
            m, v = self._m[name], self._v[name]
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * (g * g)
            params[name] -= step_size * m / (np.sqrt(v) + self.eps)
        return norm

    def state(self) -> tuple[dict[str, np.ndarray], int]:
        """The moments (``m/{name}``, ``v/{name}``) and the step count, for snapshots."""
        moments = {f"m/{name}": value for name, value in self._m.items()}
        moments.update({f"v/{name}": value for name, value in self._v.items()})
        return moments, self._t

    def load_state(self, moments: Mapping[str, np.ndarray], steps: int) -> None:
        """Takes back a :meth:`state` (same parameter names and shapes).

        Raises:
            ConfigError: If a moment is missing or has another shape.
        """
        for prefix, target in (("m/", self._m), ("v/", self._v)):
            for name, value in target.items():
                saved = moments.get(prefix + name)
                if saved is None or saved.shape != value.shape:
                    raise ConfigError(
                        f"Adam state has no {prefix}{name} of shape {value.shape}; got "
                        f"{None if saved is None else saved.shape}"
                    )
                np.copyto(value, saved)
        self._t = int(steps)
