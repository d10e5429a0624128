"""A synthetic multinomial-logistic classification problem for federated experiments.

:func:`multinomial_logistic` draws features ``x ~ N(0, I_d)`` and a ground-truth linear
softmax model ``W ~ N(0, scale^2 / d)`` with bias, then samples every label from
``softmax(W^T [x, 1])``: the Bayes-optimal classifier is the linear head itself, so the
non-private optimum of a linear softmax head is the Bayes rate (0.85 on the test split at
the defaults and ``seed=0``; :func:`bayes_accuracy` computes it).
Federated splits (for example Dirichlet(0.1) over 100 clients) are made by
:func:`dpprecond.fl.partition.make_partition`, as for every data set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpprecond._validation import check_fraction, check_int, check_positive, check_random_state
from dpprecond.data.base import Dataset

__all__ = ["bayes_accuracy", "multinomial_logistic"]


def _true_model(gen: np.random.Generator, d: int, k: int, scale: float) -> np.ndarray:
    return gen.standard_normal((d + 1, k)) * (scale / np.sqrt(d))


def _labels(gen: np.random.Generator, X: np.ndarray, W: np.ndarray) -> np.ndarray:
    logits = np.hstack([X, np.ones((X.shape[0], 1))]) @ W
    logits -= logits.max(axis=1, keepdims=True)
    P = np.exp(logits)
    P /= P.sum(axis=1, keepdims=True)
    u = gen.random((X.shape[0], 1))
    return np.minimum((P.cumsum(axis=1) < u).sum(axis=1), W.shape[1] - 1).astype(np.int64)


def multinomial_logistic(n: int = 10000, d: int = 20, n_classes: int = 10, *,
                         scale: float = 8.0, test_fraction: float = 0.2,
                         seed: Any = None) -> Dataset:
    """A labelled train/test split of a multinomial-logistic model (see the module docstring).

    Parameters
    ----------
    n : int
        Records in all (train plus test).
    d : int
        Features.
    n_classes : int
        Classes (at least 2).
    scale : float
        Norm scale of the true model's columns: larger is more separable.
    test_fraction : float
        Share of the records held out as the test split.
    seed : None, int, SeedSequence or Generator
        Randomness of the model, the features and the labels (an int or a SeedSequence
        makes the problem reproducible, and :func:`bayes_accuracy` needs one).

    Returns
    -------
    Dataset
        Features of shape ``(n_train, d)`` and labels in ``[0, n_classes)``.
    """
    n = check_int("n", n, low=2)
    d = check_int("d", d, low=1)
    k = check_int("n_classes", n_classes, low=2)
    scale = check_positive("scale", scale)
    frac = check_fraction("test_fraction", test_fraction, low_open=True)
    gen = check_random_state("seed", seed)
    W = _true_model(gen, d, k, scale)
    X = gen.standard_normal((n, d))
    y = _labels(gen, X, W)
    n_test = max(1, min(n - 1, round(frac * n)))
    return Dataset("multinomial-logistic", X[n_test:], y[n_test:], X[:n_test], y[:n_test],
                   n_classes=k)


def bayes_accuracy(n: int = 10000, d: int = 20, n_classes: int = 10, *, scale: float = 8.0,
                   test_fraction: float = 0.2, seed: Any = None) -> float:
    """Test accuracy of the true model of :func:`multinomial_logistic` (same arguments).

    The argmax of the true logits is the Bayes-optimal rule, so no classifier does better
    in expectation; a non-private linear head approaches it.
    """
    data = multinomial_logistic(n, d, n_classes, scale=scale, test_fraction=test_fraction,
                                seed=seed)
    gen = check_random_state("seed", seed)
    W = _true_model(gen, d, n_classes, scale)
    logits = np.hstack([data.X_test, np.ones((data.X_test.shape[0], 1))]) @ W
    return float(np.mean(logits.argmax(axis=1) == data.y_test))
