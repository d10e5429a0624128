"""Hole 1 of the privacy issue: a finite row of huge norm must not break the sensitivity.

Rows are divided by the public ``row_norm`` and scaled down to norm 1 when still above it,
so two inputs that agree after that map are the *same* input to every release. With the
same seed they must give the same output, whatever the raw norm of a row (1e8, 1e300).
Before the fix, the Gram matrix was computed as ``X^T X / row_norm^2`` minus a correction,
which cancels catastrophically for a huge row (and overflows to NaN at 1e155 and above).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpprecond.pca import fit_private_pca

METHODS = ["analyze_gauss", "fixed", "select", "power", "exact"]


def _base(seed: int = 0, n: int = 2000, d: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1).max()
    return X


@pytest.mark.parametrize("norm", [1e8, 1e154, 1e300])
@pytest.mark.parametrize("method", METHODS)
def test_a_huge_row_is_the_same_input_as_its_unit_version(method: str, norm: float) -> None:
    X = _base()
    X[0] = 0.0
    X[0, 0] = 1.0  # a unit row: unchanged by the scaling
    Y = X.copy()
    Y[0, 0] = norm  # scaled down to the same unit row
    eps = None if method == "exact" else 1.0
    a = fit_private_pca(X, 2, method=method, target_epsilon=eps, target_delta=1e-6, row_norm=1.0,
                        seed=3)
    b = fit_private_pca(Y, 2, method=method, target_epsilon=eps, target_delta=1e-6, row_norm=1.0,
                        seed=3)
    assert np.all(np.isfinite(b.components))
    np.testing.assert_allclose(b.components, a.components, rtol=0, atol=1e-9)
    if a.explained_variance is not None:
        np.testing.assert_allclose(b.explained_variance, a.explained_variance, rtol=1e-9)


@pytest.mark.parametrize("top", [1e8, 1e300, 1.7e308])
def test_noiseless_gram_of_a_huge_row_matches_the_clipped_rows(top: float) -> None:
    """The issue's repro: ``||triu(S - A^T A)||_F`` was about 20 for a row of norm 1e8."""
    X = _base()
    direction = X[0] / np.linalg.norm(X[0])
    X[0] = direction / np.abs(direction).max() * top  # largest entry = top (finite)
    A = X.copy()
    A[0] = direction  # what the row is scaled down to
    res = fit_private_pca(X, 6, method="analyze_gauss", target_epsilon=1.0, target_delta=1e-6,
                          row_norm=1.0,
                          seed=0, add_noise=False)
    ref = np.linalg.eigvalsh(A.T @ A)[::-1] / X.shape[0]
    np.testing.assert_allclose(res.explained_variance, ref, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("row_norm", [1e-300, 1e-100, 1e100, 1e300])
def test_extreme_row_norm_bounds_give_the_scaled_problem(row_norm: float) -> None:
    """Rescaling the data and its public bound together changes nothing."""
    X = _base()
    Y = X * row_norm
    a = fit_private_pca(X, 2, method="analyze_gauss", target_epsilon=1.0, target_delta=1e-6,
                        row_norm=1.0,
                        seed=5)
    b = fit_private_pca(Y, 2, method="analyze_gauss", target_epsilon=1.0, target_delta=1e-6,
                        row_norm=row_norm, seed=5)
    assert np.all(np.isfinite(b.components))
    np.testing.assert_allclose(b.components, a.components, atol=1e-8)


def test_float32_and_memory_mapped_input_are_read_without_a_copy(tmp_path) -> None:
    """The result is the same as for the float64 array; NaN is found by the first pass."""
    X = _base().astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, X)
    mm = np.load(path, mmap_mode="r")
    ref = fit_private_pca(X.astype(np.float64), 2, method="analyze_gauss", target_epsilon=1.0,
                          target_delta=1e-6, row_norm=1.0, seed=4)
    for data in (X, mm):
        res = fit_private_pca(data, 2, method="analyze_gauss", target_epsilon=1.0,
                              target_delta=1e-6, row_norm=1.0, seed=4)
        np.testing.assert_allclose(res.components, ref.components, atol=1e-12)
    bad = np.array(mm)
    bad[1500, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinite entries \(first at index \(1500, 3\)"):
        fit_private_pca(bad, 2, method="exact", target_epsilon=None, target_delta=1e-6,
                        row_norm=1.0)


def test_auto_probe_with_a_tiny_bound_and_a_zero_row_releases_finite_values() -> None:
    """A public bound of 1e-300 makes the fast path's row factor 1e300 on a zero row: the
    probe's rest energy must not compute 0 * inf (found by the hypothesis shapes test)."""
    X = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = fit_private_pca(X, 2, method="auto", target_epsilon=1.0, target_delta=1e-5,
                              row_norm=1e-300, seed=0)
    assert np.all(np.isfinite(res.components))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kept_row_norms_give_every_pass_the_same_numbers(dtype) -> None:
    """The first pass keeps the raw rows' squared norms so that later passes do not read
    the rows for them again: every pass (Gram, centered Gram, A @ M, column sum, the
    row-scaled block sums of auto's probe and clipped step, the rows themselves) must
    give bit for bit what the same pass gives when it recomputes them. The rows mix the
    cases: below the bound, above it (clipped), tiny (prescaled) and zero."""
    from dpprecond.pca.auto import HIST_EDGES, _block_clipped_step, _block_probe, _block_sum
    from dpprecond.pca.rows import ClippedRows

    rng = np.random.default_rng(8)
    X = rng.normal(size=(3000, 7)) * 0.2
    X[5:400] *= 1e-160     # block 0 (blocks of 400 rows): tiny rows, prescaled in float64
    X[401] = 0.0           # block 1: a zero row
    X[1600::7] *= 30.0     # blocks 4 to 7: rows above the bound, clipped
    X = X.astype(dtype)
    kept = ClippedRows.from_data(X, 2.5, block_bytes=7 * 8 * 400)
    fresh = ClippedRows.from_data(X, 2.5, block_bytes=7 * 8 * 400, norms_bytes=0)
    assert kept._sq is not None and fresh._sq is None
    # float32 cannot hold 1e-160 (block 0 is zeros there, and takes the fast paths)
    assert kept._unclipped_blocks.tolist() == [dtype == np.float32] + [True] * 3 + [False] * 4
    M = np.linalg.qr(rng.normal(size=(7, 3)))[0]
    B = np.diag([1.0, 2.0, 0.5])
    mu = rng.normal(size=7) * 0.1
    passes = {
        "gram": lambda r: r.gram(),
        "centered gram": lambda r: r.centered(mu).gram(),
        "centered count": lambda r: np.array([r.centered(mu).n_clipped_centered]),
        "times": lambda r: r.times(M),
        "column_sum": lambda r: r.column_sum(),
        "rows": lambda r: r.materialize(),
        "probe": lambda r: _block_sum(r, _block_probe, M, B, 0.01, HIST_EDGES,
                                      shape=(2 * HIST_EDGES.size + 2,), row_sq=True),
        "clipped step": lambda r: _block_sum(r, _block_clipped_step, M @ B, 0.3,
                                             shape=(7, 3)),
    }
    for name, run in passes.items():
        assert np.array_equal(run(kept), run(fresh)), name
    # Beyond norms_bytes (16 MiB by default) the norms are not kept.
    assert ClippedRows.from_data(X, 2.5, norms_bytes=8 * 2999)._sq is None
