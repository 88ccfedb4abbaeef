"""Numeric helpers whose results do not depend on batch composition."""

from __future__ import annotations

import math

import numpy as np

#: Rows per BLAS call of :func:`row_stable_matmul`. Every call has exactly
#: this many rows, so every row goes through the same gemm kernel path.
ROW_BLOCK = 8


def row_stable_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Computes ``x @ w`` so that each row's bits do not depend on the batch.

    A plain ``x @ w`` goes to BLAS gemm, whose kernels tile the rows: a row
    is summed in a different order depending on the batch size and on where
    it sits (measured here with OpenBLAS 0.3.31: with w of shape (32, 2),
    rows 0-3 of a 4-row batch differ from the same rows computed alone).
    Here the rows are cut into blocks of exactly :data:`ROW_BLOCK` rows
    (the last one padded with zeros) and numpy's matmul hands each block to
    the same BLAS call, with the same sizes and strides. Within one gemm
    call of fixed shape, every row is reduced by the same kernel in the same
    order whatever its position and whatever the other rows hold, so row
    i's bits depend on ``x[i]`` and ``w`` only. This costs one gemm per 8
    rows (about 1 us for an 8x32x32 layer), against one gemv per row for
    the row-by-row product it replaces. ``tests/test_numeric.py`` proves the
    invariance (every batch size and position) on the machine it runs on.

    The bits are the same within one machine type and BLAS configuration;
    a different CPU family or BLAS thread count may round differently (set
    ``OPENBLAS_NUM_THREADS=1`` on workers for large layers, where OpenBLAS
    may split a product across threads).

    Args:
        x: Array of shape (N, K).
        w: Array of shape (K, H).

    Returns:
        Array of shape (N, H).
    """
    if len(x) == ROW_BLOCK and w.flags.c_contiguous:
        # The hot path, one block: the 2-D product is the very gemm call each
        # block of the stacked product makes (same sizes and strides), without
        # the reshapes and the stacked loop (about 0.7 us of 1.6 us here). A
        # worker's observations are a strided view of its slot-major ring: one
        # contiguous copy of 8 rows (0.1 us) beats the padded path (1.3 us more).
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        return np.matmul(x, w)
    n, k = x.shape
    h = w.shape[1]
    if not w.flags.c_contiguous:
        w = np.ascontiguousarray(w)
    if n % ROW_BLOCK == 0 and x.flags.c_contiguous:  # whole blocks, no copy
        return np.matmul(x.reshape(-1, ROW_BLOCK, k), w).reshape(n, h)
    # Pad to whole blocks: zero rows cost nothing and never reach a result.
    blocks = -(-n // ROW_BLOCK)
    rows = np.zeros((blocks, ROW_BLOCK, k), dtype=x.dtype)
    rows.reshape(-1, k)[:n] = x
    return np.matmul(rows, w).reshape(blocks * ROW_BLOCK, h)[:n]


def all_finite(values: np.ndarray) -> bool:
    """Whether every element is finite (True for integer dtypes).

    One BLAS dot product in the common case: ``vdot(v, v)``, a sum of
    squares, is finite when every element is (NaN and inf propagate). It
    can also overflow for huge finite values, so the exact elementwise
    check runs whenever it is not finite.
    """
    kind = values.dtype.kind
    if kind not in "fc":
        return True
    if kind == "f" and math.isfinite(np.vdot(values, values)):
        return True
    return bool(np.isfinite(values).all())
