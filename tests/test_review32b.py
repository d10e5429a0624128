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
