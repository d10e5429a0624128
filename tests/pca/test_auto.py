"""method="auto" (pca/auto.py): budget spent exactly in every branch, sensitivities pinned,
the Analyze Gauss branch equal to Analyze Gauss, the noise coupling, exactness without
noise, reproducibility, extreme magnitudes and option errors."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import gaussian_precision
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.noise import coupled_symmetric_gaussian, symmetric_gaussian
from dpprecond.pca.auto import (
    HIST_EDGES,
    POOR_START_TAN2,
    RADIUS_GRID,
    _start_tilt,
    clipped_step,
    estimate_spectrum,
    fit_auto,
    predict_errors,
    probe,
    rescaled_gram,
    row_scale,
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
    res = fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=3, branch=branch,
                   n_iter=n_iter)
    z = _z_pca()
    # The releases compose to exactly one Gaussian with the calibrated multiplier ...
    assert gaussian_precision(res.dp_event) == pytest.approx(z**-2, rel=1e-12)
    # ... so the reported epsilon is the target (calibration tolerance 1e-4) and never above.
    assert res.epsilon == pytest.approx(EPS, rel=1e-4)
    assert res.epsilon <= EPS
    assert res.epsilon == pytest.approx(float(dp_accounting.get_epsilon_gaussian(z, DELTA)),
                                        rel=1e-12)
    n_releases = len(res.dp_event.events)
    probed = res.info["probe_counts"] is not None  # M1, [the probe], M2 or the T steps
    assert probed or res.branch == "analyze_gauss"  # only Analyze Gauss goes without it
    assert probed == ("z_probe" in res.info["noise_multipliers"])
    completion = 1 if res.branch == "analyze_gauss" else res.info["n_iter"]
    assert n_releases == 1 + probed + completion
    assert all(isinstance(e, dp_event.GaussianDpEvent) for e in res.dp_event.events)


def _heavy_rows(n=200000, d=20, k=2, theta=9.0, seed=5):
    """Spiked rows with multivariate-t (3 d.o.f.) norms divided by the largest: most rows
    lie far below the bound of 1, so M1's noise hides the top k (issue 21)."""
    rng = np.random.default_rng(seed)
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    G = rng.standard_normal((n, d))
    G += (math.sqrt(1 + theta) - 1) * (G @ V) @ V.T
    G /= np.sqrt(rng.chisquare(3, n) / 3)[:, None]
    G /= np.linalg.norm(G, axis=1).max()
    return DenseRows(G), V


@pytest.fixture(scope="module")
def heavy():
    rows, V = _heavy_rows()
    return rows, rows.A.T @ rows.A, V


def test_hidden_top_k_far_below_the_bound_takes_the_rows_scale_exactly(heavy):
    """M1 hides the top k; the probe, through a noise-driven X0, gives the rows' scale; the
    release at that scale shows the top k, and Analyze Gauss is completed there. Every
    release is a Gaussian and the total is still exactly the target."""
    rows, S, V = heavy
    res = fit_auto(rows, S, 2, noise_multiplier=_z_pca(), delta=DELTA, rng=1)
    assert res.info["prediction"]["hidden"]
    assert res.branch == "analyze_gauss_rescaled"
    assert 0 < res.info["row_scale"] < 0.3
    assert len(res.dp_event.events) == 4  # M1, probe, M1 at the rows' scale, M2
    assert gaussian_precision(res.dp_event) == pytest.approx(_z_pca()**-2, rel=1e-12)
    assert res.epsilon == pytest.approx(EPS, rel=1e-4) and res.epsilon <= EPS
    ag = analyze_gauss(S, 2, _z_pca(), np.random.default_rng(1))[0]
    assert sin_theta(res.basis, V) < 0.5 * sin_theta(ag, V)


def test_hidden_analyze_gauss_completion_spends_exactly_what_is_left():
    """Rows far below the bound but no top k to find: the diagnostic at the rows' scale
    shows nothing, and the Analyze Gauss completion gets exactly the precision left."""
    rows, _ = _heavy_rows(theta=0.0)
    S = rows.A.T @ rows.A
    res = fit_auto(rows, S, 2, noise_multiplier=_z_pca(), delta=DELTA, rng=1)
    assert res.info["prediction"]["hidden"] and res.branch == "analyze_gauss"
    assert "z_rescaled" in res.info["noise_multipliers"] and res.info["row_scale"] == 1.0
    assert len(res.dp_event.events) == 4
    assert gaussian_precision(res.dp_event) == pytest.approx(_z_pca()**-2, rel=1e-12)
    assert res.epsilon == pytest.approx(EPS, rel=1e-4) and res.epsilon <= EPS


# -- the Analyze Gauss branch and the coupling -------------------------------------------------

def test_analyze_gauss_branch_is_analyze_gauss_for_the_same_seed(data):
    """Without a probe (forced here) the branch spends the whole precision on A^T A: it is
    Analyze Gauss at the calibrated multiplier, with Analyze Gauss's own noise."""
    rows, S, _ = data
    res = fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=np.random.default_rng(9),
                   branch="analyze_gauss")
    assert res.info["probe_counts"] is None and len(res.dp_event.events) == 2
    X, w = analyze_gauss(S, K, _z_pca(), np.random.default_rng(9))
    assert np.abs(X.T @ res.basis) == pytest.approx(np.eye(K), abs=1e-9)
    assert res.eigenvalues == pytest.approx(w, rel=1e-12)


def test_coupled_noise_is_two_independent_releases_that_average_to_the_full_one():
    rng = np.random.default_rng(0)
    s_full, s_first = 1.3, 2.1
    firsts, seconds = [], []
    iu = np.triu_indices(150)
    for _ in range(6):
        c = coupled_symmetric_gaussian(150, s_full, s_first, rng)
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
    a = coupled_symmetric_gaussian(7, 0.5, 0.9, np.random.default_rng(1))

    assert np.array_equal(a.full, symmetric_gaussian(7, 0.5, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="std_first >= std_full"):
        coupled_symmetric_gaussian(3, 1.0, 0.5, np.random.default_rng(0))


# -- sensitivities of the new releases ------------------------------------------------------

def test_probe_sensitivity_2_reached():
    """The probe releases counts and rest energies per bin: a row with no top-k part (bin
    0, rest energy 1) replaced by one that is almost all rest but has a huge preconditioned
    norm (top bin) changes the vector by sqrt(1 + 1 + 1 + (1 - eps^2)^2) -> 2."""
    d, k, b, unit = 6, 2, 1e9, 0.01
    X, B = np.eye(d)[:, :k], b * np.eye(k)
    eps = 1e-4
    rng = np.random.default_rng(0)
    A = rng.standard_normal((40, d)) * 1e-3
    A[0] = np.eye(d)[k]
    A2 = A.copy()
    A2[0] = math.sqrt(1 - eps**2) * np.eye(d)[k] + eps * np.eye(d)[0]
    h = np.concatenate(probe(DenseRows(A), X, B, unit, HIST_EDGES, 0.0, rng))
    h2 = np.concatenate(probe(DenseRows(A2), X, B, unit, HIST_EDGES, 0.0, rng))
    assert np.linalg.norm(h - h2) == pytest.approx(2.0, rel=1e-6)
    assert np.linalg.norm(h - h2) <= 2.0
    for _ in range(100):
        A3 = A.copy()
        v = rng.standard_normal(d)
        A3[rng.integers(40)] = v / np.linalg.norm(v) * rng.uniform(0, 1)
        Bq = rng.standard_normal((k, k))
        Bq = Bq @ Bq.T * rng.uniform(0.1, 1e3)
        diff = (np.concatenate(probe(DenseRows(A3), X, Bq, unit, HIST_EDGES, 0.0, rng))
                - np.concatenate(probe(DenseRows(A), X, Bq, unit, HIST_EDGES, 0.0, rng)))
        assert np.linalg.norm(diff) <= 2.0


@pytest.mark.parametrize("tau", [1.0, 0.3, 2.0**-9])
def test_rescaled_gram_sensitivity_sqrt2(tau):
    """Rows divided by the public tau and clipped to norm 1: two neighbours with orthogonal
    rows of norm >= tau differ by e1 e1^T - e2 e2^T, Frobenius sqrt(2) (the upper triangle
    releases the diagonal part, norm sqrt(2)); no row, of any norm <= 1, does more."""
    rng = np.random.default_rng(4)
    A = rng.standard_normal((50, 4)) * 1e-3
    A[0] = np.eye(4)[0]
    A2 = A.copy()
    A2[0] = np.eye(4)[1] * max(tau, 0.5)
    S, S2 = rescaled_gram(DenseRows(A), tau), rescaled_gram(DenseRows(A2), tau)
    assert np.linalg.norm(np.triu(S - S2)) == pytest.approx(math.sqrt(2), rel=1e-8)
    for _ in range(100):
        A3 = A.copy()
        v = rng.standard_normal(4)
        A3[rng.integers(50)] = v / np.linalg.norm(v) * rng.uniform(0, 1)
        diff = np.triu(rescaled_gram(DenseRows(A3), tau) - S)
        assert np.linalg.norm(diff) <= math.sqrt(2) * (1 + 1e-12)
    # clipped rows as computed: every term has norm <= 1 even for tiny tau
    big = rescaled_gram(DenseRows(np.eye(4)), 2.0**-9)
    assert np.all(np.diag(big) <= 1.0)


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
    res = fit_auto(rows, S, K, noise_multiplier=None, delta=DELTA, rng=0, branch=branch,
                   add_noise=False, clip_radius=math.inf)
    assert sin_theta(res.basis, V) < 1e-8
    assert res.epsilon == math.inf
    assert isinstance(res.dp_event, dp_event.NonPrivateDpEvent)


def test_reproducible_with_a_seed(data):
    rows, S, _ = data
    a = fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=42, branch="iterate")
    b = fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=42, branch="iterate")
    c = fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=43, branch="iterate")
    assert np.array_equal(a.basis, b.basis)
    assert np.array_equal(a.info["probe_counts"], b.info["probe_counts"])
    assert not np.array_equal(a.basis, c.basis)


def test_useful_at_moderate_noise(data):
    """Both branches estimate the subspace of this well-separated spike (eps = 4)."""
    rows, S, V = data
    for branch in ("analyze_gauss", "iterate"):
        res = fit_auto(rows, S, K, noise_multiplier=_z_pca(4.0), delta=DELTA, rng=1, branch=branch)
        assert sin_theta(res.basis, V) < 0.5


@pytest.mark.parametrize("scale", [1e300, 1e-300, 1e8])
def test_extreme_rows(scale):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((600, 8))
    X[0] *= scale  # one huge (or tiny) row among ordinary ones
    rows = ClippedRows.from_data(X, row_norm=3.0)
    S = rows.gram()
    assert np.all(np.isfinite(S))
    for branch in ("analyze_gauss", "iterate", "rule"):
        res = fit_auto(rows, S, 2, noise_multiplier=_z_pca(), delta=DELTA, rng=0, branch=branch)
        assert np.all(np.isfinite(res.basis))
        assert res.basis.T @ res.basis == pytest.approx(np.eye(2), abs=1e-10)
        assert res.epsilon == pytest.approx(EPS, rel=1e-4)


# -- the rule ---------------------------------------------------------------------------------

def _noisy_eigenvalues(lam, s, seed):
    """Eigenvalues of diag(lam) + W, W symmetric with entry std s (as M1 is made)."""
    rng = np.random.default_rng(seed)
    d = lam.size
    g = np.triu(rng.standard_normal((d, d)))
    return np.linalg.eigvalsh(np.diag(lam) + (g + np.triu(g, 1).T) * s)[::-1]


def test_spectrum_estimate_inverts_the_spike_shift():
    """Spikes above the noise bulk are read back at their height (spiked-Wigner inversion);
    a spike inside the bulk is hidden."""
    d, s, c = 400, 0.5, 10.0
    thr = s * math.sqrt(d - 2)  # the detection threshold, ~10 above the centre
    lam = np.r_[c + 4 * thr, c + 4 * thr, c + 2.5 * thr, np.full(d - 3, c)]
    top, rest = [], []
    for seed in range(10):
        spec = estimate_spectrum(_noisy_eigenvalues(lam, s, seed), 2, s)
        assert spec.n_visible == 2 and spec.rest.shape == (d - 2,)
        top.append(spec.top[-1])
        rest.append(spec.rest[0])
    assert np.median(top) == pytest.approx(c + 4 * thr, rel=0.05)
    assert np.median(rest) == pytest.approx(c + 2.5 * thr, rel=0.1)
    lam[:3] = c + 0.7 * thr
    assert estimate_spectrum(_noisy_eigenvalues(lam, s, 0), 2, s).n_visible == 0


@pytest.mark.parametrize(("d", "k"), [(10, 5), (16, 8), (40, 30)])
def test_spectrum_estimate_when_k_is_at_least_half_of_d(d, k):
    """The bulk centre comes from the bottom d - k eigenvalues: the median of all of them
    lay among the spikes once k >= d/2, which read lambda_{k+1} as a spike (issue 21)."""
    rng = np.random.default_rng(0)
    s, lam_top, lam_rest = 4.0, 380.0, 40.0
    lam = np.r_[np.full(k, lam_top), np.full(d - k, lam_rest)]
    errs_k, errs_rest = [], []
    for _ in range(20):
        g = np.triu(rng.standard_normal((d, d)))
        W = (g + np.triu(g, 1).T) * s
        spec = estimate_spectrum(np.linalg.eigvalsh(np.diag(lam) + W)[::-1], k, s)
        assert spec.n_visible == k
        errs_k.append(spec.top[-1] / lam_top - 1)
        errs_rest.append(spec.rest[0] / lam_top)
    assert abs(np.median(errs_k)) < 0.05
    assert np.median(errs_rest) < 0.2  # lambda_{k+1} stays near the bulk, far below


def _counts(n):
    c = np.zeros(HIST_EDGES.size + 1)
    c[np.searchsorted(HIST_EDGES, 1.0, side="right")] = n  # every row at the RMS norm
    return c


def test_rule_prefers_the_iteration_on_a_spread_spectrum_and_not_without_a_gap():
    n, d, k = 100000, 1500, 5
    kw = dict(counts=_counts(n), energies=_counts(n) * 0.9, n=n, d=d, k=k, init_std=6.0,
              full_std=4.2, rest_multiplier=6.0, iter_choices=(2, 3), count_std=60.0,
              switch_ratio=0.9, iter_calibration=1.0, count_threshold=3.0)
    bulk = 50.0 + 2 * 6.0 * math.sqrt(d - k) * np.cos(np.linspace(0, math.pi, d - k - 1))
    spread = predict_errors(eigvals=np.concatenate([[1100.0] * 5, [70.0], bulk]), **kw)
    assert spread.iterate and spread.error_iterate < spread.error_analyze_gauss
    assert spread.radius_factor in RADIUS_GRID and not spread.hidden
    # inside the noise bulk (edge 2 * 6 * sqrt(1495) = 464 above the centre), some of the
    # top k visible: a decaying spectrum cannot be excluded, so Analyze Gauss
    hidden = predict_errors(eigvals=np.concatenate([[3000.0], [300.0] * 5, bulk[1:]]), **kw)
    assert hidden.hidden and not hidden.iterate and hidden.lam_k is None


def test_hidden_rule_iterates_on_a_flat_spike_but_fears_a_heavy_tail():
    """None of the top k stands out: the rule compares Analyze Gauss and the iteration from
    a random start at every plausible height. Rows of about equal norm: iterating pays;
    1% of the rows at 4x the RMS (they could carry the spike alone): Analyze Gauss."""
    n, d, k, s1 = 30000, 1500, 5, 6.0
    lam = np.r_[np.full(k, 20.0 + 0.9 * s1 * math.sqrt(d - k)), np.full(d - k, 20.0)]
    eig = _noisy_eigenvalues(lam, s1, 1)
    kw = dict(eigvals=eig, energies=_counts(n) * 0.99, n=n, d=d, k=k, init_std=s1,
              full_std=1.5, rest_multiplier=1.5, iter_choices=(2, 3), count_std=21.0,
              switch_ratio=0.9, iter_calibration=1.0, count_threshold=3.0)
    assert estimate_spectrum(eig, k, s1).n_visible == 0
    flat = predict_errors(counts=_counts(n), **kw)
    assert flat.hidden and flat.iterate and flat.lam_k is None
    tail = _counts(0.99 * n)
    tail[np.searchsorted(HIST_EDGES, 4.0, side="right")] = 0.01 * n
    pred = predict_errors(counts=tail, **kw)
    assert pred.hidden and not pred.iterate and "beyond" in pred.reason


@pytest.mark.parametrize("height", [0.6, 0.65])
def test_visible_spike_with_a_poor_start_fears_a_heavy_tail(height):
    """The top k just visible in M1 (its own start predicted tan^2 > POOR_START_TAN2):
    with rows of about equal norm the rule iterates; with 1% of the rows at 4x the RMS it
    takes Analyze Gauss (issue 21's family 2 at f = 0.03), keeping the iteration's radius
    and steps for a forced iteration. A good start with the same tail still iterates."""
    n, d, k, s1 = 100000, 1500, 5, 6.0
    tail = _counts(0.99 * n)
    tail[np.searchsorted(HIST_EDGES, 4.0, side="right")] = 0.01 * n
    kw = dict(energies=_counts(n) * 0.99, n=n, d=d, k=k, init_std=s1,
              full_std=s1 * math.sqrt(0.5 / 0.99), rest_multiplier=s1 * math.sqrt(0.5 / 0.49),
              iter_choices=(2, 3), count_std=21.0, switch_ratio=0.9, iter_calibration=1.0,
              count_threshold=3.0)

    def eig(f):
        lam = np.r_[np.full(k, 20.0 + f * 2 * s1 * math.sqrt(d)), np.full(d - k, 20.0)]
        return _noisy_eigenvalues(lam, s1, 0)

    e = eig(height)
    spec = estimate_spectrum(e, k, s1)
    assert spec.n_visible == k
    rest = np.minimum(spec.rest, spec.top[-1])
    assert _start_tilt(s1, float(spec.top[-1]), rest, d - k, k).sum() > POOR_START_TAN2
    flat = predict_errors(eigvals=e, counts=_counts(n), **kw)
    assert flat.iterate and not flat.hidden
    pred = predict_errors(eigvals=e, counts=tail, **kw)
    assert not pred.iterate and not pred.hidden and "start is poor" in pred.reason
    assert pred.radius_factor in RADIUS_GRID and pred.n_iter in (2, 3)
    assert pred.error_iterate == pytest.approx(flat.error_iterate, rel=0.1)
    good = predict_errors(eigvals=eig(0.9), counts=tail, **kw)
    assert good.iterate and "start is poor" not in good.reason


def test_row_scale_from_the_probe():
    """r^2 ~ ||a||^2 H / d through a noise-driven X0: the rows' 99th percentile norm."""
    n, d, k = 100000, 50, 3
    unit = math.sqrt(k / n)
    H = 3 / 100.0  # three eigenvalues of X0^T M1 X0 at 100
    counts = np.zeros(HIST_EDGES.size + 1)
    j = 12
    counts[j] = 0.995 * n  # below HIST_EDGES[j] ...
    counts[-1] = 0.005 * n  # ... and 0.5% far above
    tau = row_scale(counts, n, d, 10.0, unit, H)
    expect = HIST_EDGES[j] * unit * math.sqrt(d / H)
    assert expect <= tau < expect * 2**0.25
    # too noisy to certify 1% of 1000 rows: the public bound
    assert row_scale(counts / 100, 1000, d, 10.0, unit, H) == 1.0


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
    ({"rescale_share": 0.0}, ValueError, "rescale_share"),
    ({"init_share": 0.5, "rescale_share": 0.49}, ValueError, "rescale_share"),
    ({"add_noise": "yes"}, TypeError, "add_noise"),
])
def test_bad_options(data, opts, exc, match):
    rows, S, _ = data
    with pytest.raises(exc, match=match):
        fit_auto(rows, S, K, noise_multiplier=_z_pca(), delta=DELTA, rng=0, **opts)


def test_bad_arguments(data):
    rows, S, _ = data
    with pytest.raises(ValueError, match="noise_multiplier"):
        fit_auto(rows, S, K, noise_multiplier=-1.0, delta=DELTA)
    with pytest.raises(TypeError, match="noise_multiplier"):
        fit_auto(rows, S, K, noise_multiplier=None, delta=DELTA)
    with pytest.raises(ValueError, match="shape"):
        fit_auto(rows, S[:5, :5], K, noise_multiplier=_z_pca(), delta=DELTA)
    with pytest.raises(ValueError, match="k"):
        fit_auto(rows, S, 31, noise_multiplier=_z_pca(), delta=DELTA)


def test_k_equals_d_takes_the_analyze_gauss_branch(data):
    rows, S, _ = data
    res = fit_auto(rows, S, 30, noise_multiplier=_z_pca(), delta=DELTA, rng=0)
    assert res.branch == "analyze_gauss"
    assert res.basis.T @ res.basis == pytest.approx(np.eye(30), abs=1e-10)
    assert res.epsilon == pytest.approx(EPS, rel=1e-4)
