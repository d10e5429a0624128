"""The accounting layer against dp_accounting's independent routines and closed forms."""

from __future__ import annotations

import math
import warnings

import dp_accounting
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import (
    PrivacyBudgetExceededError,
    PrivacyLedger,
    calibrate_noise,
    compose,
    epsilon_of,
    gaussian,
    gaussian_precision,
)
from tests.gdp import gaussian_gdp_epsilon


@pytest.mark.parametrize("z", [0.5, 1.0, 4.0])
def test_single_gaussian_matches_exact_gaussian_mechanism(z: float) -> None:
    delta = 1e-5
    exact = dp_accounting.get_epsilon_gaussian(z, delta)  # Balle and Wang (2018), tight
    assert epsilon_of(gaussian(z), delta, "pld") == pytest.approx(exact, rel=2e-3)
    # RDP is an upper bound; at these deltas it is loose by at most ~40%.
    assert exact <= epsilon_of(gaussian(z), delta, "rdp") <= 1.4 * exact + 0.05


@pytest.mark.parametrize("z", [0.7, 2.0])
def test_gdp_closed_form_equals_exact_gaussian(z: float) -> None:
    # One Gaussian release with multiplier z is exactly (1/z)-GDP.
    assert gaussian_gdp_epsilon(1 / z, 1e-5) == pytest.approx(
        dp_accounting.get_epsilon_gaussian(z, 1e-5), rel=1e-6)


def test_composition_matches_gdp() -> None:
    z, t, delta = 8.0, 50, 1e-5
    event = dp_event.SelfComposedDpEvent(gaussian(z), t)
    assert epsilon_of(event, delta, "pld") == pytest.approx(
        gaussian_gdp_epsilon(math.sqrt(t) / z, delta), rel=5e-3)
    # A list of events is their composition.
    assert epsilon_of([gaussian(z)] * 3, delta) == pytest.approx(
        epsilon_of(dp_event.SelfComposedDpEvent(gaussian(z), 3), delta))


@pytest.mark.parametrize(("eps", "acc"), [(0.5, "rdp"), (1.0, "rdp"), (4.0, "pld")])
def test_calibrate_noise_hits_target_and_is_minimal(eps: float, acc: str) -> None:
    delta = 1e-6
    def make(s: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(gaussian(s), 10)
    s = calibrate_noise(make, eps, delta, acc)
    got = epsilon_of(make(s), delta, acc)
    assert got <= eps
    assert got == pytest.approx(eps, rel=1e-3)
    assert epsilon_of(make(s * 0.99), delta, acc) > eps


def _discretized_pld_epsilon(event: dp_event.DpEvent, delta: float) -> float:
    """dp_accounting's PLD accountant itself (FFT composition of discretized PLDs)."""
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def test_gaussian_composition_is_evaluated_exactly() -> None:
    # Mixed multipliers: 20 x z=6, one z=2 and a no-op compose to one Gaussian with
    # precision 20/36 + 1/4, i.e. mu-GDP with mu^2 = that precision.
    event = compose([dp_event.SelfComposedDpEvent(gaussian(6.0), 20), gaussian(2.0),
                     gaussian(math.inf)])
    precision = 20 / 36 + 1 / 4
    assert gaussian_precision(event) == pytest.approx(precision, rel=1e-15)
    delta = 1e-5
    got = epsilon_of(event, delta, "pld")
    assert got == pytest.approx(gaussian_gdp_epsilon(math.sqrt(precision), delta), rel=1e-9)
    # The discretized PLD is a pessimistic estimate of the same distribution: above the
    # exact value by its rounding error only.
    pld = _discretized_pld_epsilon(event, delta)
    assert got <= pld <= got * (1 + 1e-4)


def test_only_plain_gaussian_compositions_take_the_exact_path() -> None:
    sampled = dp_event.PoissonSampledDpEvent(0.01, gaussian(1.0))
    assert gaussian_precision(sampled) is None
    assert gaussian_precision(compose([gaussian(1.0), sampled])) is None
    assert gaussian_precision(dp_event.NonPrivateDpEvent()) is None
    assert gaussian_precision(dp_event.NoOpDpEvent()) == 0.0
    # Subsampled events still go through the accountant (discretized at 1e-3: a pessimistic
    # bound, above the finer 1e-4 one by at most about the discretization).
    event = dp_event.SelfComposedDpEvent(sampled, 100)
    fine = _discretized_pld_epsilon(event, 1e-5)
    assert fine <= epsilon_of(event, 1e-5, "pld") <= fine + 1e-3
    assert math.isinf(epsilon_of(compose([gaussian(1.0), dp_event.NonPrivateDpEvent()]),
                                 1e-5, "pld"))


def test_trivial_events() -> None:
    assert epsilon_of(gaussian(math.inf), 1e-5) == 0.0
    assert math.isinf(epsilon_of(gaussian(0.0), 1e-5))
    assert isinstance(compose([]), dp_event.NoOpDpEvent)
    assert compose([gaussian(1.0)]) == gaussian(1.0)


def test_ledger_records_and_enforces_budget() -> None:
    ledger = PrivacyLedger(delta=1e-5, max_epsilon=3.0)
    assert ledger.epsilon == 0.0
    e1 = ledger.spend(gaussian(3.0))
    assert e1 == pytest.approx(epsilon_of(gaussian(3.0), 1e-5, "pld"))
    e2 = ledger.spend(gaussian(3.0))
    assert e2 > e1
    with pytest.raises(PrivacyBudgetExceededError, match="max_epsilon=3"):
        ledger.spend(gaussian(0.5))
    assert len(ledger.events) == 2 and ledger.epsilon == pytest.approx(e2)
    # consecutive identical releases are one self-composed event (one evaluation)
    assert ledger.event == dp_event.SelfComposedDpEvent(gaussian(3.0), 2)


def test_ledger_composes_pca_and_fl_events_exactly() -> None:
    """One ledger over a Gaussian PCA release and a federated run: the Gaussian parts
    compose exactly (one Gaussian with the precisions added), and a repeat-and-select
    event switches the evaluation to RDP, the accountant that supports it."""
    ledger = PrivacyLedger(delta=1e-6)
    ledger.spend(gaussian(4.0))  # e.g. Analyze Gauss
    ledger.spend(gaussian(20.0), count=50)  # e.g. 50 rounds
    precision = 1 / 16 + 50 / 400
    assert ledger.epsilon == pytest.approx(gaussian_gdp_epsilon(math.sqrt(precision), 1e-6),
                                           rel=1e-9)
    rs = dp_event.RepeatAndSelectDpEvent(gaussian(3.0), 3.0, 1)
    ledger.spend(rs)
    rdp = dp_accounting.rdp.RdpAccountant(orders=[1 + x / 20 for x in range(1, 100)]
                                          + list(range(6, 64)))
    rdp.compose(ledger.event)
    assert ledger.epsilon == pytest.approx(rdp.get_epsilon(1e-6), rel=2e-2)
    assert ledger.epsilon > epsilon_of(gaussian(precision ** -0.5), 1e-6, "pld")


def test_ledger_check_refuses_before_recording() -> None:
    ledger = PrivacyLedger(delta=1e-5, max_epsilon=1.0)
    ledger.spend(gaussian(8.0))
    with pytest.raises(PrivacyBudgetExceededError, match="nothing was released"):
        ledger.check(dp_event.SelfComposedDpEvent(gaussian(2.0), 10))
    assert ledger.n_releases == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"delta": 0.0}, r"delta in the open interval \(0, 1\), got delta=0.0"),
    ({"delta": 1.5}, "delta=1.5"),
    ({"delta": 1e-5, "max_epsilon": -1.0}, "max_epsilon > 0, got max_epsilon=-1.0"),
    ({"delta": 1e-5, "accountant": "gdp"}, "accountant='gdp'"),
])
def test_ledger_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivacyLedger(**kwargs)


def test_event_serialization_round_trips() -> None:
    from dpprecond.accounting import event_from_dict, event_to_dict

    ev = compose([gaussian(2.0), dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(0.1, gaussian(1.3)), 5),
        dp_event.RepeatAndSelectDpEvent(gaussian(3.0), 3.0, 1), gaussian(0.0)])
    assert event_from_dict(event_to_dict(ev)) == ev


def test_calibrate_bad_input() -> None:
    with pytest.raises(ValueError, match="epsilon > 0, got epsilon=0"):
        calibrate_noise(gaussian, 0, 1e-5)
    with pytest.raises(ValueError, match="delta=2"):
        calibrate_noise(gaussian, 1.0, 2)


def test_calibration_stops_at_the_smallest_scale_for_tiny_sampling_rates() -> None:
    # A Poisson rate of 1e-6 meets any target at any scale; the search used to walk the
    # scale down to 1e-6, where the PLD accountant ran out of 20 GB of memory.
    from dpprecond.accounting import MIN_NOISE_SCALE

    def event(z: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(1e-6, dp_event.GaussianDpEvent(z)), 2)

    z = calibrate_noise(event, 1.0, 1e-5, "pld")
    assert z == MIN_NOISE_SCALE
    assert epsilon_of(event(z), 1e-5, "pld") <= 1.0
    # a large epsilon for a Gaussian: the smallest scale, spending less than asked
    assert calibrate_noise(gaussian, 1e4, 1e-5, "pld") == MIN_NOISE_SCALE


# -- issue 17, hole 7: a target beyond the noise floor is said, not silently undershot ------


def test_a_target_beyond_the_noise_floor_warns_with_what_is_spent() -> None:
    """``target_epsilon=1000`` spent 294 without a word (the calibration's noise floor)."""
    from dpprecond.accounting import MIN_NOISE_SCALE, NoiseFloorWarning
    from dpprecond.data import load_dataset
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.pca import fit_private_pca

    ds = load_dataset("digits")
    with pytest.warns(NoiseFloorWarning, match=r"epsilon=1000 .*=0\.05 .* epsilon=294\.\d+ "):
        res = fit_private_pca(ds.X_train, 2, method="analyze_gauss", target_epsilon=1000.0,
                              target_delta=1e-6, row_norm=8.0, seed=0)
    assert res.epsilon == pytest.approx(epsilon_of(gaussian(MIN_NOISE_SCALE), 1e-6, "pld"))
    with pytest.warns(NoiseFloorWarning, match="epsilon=1000"):
        run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, 10, algorithm="fedgd",
                      n_clients=2, seed=0, config=FLConfig(n_rounds=1, target_epsilon=1000.0))
    with warnings.catch_warnings():  # a target the floor can meet exactly: no warning
        warnings.simplefilter("error", NoiseFloorWarning)
        fit_private_pca(ds.X_train, 2, method="analyze_gauss", target_epsilon=10.0,
                        target_delta=1e-6, row_norm=8.0, seed=0)
