"""The Poisson sampler of secure mode (dpprecond._poisson) against numpy's and the pmf."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpprecond._poisson import MAX_LAM, poisson_from_uniforms
from dpprecond.secure import SecureGenerator


@pytest.mark.parametrize("lam", [0.3, 2.5, 9.99, 10.0, 37.5, 1e3, 1e6, 1e9])
def test_one_at_a_time_it_is_numpys_sampler_on_the_same_uniforms(lam: float) -> None:
    """Fed a seeded generator's random(), one variate per call consumes the uniforms in
    numpy's order, so it returns Generator.poisson's variates of the same seed: the same
    algorithms and constants (the reformulated acceptance test differs only where numpy's
    cancellation error decides, which at these means did not happen in 2,000 draws)."""
    ours_rng, numpy_rng = np.random.default_rng(5), np.random.default_rng(5)
    ours = [int(poisson_from_uniforms(lam, 1, ours_rng.random)[0]) for _ in range(2000)]
    theirs = [int(numpy_rng.poisson(lam)) for _ in range(2000)]
    assert ours == theirs


@pytest.mark.parametrize("lam", [0.3, 4.0, 10.0, 61.0, 2.0e4, 1.0e12])
def test_the_vectorized_draws_follow_the_pmf(lam: float) -> None:
    """Chi-square against the Poisson pmf over 20 bins of about equal probability
    (quantiles, merged where the discrete ones coincide): 2e5 draws at a fixed seed.
    Under the null the statistic is chi-square with (bins - 1) degrees of freedom; the
    bound is its 1 - 1e-6 quantile, so a correct sampler fails with probability 1e-6."""
    n = 200_000
    x = poisson_from_uniforms(lam, n, np.random.default_rng(11).random)
    assert x.dtype == np.int64 and x.shape == (n,)
    if lam < 1e9:
        edges = np.unique(stats.poisson.ppf(np.linspace(0, 1, 21)[1:-1], lam))
        inner = stats.poisson.cdf(edges, lam)
    else:  # scipy's Poisson cdf fails here; the normal with continuity correction errs by
        # O(lam^-1/2) = 1e-6 of a bin's probability (the skewness), far below what 2e5
        # draws resolve
        edges = np.unique(np.floor(stats.norm.ppf(np.linspace(0, 1, 21)[1:-1], lam,
                                                  math.sqrt(lam))))
        inner = stats.norm.cdf(edges + 0.5, lam, math.sqrt(lam))
    # category j: edges[j-1] < x <= edges[j] (the last: x > edges[-1])
    observed = np.bincount(np.searchsorted(edges, x, side="left"), minlength=edges.size + 1)
    cdf = np.concatenate([[0.0], inner, [1.0]])
    expected = n * np.diff(cdf)
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert chi2 < stats.chi2.ppf(1 - 1e-6, expected.size - 1), (chi2, observed, expected)
    # the mean within 6 standard errors (sqrt(lam / n)), the variance within 6 of its own
    assert abs(x.mean() - lam) < 6 * math.sqrt(lam / n)
    assert abs(x.var() / lam - 1) < 6 * math.sqrt(2 / n)


def test_bad_means_are_refused_by_name() -> None:
    for bad in (-1.0, math.nan, math.inf, MAX_LAM * 2, True, "3"):
        with pytest.raises(ValueError, match="lam, a Poisson mean"):
            poisson_from_uniforms(bad, 3, np.random.default_rng(0).random)  # type: ignore[arg-type]
    assert poisson_from_uniforms(0.0, 4, np.random.default_rng(0).random).tolist() == [0] * 4
    assert poisson_from_uniforms(5.0, 0, np.random.default_rng(0).random).size == 0


def test_the_secure_generator_draws_fresh_poisson_variates() -> None:
    """SecureGenerator.poisson: int64 of the asked shape from the OS CSPRNG (two draws
    differ), the mean of 1e5 draws within 6 standard errors."""
    g = SecureGenerator()
    a, b = g.poisson(1e6, (2, 50_000)), g.poisson(1e6, (2, 50_000))
    assert a.shape == (2, 50_000) and a.dtype == np.int64
    assert not np.array_equal(a, b)
    assert abs(a.mean() - 1e6) < 6 * math.sqrt(1e6 / a.size)
    assert isinstance(g.poisson(3.0), int)
