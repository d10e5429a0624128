"""The per-run test evaluator (dpprecond.fl.models.round_evaluator) and the logits' layout."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl.models import LinearSoftmax, round_evaluator


def _problem(scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, LinearSoftmax]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 7))
    X[5] *= scale  # one row far out: the overflow-safe logits when scale is huge
    y = rng.integers(0, 4, 300)
    model = LinearSoftmax(7, 4)
    params = rng.standard_normal(model.n_params)
    return X, y, params, model


@pytest.mark.parametrize("scale", [1.0, 1e8, 1e300])
def test_round_evaluator_gives_evaluate_s_numbers(scale: float) -> None:
    X, y, params, model = _problem(scale)
    evaluate = round_evaluator(model, X, y)
    for step in range(3):  # the kept norms serve every round
        p = params * (step + 1)
        loss, acc = evaluate(p)
        assert (loss, acc) == model.evaluate(p, X, y)
        assert np.isfinite(loss) and 0.0 <= acc <= 1.0


def test_round_evaluator_calls_an_overriding_evaluate_as_it_is() -> None:
    X, y, params, _ = _problem()
    calls = []

    class Custom(LinearSoftmax):
        def evaluate(self, params, X, y):  # no x_sq_norms keyword
            calls.append(X.shape)
            return 1.0, 0.5

    assert round_evaluator(Custom(7, 4), X, y)(params) == (1.0, 0.5)
    assert calls == [X.shape]


def test_logits_are_the_plain_product_up_to_rounding() -> None:
    X, _, params, model = _problem()
    W = params.reshape(8, 4)
    L = model.logits(params, X)
    assert L.shape == (300, 4)
    np.testing.assert_allclose(L, X @ W[:-1] + W[-1], rtol=1e-13, atol=1e-13)
    assert np.array_equal(np.argmax(L, axis=1), np.argmax(np.ascontiguousarray(L), axis=1))
