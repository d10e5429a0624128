"""The synthetic multinomial-logistic problem of the federated benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.data.synthetic_fl import bayes_accuracy, multinomial_logistic


def test_shapes_labels_and_reproducibility() -> None:
    a = multinomial_logistic(1000, 5, 4, seed=3)
    b = multinomial_logistic(1000, 5, 4, seed=3)
    assert a.X_train.shape == (800, 5) and a.X_test.shape == (200, 5)
    assert a.n_classes == 4 and set(np.unique(a.y_train)) <= {0, 1, 2, 3}
    np.testing.assert_array_equal(a.X_train, b.X_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)


def test_the_default_problem_has_bayes_accuracy_085() -> None:
    assert bayes_accuracy(seed=0) == pytest.approx(0.85, abs=0.01)
    # a more separable problem has a higher Bayes rate
    assert bayes_accuracy(seed=0, scale=16.0) > bayes_accuracy(seed=0, scale=4.0)


def test_the_labels_follow_the_true_softmax() -> None:
    ds = multinomial_logistic(40000, 3, 2, scale=0.01, seed=1)  # near-uniform probabilities
    assert np.mean(ds.y_train) == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(("kwargs", "name"), [({"n": 1}, "n"), ({"d": 0}, "d"),
                                              ({"n_classes": 1}, "n_classes"),
                                              ({"scale": -1.0}, "scale"),
                                              ({"test_fraction": 1.0}, "test_fraction")])
def test_bad_arguments_are_refused_by_name(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        multinomial_logistic(**kwargs)
