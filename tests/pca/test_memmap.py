"""A memory-mapped ``.npy`` larger than one block is read block by block, never whole."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.pca import fit_private_pca
from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES, ClippedRows, block_rows_for

D = 16
N = 2 * block_rows_for(D, DEFAULT_BLOCK_BYTES) + 5000  # three blocks, the last one short


@pytest.fixture(scope="module")
def npy(tmp_path_factory) -> str:
    rng = np.random.default_rng(11)
    X = (rng.standard_normal((N, D)) * rng.uniform(0.1, 1.5, (N, 1))).astype(np.float32)
    path = tmp_path_factory.mktemp("memmap") / "x.npy"
    np.save(path, X)
    return str(path)


@pytest.mark.parametrize("method", ["analyze_gauss", "fixed"])
def test_a_memmap_larger_than_one_block_equals_the_in_memory_result(npy: str,
                                                                    method: str) -> None:
    """Same blocks, same float64 values (float32 widens exactly): bit-identical results."""
    mm = np.load(npy, mmap_mode="r")
    rows = ClippedRows.from_data(mm, 2.0)
    assert rows.X is mm and len(rows._unclipped_blocks) == 3  # not copied; three blocks
    kw = {"target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": 2.0, "seed": 9,
          "center": "private", "method": method}
    ref = fit_private_pca(np.array(mm, dtype=np.float64), 3, **kw)
    res = fit_private_pca(mm, 3, **kw)
    np.testing.assert_array_equal(res.components, ref.components)
    np.testing.assert_array_equal(res.mean, ref.mean)


def test_a_nan_in_a_later_block_of_a_memmap_is_found(npy: str, tmp_path) -> None:
    X = np.load(npy)
    row = N - 10  # in the third block
    X[row, 4] = np.nan
    path = tmp_path / "bad.npy"
    np.save(path, X)
    with pytest.raises(ValueError, match=rf"first at index \({row}, 4\)"):
        fit_private_pca(np.load(path, mmap_mode="r"), 2, method="exact", target_epsilon=None,
                        target_delta=1e-6, row_norm=1.0)
