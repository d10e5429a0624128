"""Private PCA features then DP federated training: one ledger, the total per record."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.features import load_features
from dpprecond.pipeline import parse_features, run_pipeline, split_budget
from tests.fl.conftest import FIXED


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


def test_one_calibration_splits_the_target_gaussian_exactly(digits) -> None:
    """The pipeline calibrates once: the PCA runs at ``z / sqrt(share)`` and the training at
    the scale whose run is ``z / sqrt(1 - share)``, with no second calibration, so the
    stages compose to exactly the target's Gaussian (not to within a tolerance)."""
    from dpprecond.accounting import calibrate_noise, gaussian, gaussian_precision
    from dpprecond.pipeline import split_noise

    z = calibrate_noise(gaussian, 4.0, 1e-5, "pld")
    z_pca, z_fl = split_noise(4.0, 1e-5, 0.3)
    assert z_pca == z / math.sqrt(0.3) and z_fl == z / math.sqrt(0.7)
    res = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                       features="pca:16", target_epsilon=4.0, row_norm=8.0, pca_share=0.3,
                       algorithm="fedgd", n_clients=5, n_rounds=10, seed=0,
                       **FIXED)
    events = res.ledger.events
    pca_precision = gaussian_precision(events[0])
    fl_precision = gaussian_precision(dp_event.ComposedDpEvent(list(events[1:])))
    assert pca_precision == pytest.approx(0.3 / z**2, rel=1e-12)
    assert fl_precision == pytest.approx(0.7 / z**2, rel=1e-12)
    assert res.fl.noise_multiplier == pytest.approx(z_fl * math.sqrt(10), rel=1e-12)
    exact = epsilon_of(gaussian(z), 1e-5, "pld")
    assert res.epsilon == pytest.approx(exact, rel=1e-9) and res.epsilon <= 4.0
    # with the defaults (adaptive clipping, size weights) the counts share the training's
    # precision: the same exact total
    dflt = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                        features="pca:16", target_epsilon=4.0, row_norm=8.0, pca_share=0.3,
                        algorithm="fedgd", n_clients=5, n_rounds=10, seed=0)
    assert len(dflt.ledger.events) == 1 + 2 * 10
    assert gaussian_precision(dp_event.ComposedDpEvent(list(dflt.ledger.events[1:]))) == \
        pytest.approx(0.7 / z**2, rel=1e-12)
    assert dflt.epsilon == pytest.approx(exact, rel=1e-9)


def test_pca_noise_multiplier_is_one_gaussian_or_refused(digits) -> None:
    from dpprecond.accounting import gaussian_precision
    from dpprecond.pca import fit_private_pca
    from dpprecond.pca.api import planned_event

    for method, opts in [("auto", {}), ("analyze_gauss", {}), ("fixed", {"n_iter": 3}),
                         ("power", {"n_iter": 4, "power_init": "private"})]:
        for center in (None, "private"):
            event = planned_event(method, target_epsilon=None, noise_multiplier=2.5,
                                  target_delta=1e-5, center=center, **opts)
            assert gaussian_precision(event) == pytest.approx(2.5**-2, rel=1e-12), method
    with pytest.raises(ValueError, match=r"noise_multiplier=2\.5 applies to a plan of Gaussian"):
        planned_event("select", target_epsilon=None, noise_multiplier=2.5, target_delta=1e-5)
    with pytest.raises(ValueError, match="target_epsilon or noise_multiplier, not both"):
        fit_private_pca(digits.X_train, 4, target_epsilon=1.0, noise_multiplier=2.0,
                        target_delta=1e-5, row_norm=8.0, seed=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        fit_private_pca(digits.X_train, 4, target_epsilon=None, noise_multiplier=-1.0,
                        target_delta=1e-5, row_norm=8.0, seed=0)
    res = fit_private_pca(digits.X_train, 4, target_epsilon=None, noise_multiplier=3.0,
                          target_delta=1e-5, row_norm=8.0, seed=0)
    assert gaussian_precision(res.dp_event) == pytest.approx(1 / 9, rel=1e-12)


def test_pca_features_pipeline_spends_the_total_once(digits) -> None:
    res = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                       features="pca:16", target_epsilon=4.0, row_norm=8.0, pca_share=0.3,
                       algorithm="fedgd", n_clients=5, n_rounds=10, seed=0,
                       **FIXED)
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
                        algorithm="fedgd", n_clients=5, n_rounds=5, seed=0,
                       **FIXED)
    assert free.ledger.n_releases == 5 and free.pca_epsilon is None
    assert free.epsilon == pytest.approx(2.0, rel=1e-3)
    exact = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                         features="pca:16", target_epsilon=None, row_norm=8.0,
                         algorithm="fedgd", n_clients=5, n_rounds=30, seed=0,
                       **FIXED)
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
                         algorithm="fedgd", n_clients=4, n_rounds=3, seed=0, ledger=ledger,
                       **FIXED)
        assert ledger.n_releases == 0 and ledger.epsilon == 0.0
    # a cap that covers the plan records both stages
    ledger = PrivacyLedger(1e-5, max_epsilon=1.0)
    res = run_pipeline(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                       features="pca:8", target_epsilon=1.0, row_norm=8.0, algorithm="fedgd",
                       n_clients=4, n_rounds=3, seed=0, ledger=ledger,
                       **FIXED)
    assert res.ledger is ledger and ledger.n_releases == 1 + 3
    assert ledger.epsilon == pytest.approx(1.0, rel=1e-3)
