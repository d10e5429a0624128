"""Gaussian noise for the releases of the private PCA algorithms.

Every function here draws noise for a release whose l2 sensitivity is stated by the caller;
the standard deviation is always ``noise_multiplier * sensitivity`` (the accounting layer's
convention). Noise is drawn from an explicit ``numpy.random.Generator``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gaussian_matrix", "symmetric_gaussian"]


def symmetric_gaussian(dim: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric Gaussian matrix: upper triangle (with diagonal) i.i.d. ``N(0, std^2)``, mirrored.

    This is the noise of a release of the upper triangle (diagonal included) of a symmetric
    matrix statistic: the lower triangle is a copy, hence post-processing, so the l2
    sensitivity of the release is the one of the upper triangle.

    Parameters
    ----------
    dim : int
        Size of the (dim, dim) matrix.
    std : float
        Standard deviation of every upper-triangle entry; ``0`` gives the zero matrix.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    W : ndarray of shape (dim, dim)
        Symmetric noise matrix.
    """
    if std == 0:
        return np.zeros((dim, dim))
    g = rng.standard_normal((dim, dim))
    w = np.triu(g)
    w = w + np.triu(w, 1).T
    w *= std
    return w


def gaussian_matrix(shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``N(0, std^2)`` entries of the given shape (zeros when ``std == 0``)."""
    if std == 0:
        return np.zeros(shape)
    return std * rng.standard_normal(shape)
