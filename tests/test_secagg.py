"""The distributed Skellam mechanism: sensitivity after rounding, the sum's noise, wrap-around,
extreme inputs, the published RDP bound and its Gaussian limit, dropouts and collusion."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.secagg import (
    InsufficientNoiseError,
    SkellamPlan,
    aggregate,
    client_share,
    colluding_variance,
    conditional_round,
    decode,
    plan_event,
    plan_skellam,
    quantize_records,
    skellam_event,
    skellam_noise,
    skellam_rdp,
)

D = 50


def _plan(z: float = 1.0, min_clients: int = 4, **kw: object) -> SkellamPlan:
    return plan_skellam(1.0, D, z, min_clients, 1000, max_clients=20, resolution=64.0, **kw)


def _worst_records(plan: SkellamPlan, n: int) -> np.ndarray:
    """Records on the clip sphere whose scaled coordinates all sit at fraction 1/2 (the
    rounding's worst case: every coordinate moves by 1/2) plus sign flips."""
    gc = plan.scale * plan.clip_norm
    base = np.full(D, (math.floor(gc / math.sqrt(D)) + 0.5) / plan.scale)
    base *= plan.clip_norm / np.linalg.norm(base)  # on the sphere, fractions near 1/2
    signs = np.where(np.random.default_rng(0).random((n, D)) < 0.5, -1.0, 1.0)
    return base * signs


def test_every_rounded_record_meets_the_bound_and_neighbours_the_sensitivity():
    plan = _plan()
    rng = np.random.default_rng(1)
    X = _worst_records(plan, 4000)
    Q = quantize_records(X, plan, rng)
    norms = np.linalg.norm(Q.astype(float), axis=1)
    assert norms.max() <= plan.record_bound
    # the bound is tight-ish: the deterministic one is gamma C + sqrt(d)
    assert plan.record_bound < plan.scale * plan.clip_norm + math.sqrt(D)
    # worst-case neighbours: x and -x (replace-one), rounded independently
    Qp = quantize_records(-X, plan, rng)
    diff = (Q - Qp).astype(float)
    assert np.linalg.norm(diff, axis=1).max() <= plan.l2_sensitivity
    assert np.abs(diff).sum(axis=1).max() <= plan.l1_sensitivity
    # the rounding is unbiased
    mean = quantize_records(np.repeat(X[:1], 20000, axis=0), plan, rng).mean(axis=0)
    np.testing.assert_allclose(mean, X[0] * plan.scale, atol=5 * 0.5 / math.sqrt(20000))


def test_conditional_rounding_refuses_rows_it_cannot_bound():
    with pytest.raises(RuntimeError, match="rounding bound"):
        conditional_round(np.full((1, 4), 10.3), 1.0, np.random.default_rng(0))


def test_huge_and_non_finite_records_are_clipped_or_zeroed():
    plan = _plan()
    X = np.zeros((4, D))
    X[0, 0] = 1e8
    X[1, :] = 1e300
    X[2, 3] = np.inf
    X[3, 1] = np.nan
    Q = quantize_records(X, plan, np.random.default_rng(0))
    assert np.linalg.norm(Q.astype(float), axis=1).max() <= plan.record_bound
    assert abs(Q[0, 0] - plan.scale * plan.clip_norm) <= 1  # clipped to C, not overflowed
    assert (Q[2:] == 0).all()  # non-finite rows contribute nothing, as in the engine
    with pytest.raises(ValueError, match="shape"):
        quantize_records(np.zeros((2, D + 1)), plan, np.random.default_rng(0))


def test_the_sum_of_the_shares_has_the_calibrated_variance():
    plan = _plan(z=0.8, min_clients=5)
    rng = np.random.default_rng(2)
    reps, k = 400, 5
    samples = []
    for _ in range(reps):
        shares = [client_share(np.zeros((0, D)), plan, rng) for _ in range(k)]
        samples.append(decode(aggregate(shares, plan), plan, k) * plan.scale)
    noise = np.concatenate(samples)  # reps * D = 20000 coordinates of the integer noise
    n = noise.size
    # sample variance of n iid draws: relative std sqrt((2 + kurtosis excess) / n); the
    # Skellam excess kurtosis is 1/v (negligible): 5 standard errors
    tol = 5 * math.sqrt(2.0 / n)
    assert abs(noise.var() / plan.noise_variance - 1) < tol
    assert abs(noise.mean()) < 5 * math.sqrt(plan.noise_variance / n)


def test_more_shares_add_variance_and_fewer_are_refused():
    plan = _plan(z=0.5, min_clients=4)
    rng = np.random.default_rng(3)
    noise = np.concatenate([
        decode(aggregate([client_share(np.zeros((0, D)), plan, rng) for _ in range(8)],
                         plan), plan, 8) * plan.scale for _ in range(300)])
    assert abs(noise.var() / (2 * plan.noise_variance) - 1) < 5 * math.sqrt(2 / noise.size)
    shares = [client_share(np.zeros((0, D)), plan, rng) for _ in range(3)]
    with pytest.raises(InsufficientNoiseError, match="min_clients=4"):
        decode(aggregate(shares, plan), plan, 3)


def test_decoding_is_exact_without_wrap_and_the_signal_survives():
    plan = _plan(z=0.0)  # no noise: the decoded sum is the rounded records' sum
    rng = np.random.default_rng(4)
    parts = [rng.standard_normal((30, D)) for _ in range(4)]
    shares = [client_share(p, plan, np.random.default_rng(10 + i)) for i, p in enumerate(parts)]
    expected = sum(quantize_records(p, plan, np.random.default_rng(10 + i)).sum(axis=0)
                   for i, p in enumerate(parts))
    np.testing.assert_array_equal(decode(aggregate(shares, plan), plan, 4) * plan.scale,
                                  expected)


def test_wrap_around_probability_bound_holds_and_picks_the_modulus():
    # a deliberately small modulus: the bound is loose but must hold empirically
    plan = SkellamPlan(1.0, 8, 4.0, 400.0, 1, 6)
    bound = plan.wrap_probability(0, 1)
    rng = np.random.default_rng(5)
    trials = 20000
    noise = skellam_noise(plan.share_parameter, (trials, 8), rng)  # type: ignore[arg-type]
    wrapped = (np.abs(noise) >= plan.modulus // 2 - 1).any(axis=1).mean()
    assert 0 < wrapped <= bound
    # plan_skellam picks the smallest power of two meeting the target
    p = plan_skellam(1.0, D, 1.0, 4, 1000, max_clients=20, max_wrap_probability=1e-12)
    assert p.wrap_probability(1000, 20) <= 1e-12
    smaller = SkellamPlan(p.clip_norm, p.dim, p.scale, p.noise_variance, p.min_clients,
                          p.bits - 1)
    assert smaller.wrap_probability(1000, 20) > 1e-12
    with pytest.raises(ValueError, match="modulus"):
        plan_skellam(1.0, D, 1.0, 4, 10 ** 16)


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


def test_epsilon_tends_to_the_gaussian_mechanisms_as_the_resolution_grows():
    z, t, delta = 2.0, 10, 1e-5
    gauss = epsilon_of(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), t), delta,
                       "rdp")
    gaps = []
    for resolution in (16.0, 256.0, 4096.0):
        plan = plan_skellam(1.0, D, z, 4, 100, resolution=resolution)
        eps = epsilon_of(dp_event.SelfComposedDpEvent(plan_event(plan), t), delta, "rdp")
        assert eps >= gauss  # never below the Gaussian at the same variance
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


def test_conditional_rounding_bound_is_exact_in_floating_point():
    # d = 64, gamma C = 1024: B^2 = 1049620 in exact arithmetic, but the float B is a hair
    # below sqrt(1049620) while B * B rounds to 1049620.0, so a row of squared norm
    # 1049620 (this one with its two halves rounded up, probability 1/4) would pass a
    # float test and exceed the bound B that the sensitivity 2B is built on
    plan = SkellamPlan(1.0, 64, 1024.0, 1.0, 1, 40)
    B = Fraction(plan.record_bound)
    assert B ** 2 < 1049620 <= plan.record_bound * plan.record_bound
    y = np.zeros(64)
    y[:6] = [1023.5, 20.5, 24.0, 5.0, 1.0, 1.0]  # up: 1024^2 + 21^2 + 603 = 1049620
    assert np.linalg.norm(y) <= 1024.0
    Q = quantize_records(np.tile(y / 1024.0, (400, 1)), plan, np.random.default_rng(0))
    sq = (Q.astype(object) ** 2).sum(axis=1)
    assert all(Fraction(int(v)) <= B ** 2 for v in sq)
    with pytest.raises(ValueError, match="bound"):
        conditional_round(np.zeros((1, 2)), 1e8, np.random.default_rng(0))
