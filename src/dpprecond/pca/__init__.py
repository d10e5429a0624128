"""Coherence-adaptive private top-k PCA and its baselines.

Layout (functional core, thin shells):

- :mod:`~dpprecond.pca.rows`: the clipped rows of ``A`` (division by the public
  ``row_norm``, clipping, centering), read block by block; every release is a sum over them;
- :mod:`~dpprecond.pca.preprocess`: the same rows as one array (for evaluation);
- :mod:`~dpprecond.pca.core`: Algorithms 1-3 (private init, preconditioned clipped block
  power iteration, private selection of (R, T)); every release is
  :func:`dpprecond.noise.release`;
- :mod:`~dpprecond.pca.baselines`: Analyze Gauss, DP power method, exact top-k;
- :mod:`~dpprecond.pca.budget`: (epsilon, delta, split) -> noise multipliers and DpEvent;
- :mod:`~dpprecond.pca.metrics`: sin-theta, captured variance, coherence, eigengap;
- :mod:`~dpprecond.pca.methods`: the registry of methods (options, budget plan, run);
- :mod:`~dpprecond.pca.api`: :func:`fit_private_pca` (what the CLI calls);
- :mod:`~dpprecond.pca.estimator`: the scikit-learn style :class:`PrivatePCA`.
"""

from dpprecond.pca.api import DEFAULT_METHOD, PCAResult, fit_private_pca
from dpprecond.pca.methods import METHODS
from dpprecond.pca.metrics import (
    captured_variance_ratio,
    coherence,
    eigengap,
    rank_k_coherence,
    sin_theta,
    sin_theta_frobenius,
)

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "PCAResult",
    "PrivatePCA",
    "captured_variance_ratio",
    "coherence",
    "eigengap",
    "fit_private_pca",
    "rank_k_coherence",
    "sin_theta",
    "sin_theta_frobenius",
]


def __getattr__(name: str):  # the estimator imports scikit-learn: load it on demand
    if name == "PrivatePCA":
        from dpprecond.pca.estimator import PrivatePCA

        return PrivatePCA
    raise AttributeError(f"module 'dpprecond.pca' has no attribute {name!r}")
