"""Poisson variates from a source of uniforms: the sampler of secure mode's Skellam noise.

The secure source (:class:`dpprecond.secure.SecureGenerator`) reads 53-bit uniforms from
the OS CSPRNG and has no Poisson sampler of its own; this module turns its uniforms into
Poisson variates with the two algorithms numpy's ``Generator.poisson`` uses, so that the
distribution is the one the library's non-secure Skellam noise already has:

- ``lam < 10``: the multiplication method (Knuth): the number of uniforms whose running
  product stays above ``exp(-lam)``;
- ``lam >= 10``: Hörmann's transformed rejection with squeeze, PTRS (Hörmann 1993,
  "The transformed rejection method for generating Poisson random variables"), with
  numpy's constants.

Both consume uniforms in numpy's order (two per PTRS trial, ``U`` then ``V``; one per
factor of the product), so one variate at a time from a seeded generator's ``random()``
reproduces ``Generator.poisson`` of the same seed (tested). The one change is the
acceptance test of PTRS, ``log f(k) = -lam + k log lam - log k!``: it is evaluated as
``-D(k) - log(2 pi k) / 2 - s(k)`` (``D(k) = k log(k / lam) + lam - k``, summed as a
series near ``lam``; ``s`` Stirling's remainder), which avoids the cancellation of terms
of size ``lam log lam`` (at ``lam = 1e12``, ``2.8e13``: about ``6e-3`` of absolute error
in float64, against ``1e-10`` here up to ``lam = 2^50``).
Means above ``2^50`` are refused: there ``k`` and ``lam`` no longer carry the unit
resolution PTRS needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["MAX_LAM", "poisson_from_uniforms"]

#: Largest mean sampled (integers near ``lam`` keep unit resolution in float64).
MAX_LAM = 2.0**50
#: Below this mean the multiplication method, from it PTRS (numpy's switch).
_PTRS_FROM = 10.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _stirling_remainder(k: np.ndarray) -> np.ndarray:
    """``log k! - (k log k - k + log(2 pi k) / 2)`` for integers ``k >= 1``."""
    out = np.empty_like(k)
    small = k < 10
    ks = k[small]
    out[small] = [math.lgamma(v + 1.0) - (v * math.log(v) - v + _HALF_LOG_2PI
                                           + 0.5 * math.log(v)) for v in ks]
    kb = k[~small]
    inv, inv2 = 1.0 / kb, 1.0 / (kb * kb)
    # the asymptotic series; its first omitted term, 1/(1680 k^7), is below 1e-10 at k = 10
    out[~small] = inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 / 1260.0))
    return out


def _deviance(k: np.ndarray, lam: float) -> np.ndarray:
    """``k log(k / lam) + lam - k`` (``>= 0``) for ``k >= 1``, without cancellation.

    Directly, ``k log1p(x / lam) - x`` (``x = k - lam``) loses ``|x|`` times the
    rounding of ``log1p``: about ``6e-8`` at ``lam = 2^50`` twelve standard deviations
    out. Where ``|v| < 0.1``, ``v = x / (k + lam)``, it is summed instead from ``log(k /
    lam) = 2 (v + v^3/3 + v^5/5 + ...)``: ``x v + 2 k (v^3/3 + v^5/5 + ...)``, whose terms
    fall by ``v^2 <= 0.01`` each (the first omitted is below ``1e-22`` of the sum)."""
    x = k - lam
    out = k * np.log1p(x / lam) - x
    v = x / (k + lam)
    near = np.abs(v) < 0.1
    if near.any():
        vn, kn = v[near], k[near]
        v2 = vn * vn
        term = 2.0 * kn * vn
        total = x[near] * vn
        for j in range(1, 12):
            term = term * v2
            total = total + term / (2 * j + 1)
        out[near] = total
    return out


def _log_pmf(k: np.ndarray, lam: float) -> np.ndarray:
    """``log P(Poisson(lam) = k)`` for float integers ``k >= 0``, without cancellation."""
    out = np.full(k.shape, -lam)
    pos = k >= 1
    kp = k[pos]
    out[pos] = (-_deviance(kp, lam) - _HALF_LOG_2PI - 0.5 * np.log(kp)
                - _stirling_remainder(kp))
    return out


def _multiplication(lam: float, n: int, uniform: Callable[[int], np.ndarray]) -> np.ndarray:
    threshold = math.exp(-lam)
    counts = np.zeros(n, dtype=np.int64)
    prod = np.ones(n)
    active = np.arange(n)
    while active.size:
        prod[active] *= uniform(active.size)
        going = prod[active] > threshold
        counts[active[going]] += 1
        active = active[going]
    return counts


def _ptrs(lam: float, n: int, uniform: Callable[[int], np.ndarray]) -> np.ndarray:
    slam = math.sqrt(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2.0)
    out = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        U = uniform(active.size) - 0.5
        V = uniform(active.size)
        us = 0.5 - np.abs(U)
        with np.errstate(divide="ignore", invalid="ignore"):  # us = 0: a rejected trial
            k = np.floor((2.0 * a / us + b) * U + lam + 0.43)
        quick = (us >= 0.07) & (V <= vr)
        rejected = ~quick & ((k < 0) | ((us < 0.013) & (V > us)))
        test = ~quick & ~rejected
        accept = quick.copy()
        if test.any():
            kt, ut, vt = k[test], us[test], V[test]
            accept[test] = (np.log(vt) + log_invalpha - np.log(a / (ut * ut) + b)
                            <= _log_pmf(kt, lam))
        out[active[accept]] = k[accept].astype(np.int64)
        active = active[~accept]
    return out


def poisson_from_uniforms(lam: float, size: int,
                          uniform: Callable[[int], np.ndarray]) -> np.ndarray:
    """``size`` Poisson(``lam``) variates (int64) from ``uniform(n)``, ``n`` floats in
    ``[0, 1)``.

    Parameters
    ----------
    lam : float
        The mean, finite, in ``[0, 2^50]``.
    size : int
        Number of variates.
    uniform : callable
        ``uniform(n)`` returns ``n`` independent uniforms in ``[0, 1)`` (for secure mode,
        53-bit uniforms from the OS CSPRNG).

    Returns
    -------
    ndarray of int64, shape (size,)
    """
    if isinstance(lam, bool) or not isinstance(lam, (int, float, np.floating, np.integer)) \
            or not math.isfinite(lam) or lam < 0 or lam > MAX_LAM:
        raise ValueError(f"Expected lam, a Poisson mean, in [0, 2^50], got {lam!r}; a "
                         "larger mean needs a larger epsilon or fewer clients per sum.")
    lam = float(lam)
    n = int(size)
    if n < 0:
        raise ValueError(f"Expected size >= 0, got {size!r}.")
    if lam == 0.0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if lam < _PTRS_FROM:
        return _multiplication(lam, n, uniform)
    return _ptrs(lam, n, uniform)
