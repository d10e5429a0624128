"""Metrics on cases with known answers; synthetic families report measured properties;
row scaling and centering."""

import math

import numpy as np
import pytest

from dpprecond.data.synthetic import coherent_spiked, exact_spectrum, spiked_covariance
from dpprecond.pca import (
    captured_variance_ratio,
    coherence,
    eigengap,
    rank_k_coherence,
    sin_theta,
    sin_theta_frobenius,
)
from dpprecond.pca.metrics import describe, top_right_singular_vectors
from dpprecond.pca.preprocess import preprocess
from dpprecond.pca.rows import ClippedRows


def test_sin_theta_known_angles():
    d = 5
    e = np.eye(d)
    a, b = 0.3, 0.7
    X = e[:, :2]
    V = np.column_stack([math.cos(a) * e[:, 0] + math.sin(a) * e[:, 2],
                         math.cos(b) * e[:, 1] + math.sin(b) * e[:, 3]])
    assert sin_theta(X, V) == pytest.approx(math.sin(b))
    assert sin_theta_frobenius(X, V) == pytest.approx(math.hypot(math.sin(a), math.sin(b)))
    assert sin_theta(X, X) == pytest.approx(0.0, abs=1e-15)
    assert sin_theta(e[:, :2], e[:, 2:4]) == pytest.approx(1.0)


def test_captured_variance_and_eigengap():
    A = exact_spectrum(200, 8, 2, 0.25, seed=0, sigma_k=2.0)
    V = top_right_singular_vectors(A, 2)
    assert captured_variance_ratio(A, V, V) == pytest.approx(1.0)
    W = np.linalg.qr(np.random.default_rng(1).standard_normal((8, 2)))[0]
    assert captured_variance_ratio(A, W, V) < 1.0
    assert eigengap(A, 2) == pytest.approx(4.0 - 1.0)
    ratio = captured_variance_ratio(A, W, V)
    for scale in (1e-300, 1e300):  # rows divided by a huge or tiny public row norm
        assert captured_variance_ratio(A * scale, W, V) == pytest.approx(ratio, rel=1e-12)


def test_coherence_extremes():
    n, d = 64, 4
    spiky = np.zeros((n, d))
    spiky[:d] = np.diag([4.0, 3.0, 2.0, 1.0])
    assert coherence(spiky) == pytest.approx(1.0)
    assert rank_k_coherence(spiky, 2) == pytest.approx(1.0)
    # columns of a Hadamard matrix: every entry of U is +-1/sqrt(n)
    H = np.array([[1.0]])
    while H.shape[0] < n:
        H = np.block([[H, H], [H, -H]])
    flat = H[:, 1:d + 1] * np.array([4.0, 3.0, 2.0, 1.0])
    assert coherence(flat) == pytest.approx(1 / math.sqrt(n))
    assert rank_k_coherence(flat, 2) == pytest.approx(math.sqrt(2 / n))


def test_spiked_family_is_seeded_and_bounded():
    A = spiked_covariance(2000, 30, 3, 4.0, seed=5)
    assert A.shape == (2000, 30)
    assert np.linalg.norm(A, axis=1).max() == pytest.approx(1.0)
    assert np.array_equal(A, spiked_covariance(2000, 30, 3, 4.0, seed=5))
    stats = describe(A, 3)
    assert stats["max_row_norm"] == pytest.approx(1.0)
    assert stats["kappa"] < 0.5  # a real spike: theta = 4 against noise 1
    assert stats["rank_k_coherence"] == pytest.approx(rank_k_coherence(A, 3))
    assert stats["coherence"] == pytest.approx(coherence(A))


def test_coherent_family_coherence_rises_as_fraction_falls():
    coh = [describe(coherent_spiked(4000, 20, 2, 50.0, f, seed=1), 2)["rank_k_coherence"]
           for f in (1.0, 0.1, 0.01)]
    assert coh[0] < coh[1] < coh[2], coh


def test_exact_spectrum_family_has_the_requested_kappa():
    A = exact_spectrum(500, 20, 4, 0.5, seed=2, sigma_k=3.0)
    stats = describe(A, 4)
    assert stats["kappa"] == pytest.approx(0.5, rel=1e-10)
    assert stats["sigma_k_sq"] == pytest.approx(9.0, rel=1e-10)


def test_preprocess_scales_clips_and_counts():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0], [0.0, 0.0]])
    X0 = X.copy()
    out = preprocess(X, 5.0)
    assert np.array_equal(X, X0)  # input untouched
    assert out.n_clipped == 1 and out.mean is None
    assert np.allclose(np.linalg.norm(out.A, axis=1), [1.0, 0.1, 1.0, 0.0])
    assert np.allclose(out.A[2], [0.6, 0.8])  # scaled down, direction kept, not dropped


def test_preprocess_centering():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (500, 6))
    mean = X.mean(axis=0)
    pub = preprocess(X, 3.0, center=mean)
    assert np.allclose(pub.mean, mean)
    # no row above 1 here; rows carry the factor SHRINK = 1 - 2^-30 (clipping.py)
    assert np.allclose(pub.A.mean(axis=0), 0.0, atol=1e-9)
    exact = preprocess(X, 3.0, center="private", mean_noise_multiplier=0.0,
                       rng=np.random.default_rng(1))
    assert np.allclose(exact.mean, mean)
    noisy = preprocess(X, 3.0, center="private", mean_noise_multiplier=1.0,
                       rng=np.random.default_rng(1))
    # noise std on the scaled mean is 2/n: about 2 * 3 / 500 per coordinate in X units
    assert 0 < np.abs(noisy.mean - mean).max() < 5 * 2 * 3.0 / 500
    # re-bounding after centering: a far public mean pushes rows above norm 1
    far = preprocess(X, 1.5, center=-np.ones(6))
    assert far.n_clipped_centered > 0
    assert np.linalg.norm(far.A, axis=1).max() <= 1.0 + 1e-12


def test_block_gram_matches_the_materialized_rows():
    """The Gram pass (raw fast path for unclipped blocks, clipped blocks otherwise) equals
    A^T A of the materialized rows, with and without centering; tiny blocks force many
    blocks of both kinds."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((300, 7)) * rng.uniform(0.1, 3, (300, 1))
    X[:100] *= 0.1  # the first blocks have no clipped row: the raw path runs
    rows = ClippedRows.from_data(X, 2.0, block_bytes=8 * 7 * 64)
    A = rows.materialize()
    assert rows.n_clipped == preprocess(X, 2.0).n_clipped > 0
    assert np.allclose(rows.gram(), A.T @ A, atol=1e-12)
    assert np.allclose(rows.norms, np.linalg.norm(A, axis=1))
    assert np.linalg.norm(A, axis=1).max() <= 1.0
    centered = rows.centered(A.mean(axis=0))
    C = centered.materialize()
    assert np.allclose(centered.gram(), C.T @ C, atol=1e-12)
    assert np.allclose(centered.times(np.eye(7)), C)
    assert np.allclose(centered.t_times(np.ones((300, 1))), C.sum(axis=0)[:, None])
    idx = np.array([0, 5, 64, 65, 200, 299])
    assert np.array_equal(centered.rows(idx), C[idx])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_times_fast_path_equals_the_clipped_rows(dtype: type) -> None:
    """``A @ M`` through the raw fast path (unclipped blocks: the raw block times ``M``,
    scaled by the step-1 factors) equals the materialized rows times ``M``; blocks holding
    a huge, a tiny or a clipped row take the materialized path, and no row's product grows
    past ``||M||`` (rows of norm <= 1)."""
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((400, 6)) * 0.1).astype(dtype)
    big = np.finfo(dtype).max / 4
    X[70, 0] = big  # a row far past row_norm, scaled down to norm 1
    X[200] = np.finfo(dtype).tiny  # underflowing squares
    X[330] *= 100  # clipped
    rows = ClippedRows.from_data(X, 1.0, block_bytes=8 * 6 * 64)
    M = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    Y = rows.times(M)
    np.testing.assert_allclose(Y, rows.materialize() @ M, rtol=1e-12, atol=1e-15)
    assert np.all(np.isfinite(Y))
    assert np.linalg.norm(Y, axis=1).max() <= 1.0 + 1e-12


def test_gram_upper_is_numpys_gram_on_one_triangle():
    """The Gram pass's block term (one dsyrk writing one triangle, into a reused buffer) has
    bit for bit numpy's B.T @ B in its upper triangle and zeros below, for every layout; so
    the mirrored sum equals the sum of numpy's terms, which are exactly symmetric for
    BLAS-compatible layouts (a block strided both ways is not: numpy's own loop there
    is symmetric only to rounding, and the pass keeps its upper triangle)."""
    from dpprecond.pca.rows import finish_gram, gram_upper

    rng = np.random.default_rng(9)
    buf = np.zeros((9, 9), order="F")
    total, ref = np.zeros((9, 9)), np.zeros((9, 9))
    iu = np.triu_indices(9)
    for B in (rng.normal(size=(50, 9)), rng.normal(size=(3, 9)),
              np.asfortranarray(rng.normal(size=(40, 9))), rng.normal(size=(80, 18))[:, ::2]):
        term = gram_upper(B, buf)
        full = B.T @ B
        assert np.array_equal(term[iu], full[iu]) and not np.tril(term, -1).any()
        if B.flags.c_contiguous or B.flags.f_contiguous:
            assert np.array_equal(full, full.T)
            total += term
            ref += full
    assert np.array_equal(finish_gram(total, np.zeros((9, 9)), 1.0, False), ref)
