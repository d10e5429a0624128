"""Noise off and R infinite: every method returns the exact top-k subspace. The batched,
Gram-matrix implementation of Algorithm 2 equals a direct implementation."""

import numpy as np
import pytest

from dpprecond.noise import gaussian, symmetric_gaussian
from dpprecond.pca import fit_private_pca, sin_theta
from dpprecond.pca.core import SQRT2, TrialSpec, orthonormalize, run_trials
from dpprecond.pca.metrics import top_right_singular_vectors

NOISE_OFF = {
    "select": {"add_noise": False, "clip_grid": [np.inf]},
    "fixed": {"add_noise": False, "clip_radius": np.inf, "n_iter": 8},
    "analyze_gauss": {"add_noise": False},
    "power": {"add_noise": False, "n_iter": 200},
    "exact": {},
}


@pytest.mark.parametrize("method", list(NOISE_OFF))
def test_noise_off_returns_exact_subspace(gap_matrix, method):
    V = top_right_singular_vectors(gap_matrix, 3)
    res = fit_private_pca(gap_matrix, 3, method=method, target_epsilon=1.0, target_delta=1e-6,
                          row_norm=1.0, seed=0, **NOISE_OFF[method])
    assert sin_theta(res.basis, V) < 1e-8
    assert np.allclose(res.components @ res.components.T, np.eye(3), atol=1e-10)


def _reference_alg2(A, X, R, T, zH, zZ, rng, floor_factor=4.0):
    """Algorithm 2 written straight from the spec (two passes over A per iteration)."""
    k = X.shape[1]
    for _ in range(T):
        P = A @ X
        H = P.T @ P + symmetric_gaussian(k, zH * SQRT2, rng)
        w, U = np.linalg.eigh(H)
        floor = floor_factor * zH * SQRT2 if zH > 0 else 1e-12 * np.trace(H)
        B = (U / np.sqrt(np.maximum(w, floor))) @ U.T
        Y = P @ B
        norms = np.linalg.norm(Y, axis=1, keepdims=True)
        C = Y * np.minimum(1.0, R / np.maximum(norms, 1e-300))
        Z = A.T @ C
        if zZ > 0:
            Z = Z + gaussian(Z.shape, 2 * R * zZ, rng)
        X = orthonormalize(Z)
    return X


def test_gram_trick_and_batching_match_reference(gap_matrix):
    A = gap_matrix
    d, k = A.shape[1], 3
    X0 = orthonormalize(np.random.default_rng(5).standard_normal((d, k)))
    configs = [(0.02, 3, 0.0, 0.0), (0.05, 5, 0.5, 0.4), (0.5, 2, 1.0, 1.0), (0.01, 0, 1, 1),
               (0.03, 4, 0.2, 0.3)]
    seeds = np.random.SeedSequence(11).spawn(len(configs))

    def specs():
        return [TrialSpec(R, T, zH, zZ, np.random.default_rng(s))
                for (R, T, zH, zZ), s in zip(configs, seeds, strict=True)]

    batched, clipped = run_trials(A, A.T @ A, X0, specs())
    assert clipped[0] > 0  # clipping is active in the first configuration
    for j, ((R, T, zH, zZ), s) in enumerate(zip(configs, seeds, strict=True)):
        ref = _reference_alg2(A, X0, R, T, zH, zZ, np.random.default_rng(s))
        assert np.allclose(batched[j], ref, atol=1e-9), j
        single, _ = run_trials(A, A.T @ A, X0, [specs()[j]])
        assert np.allclose(batched[j], single[0], atol=1e-12)
    # a tiny batch limit (one trial per group) gives the same numbers
    grouped, _ = run_trials(A, A.T @ A, X0, specs(), max_batch_columns=k)
    for a, b in zip(batched, grouped, strict=True):
        assert np.allclose(a, b, atol=1e-12)


def test_without_clipping_span_is_power_step(gap_matrix):
    """No clipping and no noise: span(Z) = span(A^T A X)."""
    A = gap_matrix
    X0 = orthonormalize(np.random.default_rng(1).standard_normal((A.shape[1], 3)))
    (X1,), clipped = run_trials(A, A.T @ A, X0, [TrialSpec(np.inf, 1, 0.0, 0.0,
                                                           np.random.default_rng(0))])
    assert clipped[0] == 0
    assert sin_theta(X1, orthonormalize(A.T @ A @ X0)) < 1e-10


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("quantile", [0.05, 0.5, 0.9, 0.99, 1.0])
def test_scaled_rows_paths_match_reference(quantile, heavy):
    """Implicit row scaling and every screening path: GEMM over all rows with the
    correction gathered or as a second pass, and GEMM over a few candidate rows (reached
    with 10% heavy rows and a large R)."""
    rng = np.random.default_rng(8)
    if heavy:
        row_scale = np.where(rng.random((2000, 1)) < 0.1, 2.0, 0.2)
    else:
        row_scale = rng.uniform(0.2, 2.0, (2000, 1))
    X = rng.standard_normal((2000, 15)) * row_scale
    from dpprecond.pca.rows import ClippedRows

    rows = ClippedRows.from_data(X, 2.5, block_bytes=8 * 15 * 256)  # several blocks
    A = rows.materialize()
    X0 = orthonormalize(rng.standard_normal((15, 3)))
    P = A @ X0
    B = np.linalg.inv(np.linalg.cholesky(P.T @ P)).T  # any preconditioner, for the scale of y
    R = float(np.quantile(np.linalg.norm(P @ B, axis=1), quantile))
    spec = [TrialSpec(R, 3, 0.0, 0.0, np.random.default_rng(0))]
    implicit, c1 = run_trials(rows, A.T @ A, X0, spec)
    ref = _reference_alg2(A, X0, R, 3, 0.0, 0.0, np.random.default_rng(0))
    assert np.allclose(implicit[0], ref, atol=1e-9)
    if quantile < 1.0:
        assert c1[0] > 0


def _symmetric(rng, d, scale=1.0):
    A = rng.standard_normal((d, d)) * scale
    return A + A.T


@pytest.mark.parametrize(("name", "n"), [("random", 1), ("random", 5), ("random", 39),
                                         ("split", 3), ("split", 30), ("tiny", 1),
                                         ("wide", 11), ("huge", 4), ("small", 4),
                                         ("full", 40)])
def test_one_reduction_gives_the_two_eigensolvers_numbers(name, n):
    """spectrum_and_top_eigvecs (one tridiagonal reduction, auto's M1) returns bit for bit
    what top_eigvecs (LAPACK dsyevx) returns, and eigvalsh's spectrum; matrices that
    dsyevx would rescale ("huge": entries 1e200, "small": 1e-200) and n = d take the two
    solvers themselves."""
    from scipy.linalg import block_diag

    from dpprecond.pca.core import spectrum_and_top_eigvecs, top_eigvecs

    rng = np.random.default_rng(5)
    M = {"random": lambda: _symmetric(rng, 40),
         # a tridiagonal form that splits into blocks (dstebz orders by block, then sorts)
         "split": lambda: block_diag(_symmetric(rng, 20), np.zeros((5, 5)),
                                     np.diag(rng.standard_normal(15))),
         "tiny": lambda: _symmetric(rng, 2),
         "wide": lambda: _symmetric(rng, 300),
         "huge": lambda: _symmetric(rng, 20, 1e200),
         "small": lambda: _symmetric(rng, 20, 1e-200),
         "full": lambda: _symmetric(rng, 40)}[name]()
    spectrum, w, V = spectrum_and_top_eigvecs(M, n)
    w0, V0 = top_eigvecs(M, n)
    assert np.array_equal(w, w0) and np.array_equal(V, V0)
    ref = np.linalg.eigvalsh(M)[::-1]
    # eigvalsh is numpy's LAPACK (dsyevd: the same dsytrd and dsterf); equal here to
    # rounding, bit for bit where numpy and scipy load the same build
    np.testing.assert_allclose(spectrum, ref, rtol=1e-13, atol=1e-13 * np.abs(ref).max())
    assert spectrum.shape == (M.shape[0],) and np.all(np.diff(spectrum) <= 0)
