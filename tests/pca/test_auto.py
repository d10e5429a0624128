"""method="auto" (pca/auto.py): budget spent exactly in every branch, sensitivities pinned,
the Analyze Gauss branch equal to Analyze Gauss, the noise coupling, exactness without
noise, reproducibility, extreme magnitudes and option errors."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of, gaussian, gaussian_precision
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca.auto import (
    HIST_EDGES,
    RADIUS_GRID,
    clipped_step,
    coupled_symmetric_noise,
    estimate_spectrum,
    fit_auto,
    iteration_weights,
    noisy_histogram,
    predict_errors,
)
from dpprecond.pca.baselines import analyze_gauss
from dpprecond.pca.budget import plan_auto
from dpprecond.pca.metrics import sin_theta
from dpprecond.pca.rows import ClippedRows, DenseRows

EPS, DELTA, K = 1.0, 1e-6, 2


@pytest.fixture(scope="module")
def data():
    A = spiked_covariance(4000, 30, K, 20.0, seed=11)
    S = A.T @ A
    _w, U = np.linalg.eigh(S)
    return DenseRows(A), S, U[:, ::-1][:, :K]


def _z_pca(eps=EPS, delta=DELTA):
    return plan_auto(eps, delta).noise_multipliers["z_pca"]


# -- accounting ---------------------------------------------------------------------------

@pytest.mark.parametrize(("branch", "n_iter"), [("analyze_gauss", None), ("iterate", 1),
                                                ("iterate", 2), ("iterate", 3),
                                                ("rule", None)])
def test_epsilon_is_the_target_in_every_branch(data, branch, n_iter):
    rows, S, _ = data
    res = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=3, branch=branch, n_iter=n_iter)
    z = _z_pca()
    # The releases compose to exactly one Gaussian with the calibrated multiplier ...
    assert gaussian_precision(res.dp_event) == pytest.approx(z**-2, rel=1e-12)
    # ... so the reported epsilon is the target (calibration tolerance 1e-4) and never above.
    assert res.epsilon == pytest.approx(EPS, rel=1e-4)
    assert res.epsilon <= EPS
    assert res.epsilon == pytest.approx(float(dp_accounting.get_epsilon_gaussian(z, DELTA)),
                                        rel=1e-12)
    n_releases = len(res.dp_event.events)
    assert n_releases == (3 if res.branch == "analyze_gauss" else 2 + res.info["n_iter"])
    assert all(isinstance(e, dp_event.GaussianDpEvent) for e in res.dp_event.events)


def test_event_multipliers_match_the_shares(data):
    rows, S, _ = data
    res = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=4, branch="iterate", n_iter=3,
                   init_share=0.4, probe_share=0.02)
    z = _z_pca()
    zs = [e.noise_multiplier for e in res.dp_event.events]
    rest = 1 - 0.4 - 0.02
    expected = [z / math.sqrt(0.4), z / math.sqrt(0.02),
                *(z / math.sqrt(rest * w) for w in iteration_weights(3))]
    assert zs == pytest.approx(expected, rel=1e-12)


def test_budget_share_composes_with_the_callers_release(data):
    rows, S, _ = data
    plan = plan_auto(EPS, DELTA, mean_share=0.1)
    res = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=5, budget_share=0.9)
    assert res.info["noise_multipliers"]["z_pca"] == pytest.approx(
        plan.noise_multipliers["z_pca"], rel=1e-12)
    total = epsilon_of([gaussian(plan.noise_multipliers["z_mean"]), res.dp_event], DELTA, "pld")
    assert total == pytest.approx(EPS, rel=1e-4)
    assert total <= EPS


# -- the Analyze Gauss branch and the coupling -------------------------------------------------

def test_analyze_gauss_branch_is_analyze_gauss_for_the_same_seed(data):
    rows, S, _ = data
    probe = 0.01
    res = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=np.random.default_rng(9),
                   branch="analyze_gauss", probe_share=probe)
    # Analyze Gauss at the precision the branch spends on A^T A (all but the probe's share).
    z_ag = _z_pca() / math.sqrt(1 - probe)
    X, w = analyze_gauss(S, K, z_ag, np.random.default_rng(9))
    assert np.abs(X.T @ res.components) == pytest.approx(np.eye(K), abs=1e-9)
    assert res.eigenvalues == pytest.approx(w, rel=1e-12)


def test_coupled_noise_is_two_independent_releases_that_average_to_the_full_one():
    rng = np.random.default_rng(0)
    s_full, s_first = 1.3, 2.1
    firsts, seconds = [], []
    iu = np.triu_indices(150)
    for _ in range(6):
        c = coupled_symmetric_noise(150, s_full, s_first, rng)
        first, second = c.first, c.second
        firsts.append(first[iu])
        seconds.append(second[iu])
        # Inverse-variance average of S + first and S + second is S + full.
        avg = (first / c.var_first + second / c.var_second) / (
            1 / c.var_first + 1 / c.var_second)
        assert np.abs(avg - c.full).max() < 1e-12
        assert np.array_equal(first, first.T) and np.array_equal(second, second.T)
    f, s = np.concatenate(firsts), np.concatenate(seconds)
    N = f.size
    v1 = s_first**2
    v2 = s_full**2 * v1 / (v1 - s_full**2)
    # Sample (co)variances within 5 standard errors of the design values.
    assert np.mean(f * s) == pytest.approx(0.0, abs=5 * math.sqrt(v1 * v2 / N))
    assert np.var(f) == pytest.approx(v1, abs=5 * v1 * math.sqrt(2 / N))
    assert np.var(s) == pytest.approx(v2, abs=5 * v2 * math.sqrt(2 / N))
    # The precisions add up: 1/v1 + 1/v2 = 1/v_full.
    assert 1 / v1 + 1 / v2 == pytest.approx(1 / s_full**2, rel=1e-12)


def test_coupled_noise_full_part_is_the_single_release_draw():
    a = coupled_symmetric_noise(7, 0.5, 0.9, np.random.default_rng(1))
    from dpprecond.pca.noise import symmetric_gaussian

    assert np.array_equal(a.full, symmetric_gaussian(7, 0.5, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="std_first >= std_full"):
        coupled_symmetric_noise(3, 1.0, 0.5, np.random.default_rng(0))


# -- sensitivities of the new releases ------------------------------------------------------

def test_histogram_sensitivity_sqrt2():
    """Replace-one moves one value between bins: the counts change by exactly sqrt(2)."""
    rng = np.random.default_rng(2)
    r = rng.uniform(0, 4, 300)
    r2 = r.copy()
    r2[0] = 0.0 if r[0] > HIST_EDGES[0] else 100.0  # lands in another bin
    h, h2 = (noisy_histogram(x, HIST_EDGES, 0.0, rng) for x in (r, r2))
    assert np.linalg.norm(h - h2) == pytest.approx(math.sqrt(2), rel=1e-15)
    for _ in range(100):
        r3 = r.copy()
        r3[rng.integers(300)] = rng.uniform(0, 100)
        assert np.linalg.norm(noisy_histogram(r3, HIST_EDGES, 0.0, rng) - h) <= math.sqrt(2)


def test_clipped_step_sensitivity_2R_reached():
    """Z = sum a_i c_i^T with ||c_i|| <= R: the pair a = cos e1 + sin e_{k+1},
    a' = cos e1 - sin e_{k+1}, both clipped to R e1 by a large public B, changes Z by
    2 R sin(phi) -> 2R."""
    d, k, R, b = 7, 2, 0.3, 1e5
    X = np.eye(d)[:, :k]
    B = b * np.eye(k)
    cos_phi = 2 * R / b
    sin_phi = math.sqrt(1 - cos_phi**2)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((25, d)) * 1e-6
    A[0] = cos_phi * np.eye(d)[0] + sin_phi * np.eye(d)[k]
    A2 = A.copy()
    A2[0] = cos_phi * np.eye(d)[0] - sin_phi * np.eye(d)[k]
    Z = clipped_step(DenseRows(A), X, B, R, 0.0, rng)
    Z2 = clipped_step(DenseRows(A2), X, B, R, 0.0, rng)
    assert np.linalg.norm(Z - Z2) == pytest.approx(2 * R, rel=1e-8)
    assert np.linalg.norm(Z - Z2) <= 2 * R
    for _ in range(100):
        A3 = A.copy()
        v = rng.standard_normal(d)
        A3[rng.integers(25)] = v / np.linalg.norm(v) * rng.uniform(0, 1)
        Bq = rng.standard_normal((k, k))
        Bq = Bq @ Bq.T * 1e3
        diff = clipped_step(DenseRows(A3), X, Bq, R, 0.0, rng) - clipped_step(
            DenseRows(A), X, Bq, R, 0.0, rng)
        assert np.linalg.norm(diff) <= 2 * R * (1 + 1e-12)


# -- exactness, reproducibility, extremes ---------------------------------------------------

@pytest.mark.parametrize("branch", ["analyze_gauss", "iterate", "rule"])
def test_noise_off_and_no_clipping_returns_the_exact_subspace(data, branch):
    rows, S, V = data
    res = fit_auto(rows, S, K, epsilon=None, delta=DELTA, rng=0, branch=branch,
                   add_noise=False, clip_radius=math.inf)
    assert sin_theta(res.components, V) < 1e-8
    assert res.epsilon == math.inf
    assert isinstance(res.dp_event, dp_event.NonPrivateDpEvent)


def test_reproducible_with_a_seed(data):
    rows, S, _ = data
    a = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=42, branch="iterate")
    b = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=42, branch="iterate")
    c = fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=43, branch="iterate")
    assert np.array_equal(a.components, b.components)
    assert np.array_equal(a.info["probe_counts"], b.info["probe_counts"])
    assert not np.array_equal(a.components, c.components)


def test_useful_at_moderate_noise(data):
    """Both branches estimate the subspace of this well-separated spike (eps = 4)."""
    rows, S, V = data
    for branch in ("analyze_gauss", "iterate"):
        res = fit_auto(rows, S, K, epsilon=4.0, delta=DELTA, rng=1, branch=branch)
        assert sin_theta(res.components, V) < 0.5


@pytest.mark.parametrize("scale", [1e300, 1e-300, 1e8])
def test_extreme_rows(scale):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((600, 8))
    X[0] *= scale  # one huge (or tiny) row among ordinary ones
    rows = ClippedRows.from_data(X, row_norm=3.0)
    S = rows.gram()
    assert np.all(np.isfinite(S))
    for branch in ("analyze_gauss", "iterate", "rule"):
        res = fit_auto(rows, S, 2, epsilon=EPS, delta=DELTA, rng=0, branch=branch)
        assert np.all(np.isfinite(res.components))
        assert res.components.T @ res.components == pytest.approx(np.eye(2), abs=1e-10)
        assert res.epsilon == pytest.approx(EPS, rel=1e-4)


# -- the rule ---------------------------------------------------------------------------------

def test_spectrum_estimate_inverts_the_spike_shift():
    d, s, center = 400, 0.5, 10.0
    edge = 2 * s * math.sqrt(d)
    h_k, h_k1 = 40.0, 25.0  # both above the detection threshold s sqrt(d) = 10
    top = center + np.array([h_k + s * s * d / h_k] * 2 + [h_k1 + s * s * d / h_k1])
    eig = np.concatenate([top, np.full(d - 3, center)])
    lam_k, rest = estimate_spectrum(eig, center, 2, s, d)
    assert lam_k == pytest.approx(center + h_k, rel=1e-12)
    assert rest[0] == pytest.approx(center + h_k1, rel=1e-12)
    assert rest.shape == (d - 2,)
    assert np.all(rest[1:] == center)
    # Inside the noise bulk: not detectable, and lambda_{k+1} falls back to the bulk top.
    eig = np.concatenate([np.full(3, center + 0.9 * edge), np.full(d - 3, center)])
    lam_k, rest = estimate_spectrum(eig, center, 2, s, d)
    assert lam_k is None
    assert rest[0] == pytest.approx(center, abs=1e-12)


def _counts(n):
    c = np.zeros(HIST_EDGES.size + 1)
    c[np.searchsorted(HIST_EDGES, 1.0, side="right")] = n  # every row at the RMS norm
    return c


def test_rule_prefers_the_iteration_on_a_spread_spectrum_and_not_without_a_gap():
    kw = dict(center=50.0, counts=_counts(100000), n=100000, d=1500, k=5, init_std=6.0,
              full_std=4.2, rest_multiplier=6.0, iter_choices=(2, 3), count_std=60.0,
              switch_ratio=0.9, iter_calibration=1.0, count_threshold=3.0)
    bulk = np.full(1494, 50.0)
    spread = predict_errors(eigvals=np.concatenate([[600.0] * 5, [70.0], bulk]), **kw)
    assert spread.iterate and spread.error_iterate < spread.error_analyze_gauss
    assert spread.radius_factor in RADIUS_GRID
    # inside the noise bulk (edge 2 * 6 * sqrt(1500) = 465 above the centre)
    flat = predict_errors(eigvals=np.concatenate([[300.0] * 6, bulk]), **kw)
    assert not flat.iterate and flat.lam_k is None


# -- options ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("opts", "exc", "match"), [
    ({"bogus": 1}, TypeError, "bogus"),
    ({"init_share": 1.5}, ValueError, "init_share"),
    ({"init_share": 0.0}, ValueError, "init_share"),
    ({"probe_share": -0.1}, ValueError, "probe_share"),
    ({"init_share": 0.9, "probe_share": 0.1}, ValueError, "init_share \\+ probe_share"),
    ({"n_iter": 0}, ValueError, "n_iter"),
    ({"n_iter": 2.5}, TypeError, "n_iter"),
    ({"iter_choices": ()}, ValueError, "iter_choices"),
    ({"iter_choices": (2, 0)}, ValueError, "iter_choices"),
    ({"branch": "fastest"}, ValueError, "branch"),
    ({"clip_radius": -1.0}, ValueError, "clip_radius"),
    ({"clip_radius": math.inf}, ValueError, "clip_radius"),
    ({"switch_ratio": 0}, ValueError, "switch_ratio"),
    ({"add_noise": "yes"}, TypeError, "add_noise"),
])
def test_bad_options(data, opts, exc, match):
    rows, S, _ = data
    with pytest.raises(exc, match=match):
        fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, rng=0, **opts)


def test_bad_arguments(data):
    rows, S, _ = data
    with pytest.raises(ValueError, match="epsilon"):
        fit_auto(rows, S, K, epsilon=-1.0, delta=DELTA)
    with pytest.raises(TypeError, match="epsilon"):
        fit_auto(rows, S, K, epsilon=None, delta=DELTA)
    with pytest.raises(ValueError, match="shape"):
        fit_auto(rows, S[:5, :5], K, epsilon=EPS, delta=DELTA)
    with pytest.raises(ValueError, match="budget_share"):
        fit_auto(rows, S, K, epsilon=EPS, delta=DELTA, budget_share=0.0)
    with pytest.raises(ValueError, match="k"):
        fit_auto(rows, S, 31, epsilon=EPS, delta=DELTA)


def test_k_equals_d_takes_the_analyze_gauss_branch(data):
    rows, S, _ = data
    res = fit_auto(rows, S, 30, epsilon=EPS, delta=DELTA, rng=0)
    assert res.branch == "analyze_gauss"
    assert res.components.T @ res.components == pytest.approx(np.eye(30), abs=1e-10)
    assert res.epsilon == pytest.approx(EPS, rel=1e-4)
