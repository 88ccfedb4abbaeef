"""Numeric helpers whose results do not depend on batch composition."""

from __future__ import annotations

import numpy as np


def row_stable_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Computes ``x @ w`` so that each row's bits do not depend on the batch.

    BLAS answers a one-row product through gemv and a many-row product
    through gemm, whose sums run in different orders: the same observation
    gives different float bits alone and in a batch (measured on this
    project's machines, float32 and float64). gemm rows do not depend on the
    row count or position, so a single row is computed as a two-row product.
    ``tests/test_numeric.py`` proves the invariance on the machine it runs on.

    Args:
        x: Array of shape (N, K).
        w: Array of shape (K, H).

    Returns:
        Array of shape (N, H).
    """
    if x.shape[0] == 1:
        return (np.concatenate([x, x]) @ w)[:1]
    return x @ w
