"""Every method warns when its test loss climbs (the paper's sofim is one case of many)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

from dpprecond.fl import FLConfig, run_federated
from dpprecond.fl.divergence import CLIMB_RATIO, DivergenceWarning, find_climb
from dpprecond.fl.methods import METHODS, method_options
from dpprecond.fl.models import LinearSoftmax


def _history(losses: list[float]) -> list[dict[str, float]]:
    return [{"round": i + 1, "test_loss": loss, "test_accuracy": 0.5 - 0.01 * i}
            for i, loss in enumerate(losses)]


def test_find_climb_reads_the_last_loss_against_the_lowest() -> None:
    assert find_climb(_history([2.3, 1.0, 0.5, 0.4])) is None  # learning
    assert find_climb(_history([2.3, 1.0, 1.0 * CLIMB_RATIO * 0.99])) is None  # wandering
    climb = find_climb(_history([3.99, 2.0, 9.0, 18.0]))
    assert climb is not None and (climb.best_round, climb.last_round) == (2, 4)
    assert climb.ratio == pytest.approx(9.0)
    assert climb.best_accuracy == 0.5 and climb.best_accuracy_round == 1
    blown = find_climb(_history([2.0, 1.0, math.inf]))
    assert blown is not None and math.isinf(blown.ratio)
    assert find_climb(_history([1.0, 5.0])) is None  # too short to read a trend
    text = climb.describe("scaffold")
    assert "'scaffold'" in text and "from 2 (round 2) to 18 (round 4)" in text
    assert "9.0 times its lowest" in text and "raise epsilon" in text


class _ClimbingLoss(LinearSoftmax):
    """The linear head, reporting a test loss that doubles every round (the engine's hook
    must see it whatever the method)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = 0

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        loss, acc = super().evaluate(params, X, y)
        self.calls += 1
        return loss * 2.0 ** self.calls, acc


@pytest.mark.parametrize("algorithm", list(METHODS))
def test_every_method_warns_when_its_test_loss_climbs(algorithm: str) -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(120, 6)), rng.integers(0, 3, 120)
    with pytest.warns(DivergenceWarning, match=f"method '{algorithm}': the test loss climbed"):
        run_federated(X, y, X[:30], y[:30], 3, algorithm=algorithm, n_clients=3,
                      config=FLConfig(n_rounds=4, target_epsilon=2.0), seed=0,
                      model=_ClimbingLoss(6, 3))


@pytest.mark.parametrize("algorithm", list(METHODS))
def test_no_method_warns_when_it_learns(algorithm: str, digits: Any) -> None:
    """Non-private runs on digits: the loss falls, no warning (no false alarm)."""
    ds = digits
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        res = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                            algorithm=algorithm, n_clients=5,
                            config=FLConfig(n_rounds=10, noise_multiplier=0.0), seed=0)
    assert res.history[-1]["test_loss"] < res.history[0]["test_loss"]


def test_a_real_climb_warns(digits: Any) -> None:
    """DP-FedGD at ten times its step size and epsilon 0.3: the noise drives the loss up."""
    ds = digits
    lr = 10 * method_options("fedgd")["learning_rate"].default
    with pytest.warns(DivergenceWarning, match="method 'fedgd'"):
        run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                      algorithm="fedgd", n_clients=10, learning_rate=lr,
                      config=FLConfig(n_rounds=20, target_epsilon=0.3), seed=0)


@pytest.fixture(scope="module")
def digits() -> Any:
    from dpprecond.features import load_features

    return load_features("digits")[0]
