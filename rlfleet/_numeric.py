"""Numeric helpers whose results do not depend on batch composition."""

from __future__ import annotations

import numpy as np


def row_stable_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Computes ``x @ w`` so that each row's bits do not depend on the batch.

    A plain ``x @ w`` goes to BLAS gemm, whose kernels tile the rows: a row
    is summed in a different order depending on the batch size and on where
    it sits (measured here with OpenBLAS 0.3.31: with w of shape (32, 2),
    rows 0-3 of a 4-row batch differ from the same rows computed alone).
    Computing ``x[:, None, :] @ w`` instead makes numpy's matmul loop over
    the rows and hand each one to the same BLAS call (gemv, or dot when w has
    one column), with the same sizes and strides, so row i's bits depend on
    ``x[i]`` and ``w`` only. It costs about one extra microsecond for small
    layers. ``tests/test_numeric.py`` proves the invariance on the machine it
    runs on.

    The bits are the same within one machine type and BLAS configuration;
    a different CPU family or BLAS thread count may round differently (set
    ``OPENBLAS_NUM_THREADS=1`` on workers for layer sizes above ~9000
    weights, where OpenBLAS may split a gemv across threads).

    Args:
        x: Array of shape (N, K).
        w: Array of shape (K, H).

    Returns:
        Array of shape (N, H).
    """
    # numpy only hands a row to BLAS if it is contiguous: make every row take
    # that same path, whatever the layout of the batch it came in.
    rows = np.ascontiguousarray(x)
    return np.matmul(rows[:, None, :], np.ascontiguousarray(w))[:, 0, :]
