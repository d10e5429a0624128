"""A fixed random feature map: the data-independent control for private PCA features.

``z = cos(x G + b)`` with ``G`` i.i.d. ``N(0, 1/d)`` and ``b`` uniform on ``[0, 2 pi)``
(random Fourier features of a Gaussian kernel of bandwidth about ``sqrt(d)``, the scale
of a row of fixed-standardized pixels). ``G`` and ``b`` come from a public seed and use no
data, so the map costs no privacy budget: it measures what spending budget on private
PCA features buys. Every feature lies in ``[-1, 1]``.
"""

from __future__ import annotations

import numpy as np

from dpprecond._validation import check_array, check_int

__all__ = ["random_fourier_features"]


def random_fourier_features(X: np.ndarray, n_features: int = 64, *,
                            seed: int = 0) -> np.ndarray:
    """``cos(X G + b)`` of shape (n, n_features) (see the module docstring).

    ``seed`` is public (the map must be the same for every client and for the test set);
    it is not the seed of any noise.
    """
    X = check_array("X", X)
    n_features = check_int("n_features", n_features, low=1)
    rng = np.random.default_rng(check_int("seed", seed, low=0))
    d = X.shape[1]
    G = rng.standard_normal((d, n_features)) / np.sqrt(d)
    b = rng.uniform(0.0, 2.0 * np.pi, n_features)
    return np.cos(X @ G + b)
