"""Per-row sampling from categorical and diagonal Gaussian distributions.

Row i draws from ``rngs[i]`` only, a fixed number of draws per row (one
``random()`` for a categorical, ``standard_normal(d)`` for a Gaussian, none
in deterministic mode), and every reduction runs along a row. So an episode
gets the same actions whichever batch, slot or worker computes them. The
formulas are the cross-language contract written out in docs/policies.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlfleet._numeric import all_finite
from rlfleet.errors import PolicyError

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

#: ``random()`` draws k / 2**53; for u <= 1 - 2**-52, u * Z rounds below Z.
_U_SAFE = 1.0 - 2.0**-52

#: Draws up to which Python's max beats a numpy reduction (see _largest).
_SHORT = 16

# Row indices for picking one entry per row, made once instead of per call.
_MAX_ROWS = 1024
_ROWS = np.arange(_MAX_ROWS)


def row_generators(
    rngs: Sequence[np.random.Generator] | None,
    n: int,
    fallback: np.random.Generator,
    owner: str,
) -> Sequence[np.random.Generator]:
    """Returns one generator per row: ``rngs`` itself, or ``fallback`` n times.

    Raises:
        PolicyError: If ``rngs`` does not have one generator per row.
    """
    if rngs is None:
        return [fallback] * n
    if len(rngs) != n:
        raise PolicyError(
            f"{owner}.get_actions: got {len(rngs)} generators for {n} observations; "
            "pass one numpy Generator per row, or None to use the policy's own"
        )
    return rngs


def check_finite(values: np.ndarray, what: str, owner: str) -> None:
    """Raises PolicyError naming the first row of ``values`` that is not finite."""
    if all_finite(values):
        return
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    row = int(np.argmin(finite))
    raise PolicyError(
        f"{owner}.get_actions: {what} of row {row} are not finite "
        f"({values[row].tolist()}); check that row's observation and the policy "
        "parameters for NaN, inf or overflow"
    )


def categorical(
    logits: np.ndarray, draws: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Samples (or takes the argmax of) softmax(logits), row by row.

    Sampling by inverse CDF on unnormalised weights: ``e = exp(l - max(l))``
    (float32), ``c = cumsum(e)`` (float64), ``t = u * c[-1]`` with
    ``u = rng.random()``; the action is the first index with ``c[i] > t``,
    or the last index with ``e[i] > 0`` if rounding left none. A zero-weight
    action is never chosen.

    Args:
        logits: Finite float32 array (N, n).
        draws: Each row's ``u`` (N values: a list, or a float64 array), or
            None to take the first argmax instead of sampling.

    Returns:
        Indices (N,) int64 and their log-probabilities (N,) float32.
    """
    n = len(logits)
    shifted = logits - np.maximum.reduce(logits, axis=1, keepdims=True)
    weights = np.exp(shifted)
    # Each float32 weight is cast to float64 (exact), then added in index order.
    cumulative = np.add.accumulate(weights, axis=1, dtype=np.float64)
    total = cumulative[:, -1]
    if draws is None:
        index = shifted.argmax(axis=1)
    else:
        threshold = np.multiply(draws, total)  # a list becomes float64 inside the ufunc
        index = (cumulative > threshold[:, None]).argmax(axis=1)
        # No c[i] > t (argmax gave 0) needs t = u * Z to round up to Z, which only
        # the largest draw below 1 can do: then the row takes its last positive weight.
        if n and _largest(draws) > _U_SAFE:
            past_end = threshold >= total
            index[past_end] = _last_positive(weights[past_end])
    chosen = shifted[_ROWS[:n] if n <= _MAX_ROWS else np.arange(n), index]
    # float32 - float64 computes in float64 (exact promotion), as the contract says.
    log_prob = chosen - np.log(total)
    return index.astype(np.int64, copy=False), log_prob.astype(np.float32)


def _largest(draws: Sequence[float] | np.ndarray) -> float:
    """The largest of at least one draw.

    Python's ``max`` of a short list costs a third of a numpy reduction
    (0.3 against 0.9 us for 8 draws); from about 32 draws the reduction wins.
    """
    if not isinstance(draws, np.ndarray):
        return max(draws)
    return max(draws.tolist()) if len(draws) <= _SHORT else float(np.maximum.reduce(draws))


def _last_positive(weights: np.ndarray) -> np.ndarray:
    """Index of the last positive entry of each row."""
    return weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)


def gaussian(
    mean: np.ndarray, log_std: np.ndarray, draws: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``mean + exp(log_std) * eps`` (or takes the mean), row by row.

    Args:
        mean: Float32 array (N, d).
        log_std: Float32 array (d,), shared by every row.
        draws: Float64 array (N, d): row i's ``rngs[i].standard_normal(d)``
            (see :func:`normal_draws`), or None to return the mean.

    Returns:
        Actions (N, d) float32 and their log-densities (N,) float32.
    """
    if draws is None:
        eps = np.zeros(mean.shape, dtype=np.float32)
        actions = mean.copy()
    else:
        eps = draws.astype(np.float32)
        actions = mean + np.exp(log_std) * eps
    # (a - mean) / std is eps up to rounding: use eps for the exact density.
    return actions, gaussian_log_prob(eps, log_std)


def normal_draws(rngs: Sequence[np.random.Generator], d: int) -> np.ndarray:
    """Row i's ``rngs[i].standard_normal(d)``, as a float64 array (N, d)."""
    draws = np.empty((len(rngs), d), dtype=np.float64)
    for row, rng in enumerate(rngs):
        rng.standard_normal(out=draws[row])
    return draws


def gaussian_log_prob(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """Log-density of a diagonal Gaussian at standardised points.

    Args:
        z: ``(a - mean) / std``, shape (N, d).
        log_std: Shape (d,).

    Returns:
        ``sum_j(-0.5 * z_j**2 - log_std_j - 0.5 * log(2 pi))`` per row, float32.
    """
    z64 = z.astype(np.float64)
    terms = -0.5 * z64 * z64 - log_std.astype(np.float64) - _HALF_LOG_2PI
    return terms.sum(axis=1).astype(np.float32)
