"""Adversarial review of the grouped Gram pass and the deferred first pass (pca/rows.py).

The change under review: ``ClippedRows.gram`` sums its blocks with ``GramSum`` (``dsyrk``
with ``beta = 1`` over ``gram_group(block_rows)`` blocks), ``make_rows`` defers the first
pass (NaN check, clip counts, kept norms) to the first pass a method makes (fused into the
Gram pass), and the skinny block products are computed as ``(M^T B^T)^T``.

The first three tests pin the defects the review found, fixed since (the fused pass clips
with the scan's norms only where they are kept; ``GramSum`` is closed once handed out; the
documented size of the rounding inflation); the others pin what was checked and found
sound.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from dpprecond.pca import rows as rows_mod
from dpprecond.pca.auto import _block_clipped_step
from dpprecond.pca.rows import ClippedRows, GramSum, make_rows

D = 9
BLOCK = {"block_bytes": 8 * D * 64}  # 64 rows per block


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 4 blocks of 64 rows."""
    monkeypatch.setattr(rows_mod, "GRAM_GROUP_ROWS", 256)


def _data(n: int = 1000, d: int = D, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * 0.3
    X[rng.random(n) < 0.03] *= 40.0  # clipped rows: clipped and raw blocks both occur
    X[5] = 0.0
    X[700:720] *= 1e-200  # prescaled rows
    return X


def _layouts(X: np.ndarray) -> dict[str, np.ndarray]:
    return {"C": X, "F": np.asfortranarray(X),
            "column-strided": np.repeat(X, 2, axis=1)[:, ::2],
            "row-strided": np.repeat(X, 2, axis=0)[::2]}


# -- defects ------------------------------------------------------------------------------


def test_deferred_gram_is_the_eager_one_for_a_column_strided_view_without_kept_norms(
        small_groups: None) -> None:
    """``make_rows`` keeps no norms above 2^21 rows (16 MiB); ``norms_bytes=0`` is that path
    at test size. On a float64 view with a column stride (``X[:, ::2]``), ``einsum`` on the
    strided block and on its contiguous copy round differently, so the fused Gram pass
    (scan's numbers) and the eager one (recomputed) differ in the last bits, against the
    claim that the deferred path gives the eager results bit for bit. (Seen at make_rows
    level too: n = 2^21 + 1000, d = 8, max difference 7e-14.)"""
    X = _layouts(_data())["column-strided"]
    eager = ClippedRows.from_data(X, 2.5, norms_bytes=0, **BLOCK)
    deferred = ClippedRows.from_data(X, 2.5, norms_bytes=0, defer_scan=True, **BLOCK)
    assert eager._sq is None
    assert np.array_equal(deferred.gram(), eager.gram())


def test_gram_sum_is_closed_once_handed_out() -> None:
    """``upper()`` returns a view of the accumulator (no d x d copy), so a later ``add``
    would change a result already handed out: it raises instead."""
    rng = np.random.default_rng(0)
    B1, B2 = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    acc = GramSum(4, group=1)
    acc.add(B1)
    first = acc.upper()
    kept = first.copy()
    with pytest.raises(RuntimeError, match="after upper"):
        acc.add(B2)
    assert np.array_equal(acc.upper(), kept)
    assert np.array_equal(first, kept)


def test_documented_rounding_slack_bound_holds() -> None:
    """The figures the docs give (rows.py module docstring, docs/pca.md, the api.py
    comment): for d = 784, 1.4e-6 at n = 1e5 and 1.5e-4 at n = 1e7."""
    rows = ClippedRows.from_data(np.zeros((1, 784)), 1.0)
    assert rows.rounding_slack(10**5) < 1.5e-6
    assert rows.rounding_slack(10**7) < 1.5e-4


# -- checked and sound ----------------------------------------------------------------------


def _passes(rows: ClippedRows, n: int) -> dict:
    return {
        "gram": rows.gram,
        "times": lambda: rows.times(np.ones((D, 2))),
        "t_times": lambda: rows.t_times(np.ones((n, 2))),
        "column_sum": rows.column_sum,
        "n_clipped": lambda: rows.n_clipped,
        "n_clipped_centered": lambda: rows.n_clipped_centered,
        "centered": lambda: rows.centered(np.zeros(D)),
        "norms": lambda: rows.norms,
        "rows": lambda: rows.rows(np.array([0])),
        "block": lambda: rows.block(0, 1),
        "materialize": rows.materialize,
        "block_sum": lambda: rows.block_sum(_block_clipped_step, np.eye(D)[:, :2], 1.0,
                                            shape=(D, 2), row_scaled=True),
    }


@pytest.mark.parametrize("layout", ["C", "F", "column-strided", "float32", "memmap"])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_every_pass_of_deferred_rows_refuses_a_nonfinite_entry(
        tmp_path, layout: str, where: str, value: float) -> None:
    n = 300
    X = _data(n)
    row = 0 if where == "first" else n - 1
    X[row, 3] = value
    if layout == "float32":
        X = X.astype(np.float32)
    elif layout == "memmap":
        path = os.path.join(tmp_path, "x.npy")
        np.save(path, X)
        X = np.load(path, mmap_mode="r")
    elif layout != "C":
        X = _layouts(X)[layout]
    for name in _passes(make_rows(X, 1.0, **BLOCK), n):
        rows = make_rows(X, 1.0, **BLOCK)
        with pytest.raises(ValueError, match=rf"first at index \({row}, 3\)"):
            _passes(rows, n)[name]()


@pytest.mark.parametrize(("scale", "row_norm"), [(1.0, 2.5), (1e8, 2.5e8), (1e300, 2.5e300),
                                                 (1.0, 1e-300), (1.0, 1e300),
                                                 (1e300, 1e-300)])
@pytest.mark.parametrize("layout", ["C", "F", "column-strided", "row-strided", "float32"])
def test_deferred_gram_is_the_eager_one_with_kept_norms(small_groups: None, scale: float,
                                                        row_norm: float, layout: str) -> None:
    with np.errstate(over="ignore"):
        X = _data() * scale
        Xv = X.astype(np.float32) if layout == "float32" else _layouts(X)[layout]
    if not np.all(np.isfinite(Xv)):
        pytest.skip("float32 cannot hold the rows")
    eager = ClippedRows.from_data(Xv, row_norm, **BLOCK)
    deferred = ClippedRows.from_data(Xv, row_norm, defer_scan=True, **BLOCK)
    G = deferred.gram()
    assert np.all(np.isfinite(G))
    assert np.array_equal(G, eager.gram())
    assert np.array_equal(deferred.gram(), G)  # the second call takes the eager loop
    assert deferred.n_clipped == eager.n_clipped


def test_gram_sum_takes_any_layout_and_flushes_once() -> None:
    rng = np.random.default_rng(2)
    blocks = [rng.standard_normal((7, 5)) for _ in range(5)]
    views = [blocks[0], np.asfortranarray(blocks[1]), blocks[2].astype(np.float32),
             np.repeat(blocks[3], 2, axis=1)[:, ::2], blocks[4][::-1]]
    acc = GramSum(5, group=2)
    for B in views:
        acc.add(B)
    exact = sum(np.asarray(B, dtype=np.float64).T @ np.asarray(B, dtype=np.float64)
                for B in views)
    U = acc.upper()
    np.testing.assert_allclose(U, np.triu(exact), rtol=0, atol=1e-5)
    assert np.array_equal(U, np.triu(U)) and np.array_equal(acc.upper(), U)
