"""Standardized pixels with fixed, data-independent constants.

Rule: ``x -> (x - 0.5) / 0.5``, mapping pixels in [0, 1] to [-1, 1].

Why not the usual per-feature (or per-channel) mean and standard deviation? Estimating them
on the training set is a release about the private records that the DP accounting of the
federated algorithms does not cover: it would need its own mechanism and budget. Published
per-dataset constants (e.g. CIFAR-10's channel means 0.4914, 0.4822, 0.4465) are no better
in principle, because they were computed from that same training set. A fixed affine map uses
no data at all, so it is free post-processing of the public input domain; it roughly centres
pixels (which is what matters for the conditioning of a linear head) and keeps every feature
in [-1, 1], hence every row's norm at most ``sqrt(d)``. Since the head has a bias, a fixed
shift does not change which models are representable, only the geometry gradient methods see.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PIXEL_CENTER", "PIXEL_SCALE", "check_unit_pixels", "standardize_pixels"]

#: Fixed centre of the standardization (the midpoint of the pixel range [0, 1]).
PIXEL_CENTER = 0.5
#: Fixed scale of the standardization (half the width of the pixel range).
PIXEL_SCALE = 0.5


def check_unit_pixels(name: str, X: np.ndarray) -> None:
    """Raise ``ValueError`` unless every entry of ``X`` lies in [0, 1] (raw loader output)."""
    if X.size and (X.min() < 0.0 or X.max() > 1.0):
        raise ValueError(
            f"Expected {name} to hold raw pixels in [0, 1] as returned by "
            f"dpprecond.data.load_dataset, got values in [{X.min():.4g}, {X.max():.4g}]. "
            "Featurize the loader's output, not already transformed features.")


def standardize_pixels(X: np.ndarray) -> np.ndarray:
    """Map pixels in [0, 1] to [-1, 1] with the fixed rule ``(X - 0.5) / 0.5``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Pixels scaled to [0, 1].

    Returns
    -------
    ndarray of shape (n, d), float64
        A new array; ``X`` is not changed.
    """
    out = np.asarray(X, dtype=np.float64) - PIXEL_CENTER
    out /= PIXEL_SCALE
    return out
