"""row_stable_matmul: a row's bits do not depend on the batch around it.

These tests run on the machine's own BLAS, which is the point: they prove
the invariance where the workers run. Shapes include the ones where a plain
``x @ w`` (BLAS gemm) was measured to change bits with the batch size: few
output columns (1, 2, 17) and long rows (K = 1000).
"""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet._numeric import ROW_BLOCK, all_finite, row_stable_matmul

MAX_BATCH = 16


def _operands(k: int, h: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([k, h])
    x: np.ndarray = rng.standard_normal((MAX_BATCH, k)).astype(dtype)
    w: np.ndarray = rng.standard_normal((k, h)).astype(dtype)
    return x, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [4, 64, 1000])
@pytest.mark.parametrize("h", [1, 2, 17, 64])
def test_row_bits_do_not_depend_on_batch_size_or_position(dtype: type, k: int, h: int) -> None:
    x, w = _operands(k, h, dtype)
    alone = [row_stable_matmul(x[i : i + 1], w).tobytes() for i in range(MAX_BATCH)]
    # Every window x[start:start + n] puts each row at every position of
    # every batch size 1..16 it fits in.
    for n in range(1, MAX_BATCH + 1):
        for start in range(MAX_BATCH - n + 1):
            batch = row_stable_matmul(x[start : start + n], w)
            for position in range(n):
                assert batch[position].tobytes() == alone[start + position], (
                    f"row {start + position} at position {position} of a batch of {n}"
                )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_of_a_non_contiguous_batch_match_rows_computed_alone(dtype: type) -> None:
    x, w = _operands(64, 2, dtype)
    fortran = np.asfortranarray(x)
    strided = np.repeat(x, 2, axis=0)[::2]  # a view with a row step of 2 rows
    for batch in (row_stable_matmul(fortran, w), row_stable_matmul(strided, w)):
        for i in range(MAX_BATCH):
            assert batch[i].tobytes() == row_stable_matmul(x[i : i + 1], w).tobytes()
    # One block viewed in a worker's slot-major ring (rows 3 steps apart): the
    # one-block fast path copies it instead of padding it.
    ring: np.ndarray = np.zeros((ROW_BLOCK, 3, x.shape[1]), dtype=dtype).swapaxes(0, 1)
    ring[1] = x[:ROW_BLOCK]
    assert not ring[1].flags.c_contiguous
    block = row_stable_matmul(ring[1], w)
    for i in range(ROW_BLOCK):
        assert block[i].tobytes() == row_stable_matmul(x[i : i + 1], w).tobytes()


def test_result_is_the_matrix_product() -> None:
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]], dtype=np.float32)
    w = np.array([[1.0, 0.0, 2.0], [-1.0, 4.0, 0.5]], dtype=np.float32)
    expected = np.array([[-1.0, 8.0, 3.0], [4.0, -4.0, 5.5], [0.5, 0.0, 1.0]], dtype=np.float32)
    out = row_stable_matmul(x, w)
    assert out.shape == (3, 3)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_large_product_matches_blas_to_rounding() -> None:
    x, w = _operands(1000, 64, np.float64)
    np.testing.assert_allclose(row_stable_matmul(x, w), x @ w, rtol=1e-12, atol=1e-12)


def test_empty_batch_gives_empty_rows() -> None:
    w = np.ones((4, 3), dtype=np.float32)
    out = row_stable_matmul(np.empty((0, 4), dtype=np.float32), w)
    assert out.shape == (0, 3)


@pytest.mark.parametrize(("k", "h"), [(4, 32), (32, 2), (64, 1)])
def test_rows_keep_their_bits_across_many_blocks_and_padded_tails(k: int, h: int) -> None:
    rng = np.random.default_rng([k, h, 40])
    x = rng.standard_normal((40, k)).astype(np.float32)
    w = rng.standard_normal((k, h)).astype(np.float32)
    alone = [row_stable_matmul(x[i : i + 1], w).tobytes() for i in range(len(x))]
    # 17..40 rows: three to five 8-row blocks, full or with a padded tail,
    # and every row at a different position than when computed alone.
    for n in (17, 23, 24, 31, 33, 40):
        for start in (0, len(x) - n):
            batch = row_stable_matmul(x[start : start + n], w)
            assert [row.tobytes() for row in batch] == alone[start : start + n], n


def test_all_finite_finds_nan_and_inf_and_tolerates_huge_finite_values() -> None:
    values = np.ones((5, 3), dtype=np.float32)
    assert all_finite(values)
    for bad in (np.nan, np.inf, -np.inf):
        spoiled = values.copy()
        spoiled[3, 1] = bad
        assert not all_finite(spoiled)
    # The squares overflow the quick check; the exact check still says finite.
    assert all_finite(np.full((2, 2), 3e38, dtype=np.float32))
    assert all_finite(np.array([[1, 2]], dtype=np.int64))
    assert all_finite(np.empty((0, 4), dtype=np.float64))
    assert not all_finite(np.array([1 + 1j, complex(np.nan, 0)]))
