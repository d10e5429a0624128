"""The distributed Skellam arithmetic: the sum's noise, dropouts, wrap-around, the published
RDP bound and its Gaussian limit, collusion, malformed shares.

The rounding of the clients' parts and its sensitivity are tested with the secure sums
that use it: tests/pca/test_federated_secagg.py (federated PCA's parts) and
tests/fl/test_secure_sum_fl.py (the federated rounds' clipped gradient sums)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.secagg import (
    InsufficientNoiseError,
    SumPlan,
    aggregate,
    colluding_variance,
    decode,
    plan_event,
    plan_sum,
    skellam_event,
    skellam_noise,
    skellam_rdp,
    sum_event,
)
from dpprecond.secagg.skellam import modular_wrap_bound

D = 50


def _plan(z: float = 1.0, min_clients: int = 4, n_clients: int = 20) -> SumPlan:
    return plan_sum(D, 2.0, z, n_rows=1000, n_clients=n_clients, min_clients=min_clients)


def _shares(plan: SumPlan, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` clients' messages of zero parts: their noise shares modulo ``m``."""
    return [np.mod(skellam_noise(plan.share_parameter, D, rng), plan.modulus)
            for _ in range(k)]


def test_the_sum_of_the_shares_has_the_calibrated_variance():
    plan = _plan(z=0.8, min_clients=5)
    rng = np.random.default_rng(2)
    reps, k = 400, 5
    noise = np.concatenate([decode(aggregate(_shares(plan, k, rng), plan), plan, k)
                            * plan.scale for _ in range(reps)])
    n = noise.size  # reps * D = 20000 coordinates of the integer noise
    # sample variance of n iid draws: relative std sqrt((2 + kurtosis excess) / n); the
    # Skellam excess kurtosis is 1/v (negligible): 5 standard errors
    assert abs(noise.var() / plan.noise_variance - 1) < 5 * math.sqrt(2.0 / n)
    assert abs(noise.mean()) < 5 * math.sqrt(plan.noise_variance / n)


def test_more_shares_add_variance_and_fewer_are_refused():
    plan = _plan(z=0.5, min_clients=4)
    rng = np.random.default_rng(3)
    noise = np.concatenate([decode(aggregate(_shares(plan, 8, rng), plan), plan, 8)
                            * plan.scale for _ in range(300)])
    assert abs(noise.var() / (2 * plan.noise_variance) - 1) < 5 * math.sqrt(2 / noise.size)
    with pytest.raises(InsufficientNoiseError, match="min_clients=4"):
        decode(aggregate(_shares(plan, 3, rng), plan), plan, 3)


def test_wrap_around_probability_bound_holds_and_picks_the_modulus():
    # a deliberately small modulus: the bound is loose but must hold empirically
    dim, variance, modulus = 8, 400.0, 1 << 6
    bound = modular_wrap_bound(dim, 0.0, variance, modulus)
    rng = np.random.default_rng(5)
    trials = 20000
    noise = skellam_noise(variance / 2, (trials, dim), rng)  # type: ignore[arg-type]
    wrapped = (np.abs(noise) >= modulus // 2 - 1).any(axis=1).mean()
    assert 0 < wrapped <= bound
    assert modular_wrap_bound(dim, modulus / 2, variance, modulus) == 1.0
    # plan_sum picks the smallest power of two meeting the target
    p = _plan()
    assert p.wrap_probability() <= 1e-12
    smaller = SumPlan(p.dim, p.sensitivity, p.noise_multiplier, p.scale, p.n_rows,
                      p.n_clients, p.min_clients, p.bits - 1)
    assert smaller.wrap_probability() > 1e-12
    with pytest.raises(ValueError, match="2\\^52"):
        plan_sum(D, 2.0, 1.0, n_rows=10 ** 16, n_clients=4, min_clients=4)


def test_rdp_is_the_published_formula_and_the_event_dominates_it():
    d2, d1, v = 30.0, 400.0, 5000.0
    orders = np.array([2.0, 3.0, 8.0, 32.0, 256.0])
    expected = [a * d2 ** 2 / (2 * v) + min(((2 * a - 1) * d2 ** 2 + 6 * d1) / (4 * v * v),
                                            3 * d1 / (2 * v)) for a in orders]
    np.testing.assert_allclose(skellam_rdp(orders, d2, d1, v), expected, rtol=1e-14)
    ev = skellam_event(d2, d1, v)
    assert isinstance(ev, dp_event.ZCDpEvent)
    # the event's RDP is at least the bound at every order dp_accounting uses, fractional
    # orders included (the bound at ceil(alpha), by monotonicity)
    grid = np.array([1.05, 1.5, 1.95, 2.0, 2.5, 5.95, 7.0, 100.0])
    event_rdp = ev.xi + ev.rho * grid
    assert (event_rdp >= skellam_rdp(np.ceil(grid), d2, d1, v)
            - ev.rho * np.minimum(np.ceil(grid) - grid, 1 / (4 * (grid - 1)))).all()
    assert (event_rdp >= skellam_rdp(grid, d2, d1, v)).all()
    assert isinstance(skellam_event(d2, d1, 0.0), dp_event.NonPrivateDpEvent)


def test_epsilon_tends_to_the_gaussian_mechanisms_as_the_inflation_shrinks():
    z, t, delta = 2.0, 10, 1e-5
    gauss = epsilon_of(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), t), delta,
                       "rdp")
    gaps = []
    for inflation in (2.0**-3, 2.0**-6, 2.0**-10):
        eps = epsilon_of(dp_event.SelfComposedDpEvent(sum_event(z, inflation), t), delta,
                         "rdp")
        assert eps >= gauss  # never below the Gaussian at the same noise multiplier
        gaps.append(eps - gauss)
    assert gaps[0] > gaps[1] > gaps[2]
    # what remains is the documented fractional-order term (xi carries rho/2 per release),
    # plus vanishing corrections
    rho = 1 / (2 * z ** 2)
    assert gaps[-1] <= t * rho / 2 + 1e-3


def test_collusion_removes_the_colluders_shares():
    plan = _plan(z=1.0, min_clients=10)
    assert colluding_variance(plan, 0) == plan.noise_variance
    assert colluding_variance(plan, 4) == pytest.approx(0.6 * plan.noise_variance)
    eps = [epsilon_of(plan_event(plan, colluding_variance(plan, c)), 1e-5, "rdp")
           for c in (0, 3, 6, 9)]
    assert eps == sorted(eps) and eps[0] < eps[-1]
    assert math.isinf(epsilon_of(plan_event(plan, colluding_variance(plan, 10)), 1e-5, "rdp"))
    with pytest.raises(ValueError, match="n_colluding"):
        colluding_variance(plan, 11)


def test_malformed_shares_are_refused():
    plan = _plan()
    with pytest.raises(ValueError, match="share"):
        aggregate([np.full(D, plan.modulus, dtype=np.int64)], plan)
    with pytest.raises(ValueError, match="share"):
        aggregate([np.zeros(D, dtype=np.float64)], plan)


def test_a_plan_fitted_to_fewer_bits_coarsens_its_scale_within_the_inflation_cap():
    """``fit_bits``: the finest plan is kept when it fits; otherwise ``gamma`` halves until
    the modulus fits, never past ``max_inflation``; nothing fits: the finest plan."""
    kw = {"n_rows": 60_000, "n_clients": 20, "min_clients": 20}
    finest = plan_sum(7850, 2.0, 5.0, **kw)
    assert finest.bits == 34
    assert plan_sum(7850, 2.0, 5.0, fit_bits=34, max_inflation=2.0**-6, **kw) == finest
    fitted = plan_sum(7850, 2.0, 5.0, fit_bits=30, max_inflation=2.0**-6, **kw)
    assert fitted.bits == 30 and fitted.scale == finest.scale / 16
    assert 2.0**-7 < fitted.inflation <= 2.0**-6
    # one more bit than the cap allows: the finest plan, unchanged
    assert plan_sum(7850, 2.0, 5.0, fit_bits=29, max_inflation=2.0**-6, **kw) == finest
    assert plan_sum(7850, 2.0, 5.0, fit_bits=29, max_inflation=2.0**-5, **kw).bits == 29
    # the noise std grows by at most the plan's inflation
    assert fitted.noise_std(20) <= 5.0 * 2.0 * (1 + 2.0**-6) * (1 + 1e-9)
    with pytest.raises(ValueError, match="max_inflation"):
        plan_sum(7850, 2.0, 5.0, fit_bits=30, max_inflation=2.0**-11, **kw)
    with pytest.raises(ValueError, match="fit_bits"):
        plan_sum(7850, 2.0, 5.0, fit_bits=1, max_inflation=2.0**-6, **kw)


@pytest.mark.parametrize("z", [0.5, 1.0, 5.0])
def test_the_round_event_dominates_every_plan_a_round_may_take(z):
    """:func:`dpprecond.secagg.fl.round_event` (``sum_event`` at the 2^-6 inflation cap)
    is at least the published bound at the sensitivities of the coarsest accepted plan
    (Fashion-MNIST's shape at 30 bits) and of the finest, at integer orders."""
    from dpprecond.secagg.fl import ACCOUNTED_INFLATION, round_event, round_plan

    ev = round_event(z)
    orders = np.array([2.0, 3.0, 8.0, 32.0, 256.0])
    for n_rows in (1437, 60_000):
        plan = round_plan(7850, 2.0, z, n_rows=n_rows, n_clients=20, min_clients=20)
        assert plan.inflation <= ACCOUNTED_INFLATION
        bound = skellam_rdp(orders, plan.l2_sensitivity, plan.l1_sensitivity,
                            plan.noise_variance)
        assert (ev.xi + ev.rho * orders >= bound).all()
    assert ev.rho > sum_event(z).rho  # the cap costs a little: 1/(2 z^4 65^2) over 1025^2
    assert ev.rho - sum_event(z).rho < 1.0 / (2 * z**4 * 65**2)
