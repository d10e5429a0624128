"""Review of 6820e63 (``auto`` without its probe where no outcome of it changes the rule).

Pins: (1) the skip decision is evaluated with exactly the arguments ``predict_errors``
gets had the probe been released (default and non-default options, federated noise
amplification); (2) in every path the noise each release carries is what its event
accounts for (sensitivity x multiplier x rounding inflation) and the events compose to
one Gaussian at ``z``; without the probe ``M2`` is independent of ``M1`` at its stated
std; (3) the claim of ``choice_without_probe`` on non-default rule constants and
adversarial histograms (energies in bins without rows); (4) the defect found: with
``branch="analyze_gauss"`` (which since 6820e63 never releases the probe) the secure plan
still listed the probe's sum, so a capped secure-aggregation fit (SecAgg+'s 2^30) was
refused naming a sum it never makes (fixed in ``secure_plan.secure_release_sums``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpprecond.pca.auto as auto
from dpprecond.accounting import gaussian_precision
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.auto import HIST_EDGES, choice_without_probe, fit_auto, predict_errors
from dpprecond.pca.budget import plan_auto
from dpprecond.pca.core import SQRT2
from dpprecond.pca.federated import FederatedRows, LocalNoise
from dpprecond.pca.rows import DenseRows, noise_inflation
from dpprecond.pca.secure_plan import capped_secure_plan, secure_release_sums
from dpprecond.secure import observe_releases

DELTA = 1e-5
NB = HIST_EDGES.size + 1


def _decaying(n: int = 4000, d: int = 30, seed: int = 3) -> np.ndarray:
    A = np.random.default_rng(seed).standard_normal((n, d)) * 0.6 ** np.arange(d)
    return A / np.linalg.norm(A, axis=1).max()


def _z(eps: float) -> float:
    return plan_auto(eps, DELTA).noise_multipliers["z_pca"]


# -- (1) the skip decision sees what the rule would have seen ---------------------------

COMMON = ("n", "d", "k", "init_std", "full_std", "rest_multiplier", "iter_choices",
          "switch_ratio", "iter_calibration")


@pytest.mark.parametrize("options", [{}, {"init_share": 0.3, "probe_share": 0.05,
                                          "n_iter": 4, "switch_ratio": 1.3,
                                          "iter_calibration": 0.7}])
@pytest.mark.parametrize("federated", [False, True])
def test_the_skip_test_gets_the_rules_own_arguments(monkeypatch, options, federated):
    calls: dict[str, list[dict]] = {"choice": [], "rule": []}
    real_choice, real_rule = auto.choice_without_probe, auto.predict_errors

    def choice(**kw):
        calls["choice"].append(kw)
        return None  # force the probe, so that the rule runs on the same M1

    def rule(**kw):
        calls["rule"].append(kw)
        return real_rule(**kw)

    monkeypatch.setattr(auto, "choice_without_probe", choice)
    monkeypatch.setattr(auto, "predict_errors", rule)
    A = spiked_covariance(3000, 20, 2, 20.0, seed=4)
    if federated:  # LocalNoise: the rule reads the noise amplified by sqrt(K)
        rows = FederatedRows.from_data(A, np.array([0, 1000, 2000, 3000]), 1.0)
        gen = LocalNoise(np.random.default_rng(1).spawn(3))
        assert gen.noise_amplification == pytest.approx(math.sqrt(3))
    else:
        rows, gen = DenseRows(A), np.random.default_rng(1)
    S = rows.gram() if federated else A.T @ A
    res = fit_auto(rows, S, 2, noise_multiplier=_z(1.0), delta=DELTA, rng=gen, **options)
    assert "z_rescaled" not in res.info["noise_multipliers"]  # left = rest for the rule
    (c,), (r,) = calls["choice"], calls["rule"]
    np.testing.assert_array_equal(c["eigvals"], r["eigvals"])
    for key in COMMON:
        assert c[key] == r[key], key
    # and the real test, on these arguments, decides only what the rule decides
    if real_choice(**c) is not None:
        assert not res.info["prediction"]["iterate"]


# -- (2) the noise of each release is what its event accounts for -----------------------

def _check_releases(res, seen, z, fp):
    """Each recorded release's std is sensitivity x its event's multiplier x fp, in order."""
    events = [e.noise_multiplier for e in res.dp_event.events]
    assert len(seen) == len(events)
    zs = res.info["noise_multipliers"]
    sens = [SQRT2]  # M1
    if res.info["probe_counts"] is not None:
        sens.append(2.0)
        assert events[1] == zs["z_probe"]
    if "z_rescaled" in zs:
        sens.append(SQRT2)
    if res.branch == "iterate":
        sens += [2.0 * r for r in res.info["clip_radii"]]
    else:
        sens.append(SQRT2)
    for (_value, std), s, zi in zip(seen, sens, events, strict=True):
        assert std == pytest.approx(s * zi * fp, rel=1e-12)
    assert gaussian_precision(res.dp_event) == pytest.approx(z**-2, rel=1e-12)


@pytest.mark.parametrize(("case", "options", "probed", "branch"), [
    ("decay", {}, False, "analyze_gauss"),             # the rule decides without the probe
    ("decay", {"branch": "analyze_gauss"}, False, "analyze_gauss"),
    ("decay", {"branch": "iterate", "n_iter": 2}, True, "iterate"),
    ("hidden", {}, True, "analyze_gauss"),             # probe, then Analyze Gauss
    ("hidden", {"probe_share": 0.2}, True, "analyze_gauss"),
    ("kd", {}, False, "analyze_gauss"),                # k = d
])
def test_every_release_carries_the_noise_its_event_claims(case, options, probed, branch):
    if case == "hidden":
        A, k, eps = spiked_covariance(4000, 30, 3, 0.5, seed=1), 3, 0.3
    else:
        A, k, eps = _decaying(), (8 if case == "decay" else 30), 1.0
    rows, S, z = DenseRows(A), A.T @ A, _z(eps)
    with observe_releases() as seen:
        res = fit_auto(rows, S, k, noise_multiplier=z, delta=DELTA, rng=2, **options)
    assert (res.info["probe_counts"] is not None) == probed and res.branch == branch
    assert ("z_probe" in res.info["noise_multipliers"]) == probed
    _check_releases(res, seen, z, noise_inflation(rows))
    if not probed:  # the whole precision on A^T A: z_rest = z / sqrt(1 - init_share)
        s1 = options.get("init_share", auto.AUTO_DEFAULTS["init_share"])
        assert res.info["noise_multipliers"]["z_rest"] == pytest.approx(
            z / math.sqrt(1.0 - s1), rel=1e-15)


def test_without_the_probe_m2_is_independent_of_m1_at_its_stated_std():
    """Pooled over seeds: the entries of W2 = M2 - S have the stated std and no
    correlation with W1 (the coupling drawn at the whole precision)."""
    A = _decaying(3000, 40)
    rows, S, z = DenseRows(A), A.T @ A, _z(1.0)
    iu = np.triu_indices(40)
    w1, w2, std = [], [], []
    for seed in range(8):
        with observe_releases() as seen:
            res = fit_auto(rows, S, 8, noise_multiplier=z, delta=DELTA, rng=seed)
        assert res.info["probe_counts"] is None and len(seen) == 2
        w1.append((seen[0][0] - S)[iu])
        w2.append((seen[1][0] - S)[iu])
        std.append(seen[1][1])
    W1, W2 = np.concatenate(w1), np.concatenate(w2)
    m = W1.size  # 6560: std of a sample std about 1/sqrt(2m), of a correlation 1/sqrt(m)
    assert np.std(W2) == pytest.approx(std[0], rel=5 / math.sqrt(2 * m))
    assert abs(np.corrcoef(W1, W2)[0, 1]) < 5 / math.sqrt(m)


# -- (3) the claim on non-default constants and adversarial histograms -------------------

def _adversarial(n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for b in range(0, NB, 3):
        c = np.zeros(NB)
        c[b] = n
        for eb in (b, 0, NB - 1):  # the rest energy in a bin with no rows (rho -> 0)
            e = np.zeros(NB)
            e[eb] = n
            out.append((c, e))
    for _ in range(6):
        c = rng.dirichlet(np.full(NB, 0.1)) * n
        e = np.zeros(NB)
        e[rng.integers(NB)] = n
        out.append((c, e))
    return out


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_the_claim_holds_for_non_default_rule_constants():
    """(Extreme constants, e.g. n = 3 with T = 64, overflow the predicted tilt in both
    functions alike: a non-finite prediction reads as sin-theta 1, Analyze Gauss.)"""
    rng = np.random.default_rng(43)
    decided = 0
    for _ in range(160):
        d = int(rng.choice([2, 5, 12, 40]))
        k = int(rng.choice([1, max(1, d // 2), d - 1]))
        n = int(rng.choice([3, 200, 10**5, 10**9]))
        z = float(np.exp(rng.uniform(math.log(0.05), math.log(100.0))))
        s1 = float(rng.choice([0.1, 0.5, 0.9]))
        rest = 1.0 - s1 - 0.01
        init_std = SQRT2 * z / math.sqrt(s1)
        kw = dict(n=n, d=d, k=k, init_std=init_std,
                  full_std=SQRT2 * z / math.sqrt(s1 + rest),
                  rest_multiplier=z / math.sqrt(rest),
                  iter_choices=[(1,), (2, 3), (64,)][rng.integers(3)],
                  switch_ratio=float(rng.choice([0.3, 0.9, 1.0, 2.0])),
                  iter_calibration=float(rng.choice([0.01, 1.15, 10.0])))
        top = float(np.exp(rng.uniform(math.log(0.2), math.log(1e4)))) * 2 * init_std * d**0.5
        lam = (top * rng.uniform(0.3, 0.99) ** np.arange(d) if rng.random() < 0.5 else
               np.r_[np.full(k, top), np.full(d - k, rng.uniform(0.0, 0.5) * top)])
        g = np.triu(rng.standard_normal((d, d)))
        eig = np.linalg.eigvalsh(np.diag(lam) + (g + np.triu(g, 1).T) * init_std)[::-1]
        pred = choice_without_probe(eigvals=eig, **kw)
        if pred is None:
            continue
        decided += 1
        assert not pred.iterate
        cstd = 2.0 * z / math.sqrt(0.01)
        for thr in (0.0, 3.0):
            for c, e in _adversarial(n, rng):
                lift = 10 * thr * cstd + 1.0  # above the threshold wherever nonzero
                rule = predict_errors(eigvals=eig, counts=np.where(c > 0, c + lift, 0.0),
                                      energies=np.where(e > 0, e + lift, 0.0),
                                      count_std=cstd, count_threshold=thr, **kw)
                assert not rule.iterate, (kw, rule.reason, pred.reason)
    assert decided >= 30  # not vacuous


# -- (4) the defect: the secure plan of the forced Analyze Gauss branch ------------------

def test_the_forced_analyze_gauss_branch_plans_no_probe_sum():
    plan = plan_auto(0.5, DELTA)
    names = {br: [what for what, _, _ in secure_release_sums("auto", plan, 20, 2,
                                                             {"branch": br})]
             for br in ("rule", "analyze_gauss", "iterate")}
    assert "auto's probe" in names["rule"] and "auto's probe" in names["iterate"]
    assert "auto's probe" not in names["analyze_gauss"]
    # and the fit indeed releases none: M1 and M2 only
    A = spiked_covariance(300, 20, 2, 5.0, seed=1)
    with observe_releases() as seen:
        res = fit_auto(DenseRows(A), A.T @ A, 2, noise_multiplier=_z(0.5), delta=DELTA,
                       rng=0, branch="analyze_gauss")
    assert len(seen) == 2 and res.info["probe_counts"] is None


def test_a_capped_secure_fit_of_the_forced_analyze_gauss_branch_is_not_refused_for_the_probe():
    """d = 20, 300 rows, eps = 0.005: the probe's sum (at 10 z) has no plan under 2^30,
    the Gram sums fit. Before the fix the fit was refused naming "auto's probe", which the
    forced Analyze Gauss branch never releases."""
    eps = 0.005
    secure, bound = capped_secure_plan(plan_auto(eps, DELTA), eps, DELTA, method="auto",
                                       n_features=20, n_components=2, n_rows=300,
                                       n_clients=2, min_clients=None, fit_bits=30,
                                       options={"branch": "analyze_gauss"})
    assert bound == 2.0**-10
    X = spiked_covariance(300, 20, 2, 5.0, seed=1)
    res = fit_private_pca(X, 2, clients=np.array([0, 150, 300]), trust="secure-aggregation",
                          seed=1, target_epsilon=eps, target_delta=DELTA, row_norm=1.0,
                          branch="analyze_gauss", max_modulus_bits=30)
    sums = res.info["secure_aggregation"]
    assert sums["n_sums"] == 2 and max(sums["modulus_bits"]) <= 30
    assert res.epsilon <= eps and res.epsilon == pytest.approx(eps, rel=1e-3)
    assert res.dp_event == secure.event
