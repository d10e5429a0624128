"""The mu-GDP closed form, an independent cross-check of the accountants in the tests.

A Gaussian mechanism with noise multiplier ``z`` is exactly ``1/z``-GDP, and ``T`` of them
compose to ``sqrt(T)/z``-GDP (Dong, Roth and Su, 2019). The library itself takes every
epsilon from dp_accounting; this closed form is kept here only to check it.
"""

from __future__ import annotations

from scipy import optimize, stats


def gaussian_gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon of a ``mu``-GDP mechanism at ``delta`` (Dong, Roth and Su, 2019, Cor. 2.13)."""
    import math

    def delta_of(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2)
                     - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))

    if delta_of(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_of(hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: delta_of(e) - delta, 0.0, hi, xtol=1e-12))
