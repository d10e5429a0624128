"""Each sensitivity of the spec pinned by a worst-case neighbouring pair (replace-one).

For every release we compute the statistic on A and on A' differing in one row (rows of
norm <= 1) and check that the l2 change *reaches* the stated bound (and that random pairs
stay under it).
"""

import math

import numpy as np
import pytest

from dpprecond.pca.core import score_matrix, selection_score
from dpprecond.pca.preprocess import mean_sensitivity

SQRT2 = math.sqrt(2.0)
rng0 = np.random.default_rng(0)


def _upper(M):
    return M[np.triu_indices(M.shape[0])]


def _unit_rows(n, d, rng):
    X = rng.standard_normal((n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True) * rng.uniform(0, 1, (n, 1))


def test_gram_sensitivity_sqrt2_hit():
    d = 6
    A = _unit_rows(30, d, rng0)
    A[0] = np.eye(d)[0]
    B = A.copy()
    B[0] = np.eye(d)[1]  # orthogonal unit row
    change = np.linalg.norm(_upper(A.T @ A) - _upper(B.T @ B))
    assert change == pytest.approx(SQRT2, rel=1e-12)


def test_gram_sensitivity_random_pairs_under():
    rng = np.random.default_rng(1)
    for _ in range(200):
        A = _unit_rows(10, 5, rng)
        B = A.copy()
        B[3] = _unit_rows(1, 5, rng)[0]
        assert np.linalg.norm(_upper(A.T @ A) - _upper(B.T @ B)) <= SQRT2 + 1e-12


def test_h_sensitivity_sqrt2_hit():
    d, k = 8, 3
    X = np.linalg.qr(rng0.standard_normal((d, k)))[0]
    A = _unit_rows(20, d, rng0)
    A[5] = X[:, 0]
    B = A.copy()
    B[5] = X[:, 1]  # orthogonal unit row, inside span(X)
    H, H2 = X.T @ A.T @ A @ X, X.T @ B.T @ B @ X
    assert np.linalg.norm(_upper(H) - _upper(H2)) == pytest.approx(SQRT2, rel=1e-12)


def _clipped_Z(A, XB, R):
    Y = A @ XB
    norms = np.linalg.norm(Y, axis=1, keepdims=True)
    C = Y * np.minimum(1.0, R / np.maximum(norms, 1e-300))
    return A.T @ C


def test_z_sensitivity_2R_reached():
    """Z = A^T C with clipped c_i: the change tends to 2R (supremum, reached to 1e-8).

    Pair: a = cos(phi) e1 + sin(phi) e_{k+1}, a' = cos(phi) e1 - sin(phi) e_{k+1}, with a
    large preconditioner so that both rows are clipped to c = c' = R e1; then
    a c^T - a' c'^T = 2 sin(phi) R e_{k+1} e1^T, and sin(phi) -> 1.
    """
    d, k, R, b = 7, 2, 0.3, 1e5
    X = np.eye(d)[:, :k]
    XB = X * b  # X B with B = b I (a public preconditioner)
    cos_phi = 2 * R / b
    sin_phi = math.sqrt(1 - cos_phi**2)
    A = _unit_rows(25, d, rng0) * 1e-6
    A[0] = cos_phi * np.eye(d)[0] + sin_phi * np.eye(d)[k]
    B = A.copy()
    B[0] = cos_phi * np.eye(d)[0] - sin_phi * np.eye(d)[k]
    change = np.linalg.norm(_clipped_Z(A, XB, R) - _clipped_Z(B, XB, R))
    assert change == pytest.approx(2 * R, rel=1e-8)
    assert change <= 2 * R


def test_z_sensitivity_random_pairs_under():
    rng = np.random.default_rng(2)
    d, k, R = 6, 2, 0.2
    for _ in range(200):
        X = np.linalg.qr(rng.standard_normal((d, k)))[0]
        XB = X @ (rng.standard_normal((k, k)) * 3)
        A = _unit_rows(12, d, rng)
        B = A.copy()
        B[0] = _unit_rows(1, d, rng)[0]
        assert np.linalg.norm(_clipped_Z(A, XB, R) - _clipped_Z(B, XB, R)) <= 2 * R + 1e-12


def test_power_method_sensitivity_sqrt2_hit():
    d, k = 9, 3
    X = np.linalg.qr(rng0.standard_normal((d, k)))[0]
    A = _unit_rows(15, d, rng0)
    A[2] = X[:, 2]
    B = A.copy()
    B[2] = X[:, 0]
    change = np.linalg.norm(A.T @ A @ X - B.T @ B @ X)
    assert change == pytest.approx(SQRT2, rel=1e-12)


def _phi_matrix(S, lo, hi):
    w, U = np.linalg.eigh(S)
    return (U * np.clip((w - lo) / (hi - lo), 0, 1)) @ U.T


def test_score_sensitivity_sqrt2_over_h():
    """phi(A^T A) moves by exactly sqrt(2)/h in Frobenius norm for the worst pair; the score
    (1-Lipschitz in phi(A^T A)) moves by at most that, here by 1/h (its spectral change)."""
    d, lo, hi = 4, 2.0, 6.0
    h = hi - lo
    A = np.repeat(np.eye(d)[:2], 4, axis=0)  # S = diag(4, 4, 0, 0): inside the linear part
    B = A.copy()
    B[0] = np.eye(d)[1]  # S' = diag(3, 5, 0, 0)
    F, F2 = _phi_matrix(A.T @ A, lo, hi), _phi_matrix(B.T @ B, lo, hi)
    assert np.linalg.norm(F - F2) == pytest.approx(SQRT2 / h, rel=1e-12)
    X = np.eye(d)[:, 2:3]
    s1 = selection_score(score_matrix(A.T @ A, lo, hi), X)
    s2 = selection_score(score_matrix(B.T @ B, lo, hi), X)
    assert abs(s1 - s2) == pytest.approx(1.0 / h, rel=1e-10)
    assert abs(s1 - s2) <= SQRT2 / h


def test_score_random_pairs_under_and_matches_definition():
    rng = np.random.default_rng(3)
    d, k = 6, 2
    for _ in range(100):
        A = _unit_rows(20, d, rng)
        B = A.copy()
        B[0] = _unit_rows(1, d, rng)[0]
        S, S2 = A.T @ A, B.T @ B
        w = np.linalg.eigvalsh(S)
        lo, hi = w[-3] + 0.01, w[-2] + 0.5
        X = np.linalg.qr(rng.standard_normal((d, k)))[0]
        P = np.eye(d) - X @ X.T
        exact = np.linalg.norm(P @ _phi_matrix(S, lo, hi), 2)
        s1 = selection_score(score_matrix(S, lo, hi), X)
        assert s1 == pytest.approx(exact, abs=1e-10)
        s2 = selection_score(score_matrix(S2, lo, hi), X)
        assert abs(s1 - s2) <= SQRT2 / (hi - lo) + 1e-10


def test_mean_sensitivity_2_over_n_hit():
    n, d = 40, 5
    A = _unit_rows(n, d, rng0)
    A[0] = np.eye(d)[0]
    B = A.copy()
    B[0] = -np.eye(d)[0]
    change = np.linalg.norm(A.mean(axis=0) - B.mean(axis=0))
    assert change == pytest.approx(mean_sensitivity(n), rel=1e-12)
    assert mean_sensitivity(n) == pytest.approx(2.0 / n)


# -- issue 17, hole 9: run_trials' Z is a sum of clipped per-row terms, within its slack ----


def test_run_trials_z_is_within_the_rounding_bound_of_the_clipped_sum(monkeypatch):
    """Z used to be formed as ``S X B - sum_clipped a_i (y_i - c_i)^T``: per-row terms of
    norm up to ``||B||_2`` instead of ``R``, so its rounding could exceed the slack the noise
    is inflated by (``gamma_m n R`` for terms of norm ``R``; here the old error was 177 times
    that). With ``||B||_2 = 31`` and ``R = 1e-9`` the computed Z must stay within
    ``rounding_slack() / 2 * R`` of the exact sum of the clipped rows ``a_i c_i^T``,
    ``c_i = y_i min(1, R / ||y_i||) SHRINK`` (computed in extended precision)."""
    import dpprecond.pca.core as core
    from dpprecond.clipping import SHRINK
    from dpprecond.pca.rows import ClippedRows

    n, R = 1000, 1e-9
    t = 1e-3 * np.random.default_rng(3).uniform(0.5, 1.5, n)
    rows = ClippedRows.from_data(np.stack([t, np.sqrt(1.0 - t**2)], axis=1), 1.0)
    S = rows.gram()
    X0 = np.eye(2)[:, :1]
    seen = []
    real = core.orthonormalize
    monkeypatch.setattr(core, "orthonormalize", lambda Z: seen.append(Z.copy()) or real(Z))
    core.run_trials(rows, S, X0, [core.TrialSpec(R, 1, 0.0, 0.0, np.random.default_rng(0))])
    # the exact release for the same public B (post-processing of H = X0^T S X0, noiseless)
    H = X0.T @ S @ X0
    B, b_norm = core._preconditioner(0.5 * (H + H.T), 1e-12 * max(float(np.trace(H)), 1e-300))
    assert b_norm > 25.0
    A = rows.materialize().astype(np.longdouble)
    Y = A @ (X0 @ B).astype(np.longdouble)
    exact = A.T @ (Y * np.minimum(1.0, R / np.abs(Y)) * np.longdouble(SHRINK))
    err = float(np.abs(seen[0].astype(np.longdouble) - exact).max())
    assert err <= rows.rounding_slack() / 2 * R, (err, rows.rounding_slack() / 2 * R)
