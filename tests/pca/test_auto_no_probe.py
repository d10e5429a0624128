"""``auto`` without its probe: where no histogram can change the rule's choice.

:func:`dpprecond.pca.auto.choice_without_probe` claims that in the cases it decides,
:func:`dpprecond.pca.auto.predict_errors` picks Analyze Gauss for *every* probe outcome;
:func:`~dpprecond.pca.auto.fit_auto` then skips the probe's release and gives its share to
Analyze Gauss, which becomes Analyze Gauss at the calibrated multiplier itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.accounting import gaussian_precision
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca.auto import (
    AUTO_DEFAULTS,
    HIST_EDGES,
    choice_without_probe,
    estimate_spectrum,
    fit_auto,
    predict_errors,
)
from dpprecond.pca.baselines import analyze_gauss
from dpprecond.pca.budget import plan_auto
from dpprecond.pca.core import SQRT2
from dpprecond.pca.rows import DenseRows, noise_inflation
from dpprecond.secure import observe_releases

DELTA = 1e-5
S1, SC = AUTO_DEFAULTS["init_share"], AUTO_DEFAULTS["probe_share"]
REST = 1.0 - S1 - SC
NB = HIST_EDGES.size + 1


def _rule_arguments(z: float, n: int, d: int, k: int) -> dict:
    """The rule's noise arguments as fit_auto computes them when it releases the probe."""
    return dict(n=n, d=d, k=k, init_std=SQRT2 * z / math.sqrt(S1),
                full_std=SQRT2 * z / math.sqrt(S1 + REST), rest_multiplier=z / math.sqrt(REST),
                iter_choices=AUTO_DEFAULTS["iter_choices"],
                switch_ratio=AUTO_DEFAULTS["switch_ratio"],
                iter_calibration=AUTO_DEFAULTS["iter_calibration"])


def _histograms(n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Probe outcomes: every row in one bin (the histogram that makes the bound tight),
    for each bin; two bins; random spreads; a heavy tail; energies from none to all."""
    out = []
    for b in range(NB):
        c = np.zeros(NB)
        c[b] = n
        for share in (0.0, 1.0):
            out.append((c, c * share))
    for _ in range(12):
        c = rng.dirichlet(np.full(NB, rng.choice([0.05, 0.5, 5.0]))) * n
        out.append((c, c * rng.uniform(0.0, 1.0, NB)))
        i, j = rng.choice(NB, 2, replace=False)
        c2 = np.zeros(NB)
        c2[i], c2[j] = 0.99 * n, 0.01 * n
        out.append((c2, c2 * rng.uniform(0.0, 1.0)))
    return out


def _spectra(rng: np.random.Generator):
    """(eigenvalues of M1, n, d, k, z): spikes from far below to far above the noise,
    flat and decaying spectra, k from 1 to d - 1."""
    for d in (6, 20, 80, 300):
        for k in sorted({1, 2, d // 4 or 1, d // 2, d - 1}):
            for eps in (0.3, 1.0, 4.0, 16.0):
                z = plan_auto(eps, DELTA).noise_multipliers["z_pca"]
                s = SQRT2 * z / math.sqrt(S1)
                n = 50 * d
                for kind in ("spike", "decay"):
                    for height in (0.3, 1.0, 3.0, 30.0):
                        top = height * 2 * s * math.sqrt(d)
                        lam = (np.r_[np.full(k, top), np.full(d - k, n / d * 0.01)]
                               if kind == "spike" else top * 0.7 ** np.arange(d))
                        g = np.triu(rng.standard_normal((d, d)))
                        W = (g + np.triu(g, 1).T) * s
                        yield np.linalg.eigvalsh(np.diag(lam) + W)[::-1], n, d, k, z


def test_the_choice_without_a_probe_is_the_rules_for_every_histogram():
    rng = np.random.default_rng(20261204)
    decided = {"hidden": 0, "visible": 0, "undecided": 0}
    for eig, n, d, k, z in _spectra(rng):
        kw = _rule_arguments(z, n, d, k)
        pred = choice_without_probe(eigvals=eig, **kw)
        if pred is None:
            decided["undecided"] += 1
            continue
        assert not pred.iterate
        n_vis = estimate_spectrum(eig, k, kw["init_std"]).n_visible
        decided["visible" if n_vis == k else "hidden"] += 1
        # (hidden: predict_errors returns before it reads the probe; a few suffice)
        outcomes = _histograms(n, rng)
        for counts, energies in (outcomes if n_vis == k else outcomes[::10]):
            rule = predict_errors(eigvals=eig, counts=counts, energies=energies,
                                  count_std=2.0 * z / math.sqrt(SC), count_threshold=3.0, **kw)
            assert not rule.iterate, (n, d, k, rule.reason)
    # every kind of case occurs (the claim is tested, not vacuous)
    assert min(decided.values()) >= 10, decided


def test_without_a_probe_auto_is_analyze_gauss_at_the_calibrated_multiplier():
    """A decaying spectrum of which M1 shows the top few: the rule decides without the
    probe, and the fit is Analyze Gauss's, noise for noise, at the whole precision."""
    n, d, k, eps = 20000, 40, 8, 1.0
    rng = np.random.default_rng(3)
    A = rng.standard_normal((n, d)) * 0.6 ** np.arange(d)
    A /= np.linalg.norm(A, axis=1).max()
    rows, S = DenseRows(A), A.T @ A
    z = plan_auto(eps, DELTA).noise_multipliers["z_pca"]
    res = fit_auto(rows, S, k, noise_multiplier=z, delta=DELTA, rng=np.random.default_rng(5))
    assert res.branch == "analyze_gauss" and res.info["probe_counts"] is None
    assert "no probe" in res.info["prediction"]["reason"]
    assert len(res.dp_event.events) == 2
    assert gaussian_precision(res.dp_event) == pytest.approx(z**-2, rel=1e-12)
    assert res.epsilon == pytest.approx(eps, rel=1e-4) and res.epsilon <= eps
    X, w = analyze_gauss(S, k, z * noise_inflation(rows), np.random.default_rng(5))
    np.testing.assert_allclose(np.abs(X.T @ res.basis), np.eye(k), atol=1e-9)
    np.testing.assert_allclose(res.eigenvalues, w, rtol=1e-12)


def test_after_a_probe_the_analyze_gauss_release_carries_the_probes_share_less():
    """None of the top k stands out: the probe is released, the rule takes Analyze Gauss,
    and M2 carries the precision left after it (an extra independent draw on top of the
    coupled noise): the three releases compose to exactly one Gaussian at z."""
    A = spiked_covariance(4000, 30, 3, 0.5, seed=1)
    rows, S = DenseRows(A), A.T @ A
    z = plan_auto(0.3, DELTA).noise_multipliers["z_pca"]
    with observe_releases() as seen:
        res = fit_auto(rows, S, 3, noise_multiplier=z, delta=DELTA, rng=0)
    assert res.branch == "analyze_gauss" and res.info["probe_counts"] is not None
    assert len(seen) == 3 and len(res.dp_event.events) == 3
    fp = noise_inflation(rows)
    assert seen[0][1] == pytest.approx(SQRT2 * z / math.sqrt(S1) * fp, rel=1e-12)
    assert seen[2][1] == pytest.approx(SQRT2 * z / math.sqrt(REST) * fp, rel=1e-12)
    assert gaussian_precision(res.dp_event) == pytest.approx(z**-2, rel=1e-12)
    # M2's noise is independent of M1's, at its stated std (upper triangle, 465 entries)
    iu = np.triu_indices(30)
    w1, w2 = (seen[0][0] - S)[iu], (seen[2][0] - S)[iu]
    assert np.std(w2) == pytest.approx(seen[2][1], rel=5 / math.sqrt(2 * iu[0].size))
    assert abs(np.corrcoef(w1, w2)[0, 1]) < 5 / math.sqrt(iu[0].size)
