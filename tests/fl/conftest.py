"""Small synthetic federated problems shared by the fl tests."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig
from dpprecond.fl.partition import iid_partition


def mean_gradient(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Reference mean cross-entropy gradient of a linear softmax head with bias (plain numpy)."""
    Xt = np.hstack([X, np.ones((len(X), 1))])
    Z = Xt @ W
    P = np.exp(Z - Z.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    P[np.arange(len(y)), y] -= 1
    return Xt.T @ P / len(y)


def make_problem(n: int = 240, d: int = 6, k: int = 3, seed: int = 0,
                 scale: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian blobs: (X_train, y_train, X_test, y_test)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, d)) * scale
    y = rng.integers(0, k, n + 60)
    X = centers[y] + rng.standard_normal((n + 60, d))
    return X[:n], y[:n], X[n:], y[n:]


@pytest.fixture
def problem() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return make_problem()


@pytest.fixture
def client_data(problem: tuple) -> ClientData:
    X, y, _, _ = problem
    return ClientData.from_partition(X, y, iid_partition(len(y), 4, 1), 3)


#: The settings the tests written for the fixed clip and uniform weights pin (the paper's
#: protocol; the package defaults are size weights and adaptive clipping where it runs).
FIXED: dict = {"adaptive_clip": None, "weighting": "uniform"}


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, ...]:
    """scikit-learn's digits in [0, 1]: (X_train, y_train, X_test, y_test), 1,200 rows to
    train on (a test module may define its own ``digits``)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    return X[:1200], y[:1200], X[1200:], y[1200:]


def secure_config(n_rounds: int, target_epsilon: float, **kw: object) -> FLConfig:
    """A secure-aggregation run's config: C = 1, size weights, ``kw`` on top."""
    base: dict[str, object] = dict(n_rounds=n_rounds, clip_norm=1.0,
                                   target_epsilon=target_epsilon, weighting="size",
                                   trust="secure-aggregation")
    base.update(kw)
    return FLConfig(**base)  # type: ignore[arg-type]
