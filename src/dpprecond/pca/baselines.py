"""Baselines on the same privacy unit (one row, replace-one, rows of norm <= 1).

- :func:`analyze_gauss`: Dwork, Talwar, Thakurta and Zhang (2014). Releases the upper
  triangle of ``A^T A`` plus symmetric Gaussian noise (sensitivity ``sqrt(2)``) once, and
  returns the top-k eigenvectors. Event: ``GaussianDpEvent(z)``.
- :func:`dp_power_method`: the noisy power method in the row model. ``T`` releases
  ``Z = A^T A X + G`` with ``X`` orthonormal: ``||(a a^T - b b^T) X||_F <=
  ||a a^T - b b^T||_F <= sqrt(2)``, so ``G`` has i.i.d. ``N(0, (z sqrt(2))^2)`` entries.
  The budget is split evenly over the ``T`` iterations. Event:
  ``SelfComposedDpEvent(GaussianDpEvent(z), T)`` (after the init's event when it starts
  from Algorithm 1; a random start is data-independent and free).
- :func:`exact_top_k`: the non-private reference.
"""

from __future__ import annotations

import numpy as np

from dpprecond.noise import NoiseSource, release
from dpprecond.pca.core import SQRT2, orthonormalize, private_init, top_eigvecs

__all__ = ["analyze_gauss", "dp_power_method", "exact_top_k", "random_orthonormal"]


def exact_top_k(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenvectors (d, k) and eigenvalues (k,) of ``S = A^T A`` (non-private)."""
    w, V = top_eigvecs(S, k)
    return V, w


def analyze_gauss(S: np.ndarray, k: int, z: float,
                  rng: NoiseSource) -> tuple[np.ndarray, np.ndarray]:
    """Analyze Gauss: top-k eigenvectors and eigenvalues of ``A^T A + W`` (see module doc)."""
    init = private_init(S, k, z, rng)
    return init.X0, init.eigvals[:k]


def random_orthonormal(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random d x k orthonormal basis (data-independent start)."""
    return orthonormalize(rng.standard_normal((d, k)))


def dp_power_method(S: np.ndarray, X0: np.ndarray, n_iter: int, z: float,
                    rng: NoiseSource) -> np.ndarray:
    """Noisy power method: ``T`` times ``X <- QR(A^T A X + G)``, ``G`` std ``z sqrt(2)``.

    Parameters
    ----------
    S : ndarray of shape (d, d)
        ``A^T A`` (the iteration never needs ``A`` itself).
    X0 : ndarray of shape (d, k)
        Orthonormal start (random, or Algorithm 1's output).
    n_iter : int
        Number of noisy iterations ``T``.
    z : float
        Per-iteration noise multiplier (``0``: exact power iteration).
    rng : NoiseSource
        Noise source.
    """
    X = X0
    std = z * SQRT2
    for _ in range(n_iter):
        X = orthonormalize(release(S @ X, std, rng, sensitivity=SQRT2))
    return X
