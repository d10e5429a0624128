"""Accounting against dp_accounting and mu-GDP; noise std; worst-case sensitivity."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import optimize, stats

from dpprecond.accounting import PrivacyLedger
from dpprecond.clipping import SHRINK
from dpprecond.fl import ClientData, FLConfig, client, simulate
from dpprecond.fl.accounting import Schedule, calibrate, round_event, training_event
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.server import sgd
from tests.fl.conftest import FIXED
from tests.gdp import gaussian_gdp_epsilon


def gdp_epsilon(z: float, T: int, delta: float) -> float:
    return gaussian_gdp_epsilon(math.sqrt(T) / z, delta)


def calibrate_noise_multiplier(epsilon: float, delta: float, n_rounds: int) -> float:
    return calibrate(Schedule("rounds", n_rounds), epsilon, delta, "pld")


def pld_epsilon(z: float, T: int, delta: float) -> float:
    """dp_accounting directly: T compositions of GaussianDpEvent(z)."""
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for _ in range(T):
        acc.compose(dp_event.GaussianDpEvent(z))
    return float(acc.get_epsilon(delta))


def analytic_gaussian_epsilon(z: float, delta: float) -> float:
    """Balle & Wang (2018) exact Gaussian mechanism, sensitivity 1, std z (independent)."""
    def delta_of(eps: float) -> float:
        return (stats.norm.cdf(-eps * z + 1 / (2 * z))
                - math.exp(eps) * stats.norm.cdf(-eps * z - 1 / (2 * z)))
    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 100.0, xtol=1e-12)


def test_history_epsilon_equals_dp_accounting_and_gdp(client_data: ClientData,
                                                      problem: tuple) -> None:
    _, _, Xt, yt = problem
    T, delta = 5, 1e-5
    res = simulate(LinearSoftmax(6, 3), client_data, sgd(0.1),
                   FLConfig(**FIXED, n_rounds=T, target_epsilon=2.0, target_delta=delta),
                   X_test=Xt, y_test=yt)
    z = res.noise_multiplier
    eps = [h["epsilon"] for h in res.history]
    assert np.all(np.diff(eps) > 0)  # spent grows each round
    for t in (1, 3, T):
        ref = pld_epsilon(z, t, delta)
        assert eps[t - 1] == pytest.approx(ref, rel=1e-5)  # PLD rounding only
        # mu-GDP with mu = sqrt(t)/z: PLD discretization error is far below 1e-3
        assert eps[t - 1] == pytest.approx(gdp_epsilon(z, t, delta), rel=1e-3)
    assert eps[-1] <= 2.0 + 1e-9
    assert eps[-1] == pytest.approx(2.0, rel=1e-3)  # calibration is tight


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])  # z > 1: PLD stays fast
def test_single_round_is_the_gaussian_mechanism(epsilon: float) -> None:
    z = calibrate_noise_multiplier(epsilon, 1e-5, 1)
    assert analytic_gaussian_epsilon(z, 1e-5) == pytest.approx(epsilon, rel=1e-3)
    assert training_event(z, 1) == dp_event.GaussianDpEvent(z)


def test_calibration_is_smallest_noise_meeting_target() -> None:
    z = calibrate_noise_multiplier(1.0, 1e-5, 70)
    # composing 70 events one by one vs SelfComposed differs by PLD rounding (~1e-6)
    assert pld_epsilon(z, 70, 1e-5) <= 1.0 * (1 + 1e-5)
    assert pld_epsilon(z * 0.995, 70, 1e-5) > 1.0
    # the closed form: 70 Gaussians at z == one Gaussian at z / sqrt(70)
    assert analytic_gaussian_epsilon(z / math.sqrt(70), 1e-5) == pytest.approx(1.0, rel=1e-3)


def test_poisson_event_is_dp_accountings() -> None:
    z, q, steps, T = 1.3, 0.1, 3, 4
    ev = training_event(z, T, "poisson", sampling_rate=q, local_steps=steps)
    acc = dp_accounting.rdp.RdpAccountant()
    for _ in range(T * steps):
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    mine = dp_accounting.rdp.RdpAccountant()
    mine.compose(ev)
    assert mine.get_epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert round_event(z, "client-level") == dp_event.GaussianDpEvent(z)


def test_empirical_noise_std_is_z_times_2C() -> None:
    rng = np.random.default_rng(0)
    d, k, K, n_i = 99, 10, 8, 50  # 8 clients x 1000 params
    X = rng.standard_normal((K * n_i, d))
    y = rng.integers(0, k, K * n_i)
    bounds = np.arange(K + 1) * n_i
    model = LinearSoftmax(d, k)
    params = rng.standard_normal(model.n_params) * 0.1
    z, C = 0.7, 2.5
    root = np.random.SeedSequence(1)
    msgs = client.full_batch_messages(model, params, X, y, bounds, C, z,
                                      client.round_generators(root, 0, K))
    noise = msgs * n_i - model.clipped_grad_sums(params, X, y, bounds, C)
    # std of an 8000-sample std estimate is ~ sigma / sqrt(2 * 8000): 5 sigma -> 4%
    assert noise.std() == pytest.approx(z * 2 * C, rel=0.04)
    assert abs(noise.mean()) < 5 * z * 2 * C / math.sqrt(noise.size)


def test_client_level_noise_std() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((40, 99))
    y = rng.integers(0, 10, 40)
    bounds = np.array([0, 10, 25, 40])
    model = LinearSoftmax(99, 10)
    z, C = 0.3, 0.01  # tiny C: every client update is clipped to norm C
    agg = client.client_level_aggregate(model, np.zeros(model.n_params), X, y, bounds, C, z,
                                        np.random.default_rng(2))
    noiseless = client.client_level_aggregate(model, np.zeros(model.n_params), X, y, bounds,
                                              C, 0.0, np.random.default_rng(2))
    assert np.linalg.norm(noiseless * 3) <= 3 * C * (1 + 1e-12)
    assert ((agg - noiseless) * 3).std() == pytest.approx(2 * z * C, rel=0.08)


def test_worst_case_pair_has_sensitivity_exactly_2C() -> None:
    """Replace one record by the same features with the other label (k = 2, theta = 0):
    the two clipped gradients are exact opposites, so the sums differ by exactly 2C (times
    SHRINK = 1 - 2^-30, the factor that keeps every computed clipped norm <= C)."""
    rng = np.random.default_rng(3)
    model = LinearSoftmax(5, 2)
    X = rng.standard_normal((30, 5)) * 4
    y = rng.integers(0, 2, 30)
    y2 = y.copy()
    y2[7] = 1 - y2[7]
    bounds = np.array([0, 30])
    C = 0.5
    params = np.zeros(model.n_params)
    diff = (model.clipped_grad_sums(params, X, y, bounds, C)
            - model.clipped_grad_sums(params, X, y2, bounds, C))
    assert np.linalg.norm(diff) == pytest.approx(2 * C * SHRINK, rel=1e-12)
    # and no random replacement exceeds 2C
    for _ in range(50):
        Xr, yr = X.copy(), y.copy()
        j = rng.integers(30)
        Xr[j] = rng.standard_normal(5) * 10
        yr[j] = rng.integers(2)
        p = rng.standard_normal(model.n_params)
        dist = np.linalg.norm(model.clipped_grad_sums(p, X, y, bounds, C)
                              - model.clipped_grad_sums(p, Xr, yr, bounds, C))
        assert dist <= 2 * C


def test_ledger_epsilon_is_infinite_without_noise_and_matches_pld() -> None:
    ledger = PrivacyLedger(1e-5, accountant="pld")
    ledger.spend(round_event(0.0))
    assert math.isinf(ledger.epsilon)
    ledger = PrivacyLedger(1e-5, accountant="pld")
    ledger.spend(round_event(2.0), count=3)
    assert ledger.epsilon == pytest.approx(pld_epsilon(2.0, 3, 1e-5), rel=1e-6)


def test_poisson_mechanism_sampling_and_noise(client_data: ClientData) -> None:
    """Message = (sampled clipped sum + N(0, (zC)^2)) / (q |D_i|), masks and noise from the
    client's own stream, drawn in that order."""
    cd = client_data
    model = LinearSoftmax(6, 3)
    params = np.random.default_rng(0).standard_normal(model.n_params)
    root, q, z, C = np.random.SeedSequence(4), 0.4, 1.5, 0.8
    msgs = client.poisson_local_messages(model, params, cd.X, cd.y, cd.bounds, C, z,
                                         client.round_generators(root, 1, 4),
                                         sampling_rate=q, local_steps=1, local_lr=0.3)
    for i in range(4):
        a, b = cd.bounds[i], cd.bounds[i + 1]
        rng = client.stream(root, 1, i)
        mask = rng.random(b - a) < q
        S = model.clipped_grad_sums(params, cd.X[a:b][mask], cd.y[a:b][mask],
                                    np.array([0, mask.sum()]), C)[0]
        expected = (S + z * C * rng.standard_normal(model.n_params)) / (q * (b - a))
        np.testing.assert_allclose(msgs[i], expected, rtol=1e-9, atol=1e-12)
