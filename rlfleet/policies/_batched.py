"""Sampling a whole batch from one generator, for native vector-env workers.

The formulas are the per-row ones of :mod:`rlfleet.policies._distributions`
(docs/policies.md); only where the draws come from differs: one vectorised
call on one generator for all rows, row i taking the i-th draws. So a
batch here equals ``get_actions(observations, [generator] * N)`` on the
same logits or means, at one numpy call instead of N.
"""

from __future__ import annotations

import numpy as np

from rlfleet.policies._distributions import _U_SAFE, _last_positive, gaussian_log_prob


def categorical_batched(
    logits: np.ndarray, generator: np.random.Generator, deterministic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Samples (or takes the argmax of) softmax(logits), u = ``generator.random(N)``.

    Args:
        logits: Finite float32 array (N, n).
        generator: Draws N uniforms in one call (none when deterministic).
        deterministic: Take the first argmax instead of sampling.

    Returns:
        Indices (N,) int64 and their log-probabilities (N,) float32.
    """
    n = len(logits)
    shifted = logits - np.maximum.reduce(logits, axis=1, keepdims=True)
    weights = np.exp(shifted)
    cumulative = np.add.accumulate(weights, axis=1, dtype=np.float64)
    total = cumulative[:, -1]
    if deterministic:
        index = shifted.argmax(axis=1)
    else:
        draws = generator.random(n)
        threshold = draws * total
        index = (cumulative > threshold[:, None]).argmax(axis=1)
        if n and draws.max() > _U_SAFE:  # rounding past the end: see categorical()
            past_end = threshold >= total
            index[past_end] = _last_positive(weights[past_end])
    chosen = shifted[np.arange(n), index]
    log_prob = chosen - np.log(total)
    return index.astype(np.int64, copy=False), log_prob.astype(np.float32)


def gaussian_batched(
    mean: np.ndarray, log_std: np.ndarray, generator: np.random.Generator, deterministic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``mean + exp(log_std) * eps``, eps = ``generator.standard_normal((N, d))``.

    Args:
        mean: Float32 array (N, d).
        log_std: Float32 array (d,), shared by every row.
        generator: Draws every row's eps in one call (none when deterministic).
        deterministic: Return the mean.

    Returns:
        Actions (N, d) float32 and their log-densities (N,) float32.
    """
    if deterministic:
        eps = np.zeros(mean.shape, dtype=np.float32)
        actions = mean.copy()
    else:
        eps = generator.standard_normal(mean.shape).astype(np.float32)
        actions = mean + np.exp(log_std) * eps
    return actions, gaussian_log_prob(eps, log_std)
