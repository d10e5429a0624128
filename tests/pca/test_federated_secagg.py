"""Federated PCA under trust='secure-aggregation': the distributed Skellam secure sums."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import PrivacyLedger, calibrate_noise, epsilon_of, gaussian
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.noise import gaussian as gaussian_noise
from dpprecond.noise import release, symmetric_gaussian
from dpprecond.pca import fit_private_pca, sin_theta
from dpprecond.pca.federated import FederatedRows
from dpprecond.pca.metrics import top_right_singular_vectors
from dpprecond.pca.rows import ClippedRows
from dpprecond.secagg.skellam import InsufficientNoiseError, skellam_noise, skellam_rdp
from dpprecond.secagg.sums import (
    ROUNDING_INFLATION,
    ClientParts,
    SecureSums,
    plan_sum,
    round_shared,
    secure_sum,
    sum_event,
)

BOUNDS = np.array([0, 700, 1500, 1501, 4000])
ORDERS = [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0, 16.0, 32.0, 64.0, 256.0]


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(4000, 12, 2, 20.0, seed=2)


# -- the rounding -----------------------------------------------------------------------


def test_shared_rounding_is_floor_of_y_plus_one_minus_u_exactly() -> None:
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.standard_normal(300) * 10.0, rng.uniform(-2**51, 2**51, 300),
                        [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0**51 - 0.5]])
    u = np.concatenate([rng.random(y.size - 3), [0.0, 0.5, 1.0 - 2**-53]])
    got = round_shared(y, u)
    want = [math.floor(Fraction(a) + 1 - Fraction(b)) for a, b in zip(y, u, strict=True)]
    assert got.dtype == np.int64 and got.tolist() == want
    # unbiased: E[R(y)] = y (u uniform)
    draws = round_shared(np.full(200_000, 3.3), rng.random(200_000))
    assert draws.mean() == pytest.approx(3.3, abs=6 * 0.5 / math.sqrt(200_000))
    with pytest.raises(ValueError, match="2\\^52"):
        round_shared(np.array([2.0**52]), np.array([0.5]))


def _worst_pair(plan, gamma_delta_per_coord: float, m: int, offset: float):
    """Parts whose neighbour moves every coordinate by just over an integer number of
    levels, and the uniforms that make every coordinate's rounded difference maximal."""
    d = plan.sensitivity / math.sqrt(m)  # every coordinate moves by Delta / sqrt(m)
    p = np.full(m, offset) + 0.5 / plan.scale  # scaled parts at fraction 1/2
    q = p + d
    y, y2 = p * plan.scale, q * plan.scale
    frac = y - np.floor(y)
    eps = (y2 - y) - np.floor(y2 - y)  # fractional part of the scaled move
    u = np.minimum(frac + eps / 2, np.nextafter(1.0, 0.0))  # f + V < 1 <= f + eps + V
    return y, y2, u


@pytest.mark.parametrize(("m", "sensitivity", "n_rows"), [
    (1, math.sqrt(2.0), 1000), (78, math.sqrt(2.0), 4000), (2000, 2.0, 50),
    (5, 1e-250, 10), (3, 1e6, 2), (64, 2.0 / 1e6, 1_000_000)])
def test_coupled_rounding_meets_the_integer_sensitivity_on_worst_case_neighbours(
        m: int, sensitivity: float, n_rows: int) -> None:
    """Replace-one moves one client's part by ``Delta`` in L2; with the same uniforms the
    rounded parts differ by an integer vector within ``D2 = gamma Delta + sqrt(m)`` and
    ``D1`` (adversarial: every coordinate crosses one more level than its move), also at
    extreme magnitudes of the sensitivity and of the parts."""
    plan = plan_sum(m, sensitivity, 1.0, n_rows=n_rows, n_clients=3, min_clients=3)
    assert plan.scale >= 1 and math.log2(plan.scale) == int(math.log2(plan.scale))
    assert plan.inflation <= ROUNDING_INFLATION
    for offset in (0.0, -0.4 * plan.signal_bound / plan.scale):
        y, y2, u = _worst_pair(plan, 0.0, m, offset)
        w = round_shared(y2, u) - round_shared(y, u)
        levels = np.ceil(np.abs(y2 - y))
        assert np.array_equal(np.abs(w), levels)  # the coupling bound is attained
        assert np.linalg.norm(w) <= plan.l2_sensitivity
        assert np.abs(w).sum() <= plan.l1_sensitivity
        assert np.linalg.norm(w) >= plan.scale * sensitivity  # and D2 is nearly tight
        # random shared uniforms: always within the bound
        rng = np.random.default_rng(m)
        for _ in range(20):
            u = rng.random(m)
            w = round_shared(y2, u) - round_shared(y, u)
            assert np.all(np.abs(w) <= levels)
            assert np.linalg.norm(w) <= plan.l2_sensitivity


def test_gram_parts_of_worst_case_neighbours_round_within_the_bound() -> None:
    """Through the federated passes: replacing a unit row by an orthogonal one (a row at
    1e300 included, clipped by its client) moves only its client's Gram part, by at
    most sqrt(2) (1 + slack) on the upper triangle; the rounded parts stay within D2."""
    rng = np.random.default_rng(3)
    d = 6
    X = rng.standard_normal((40, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True) * 1.5
    X2 = X.copy()
    X[5] = 0.0
    X[5, 0] = 1e300  # clipped to norm 1
    X2[5] = 0.0
    X2[5, 1] = 1.0
    bounds = np.array([0, 10, 25, 40])
    fr = FederatedRows.from_data(X, bounds, 1.0, shared=True)
    fr2 = FederatedRows.from_data(X2, bounds, 1.0, shared=True)
    P, P2 = fr.gram(), fr2.gram()
    assert isinstance(P, ClientParts) and P.n_clients == 3
    iu = np.triu_indices(d)
    a, b = P.parts[:, iu[0], iu[1]], P2.parts[:, iu[0], iu[1]]
    assert np.array_equal(a[1:], b[1:])  # the other clients' parts are bitwise equal
    delta = math.sqrt(2.0) * (1.0 + fr.rounding_slack())
    assert np.linalg.norm(a[0] - b[0]) <= delta
    assert np.linalg.norm(a[0] - b[0]) >= 0.99 * math.sqrt(2.0)  # worst case attained
    plan = plan_sum(iu[0].size, delta, 1.0, n_rows=40, n_clients=3, min_clients=3)
    for seed in range(50):
        u = np.random.default_rng(seed).random(iu[0].size)
        w = round_shared(b[0] * plan.scale, u) - round_shared(a[0] * plan.scale, u)
        assert np.linalg.norm(w) <= plan.l2_sensitivity
        assert np.abs(w).sum() <= plan.l1_sensitivity


# -- the sum -------------------------------------------------------------------------------


def test_decoded_sum_is_the_rounded_parts_plus_the_shares_exactly() -> None:
    K, m = 4, 50
    parts = np.random.default_rng(1).standard_normal((K, m)) * 30.0
    plan = plan_sum(m, 2.0, 3.0, n_rows=100, n_clients=K, min_clients=K)
    seeds = [np.random.SeedSequence(9, spawn_key=(i,)) for i in range(K)]
    out = secure_sum(parts, plan, [np.random.default_rng(s) for s in seeds])
    total = np.zeros(m, dtype=np.int64)
    noise = np.zeros(m, dtype=np.int64)
    for i, s in enumerate(seeds):
        rng = np.random.default_rng(s)  # the client's stream: uniforms, then its share
        total += round_shared(parts[i] * plan.scale, rng.random(m))
        noise += skellam_noise(plan.share_parameter, m, rng)
    scaled = out * plan.scale  # exact: gamma is a power of two, integers below 2^53
    assert np.array_equal(scaled, (total + noise).astype(np.float64))
    assert np.all(np.abs(total) <= plan.signal_bound)
    # the rounding is unbiased and small: within K levels of the exact sum
    assert np.all(np.abs(total - parts.sum(axis=0) * plan.scale) < K)


@pytest.mark.parametrize(("K", "k_min"), [(5, 5), (5, 3)])
def test_noise_of_the_decoded_sum_matches_the_claim(K: int, k_min: int) -> None:
    """Std of the decoded noise (zero parts, 2,000 coordinates x 40 sums) against the
    plan's: ``sqrt(K / k_min) z D2 / gamma``, at most ``(1 + 2^-10) z Delta`` times
    ``sqrt(K / k_min)``."""
    m, z, delta = 2000, 2.0, math.sqrt(2.0)
    plan = plan_sum(m, delta, z, n_rows=500, n_clients=K, min_clients=k_min)
    claim = plan.noise_std()
    assert z * delta * math.sqrt(K / k_min) <= claim
    assert claim <= z * delta * math.sqrt(K / k_min) * (1 + ROUNDING_INFLATION) * (1 + 1e-9)
    rng = np.random.default_rng(5)
    draws = np.concatenate([secure_sum(np.zeros((K, m)), plan, rng.spawn(K))
                            for _ in range(40)])
    n = draws.size
    assert draws.mean() == pytest.approx(0.0, abs=5 * claim / math.sqrt(n))
    assert draws.std() / claim == pytest.approx(1.0, abs=5 * math.sqrt(0.5 / n))


def test_dropouts_below_min_clients_are_refused_and_above_carry_the_noise() -> None:
    K, m = 4, 400
    plan = plan_sum(m, 2.0, 1.5, n_rows=100, n_clients=K, min_clients=3)
    rngs = np.random.default_rng(2).spawn(K)
    with pytest.raises(InsufficientNoiseError, match="min_clients=3"):
        secure_sum(np.zeros((K, m)), plan, rngs, clients=[0, 2])
    out = np.concatenate([secure_sum(np.zeros((K, m)), plan, np.random.default_rng(s)
                                     .spawn(K), clients=[0, 1, 3]) for s in range(30)])
    # three shares of v / 3 each: the calibrated variance, no less
    assert plan.noise_std(3) == pytest.approx(1.5 * plan.l2_sensitivity / plan.scale)
    assert out.std() / plan.noise_std(3) == pytest.approx(1.0, abs=5 * math.sqrt(0.5 / out.size))


# -- accounting ---------------------------------------------------------------------------


def _rdp(event: dp_event.DpEvent, orders: list[float]) -> np.ndarray:
    assert isinstance(event, dp_event.ZCDpEvent)
    return event.xi + event.rho * np.asarray(orders)


@pytest.mark.parametrize("z", [0.3, 1.0, 4.0, 40.0])
@pytest.mark.parametrize(("m", "sensitivity"), [(1, 1.0), (78, math.sqrt(2.0)),
                                                (68, 2.0), (24, 2e-3), (500, 7.0)])
def test_the_release_event_dominates_every_secure_sum(z: float, m: int,
                                                      sensitivity: float) -> None:
    """``sum_event(z)`` is at least the published Skellam bound of every sum with that
    noise multiplier (its own D2, D1, v), at integer orders, and at least each sum's own
    event (integer and fractional orders); its Gaussian part is the Gaussian's RDP."""
    plan = plan_sum(m, sensitivity, z, n_rows=1000, n_clients=4, min_clients=4)
    event = sum_event(z)
    ints = [o for o in ORDERS if o == int(o)]
    bound = skellam_rdp(ints, plan.l2_sensitivity, plan.l1_sensitivity, plan.noise_variance)
    assert np.all(_rdp(event, ints) >= bound)
    assert np.all(_rdp(event, ORDERS) >= _rdp(plan.event(), ORDERS) * (1 - 1e-12))
    gauss = np.asarray(ORDERS) / (2 * z * z)
    assert np.all(_rdp(event, ORDERS) >= gauss)
    assert event.rho == pytest.approx(1 / (2 * z * z), rel=1e-4)


def test_the_fit_is_calibrated_in_rdp_to_the_target_and_charged_first(data: np.ndarray) -> None:
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.pca.api import planned_event

    ledger = PrivacyLedger(1e-6, max_epsilon=2.0)
    res = fit_private_pca(data, 2, method="fixed", target_epsilon=1.0, target_delta=1e-6,
                          row_norm=1.0, seed=0, clients=BOUNDS, trust="secure-aggregation",
                          ledger=ledger, center="private")
    planned = planned_event("fixed", target_epsilon=1.0, target_delta=1e-6,
                            center="private", trust="secure-aggregation")
    assert ledger.events == [planned] and res.dp_event == planned
    assert res.epsilon == ledger.epsilon == epsilon_of(planned, 1e-6, "rdp")
    assert 1.0 * (1 - 1e-3) <= res.epsilon <= 1.0
    # the multipliers are the Gaussian plan's at a larger common scale (RDP, Skellam)
    central = fit_private_pca(data, 2, method="fixed", target_epsilon=1.0, target_delta=1e-6,
                              row_norm=1.0, seed=0, center="private")
    ratio = {k: res.info["noise_multipliers"][k] / v
             for k, v in central.info["noise_multipliers"].items() if math.isfinite(v)}
    assert max(ratio.values()) == pytest.approx(min(ratio.values()), rel=1e-12)
    assert 1.0 < min(ratio.values()) < 1.15
    # the fit's mean is a secure sum too (one more sum than without centering)
    assert res.info["secure_aggregation"]["n_sums"] == 1 + 1 + 2 * 2


def test_accuracy_is_close_to_the_central_gaussian_fit(data: np.ndarray) -> None:
    """On a seeded spike, the secure-aggregation fit's error is within the noise ratio
    of the central one (its z is 8% larger: RDP with the Skellam events against the
    exact Gaussian PLD), and below the local-trust fit's (sqrt(K) = 2x the noise)."""
    V = top_right_singular_vectors(ClippedRows.from_data(data, 1.0).materialize(), 2)
    errs: dict[str, list[float]] = {"central": [], "secagg": [], "local": []}
    kw = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0)
    for method in ("analyze_gauss", "auto"):
        for s in range(6):
            errs["central"].append(sin_theta(fit_private_pca(
                data, 2, method=method, seed=s, **kw).basis, V))
            errs["secagg"].append(sin_theta(fit_private_pca(
                data, 2, method=method, seed=s, clients=BOUNDS, trust="secure-aggregation",
                **kw).basis, V))
            errs["local"].append(sin_theta(fit_private_pca(
                data, 2, method=method, seed=s, clients=BOUNDS, **kw).basis, V))
    med = {k: float(np.median(v)) for k, v in errs.items()}
    assert med["secagg"] <= 1.25 * med["central"]
    assert med["secagg"] < med["local"]


def test_min_clients_tolerates_dropouts_at_more_noise(data: np.ndarray) -> None:
    res = fit_private_pca(data, 2, method="analyze_gauss", target_epsilon=1.0,
                          target_delta=1e-6, row_norm=1.0, seed=0, clients=BOUNDS,
                          trust="secure-aggregation", min_clients=2)
    assert res.info["secure_aggregation"]["min_clients"] == 2
    assert 1.0 * (1 - 1e-3) <= res.epsilon <= 1.0


# -- the kernels' source and the refusals ------------------------------------------------


def test_secure_sums_source_releases_symmetric_parts_and_refuses_the_rest() -> None:
    K, d = 3, 5
    rng = np.random.default_rng(0)
    src = SecureSums(rng.spawn(K), rng, n_rows=30, fp=1.0)
    parts = ClientParts(np.stack([np.eye(d) * (i + 1) for i in range(K)]))
    M = release(parts, 0.5 * math.sqrt(2.0), src, symmetric=True, sensitivity=math.sqrt(2.0))
    assert np.array_equal(M, M.T) and src.plans[-1].dim == d * (d + 1) // 2
    assert src.plans[-1].noise_multiplier == pytest.approx(0.5)
    with pytest.raises(TypeError, match="sum of client parts"):
        release(np.eye(d), 1.0, src, symmetric=True, sensitivity=1.0)
    with pytest.raises(TypeError, match="sensitivity"):
        release(parts, 1.0, src, symmetric=True)
    with pytest.raises(TypeError, match="drawn beforehand"):
        release(parts, 1.0, src, noise=np.zeros((d, d)), sensitivity=1.0)
    with pytest.raises(ValueError, match="std > 0"):
        release(parts, 0.0, src, sensitivity=1.0)
    with pytest.raises(TypeError, match="Gaussian noise cannot be drawn"):
        gaussian_noise((3,), 1.0, src)
    with pytest.raises(TypeError, match="Gaussian noise cannot be drawn"):
        symmetric_gaussian(3, 1.0, src)
    with pytest.raises(TypeError, match="not released"):
        np.trace(parts)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        parts @ parts
    assert (parts @ np.ones((d, 2))).shape == (d, 2) and parts.T[0:2].shape == (2, d)
    with pytest.raises(AttributeError, match="only secure sums"):
        src.poisson  # noqa: B018


def test_plan_refusals_name_the_quantity() -> None:
    with pytest.raises(ValueError, match="sensitivity=1e-310 is too small"):
        plan_sum(3, 1e-310, 1.0, n_rows=10, n_clients=2, min_clients=2)
    with pytest.raises(ValueError, match="beyond 2\\^52"):
        plan_sum(3, 1e15, 1.0, n_rows=10, n_clients=2, min_clients=2)
    with pytest.raises(ValueError, match="min_clients"):
        plan_sum(3, 1.0, 1.0, n_rows=10, n_clients=2, min_clients=3)
    with pytest.raises(ValueError, match=r"inflation <= 0\.2"):
        sum_event(1.0, inflation=0.5)
    with pytest.raises(ValueError, match="Poisson sampler"):
        plan_sum(3, 1.0, 1e9, n_rows=10, n_clients=2, min_clients=2)


@pytest.mark.parametrize("method", ["auto", "power"])
def test_secure_mode_draws_every_share_from_the_csprng(data: np.ndarray, monkeypatch,
                                                       method: str) -> None:
    """secure=True under secure aggregation, in process: every client message of every
    sum (its rounding and Skellam share, one stream) from a SecureGenerator; the plan's
    event and epsilon are the seeded fit's, the result records secure mode; two fits
    differ."""
    from tests.spies import share_sources

    kw = dict(method=method, target_epsilon=2.0, target_delta=1e-6, row_norm=8.0,
              clients=BOUNDS, trust="secure-aggregation")
    seeded = fit_private_pca(data, 2, seed=3, **kw)
    kinds = share_sources(monkeypatch)
    a = fit_private_pca(data, 2, secure=True, **kw)
    b = fit_private_pca(data, 2, secure=True, **kw)
    K = len(BOUNDS) - 1
    n_sums = a.info["secure_aggregation"]["n_sums"] + b.info["secure_aggregation"]["n_sums"]
    assert kinds == ["SecureGenerator"] * (K * n_sums) and n_sums >= 2
    assert a.dp_event == seeded.dp_event and a.epsilon == seeded.epsilon
    assert a.info["secure_aggregation"]["secure"] is True  # recorded, as over a network
    assert seeded.info["secure_aggregation"]["secure"] is False
    assert not np.array_equal(a.components, b.components)
    np.testing.assert_allclose(a.components @ a.components.T, np.eye(2), atol=1e-8)


def test_a_release_no_plan_carries_says_the_fit_was_charged() -> None:
    """A release planned during the fit whose Skellam share would exceed the samplers'
    2^50 (epsilon 0.003, d = 300: noise multiplier 1032) stops the fit by name, saying
    that the fit's event was charged when it began (the ledger holds it)."""
    X = np.random.default_rng(0).standard_normal((3000, 300))
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    with pytest.raises(ValueError, match=r"2\^50.*raise epsilon.*planned during the fit"
                                         r".*charged when the fit began"):
        fit_private_pca(X, 2, method="analyze_gauss", target_epsilon=0.003,
                        target_delta=1e-6, row_norm=40.0, clients=[0, 1000, 2000, 3000],
                        trust="secure-aggregation", ledger=ledger)
    assert len(ledger.events) == 1


def test_fit_refusals_name_the_setting(data: np.ndarray) -> None:
    kw = dict(method="analyze_gauss", target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
              clients=BOUNDS, trust="secure-aggregation")
    with pytest.raises(ValueError, match="secure=True refuses seeds"):
        fit_private_pca(data, 2, secure=True, seed=1, **kw)
    with pytest.raises(ValueError, match="private mechanism"):
        fit_private_pca(data, 2, add_noise=False, **kw)
    with pytest.raises(ValueError, match="private mechanism"):
        fit_private_pca(data, 2, **{**kw, "method": "exact"})
    with pytest.raises(ValueError, match="min_clients"):
        fit_private_pca(data, 2, min_clients=9, **kw)
    with pytest.raises(ValueError, match="min_clients=2 applies to trust='secure-aggregation'"):
        fit_private_pca(data, 2, min_clients=2, **{**kw, "trust": "local"})


def test_secure_aggregation_spends_no_more_than_the_gaussian_plus_rounding() -> None:
    """The recalibrated plan: a Gaussian's RDP calibrated at the same target needs a
    noise multiplier within 3% of the secure one (the rho / 2 of the fractional-order
    extension and the correction terms are the difference)."""
    from dpprecond.pca.api import planned_event

    z_rdp = calibrate_noise(gaussian, 1.0, 1e-6, "rdp")
    ev = planned_event("analyze_gauss", target_epsilon=1.0, target_delta=1e-6,
                       trust="secure-aggregation")
    assert isinstance(ev, dp_event.ZCDpEvent)
    z_sec = 1 / math.sqrt(2 * ev.rho)  # rho ~ 1 / (2 z^2)
    assert z_rdp < z_sec < 1.03 * z_rdp
