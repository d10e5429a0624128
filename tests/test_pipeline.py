"""Private PCA features then DP federated training: one ledger, the total per record."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.features import load_features
from dpprecond.pipeline import parse_features, run_pipeline, split_budget


@pytest.fixture(scope="module")
def digits():
    ds, _ = load_features("digits")
    return ds


def test_budget_split_adds_up_exactly() -> None:
    e1, e2 = split_budget(2.0, 1e-5, 0.25)
    # two Gaussian releases at these epsilons compose to the target (precisions add)
    from dpprecond.accounting import calibrate_noise, gaussian

    z1 = calibrate_noise(gaussian, e1, 1e-5, "pld")
    z2 = calibrate_noise(gaussian, e2, 1e-5, "pld")
    total = epsilon_of(dp_event.ComposedDpEvent([gaussian(z1), gaussian(z2)]), 1e-5, "pld")
    assert total == pytest.approx(2.0, rel=1e-3)
    assert e1 < e2 < 2.0


def test_pca_features_pipeline_spends_the_total_once(digits) -> None:
    res = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                       features="pca:16", target_epsilon=4.0, row_norm=8.0, pca_share=0.3,
                       algorithm="fedgd", n_clients=5, n_rounds=10, seed=0)
    assert res.epsilon <= 4.0 and res.epsilon == pytest.approx(4.0, rel=1e-3)
    events = res.ledger.events
    assert len(events) == 1 + 10  # the Gram release of the PCA, then one per round
    assert res.pca_epsilon < 4.0
    assert res.components.shape == (16, 64)  # rows, as scikit-learn's components_
    assert np.isfinite(res.fl.params).all()
    # the FL run's own epsilon is its share only
    assert res.fl.epsilon < res.epsilon


def test_random_features_cost_nothing_and_non_private_runs(digits) -> None:
    free = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                        features="random:32", target_epsilon=2.0, row_norm=8.0,
                        algorithm="fedgd", n_clients=5, n_rounds=5, seed=0)
    assert free.ledger.n_releases == 5 and free.pca_epsilon is None
    assert free.epsilon == pytest.approx(2.0, rel=1e-3)
    exact = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                         features="pca:16", target_epsilon=None, row_norm=8.0,
                         algorithm="fedgd", n_clients=5, n_rounds=30, seed=0)
    assert math.isinf(exact.epsilon) and exact.final_accuracy > 0.8


def test_parse_features() -> None:
    assert parse_features("pca:64") == ("pca", 64)
    assert parse_features("random:8") == ("random", 8)
    assert parse_features("pixels") == ("pixels", None)
    for bad in ("pca", "pca:0", "pca:x", "svd:4"):
        with pytest.raises(ValueError, match="features"):
            parse_features(bad)


def test_a_capped_ledger_refuses_the_whole_plan_before_any_stage(digits) -> None:
    """Issue 17, hole 3: with a cap of 0.8 and a target of 1, the PCA stage (0.415) was
    released and charged before the training was refused. The whole plan (both stages) is
    checked first: nothing is released, nothing is recorded."""
    from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger

    for features in ("pca:8", "random:8", "pixels"):
        ledger = PrivacyLedger(1e-5, max_epsilon=0.8)
        with pytest.raises(PrivacyBudgetExceededError, match=r"max_epsilon=0\.8"):
            run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                         features=features, target_epsilon=1.0, row_norm=8.0,
                         algorithm="fedgd", n_clients=4, n_rounds=3, seed=0, ledger=ledger)
        assert ledger.n_releases == 0 and ledger.epsilon == 0.0
    # a cap that covers the plan records both stages
    ledger = PrivacyLedger(1e-5, max_epsilon=1.0)
    res = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                       features="pca:8", target_epsilon=1.0, row_norm=8.0, algorithm="fedgd",
                       n_clients=4, n_rounds=3, seed=0, ledger=ledger)
    assert res.ledger is ledger and ledger.n_releases == 1 + 3
    assert ledger.epsilon == pytest.approx(1.0, rel=1e-3)
