"""The scaled (and optionally centered) rows ``A`` as one array, for evaluation and tests.

The private methods never materialize ``A``: they read it block by block through
:class:`dpprecond.pca.rows.ClippedRows`, which is where the row map is defined (division by
the public ``row_norm``, rows still above norm 1 scaled down to norm 1, optional centering
by a public or private mean, re-bounded to norm 1). :func:`preprocess` applies the same map
and returns the whole matrix, which metrics such as the captured variance need.

Centering:

- ``center=None`` (default): no centering, the uncentered problem of the paper;
- a public mean (an array of shape ``(d,)``, in the units of ``X``): costs no budget;
- ``center="private"``: the mean of the scaled rows released by the Gaussian mechanism.
  Replace-one l2 sensitivity of ``(1/n) sum_i u_i`` with ``||u_i|| <= 1`` and public ``n``
  is ``2/n`` (tight for a row ``u`` replaced by ``-u``); noise std is
  ``noise_multiplier * 2/n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpprecond.noise import NoiseSource, release
from dpprecond.pca.rows import ClippedRows, mean_sensitivity

__all__ = ["PreprocessedRows", "mean_sensitivity", "preprocess"]


@dataclass(frozen=True)
class PreprocessedRows:
    """Result of :func:`preprocess`.

    Attributes
    ----------
    A : ndarray of shape (n, d)
        Scaled (and centered) rows, each of l2 norm <= 1.
    mean : ndarray of shape (d,) or None
        The mean subtracted, in the units of the raw ``X`` (``None`` when not centered).
    n_clipped : int
        Rows scaled down after the division by ``row_norm``.
    n_clipped_centered : int
        Rows scaled down again after centering.
    norms : ndarray of shape (n,)
        l2 norms of the rows of ``A``.
    """

    A: np.ndarray
    mean: np.ndarray | None
    n_clipped: int
    n_clipped_centered: int
    norms: np.ndarray


def preprocess(X: np.ndarray, row_norm: float, *, center: str | np.ndarray | None = None,
               mean_noise_multiplier: float = 0.0,
               rng: NoiseSource | None = None) -> PreprocessedRows:
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
    rng : NoiseSource
        Randomness for the private mean.

    Returns
    -------
    PreprocessedRows
    """
    X = np.asarray(X, dtype=np.float64)
    rows = ClippedRows.from_data(X, row_norm)
    n = X.shape[0]
    if center is not None:
        if isinstance(center, str):  # "private"; validated by the caller
            if rng is None:
                raise ValueError("center='private' needs an explicit rng for the mean's noise.")
            mu = release(rows.column_sum() / n,
                         mean_noise_multiplier * mean_sensitivity(n), rng)
        else:
            mu = np.asarray(center, dtype=np.float64) / row_norm
        rows = rows.centered(mu)
    mean = None if rows.mean is None else rows.mean * row_norm
    return PreprocessedRows(rows.materialize(), mean, rows.n_clipped, rows.n_clipped_centered,
                            rows.norms)
