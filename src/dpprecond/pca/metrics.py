"""Utility metrics of a k-dimensional subspace estimate (non-private evaluation only).

All functions take orthonormal bases of shape (d, k) and never touch privacy budgets:
they are for evaluation by someone who holds the data.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

__all__ = [
    "captured_variance_ratio",
    "coherence",
    "describe",
    "eigengap",
    "left_singular_vectors",
    "rank_k_coherence",
    "sin_theta",
    "sin_theta_frobenius",
    "top_right_singular_vectors",
]


def top_right_singular_vectors(A: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k right singular vectors V_k (d, k) of ``A`` from ``eigh(A^T A)``."""
    d = A.shape[1]
    _, V = linalg.eigh(A.T @ A, subset_by_index=[d - k, d - 1])
    return V[:, ::-1]


def _residual(X: np.ndarray, V: np.ndarray) -> np.ndarray:
    return V - X @ (X.T @ V)


def sin_theta(X: np.ndarray, V: np.ndarray) -> float:
    """Spectral sin-theta distance ``||(I - X X^T) V||_2`` (largest principal angle's sine)."""
    return min(1.0, float(np.linalg.norm(_residual(X, V), 2)))


def sin_theta_frobenius(X: np.ndarray, V: np.ndarray) -> float:
    """Frobenius sin-theta distance ``||(I - X X^T) V||_F``."""
    return float(np.linalg.norm(_residual(X, V), "fro"))


def captured_variance_ratio(A: np.ndarray, X: np.ndarray, V: np.ndarray) -> float:
    """``||A X||_F^2 / ||A V_k||_F^2`` (1 for the exact subspace).

    ``A`` is divided by its largest absolute entry first: the ratio does not change, and
    the squared norms neither underflow (rows scaled by ``1 / row_norm = 1e-300``) nor
    overflow.
    """
    A = np.asarray(A, dtype=np.float64)
    top = float(np.abs(A).max()) if A.size else 0.0
    if top > 0.0 and np.isfinite(top):
        A = A / top
    return float(np.linalg.norm(A @ X) ** 2 / np.linalg.norm(A @ V) ** 2)


def left_singular_vectors(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left singular vectors (decreasing singular values) via ``eigh(A^T A)`` (n >= d)."""
    if A.shape[0] < A.shape[1]:
        U, s, _ = np.linalg.svd(A, full_matrices=False)
        return U, s
    w, V = np.linalg.eigh(A.T @ A)
    w, V = np.maximum(w[::-1], 0.0), V[:, ::-1]
    s = np.sqrt(w)
    keep = s > (s[0] if s.size else 0.0) * max(A.shape) * np.finfo(float).eps
    U = (A @ V[:, keep]) / s[keep]
    return U, s[keep]


def coherence(A: np.ndarray) -> float:
    """``||U||_inf``: the largest absolute entry of the left singular vectors of ``A``.

    All columns of non-zero singular value are used.
    """
    U, _ = left_singular_vectors(A)
    return float(np.abs(U).max())


def rank_k_coherence(A: np.ndarray, k: int) -> float:
    """``max_i ||U_{i, 1:k}||``: the square root of the largest rank-k leverage score."""
    U, _ = left_singular_vectors(A)
    return float(np.sqrt(np.einsum("ij,ij->i", U[:, :k], U[:, :k]).max()))


def eigengap(A: np.ndarray, k: int) -> float:
    """``Delta_k = sigma_k^2 - sigma_{k+1}^2`` (``sigma_{d+1} = 0``)."""
    s = np.linalg.svd(A, compute_uv=False)
    s = np.concatenate([s, [0.0]])
    return float(s[k - 1] ** 2 - s[k] ** 2)


def describe(A: np.ndarray, k: int) -> dict[str, float]:
    """Measured properties of a data matrix ``A``: coherence, rank-k coherence, spectrum.

    One decomposition serves every quantity (the same definitions as :func:`coherence`,
    :func:`rank_k_coherence` and :func:`eigengap`).

    Returns
    -------
    dict with ``coherence`` (``||U||_inf``), ``rank_k_coherence`` (``max_i ||U_{i,1:k}||``),
    ``sigma_k_sq``, ``sigma_k1_sq``, ``kappa`` (``sigma_{k+1}^2 / sigma_k^2``), ``eigengap``
    and ``max_row_norm``.
    """
    from dpprecond._validation import check_int

    A = np.asarray(A, dtype=np.float64)
    k = check_int("k", k, low=1, high=A.shape[1])
    U, s = left_singular_vectors(A)
    s2 = np.concatenate([s**2, np.zeros(max(0, k + 1 - s.size))])
    return {
        "coherence": float(np.abs(U).max()),
        "rank_k_coherence": float(np.sqrt(np.einsum("ij,ij->i", U[:, :k], U[:, :k]).max())),
        "sigma_k_sq": float(s2[k - 1]),
        "sigma_k1_sq": float(s2[k]),
        "kappa": float(s2[k] / s2[k - 1]) if s2[k - 1] > 0 else float("nan"),
        "eigengap": float(s2[k - 1] - s2[k]),
        "max_row_norm": float(np.sqrt(np.einsum("ij,ij->i", A, A).max())),
    }
