"""Standardized pixels: a fixed affine map, no statistic of the data."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.data import Dataset, load_digits
from dpprecond.features import featurize, standardize_pixels


def tiny(n_train: int = 6, n_test: int = 3, shape: tuple[int, ...] = (4, 4, 3),
         seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    return Dataset("tiny", rng.random((n_train, d)), rng.integers(0, 3, n_train),
                   rng.random((n_test, d)), rng.integers(0, 3, n_test), n_classes=3,
                   image_shape=shape)


def test_fixed_rule_maps_unit_interval_to_symmetric() -> None:
    ds = tiny()
    out = featurize(ds, "pixels")
    np.testing.assert_array_equal(out.X_train, (ds.X_train - 0.5) / 0.5)
    np.testing.assert_array_equal(out.X_test, (ds.X_test - 0.5) / 0.5)
    np.testing.assert_array_equal(standardize_pixels(np.array([[0.0, 0.5, 1.0]])),
                                  [[-1.0, 0.0, 1.0]])
    assert out.name == "tiny+pixels" and out.image_shape is None and out.n_classes == 3
    np.testing.assert_array_equal(out.y_train, ds.y_train)
    assert out.X_train.dtype == np.float64
    assert ds.X_train.min() >= 0.0  # input untouched


def test_no_dependence_on_other_records() -> None:
    """Changing every other training record leaves a record's features unchanged."""
    a, b = tiny(seed=1), tiny(seed=2)
    X = b.X_train.copy()
    X[0] = a.X_train[0]
    b2 = Dataset("tiny", X, b.y_train, b.X_test, b.y_test, n_classes=3, image_shape=(4, 4, 3))
    np.testing.assert_array_equal(featurize(a).X_train[0], featurize(b2).X_train[0])


def test_real_digits() -> None:
    out = featurize(load_digits(), "pixels")
    assert out.X_train.shape[1] == 64
    assert out.X_train.min() >= -1.0 and out.X_train.max() <= 1.0
    assert out.X_train.min() == -1.0 and out.X_train.max() == 1.0


def test_bad_inputs() -> None:
    ds = tiny()
    with pytest.raises(ValueError, match=r"Unknown kind='vgg'"):
        featurize(ds, "vgg")
    with pytest.raises(TypeError, match=r"dpprecond.data.Dataset"):
        featurize(ds.X_train, "pixels")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"raw pixels in \[0, 1\]"):
        featurize(featurize(ds, "pixels"), "pixels")
    with pytest.raises(ValueError, match=r"batch_size >= 1"):
        featurize(ds, "pixels", batch_size=0)
