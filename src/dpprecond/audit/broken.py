"""Mechanisms with known privacy bugs, reimplemented for the audits to catch.

An audit that cannot tell a broken mechanism from a correct one shows nothing; these
references are the evidence that the audits of :mod:`dpprecond.audit.cases` have power
(``tests/test_audit.py`` and ``benchmarks/privacy_audit.py`` run them). They are never
used by a release of the library.
"""

from __future__ import annotations

import numpy as np

__all__ = ["extreme_norm_pair", "old_scaled_gram"]


def old_scaled_gram(X: np.ndarray, row_norm: float) -> np.ndarray:
    """The Gram matrix as computed before commit c0181e8 (privacy hole 1), reimplemented.

    ``X^T X / row_norm^2`` minus ``(1/row_norm^2 - 1/||x_i||^2) x_i x_i^T`` over the rows
    scaled down: for a row of norm 1e9 the subtraction cancels ~1e18 against ~1e18.
    """
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    over = norms > row_norm
    scale = np.full(norms.shape, 1.0 / row_norm)
    scale[over] = 1.0 / norms[over]
    S = X.T @ X
    S *= 1.0 / row_norm**2
    idx = np.flatnonzero(over)
    if idx.size:
        Xc = X[idx] * np.sqrt(1.0 / row_norm**2 - scale[idx] ** 2)[:, None]
        S -= Xc.T @ Xc
    return S


def extreme_norm_pair() -> tuple[np.ndarray, np.ndarray]:
    """Hole 1's pair: row 0 = e1 against row 0 = 1e9 e1, identical after the scaling."""
    X = np.random.default_rng(0).normal(size=(2000, 6))
    X /= np.linalg.norm(X, axis=1).max()
    X[0] = np.eye(6)[0]
    Y = X.copy()
    Y[0, 0] = 1e9
    return X, Y
