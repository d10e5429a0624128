"""The shared selection layer: trial-count distributions and the repeat-and-select event."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpprecond.accounting import epsilon_of, gaussian
from dpprecond.secure import SecureGenerator
from dpprecond.selection import (
    calibrate_selection,
    draw_trial_count,
    repeat_and_select_event,
    trial_gamma,
    trial_shape,
)


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("mean", [1.5, 5.0, 20.0])
def test_gamma_gives_the_requested_mean(shape: float, mean: float) -> None:
    g = trial_gamma(mean, shape)
    # dp_accounting solves the same equation for its bound: the two must agree
    ref = rdp_privacy_accountant._gamma_truncated_negative_binomial(shape, mean)
    assert g == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("trials", ["geometric", "logarithmic", 0.5, 3.0, "poisson"])
def test_the_sampler_has_the_requested_mean(trials: str | float) -> None:
    rng = np.random.default_rng(0)
    draws = np.array([draw_trial_count(rng, 4.0, trials) for _ in range(20000)])
    assert draws.mean() == pytest.approx(4.0, rel=0.04)
    assert draws.min() >= (0 if trials == "poisson" else 1)


@pytest.mark.parametrize("trials", ["geometric", "logarithmic", 2.0, "poisson"])
def test_the_secure_sampler_has_the_requested_mean(trials: str | float) -> None:
    rng = SecureGenerator()
    draws = np.array([draw_trial_count(rng, 3.0, trials) for _ in range(4000)])
    assert draws.mean() == pytest.approx(3.0, rel=0.08)


def test_the_geometric_draw_is_numpys_geometric() -> None:
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    assert [draw_trial_count(a, 3.0) for _ in range(50)] == \
        [int(b.geometric(1 / 3.0)) for _ in range(50)]


def test_the_event_and_its_calibration() -> None:
    ev = repeat_and_select_event(gaussian(2.0), 5.0, "logarithmic")
    assert ev == dp_event.RepeatAndSelectDpEvent(dp_event.GaussianDpEvent(2.0), 5.0, 0.0)
    assert isinstance(repeat_and_select_event(gaussian(0.0), 5.0), dp_event.NonPrivateDpEvent)
    z = calibrate_selection(1.0, 1e-5, 5.0, "geometric")
    eps = epsilon_of(repeat_and_select_event(gaussian(z), 5.0, "geometric"), 1e-5, "rdp")
    assert eps <= 1.0
    assert eps == pytest.approx(1.0, rel=1e-3)
    # selecting costs more than one trial: the trial alone at z is cheaper
    assert epsilon_of(gaussian(z), 1e-5, "rdp") < eps


@pytest.mark.parametrize("bad", ["uniform", -1.0, math.nan, True])
def test_bad_distributions_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="trials"):
        trial_shape(bad)  # type: ignore[arg-type]


def test_a_mean_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="mean_trials"):
        draw_trial_count(np.random.default_rng(0), 0.5)
