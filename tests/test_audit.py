"""Empirical privacy audits: the tool is valid and has power, the library passes, bugs fail.

Three groups:

1. The audit itself (:mod:`dpprecond.audit`): Clopper-Pearson bounds against scipy, the
   bound on randomized response (whose epsilon is known exactly) is valid and tight, and
   the Gaussian ceiling tends to the exact epsilon.
2. The library's mechanisms (:mod:`dpprecond.audit_cases`): each worst-case pair reaches
   the stated sensitivity, and the audited lower bound stays below the claimed epsilon.
3. The audit can fail: a quarter of the calibrated noise, and the Gram matrix as computed
   before commit c0181e8 (privacy hole 1) on the extreme-norm pair, are both detected as
   violations (lower bound above the claim).

Run counts are kept small for CI (the whole file takes seconds); the larger audits quoted
in docs/privacy.md come from benchmarks/privacy_audit.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpprecond.accounting import epsilon_of, gaussian
from dpprecond.audit import (
    audit,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gaussian_audit_ceiling,
    threshold_audit,
)
from dpprecond.audit import cases as audit_cases
from dpprecond.audit.broken import extreme_norm_pair, old_scaled_gram
from dpprecond.pca import fit_private_pca
from dpprecond.pca.core import private_init
from dpprecond.pca.rows import ClippedRows

CLAIM, DELTA = 1.0, 1e-5


# --------------------------------------------------------------------------------------
# 1. The audit tool
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (57, 1000), (0, 1)])
def test_clopper_pearson_upper_matches_scipy(k: int, n: int) -> None:
    """One-sided at 1 - alpha/2 is the upper end of the two-sided exact interval at 1 - alpha."""
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact").high
    assert clopper_pearson_upper(k, n, 0.025) == pytest.approx(ref, rel=1e-10)


def test_epsilon_lower_bound_formula() -> None:
    fp, fn, n, delta = 10, 300, 1000, 1e-3
    a = 0.05 / 2
    fpr = stats.beta.ppf(1 - a, fp + 1, n - fp)
    fnr = stats.beta.ppf(1 - a, fn + 1, n - fn)
    ref = max(math.log((1 - delta - fnr) / fpr), math.log((1 - delta - fpr) / fnr), 0.0)
    assert float(epsilon_lower_bound(fp, n, fn, n, delta)) == pytest.approx(ref, rel=1e-12)
    assert float(epsilon_lower_bound(500, 1000, 500, 1000, 0.0)) == 0.0  # coin flip


def _randomized_response(epsilon: float):
    """Output the dataset's bit with probability e^eps / (1 + e^eps): exactly (eps, 0)-DP."""
    keep = math.exp(epsilon) / (1.0 + math.exp(epsilon))

    def mechanism(bit: int, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.where(rng.random(n) < keep, bit, 1 - bit).astype(np.float64)

    return mechanism


def test_audit_of_randomized_response_is_tight_and_below_the_truth() -> None:
    """RR at eps = 1: the best test has FPR = FNR = 1/(1+e) = 0.269; with 50,000 held-out
    runs per side each Clopper-Pearson bound adds about 2.24 sqrt(p(1-p)/N) = 0.0044, so the
    bound is ln((1 - 0.2733) / 0.2733) = 0.978 up to sampling noise of a few 0.001."""
    res = audit(_randomized_response(1.0), (0, 1), n_runs=100_000, delta=0.0, batch=True,
                claimed_epsilon=1.0, seed=0)
    assert not res.violation
    assert 0.96 <= res.epsilon_lower_bound <= 1.0


def test_audit_bound_holds_with_the_stated_confidence() -> None:
    """Coverage: over 200 independent audits of RR at eps = 1 (2,000 runs per side), the
    bound may exceed the truth in at most 5% of them; 200 * 0.05 = 10, and
    P[Binomial(200, 0.05) > 20] < 1e-3."""
    mech = _randomized_response(1.0)
    rng = np.random.default_rng(1)
    above = 0
    for _ in range(200):
        null, alt = mech(0, rng, 2000), mech(1, rng, 2000)
        above += threshold_audit(null, alt, 0.0).epsilon_lower_bound > 1.0
    assert above <= 20


def test_gaussian_ceiling_tends_to_the_exact_epsilon() -> None:
    exact = epsilon_of(gaussian(1.0), DELTA, "pld")  # mu = 1
    assert gaussian_audit_ceiling(1.0, 10**12, DELTA) == pytest.approx(exact, rel=0.03)
    assert gaussian_audit_ceiling(1.0, 10**4, DELTA) < gaussian_audit_ceiling(1.0, 10**6, DELTA)
    assert gaussian_audit_ceiling(1.0, 10**6, DELTA) < exact


def test_audit_refuses_bad_statistics() -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        threshold_audit([0.0, np.nan, 1.0], [0.0, 1.0, 2.0], DELTA)
    with pytest.raises(ValueError, match="delta"):
        threshold_audit([0.0, 1.0, 2.0], [0.0, 1.0, 2.0], 1.0)


# --------------------------------------------------------------------------------------
# 2. The library's mechanisms: pairs reach the sensitivity, bounds stay below the claims
# --------------------------------------------------------------------------------------


def _check(res, case) -> None:
    print(f"{case.name}: {res.summary()}")
    assert res.claimed_epsilon == case.claimed_epsilon
    assert not res.violation
    assert res.epsilon_lower_bound < case.claimed_epsilon


def test_pca_init_pair_reaches_sqrt2_and_the_case_is_the_api_release() -> None:
    case = audit_cases.pca_init_case(CLAIM, DELTA)
    D = case.pair[0]
    S, S2 = (ClippedRows.from_data(X, 1.0).gram() for X in case.pair)
    diff = audit_cases.upper_triangle(S2 - S)
    assert np.linalg.norm(diff) == pytest.approx(math.sqrt(2.0), rel=1e-8)  # sensitivity
    assert diff @ case.info["direction"] == pytest.approx(math.sqrt(2.0), rel=1e-8)
    # The released matrix of fit_private_pca(method="analyze_gauss", k = d) is the case's
    # release (same noise multiplier up to the API's rounding inflation, same stream).
    n, d = D.shape
    res = fit_private_pca(D, d, method="analyze_gauss", target_epsilon=CLAIM,
                          target_delta=DELTA, row_norm=1.0, seed=11)
    assert res.info["noise_multipliers"]["z0"] == case.info["z0"]
    assert res.epsilon == pytest.approx(case.claimed_epsilon, rel=1e-12)
    V = res.basis
    M_api = V @ np.diag(res.explained_variance * n) @ V.T
    rows = ClippedRows.from_data(D, 1.0)
    stream = np.random.default_rng(11).spawn(3)[1]
    M = private_init(rows.gram(), d, case.info["z0"] * (1 + rows.rounding_slack()), stream).M
    np.testing.assert_allclose(M_api, M, rtol=1e-9, atol=1e-9)


def test_audit_pca_init() -> None:
    case = audit_cases.pca_init_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=20_000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=1)
    _check(res, case)
    assert res.epsilon_lower_bound > 0  # the statistic points the right way (ceiling 0.34)


def test_iteration_pair_is_clipped_at_the_radius() -> None:
    """Without the noise of Z, X1 = Z/||Z|| = (cos phi, +-sin phi): both rows clipped to R."""
    case = audit_cases.iteration_case(CLAIM, DELTA)
    from dpprecond.pca.core import TrialSpec, run_trials

    info = case.info
    for X, sign in zip(case.pair, (1.0, -1.0), strict=True):
        rows = ClippedRows.from_data(X, 1.0)
        specs = [TrialSpec(info["clip_radius"], 1, info["zH"], 0.0, g)
                 for g in np.random.default_rng(0).spawn(50)]
        out, clipped = run_trials(rows, rows.gram(), np.eye(X.shape[1])[:, :1], specs)
        assert np.all(clipped == 1)
        for x in out:
            assert x[1, 0] == pytest.approx(sign * info["sin_phi"], rel=1e-9)
    assert info["sin_phi"] > 1 - 1e-4


def test_audit_pca_iteration() -> None:
    case = audit_cases.iteration_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=6000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=2)
    _check(res, case)


def test_selection_pair_moves_the_score_by_one_over_h() -> None:
    case = audit_cases.selection_case(CLAIM, DELTA)
    from dpprecond.pca.core import InitRelease, select

    init = InitRelease(X0=np.eye(3)[:, :1], eigvals=np.array([1.0, 0.0]), noise_std=1e-12)
    scores = []
    for X in case.pair:
        rows = ClippedRows.from_data(X, 1.0)
        res = select(rows, rows.gram(), init, z_run=0.0, mean_trials=1.0, score_share=0.9,
                     h_share=0.5, radii=np.array([case.info["clip_radius"]]),
                     iters=np.array([1]), rng=np.random.default_rng(0))
        scores.append(res.noisy_score)
    assert scores[0] - scores[1] == pytest.approx(1.0, abs=1e-6)  # h = 1 - 2e-11


def test_audit_pca_selection_score() -> None:
    case = audit_cases.selection_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=300, delta=DELTA, batch=False,
                claimed_epsilon=case.claimed_epsilon, seed=3)
    _check(res, case)


def test_fl_message_pair_reaches_2C() -> None:
    case = audit_cases.fl_message_case(CLAIM, DELTA)
    from dpprecond.fl.client import full_batch_messages
    from dpprecond.fl.models import LinearSoftmax

    (X, y), (_, y2) = case.pair
    model = LinearSoftmax(2, 2)
    params = model.init_params(np.random.default_rng(0))
    bounds = np.array([0, 4])
    U = [full_batch_messages(model, params, X, labels, bounds, 1.0, 0.0, [])[0]
         for labels in (y, y2)]
    assert np.linalg.norm(U[0] - U[1]) * 4 == pytest.approx(2.0, rel=1e-8)  # 2C SHRINK / |D_i|


def test_audit_fl_message() -> None:
    case = audit_cases.fl_message_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=20_000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=4)
    _check(res, case)
    assert res.epsilon_lower_bound > 0  # ceiling 0.38


def test_fl_count_pair_moves_the_count_by_one() -> None:
    from dpprecond.fl.client import record_counts
    from dpprecond.fl.models import LinearSoftmax

    case = audit_cases.fl_count_case(CLAIM, DELTA)
    model = LinearSoftmax(2, 2)
    params = model.init_params(np.random.default_rng(0))
    counts = [record_counts(model, params, X, y, np.array([0, 4]), 1.0)[0]
              for X, y in case.pair]
    assert counts[0] - counts[1] == 1.0  # the sensitivity, reached
    assert case.claimed_epsilon < CLAIM  # the count's share of the run's budget


def test_audit_fl_count() -> None:
    case = audit_cases.fl_count_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=20_000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=6)
    _check(res, case)


def test_audit_fl_run() -> None:
    case = audit_cases.fl_run_case(CLAIM, DELTA)
    from dpprecond.fl.engine import simulate
    from dpprecond.fl.server import sgd

    X, y = case.pair[0].X, case.pair[0].y
    once = simulate(case.info["model"], case.pair[0], sgd(case.info["learning_rate"]),
                    case.info["config"], X_test=X, y_test=y, seed=5)
    assert once.epsilon == pytest.approx(case.claimed_epsilon, rel=1e-12)  # what it reports
    res = audit(case.mechanism, case.pair, n_runs=1000, delta=DELTA, batch=False,
                claimed_epsilon=case.claimed_epsilon, seed=5)
    _check(res, case)


# --------------------------------------------------------------------------------------
# 3. The audit detects broken mechanisms
# --------------------------------------------------------------------------------------


def test_quarter_noise_is_a_detected_violation() -> None:
    """The init release with z0/4 (mu = 4/z0 ~ 1) claimed at eps = 1: true epsilon ~4.5."""
    case = audit_cases.pca_init_case(CLAIM, DELTA)
    z0, u = case.info["z0"], case.info["direction"]

    def quarter(X, rng, n):
        S = ClippedRows.from_data(X, 1.0).gram()
        return audit_cases.gram_release_statistics(S, z0 / 4, u, rng, n)

    res = audit(quarter, case.pair, n_runs=5000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=6)
    print("quarter noise:", res.summary())
    assert res.violation
    assert res.epsilon_lower_bound > 1.5


@pytest.mark.parametrize("gram", ["old", "library"])
def test_extreme_norm_pair_against_the_old_gram_is_a_violation(gram: str) -> None:
    X, Y = extreme_norm_pair()
    plan, claim, _ = audit_cases.pca_plan("analyze_gauss", CLAIM, DELTA)
    z0 = plan.noise_multipliers["z0"]
    diff = audit_cases.upper_triangle(old_scaled_gram(Y, 1.0) - old_scaled_gram(X, 1.0))
    assert np.linalg.norm(diff) > 10 * math.sqrt(2.0)  # the cancellation error, ~79
    u = diff / np.linalg.norm(diff)
    compute = old_scaled_gram if gram == "old" else (
        lambda A, r: ClippedRows.from_data(A, r).gram())

    def mechanism(A, rng, n):
        return audit_cases.gram_release_statistics(compute(A, 1.0), z0, u, rng, n)

    res = audit(mechanism, (X, Y), n_runs=2000, delta=DELTA, batch=True, claimed_epsilon=claim,
                seed=7)
    print(f"extreme-norm pair, {gram} Gram:", res.summary())
    if gram == "old":
        assert res.violation
        assert res.epsilon_lower_bound > 5.0  # the cap for 1000 held-out runs is 5.6
    else:
        assert not res.violation
        assert res.epsilon_lower_bound < 0.5


# --------------------------------------------------------------------------------------
# 4. Audits with power (issue 17): auto's releases on the production path, federated PCA
#    in both trust models, the pipeline end to end, and the power of an audit's size
# --------------------------------------------------------------------------------------


def test_largest_certifiable_bound_and_the_runs_for_power() -> None:
    from dpprecond.audit import heldout_for_power, largest_certifiable_bound

    for claim, delta in ((1.0, 1e-5), (1.0, 1e-2), (4.0, 1e-3)):
        n = heldout_for_power(claim, delta, 0.9)
        assert largest_certifiable_bound(claim, n, delta) >= 0.9 * claim
        assert largest_certifiable_bound(claim, int(n / 1.2), delta) < 0.9 * claim
    # more runs, more power; never above the claim
    bounds = [largest_certifiable_bound(1.0, 10**k, 1e-5) for k in (4, 6, 8)]
    assert bounds == sorted(bounds) and bounds[-1] < 1.0


def test_probe_pair_reaches_2_and_the_case_is_probes_release() -> None:
    """The pair moves the probe's vector by its sensitivity 2 (to 1e-8), and the audited
    release is ``pca.auto.probe``'s own for the same stream."""
    from dpprecond.pca.auto import HIST_EDGES, probe

    case = audit_cases.probe_case(CLAIM, DELTA)
    info = case.info
    assert np.linalg.norm(info["change"]) == pytest.approx(2.0, rel=1e-8)
    out = []
    for A in case.pair:
        rows = ClippedRows.from_data(A, 1.0)
        counts, energies = probe(rows, info["X"], info["B"], info["unit"], HIST_EDGES,
                                 2.0 * info["noise_multiplier"], np.random.default_rng(3))
        out.append(np.concatenate([counts, energies]) @ info["direction"])
    for X, value in zip(case.pair, out, strict=True):
        audited = case.mechanism(X, np.random.default_rng(3), 1)
        # BatchNoise draws shape (1, size) from the same stream as probe's (size,)
        assert audited[0] == pytest.approx(value, rel=1e-12)


def test_audit_probe() -> None:
    case = audit_cases.probe_case(CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=20_000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=8)
    _check(res, case)
    assert res.epsilon_lower_bound > 0


def test_auto_coupled_case_releases_what_fit_auto_releases() -> None:
    """For the same stream, the audited M1 and M2 are fit_auto's own two releases
    (recorded by secure.observe_releases), in its Analyze Gauss completion without a probe."""
    from dpprecond.noise import coupled_symmetric_gaussian
    from dpprecond.pca.auto import fit_auto
    from dpprecond.pca.rows import DenseRows
    from dpprecond.secure import observe_releases

    case = audit_cases.auto_coupled_case(CLAIM, DELTA)
    A = case.pair[0]
    S = ClippedRows.from_data(A, 1.0).gram()
    with observe_releases() as seen:
        fit_auto(DenseRows(A), S, 1, delta=DELTA,
                 rng=np.random.default_rng(9), noise_multiplier=case.info["z"],
                 branch="analyze_gauss")
    assert len(seen) == 2  # M1, M2 (the forced Analyze Gauss branch releases no probe)
    coupled = coupled_symmetric_gaussian(2, case.info["std_ag"], case.info["std1"],
                                         np.random.default_rng(9))
    np.testing.assert_array_equal(seen[0][0], S + coupled.first)
    np.testing.assert_allclose(seen[1][0], S + coupled.second, rtol=0, atol=1e-12)
    assert seen[0][1] == case.info["std1"]
    assert seen[1][1] == pytest.approx(math.sqrt(2.0) * case.info["zr"], rel=1e-12)


def test_audit_auto_coupled() -> None:
    """The two coupled releases audited together: below the claim, and the statistic moves
    by the pair's mu in noise standard deviations (the pair is tight for the claim)."""
    from dpprecond.audit import sample_statistics

    case = audit_cases.auto_coupled_case(CLAIM, DELTA)
    assert case.pair_epsilon == pytest.approx(case.claimed_epsilon, rel=1e-6)  # tight pair
    rngs = [np.random.default_rng(s) for s in (10, 11)]
    null, alt = (sample_statistics(case.mechanism, X, 20_000, g, batch=True)
                 for X, g in zip(case.pair, rngs, strict=True))
    shift = (alt.mean() - null.mean()) / null.std()
    assert shift == pytest.approx(case.pair_mu, abs=5 * math.sqrt(2 / 20_000))
    res = threshold_audit(null, alt, DELTA, claimed_epsilon=case.claimed_epsilon)
    _check(res, case)


@pytest.mark.parametrize("trust", ["local", "secure-aggregation"])
def test_federated_case_releases_what_fit_private_pca_releases(trust: str) -> None:
    """The audited release is fit_private_pca(clients=, trust=)'s (same stream), and under
    local trust the aggregate carries sqrt(K) times the central noise."""
    from dpprecond.pca.federated import FederatedRows, LocalNoise
    from dpprecond.secure import observe_releases

    case = audit_cases.federated_pca_case(trust, CLAIM, DELTA)
    D, bounds = case.pair[0], case.info["bounds"]
    with observe_releases() as seen:
        res = fit_private_pca(D, 2, method="analyze_gauss", target_epsilon=CLAIM,
                              target_delta=DELTA, row_norm=1.0, seed=12, clients=bounds,
                              trust=trust)
    stream = np.random.default_rng(12).spawn(3)[1]
    if trust == "secure-aggregation":
        from dpprecond.secagg.sums import ClientParts, SecureSums

        assert res.epsilon == case.claimed_epsilon  # the secure plan's, in RDP
        rows = FederatedRows.from_data(D, bounds, 1.0, shared=True)
        fp = 1 + rows.rounding_slack()
        streams = stream.spawn(4)
        M = private_init(rows.gram(), 2, case.info["z0"] * fp,
                         SecureSums(streams[:3], streams[3], n_rows=D.shape[0], fp=fp)).M
        np.testing.assert_array_equal(seen[0][0], M)  # the same secure sum, bit for bit

        def zero_release(s: int) -> float:
            g = np.random.default_rng(s)
            src = SecureSums(g.spawn(3), g, n_rows=99, fp=1.0)
            return private_init(ClientParts(np.zeros((3, 2, 2))), 1, 1.0, src).M[0, 1]

        noise = np.array([zero_release(s) for s in range(3000)])
        assert noise.std() == pytest.approx(math.sqrt(2.0), rel=6 / math.sqrt(2 * 3000))
        return
    assert res.epsilon == pytest.approx(audit_cases.pca_init_case(CLAIM, DELTA)
                                        .claimed_epsilon, rel=1e-12)  # each message
    rows = FederatedRows.from_data(D, bounds, 1.0)
    source = LocalNoise(stream.spawn(3))
    z = case.info["z0"] * (1 + rows.rounding_slack())
    M = private_init(rows.gram(), 2, z, source).M
    np.testing.assert_allclose(seen[0][0], M, rtol=1e-12, atol=1e-12)
    noise = np.array([private_init(np.zeros((2, 2)), 1, 1.0, LocalNoise(
        np.random.default_rng(s).spawn(3))).M[0, 1] for s in range(3000)])
    assert noise.std() == pytest.approx(math.sqrt(2.0) * math.sqrt(3),
                                        rel=6 / math.sqrt(2 * 3000))


@pytest.mark.parametrize("trust", ["local", "secure-aggregation"])
def test_audit_federated_pca(trust: str) -> None:
    case = audit_cases.federated_pca_case(trust, CLAIM, DELTA)
    res = audit(case.mechanism, case.pair, n_runs=20_000, delta=DELTA, batch=True,
                claimed_epsilon=case.claimed_epsilon, seed=13)
    _check(res, case)


def test_audit_pipeline_end_to_end() -> None:
    """run_pipeline's every release, seen by observe_releases: the claim is its reported
    total; the statistic (the releases' log-likelihood ratio) separates the pair."""
    case = audit_cases.pipeline_case(CLAIM, 1e-2)
    X, y = case.pair[0]
    from dpprecond.pipeline import run_pipeline
    from dpprecond.secure import observe_releases

    with observe_releases() as seen:
        res = run_pipeline(X, y, case.info["X_test"], case.info["y_test"], 2, seed=0,
                           **case.info["kw"])
    # the statistic's features are the pipeline's own (orientation of the components)
    np.testing.assert_allclose(case.info["features"](case.info["X_test"], res.components),
                               res.test_features, rtol=1e-12, atol=1e-12)
    assert res.epsilon == pytest.approx(case.claimed_epsilon, rel=1e-4)  # what it reports
    assert res.epsilon <= case.claimed_epsilon
    assert len(seen) == 2 + 1  # M1, M2 (no probe at k = d); one client message per round
    rng = np.random.default_rng(14)
    a = np.array([case.mechanism(case.pair[0], rng) for _ in range(150)])
    b = np.array([case.mechanism(case.pair[1], rng) for _ in range(150)])
    # the log-likelihood ratio: mean 0 under D, mu^2 under D', std mu (tolerance: 5 std
    # errors of a mean over 150 runs)
    mu = case.pair_mu
    assert abs(a.mean()) < 5 * mu / math.sqrt(150)
    assert b.mean() - a.mean() == pytest.approx(mu**2, abs=5 * mu * math.sqrt(2 / 150))
    res_audit = audit(case.mechanism, case.pair, n_runs=400, delta=1e-2, batch=False,
                      claimed_epsilon=case.claimed_epsilon, seed=15)
    _check(res_audit, case)
