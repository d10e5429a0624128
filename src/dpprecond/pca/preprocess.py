"""Row scaling and explicit centering before private PCA.

Privacy unit: one row of ``X`` (one individual), replace-one adjacency. Every algorithm of
:mod:`dpprecond.pca` assumes rows of l2 norm at most 1. The caller supplies a *public*
bound ``row_norm``: rows are divided by it and any row whose norm is still above 1 is
scaled down to norm 1 (never dropped). That map is applied row by row, so neighbouring
inputs stay neighbouring; the number of scaled-down rows is reported (it is not released
by the mechanisms and is meant for the data owner).

Centering is explicit:

- ``center=None`` (default): no centering, the uncentered problem of the paper;
- a public mean (an array of shape ``(d,)``, in the units of ``X``): costs no budget;
- ``center="private"``: the mean of the scaled rows released by the Gaussian mechanism.
  Replace-one l2 sensitivity of ``(1/n) sum_i a_i`` with ``||a_i|| <= 1`` and public ``n``
  is ``2/n`` (tight for a row ``a`` replaced by ``-a``); noise std is
  ``noise_multiplier * 2/n``; its event is composed with the PCA's (see
  :mod:`dpprecond.pca.budget`).

After centering (public or private mean) rows may exceed norm 1 again (up to
``1 + ||mean||``). They are re-bounded the same way: each row above norm 1 is scaled down
to norm 1. This uses only the row itself and the public (or already released) mean, so it
is post-processing row by row and neighbouring inputs stay neighbouring. In all cases
``row_norm`` bounds the raw rows ``X``, before centering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpprecond.pca.noise import gaussian_matrix

__all__ = [
    "PreprocessedRows",
    "bound_rows",
    "mean_sensitivity",
    "preprocess",
    "row_scales",
    "scaled_gram",
]


def mean_sensitivity(n_samples: int) -> float:
    """Replace-one l2 sensitivity of the mean of ``n_samples`` rows of norm <= 1: ``2/n``."""
    return 2.0 / n_samples


def bound_rows(A: np.ndarray) -> tuple[np.ndarray, int]:
    """Scale every row of norm above 1 down to norm 1 (in place); return ``(A, n_scaled)``."""
    norms = np.sqrt(np.einsum("ij,ij->i", A, A))
    over = norms > 1.0
    n_over = int(np.count_nonzero(over))
    if n_over:
        A[over] /= norms[over, None]
    return A, n_over


@dataclass(frozen=True)
class PreprocessedRows:
    """Result of :func:`preprocess`.

    Attributes
    ----------
    A : ndarray of shape (n, d)
        Scaled (and centered) rows, each of l2 norm <= 1; sorted by increasing norm when
        :func:`preprocess` was asked to (the row order does not matter to PCA).
    mean : ndarray of shape (d,) or None
        The mean subtracted, in the units of the raw ``X`` (``None`` when not centered).
    n_clipped : int
        Rows scaled down after the division by ``row_norm``.
    n_clipped_centered : int
        Rows scaled down again after centering.
    norms : ndarray of shape (n,)
        l2 norms of the rows of ``A`` (same order).
    """

    A: np.ndarray
    mean: np.ndarray | None
    n_clipped: int
    n_clipped_centered: int
    norms: np.ndarray


def _row_norms(X: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", X, X))


def _scale_factors(norms: np.ndarray, row_norm: float) -> tuple[np.ndarray, int]:
    """Per-row factor of ``x -> x / row_norm`` then scaling down to norm <= 1."""
    over = norms > row_norm
    scale = np.full(norms.shape, 1.0 / row_norm)
    scale[over] = 1.0 / norms[over]
    return scale, int(np.count_nonzero(over))


def row_scales(X: np.ndarray, row_norm: float,
               norms: np.ndarray | None = None) -> np.ndarray:
    """Per-row factors ``scale_i`` with ``a_i = scale_i x_i`` (division, then norm <= 1)."""
    return _scale_factors(_row_norms(X) if norms is None else norms, row_norm)[0]


def scaled_gram(X: np.ndarray, row_norm: float,
                norms: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``A^T A`` for the uncentered scaled rows, without materializing ``A``.

    ``A = D X`` with ``D = diag(scale_i)``, so ``A^T A = X^T X / row_norm^2`` minus
    ``(1/row_norm^2 - 1/||x_i||^2) x_i x_i^T`` over the rows scaled down. Returns the Gram
    matrix and the number of scaled-down rows. ``norms`` (the row norms of ``X``) may be
    passed when already known.
    """
    norms = _row_norms(X) if norms is None else norms
    scale, n_over = _scale_factors(norms, row_norm)
    S = X.T @ X
    S *= 1.0 / row_norm**2
    if n_over:
        idx = np.flatnonzero(norms > row_norm)
        Xc = X[idx] * np.sqrt(1.0 / row_norm**2 - scale[idx] ** 2)[:, None]
        S -= Xc.T @ Xc
    return S, n_over


def preprocess(X: np.ndarray, row_norm: float, *, center: str | np.ndarray | None = None,
               mean_noise_multiplier: float = 0.0, rng: np.random.Generator | None = None,
               sort_by_norm: bool = False) -> PreprocessedRows:
    """Divide rows by ``row_norm``, bound them to norm 1 and optionally center them.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Raw data, already validated (finite floats). Never modified.
    row_norm : float
        Public bound on the raw row norms (> 0).
    center : None, "private" or ndarray of shape (d,)
        Centering mode (see the module docstring).
    mean_noise_multiplier : float
        Noise multiplier of the private mean (``center="private"`` only); ``0`` releases the
        exact mean (non-private, for tests).
    rng : numpy.random.Generator
        Randomness for the private mean.
    sort_by_norm : bool, default=False
        Return the rows sorted by increasing norm (one copy of ``X`` either way when not
        centered).

    Returns
    -------
    PreprocessedRows
    """
    X = np.asarray(X, dtype=np.float64)
    scale, n_clipped = _scale_factors(_row_norms(X), row_norm)
    if center is None and sort_by_norm:
        order = np.argsort(scale * _row_norms(X), kind="stable")
        A = X[order]
        A *= scale[order, None]
        return PreprocessedRows(A, None, n_clipped, 0, _row_norms(A))
    A = X * scale[:, None]
    if center is None:
        return PreprocessedRows(A, None, n_clipped, 0, _row_norms(A))
    n, d = A.shape
    if isinstance(center, str):  # "private"; validated by the caller
        if rng is None:
            raise ValueError("center='private' needs an explicit rng for the mean's noise.")
        mu = A.mean(axis=0)
        mu += gaussian_matrix((d,), mean_noise_multiplier * mean_sensitivity(n), rng)
    else:
        mu = np.asarray(center, dtype=np.float64) / row_norm
    A -= mu
    A, n_clipped_centered = bound_rows(A)
    norms = _row_norms(A)
    if sort_by_norm:
        order = np.argsort(norms, kind="stable")
        A, norms = A[order], norms[order]
    return PreprocessedRows(A, mu * row_norm, n_clipped, n_clipped_centered, norms)
