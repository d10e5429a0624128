"""Review 32b: the accuracy of secure mode's Poisson acceptance test (dpprecond._poisson).

The module promises ``log f(k)`` without the cancellation of numpy's ``-lam + k log lam -
log k!``, to about ``1e-10``. Checked against 60-digit mpmath at the means where the
cancellation is worst, over every ``k`` the PTRS test can see with non-negligible
probability (within 12 standard deviations of the mean) and the first few integers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond._poisson import MAX_LAM, _log_pmf

mpmath = pytest.importorskip("mpmath")


def _exact(k: float, lam: float) -> float:
    with mpmath.workdps(60):
        kk, ll = mpmath.mpf(int(k)), mpmath.mpf(lam)
        return float(-ll + kk * mpmath.log(ll) - mpmath.loggamma(kk + 1))


@pytest.mark.parametrize("lam", [10.0, 10.25, 37.5, 1e6, 1e9, 1e12, 2.0**45, MAX_LAM])
def test_the_log_pmf_is_accurate_to_1e_10(lam: float) -> None:
    s = math.sqrt(lam)
    ks = {float(max(1, round(lam + t * s))) for t in np.linspace(-12.0, 12.0, 193)}
    ks |= {float(v) for v in range(1, 25)}
    k = np.array(sorted(ks))
    ours = _log_pmf(k, lam)
    exact = np.array([_exact(v, lam) for v in k])
    relevant = exact > -200.0  # below, the test rejects whatever the error
    err = np.abs(ours - exact)[relevant]
    assert relevant.sum() > 20 and err.max() < 1e-10, (err.max(), k[relevant][err.argmax()])


def test_numpys_poisson_sampler_loses_the_integers_above_2_53() -> None:
    """Why a Skellam share's mean is capped at 2^50: numpy's PTRS forms the variate in
    float64, so above 2^53 every draw is a multiple of the mean's ulp (at 2^55, of 4):
    such shares put the summed noise on a lattice, and the low bits of the integer sum
    are released exactly (no epsilon bounds that)."""
    x = np.random.default_rng(0).poisson(2.0**55, 2000)
    assert np.all(x % 4 == 0)
    y = np.random.default_rng(0).poisson(MAX_LAM, 2000)
    assert len(np.unique(y % 4)) == 4


def test_a_plan_whose_shares_exceed_2_50_is_refused_before_any_draw() -> None:
    """plan_sum (every secure sum's plan, made before the charge of an FL round) refuses a
    Skellam share mean above 2^50, the largest either sampler draws on every integer
    (numpy's lost the odd integers above 2^53; secure mode's refuses above 2^50 at the
    first draw, after the charge)."""
    from dpprecond.secagg.sums import plan_sum

    kw = dict(n_rows=10, n_clients=2, min_clients=2)
    d2 = plan_sum(4, 1.0, 1.0, **kw).l2_sensitivity  # type: ignore[arg-type]
    ok = plan_sum(4, 1.0, 0.9 * math.sqrt(4.0 * MAX_LAM) / d2, **kw)  # type: ignore[arg-type]
    assert ok.share_parameter <= MAX_LAM
    for lam in (2.0 * MAX_LAM, 2.0**55, 1e17):
        with pytest.raises(ValueError, match="Skellam shares of mean"):
            plan_sum(4, 1.0, math.sqrt(4.0 * lam) / d2, **kw)  # type: ignore[arg-type]


def test_ptrs_draws_zero_at_its_probability() -> None:
    """k = 0 at lam = 10 (P = e^-10 = 4.5e-5, only through PTRS's exact test): a sampler
    that rejected k = 0 (k < 1 for k < 0) or misplaced its log-pmf (-lam) by 1 would give
    none or about 100 of the 272 zeros that 6e6 draws give. Fixed seed; the band is 6
    standard deviations of the count."""
    from dpprecond._poisson import poisson_from_uniforms

    n = 6_000_000
    x = poisson_from_uniforms(10.0, n, np.random.default_rng(21).random)
    expected = n * math.exp(-10.0)
    zeros = int(np.count_nonzero(x == 0))
    assert abs(zeros - expected) < 6 * math.sqrt(expected), (zeros, expected)
    assert x.min() >= 0
