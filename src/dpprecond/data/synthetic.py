"""The synthetic data families of the PCA spec (seeded; they return the matrix).

1. :func:`spiked_covariance`: i.i.d. rows ``x ~ N(0, I_d + theta V V^T)``, ``V`` a random
   d x k orthonormal basis; every row divided by the largest row norm (rows of norm <= 1,
   spread spectrum, low coherence).
2. :func:`coherent_spiked`: the same, but only a fraction ``f`` of the rows carries the
   spike, so the top-k leverage concentrates on few rows (coherence rises as f falls).
3. :func:`exact_spectrum`: ``A = U diag(sigma) V^T`` with random orthonormal ``U, V`` and
   ``sigma_{k+1}^2 / sigma_k^2 = kappa``.

:func:`dpprecond.pca.metrics.describe` reports what was measured on a matrix after scaling
(coherence, rank-k coherence, sigma_k^2, kappa), never the generator's parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpprecond._validation import check_fraction, check_int, check_positive, check_random_state

__all__ = ["coherent_spiked", "exact_spectrum", "spiked_covariance"]


def _orthonormal(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.standard_normal((rows, cols)))
    return Q * np.sign(np.diag(R))


def _check_shape(n: int, d: int, k: int) -> tuple[int, int, int]:
    d = check_int("d", d, low=1)
    n = check_int("n", n, low=d)
    k = check_int("k", k, low=1, high=d)
    return n, d, k


def _normalize_rows(X: np.ndarray) -> np.ndarray:
    return X / np.sqrt(np.einsum("ij,ij->i", X, X).max())


def spiked_covariance(n: int, d: int, k: int, theta: float, seed: Any = None) -> np.ndarray:
    """Family 1: i.i.d. spiked-covariance rows, scaled so that the largest row norm is 1.

    Parameters
    ----------
    n, d, k : int
        Rows, columns and spike rank (``n >= d >= k >= 1``).
    theta : float
        Spike strength (``> 0``).
    seed : None, int, SeedSequence or numpy.random.Generator
        Seed or generator.

    Returns
    -------
    A : ndarray of shape (n, d)
    """
    n, d, k = _check_shape(n, d, k)
    theta = check_positive("theta", theta)
    return coherent_spiked(n, d, k, theta, 1.0, seed)


def coherent_spiked(n: int, d: int, k: int, theta: float, fraction: float,
                    seed: Any = None) -> np.ndarray:
    """Family 2: the spike ``theta V V^T`` is carried only by a fraction of the rows.

    ``max(1, round(fraction * n))`` rows (chosen at random) are drawn from
    ``N(0, I + theta V V^T)``, the others from ``N(0, I)``; then every row is divided by the
    largest row norm.
    """
    n, d, k = _check_shape(n, d, k)
    theta = check_positive("theta", theta)
    fraction = check_fraction("fraction", fraction, low=0.0, high=1.0, low_open=True,
                              high_open=False)
    gen = check_random_state("seed", seed)
    V = _orthonormal(gen, d, k)
    X = gen.standard_normal((n, d))
    m = max(1, round(fraction * n))
    rows = gen.choice(n, size=m, replace=False) if m < n else np.arange(n)
    # x = g + (sqrt(1 + theta) - 1) V V^T g has covariance I + theta V V^T.
    G = X[rows]
    X[rows] = G + (np.sqrt(1.0 + theta) - 1.0) * (G @ V) @ V.T
    return _normalize_rows(X)


def exact_spectrum(n: int, d: int, k: int, kappa: float, seed: Any = None, *,
                   sigma_k: float = 1.0, decay: float = 0.9) -> np.ndarray:
    """Family 3: ``A = U diag(sigma) V^T`` with ``sigma_{k+1}^2 / sigma_k^2 = kappa``.

    The top k singular values are ``sigma_k`` (flat); the tail starts at
    ``sigma_{k+1} = sqrt(kappa) sigma_k`` and decays geometrically by ``decay`` per index.
    The matrix is not rescaled: choose ``sigma_k`` so that rows have norm <= 1 if needed
    (:func:`dpprecond.pca.metrics.describe` reports the largest row norm).
    """
    n, d, k = _check_shape(n, d, k)
    kappa = check_fraction("kappa", kappa, low=0.0, high=1.0, low_open=False, high_open=True)
    sigma_k = check_positive("sigma_k", sigma_k)
    decay = check_fraction("decay", decay, low=0.0, high=1.0, low_open=True, high_open=False)
    gen = check_random_state("seed", seed)
    U = _orthonormal(gen, n, d)
    V = _orthonormal(gen, d, d)
    sigma = np.empty(d)
    sigma[:k] = sigma_k
    sigma[k:] = np.sqrt(kappa) * sigma_k * decay ** np.arange(d - k)
    return (U * sigma) @ V.T
