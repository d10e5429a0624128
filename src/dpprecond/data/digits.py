"""scikit-learn's bundled digits: the embedded default dataset (always available)."""

from __future__ import annotations

import numpy as np

from dpprecond.data.base import Dataset

__all__ = ["load_digits"]

#: Seed of the fixed train/test split; part of the dataset's definition, not a user knob.
SPLIT_SEED = 20260101
TEST_FRACTION = 0.2


def load_digits() -> Dataset:
    """Load the 1797 8x8 digit images with pixels scaled to [0, 1].

    The data has no official test split: a fixed stratified split (20% test, seed
    ``SPLIT_SEED``) makes every run of the project use the same one.
    """
    from sklearn.datasets import load_digits as _sk_digits
    from sklearn.model_selection import train_test_split

    bunch = _sk_digits()
    X = bunch.data.astype(np.float64) / 16.0
    y = bunch.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    return Dataset("digits", X_tr, y_tr, X_te, y_te, n_classes=10, image_shape=(8, 8, 1))
