"""Labels and n_classes reaching the federated code: out of range or non-integer is an error.

Before these checks a hand-built ClientData with negative labels trained silently (a label
-1 picks the last class of the one-hot target), a model with more classes than the data
trained silently, one with fewer failed with an IndexError, and the Dirichlet partition
left rows with NaN labels assigned to an uninitialised client index.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, run_federated, simulate
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import dirichlet_partition, make_partition

CONFIG = FLConfig(n_rounds=1, target_epsilon=None, noise_multiplier=1.0)


@pytest.mark.parametrize(("shift", "match"), [(-3, r"got values in \[-3, -1\]"),
                                             (5, r"got values in \[5, 7\]")])
def test_hand_built_client_data_checks_its_labels(problem: tuple, shift: int,
                                                  match: str) -> None:
    X, y, _, _ = problem
    with pytest.raises(ValueError, match=r"Expected y in \[0, 3\), " + match):
        ClientData(X, y + shift, np.array([0, 120, len(y)]), 3)


def test_client_data_refuses_fractional_and_text_labels(problem: tuple) -> None:
    X, y, _, _ = problem
    bounds = np.array([0, len(y)])
    with pytest.raises(ValueError, match=r"non-integer or non-finite value\(s\), first y\[0\]"):
        ClientData(X, y + 0.5, bounds, 3)
    with pytest.raises(TypeError, match=r"integer class labels in y, got dtype <U"):
        ClientData(X, y.astype(str), bounds, 3)
    with pytest.raises(ValueError, match=r"y to have 240 entries"):
        ClientData(X, y[:-1], bounds, 3)
    with pytest.raises(ValueError, match=r"n_classes >= 2, got n_classes=1"):
        ClientData(X, np.zeros(len(y), int), bounds, 1)


def test_client_data_stores_int64_labels(problem: tuple) -> None:
    X, y, _, _ = problem
    data = ClientData(X, y.astype(np.float32), np.array([0, len(y)]), 3)
    assert data.y.dtype == np.int64
    np.testing.assert_array_equal(data.y, y)


@pytest.mark.parametrize("model_classes", [2, 5])
def test_model_classes_must_match_the_data(problem: tuple, model_classes: int) -> None:
    X, y, X_te, y_te = problem
    with pytest.raises(ValueError, match=rf"model has {model_classes} classes but the data has "
                                         r"n_classes=3; build the model with n_classes=3"):
        run_federated(X, y, X_te, y_te, 3, model=LinearSoftmax(X.shape[1], model_classes),
                      config=CONFIG, n_clients=2, seed=0)


def test_simulate_checks_the_model_against_client_data(client_data: ClientData,
                                                       problem: tuple) -> None:
    _, _, X_te, y_te = problem
    with pytest.raises(ValueError, match=r"model has 4 classes"):
        simulate(LinearSoftmax(X_te.shape[1], 4), client_data, make_method("fedgd", 0.1),
                 CONFIG, X_test=X_te, y_test=y_te, seed=0)


@pytest.mark.parametrize(("labels", "exc", "match"), [
    (np.r_[np.zeros(39), np.nan], ValueError, r"first y\[39\]=nan"),
    (np.arange(40) % 3 + 0.5, ValueError, r"non-integer"),
    (np.arange(40) % 3 - 1, ValueError, r"class labels 0, 1, 2, \.\.\., got values in \[-1, 1\]"),
    ((np.arange(40) % 3).reshape(-1, 1), ValueError, r"1-D, got shape \(40, 1\)"),
    ((np.arange(40) % 3).astype(str), TypeError, r"got dtype <U"),
])
def test_dirichlet_partition_checks_labels(labels: np.ndarray, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        dirichlet_partition(labels, 2, 0.5, 0)
    with pytest.raises(exc, match=match):
        make_partition(labels, 2, "dirichlet", 0.5, 0)


def test_dirichlet_partition_accepts_integer_valued_floats() -> None:
    y = np.arange(40) % 3
    a = dirichlet_partition(y, 3, 0.5, 7)
    b = dirichlet_partition(y.astype(float), 3, 0.5, 7)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def test_complex_features_are_refused_not_truncated(problem: tuple) -> None:
    """np.array(X, dtype=float) dropped the imaginary part with only a ComplexWarning."""
    X, y, X_te, y_te = problem
    with pytest.raises(ValueError, match=r"Complex data not supported in X_train"):
        run_federated(X + 1j, y, X_te, y_te, 3, config=CONFIG, n_clients=2, seed=0)
    with pytest.raises(TypeError, match=r"X_test to be a numeric array, got dtype <U"):
        run_federated(X, y, X_te.astype(str), y_te, 3, config=CONFIG, n_clients=2, seed=0)
