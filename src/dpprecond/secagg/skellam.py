"""The distributed Skellam mechanism: noise that adds up under secure aggregation.

Agarwal, Kairouz and Liu, "The Skellam Mechanism for Differentially Private Federated
Learning" (NeurIPS 2021).

A release is a sum over clients of integer vectors (each client's part, scaled and
rounded: :mod:`dpprecond.secagg.sums`, which both federated PCA and the federated rounds
of :mod:`dpprecond.secagg.fl` use). The server sees only the sum, through secure
aggregation (sums modulo ``m = 2^bits``), so the noise is split among the clients:

1. **Share the noise** (on the client): add ``Sk(lam, lam) = Poisson(lam) - Poisson(lam)``
   to every coordinate of the client's integer vector (:func:`skellam_noise`),
   ``lam = variance / (2 * min_clients)``. A sum of independent Skellam variables is
   Skellam: a sum holding ``k >= min_clients`` shares carries ``Sk(k lam, k lam)``,
   variance ``k / min_clients * variance >= variance``. A sum that would hold fewer shares
   must not be released (:func:`decode` refuses it).
2. **Encode** modulo ``m`` and aggregate (:func:`aggregate`: secure aggregation computes
   exactly the modular sum); :func:`decode` centres the sum into ``[-m/2, m/2)`` and
   divides by ``gamma``.

This module is the mechanism's arithmetic: the noise, the modular sum and its decoding,
the wrap-around bound, collusion, and the accounting. The sensitivities ``D2`` (L2) and
``D1`` (L1) of the integer sum are the caller's (:class:`dpprecond.secagg.sums.SumPlan`).

Accounting (:func:`skellam_rdp`, :func:`skellam_event`): for noise of variance ``v`` per
coordinate and sensitivities ``D2``, ``D1``, the Skellam mechanism is ``(alpha,
eps(alpha))``-RDP with (Agarwal, Kairouz and Liu, Theorem 3.5, written with the variance)

    eps(alpha) = alpha D2^2 / (2 v) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 v^2), 3 D1 / (2 v)).

The first term is the Gaussian mechanism's RDP at the same variance; the rest vanishes as
``v`` grows. dp_accounting has no Skellam event; the release is recorded as the
``ZCDpEvent(rho, xi)`` that dominates the first branch of the bound
(``rho = D2^2/(2v) + D2^2/(2 v^2)``, ``xi = max(0, (6 D1 - D2^2) / (4 v^2))``) at every
integer order, with ``rho / 2`` more in ``xi`` because the published bound is stated for
integer orders and dp_accounting also evaluates fractional ones: ``f(alpha) = (alpha - 1)
D_alpha`` is convex with ``f(1) = 0``, so between two integers it lies below the chord of
the integer bounds, at most ``rho/4`` above ``(alpha - 1)(xi + rho alpha)``; and ``D_alpha``
is non-decreasing, so ``D_alpha <= xi + rho ceil(alpha)``. Together ``D_alpha <= xi + rho
alpha + rho min(ceil(alpha) - alpha, 1 / (4 (alpha - 1))) <= xi + rho alpha + rho/2``.
dp_accounting's RDP accountant composes it with any other event.

Wrap-around: the modular sum is a function of the integer sum, so it never costs privacy,
but a coordinate outside ``[-m/2, m/2)`` decodes wrongly. :func:`modular_wrap_bound`
bounds that probability (deterministic signal bound plus Bernstein's inequality for the
Skellam tail, union over coordinates);
:func:`dpprecond.secagg.sums.plan_sum` picks the smallest modulus meeting a target.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import check_int, check_positive

__all__ = [
    "InsufficientNoiseError",
    "ModularSum",
    "SkellamRelease",
    "aggregate",
    "check_shares",
    "colluding_variance",
    "decode",
    "modular_wrap_bound",
    "plan_event",
    "skellam_event",
    "skellam_noise",
    "skellam_rdp",
]

#: Largest modulus: shares and sums stay below ``2^63`` in int64 arithmetic.
MAX_BITS = 62


class InsufficientNoiseError(RuntimeError):
    """A secure sum would hold fewer noise shares than its plan needs; it is not released."""


class ModularSum(Protocol):
    """What :func:`aggregate` and :func:`decode` read from a plan (the plan of a secure
    sum, :class:`dpprecond.secagg.sums.SumPlan`)."""

    @property
    def dim(self) -> int: ...

    @property
    def scale(self) -> float: ...

    @property
    def min_clients(self) -> int: ...

    @property
    def bits(self) -> int: ...

    @property
    def modulus(self) -> int: ...


class SkellamRelease(ModularSum, Protocol):
    """What :func:`colluding_variance` and :func:`plan_event` read from a plan."""

    @property
    def noise_variance(self) -> float: ...

    @property
    def l2_sensitivity(self) -> float: ...

    @property
    def l1_sensitivity(self) -> float: ...


def modular_wrap_bound(dim: int, signal: float, variance: float, modulus: int) -> float:
    """Upper bound on the probability that a secure sum decodes wrongly (wrap-around).

    Every coordinate of the integer sum is a signal part at most ``signal`` in absolute
    value plus Skellam noise of variance ``variance``. Bernstein's inequality (a Poisson
    difference is a limit of sums of centred terms bounded by 1) gives ``P(|noise| >= t)
    <= 2 exp(-t^2 / (2 (V + t/3)))``; a union over the ``dim`` coordinates with ``t = m/2 -
    1 - signal`` bounds the probability that any coordinate leaves ``[-m/2, m/2)``.
    Returns 1 when the signal alone may not fit.
    """
    t = modulus / 2 - 1 - signal
    if t <= 0:
        return 1.0
    if variance == 0:
        return 0.0
    return min(1.0, 2.0 * dim * math.exp(-t * t / (2.0 * (variance + t / 3.0))))


# -- the client's half: its noise share ------------------------------------------------


def skellam_noise(lam: float, size: int, rng: Any) -> np.ndarray:
    """``Poisson(lam) - Poisson(lam)`` per coordinate (int64); zeros for ``lam = 0``."""
    lam = check_positive("lam", lam, allow_zero=True)
    if lam == 0:
        return np.zeros(size, dtype=np.int64)
    return (rng.poisson(lam, size) - rng.poisson(lam, size)).astype(np.int64)


# -- the server's half ----------------------------------------------------------------------


def aggregate(shares: list[np.ndarray] | np.ndarray, plan: ModularSum) -> np.ndarray:
    """The modular sum of the shares (what secure aggregation reveals), int64 in ``[0, m)``."""
    total = np.zeros(plan.dim, dtype=np.int64)
    for s in shares:
        s = np.asarray(s)
        if s.shape != (plan.dim,) or s.dtype.kind not in "iu" or (s < 0).any() \
                or (s >= plan.modulus).any():
            raise ValueError(f"Expected a share of shape ({plan.dim},) with integers in "
                             f"[0, 2^{plan.bits}), got shape {s.shape}, dtype {s.dtype}.")
        total = np.mod(total + s.astype(np.int64), plan.modulus)  # < 2^63: no overflow
    return total


def check_shares(n_shares: int, plan: ModularSum) -> int:
    """``n_shares``, if a sum of that many noise shares carries the plan's noise:
    :class:`InsufficientNoiseError` below ``plan.min_clients`` (callers check before any
    part or message is computed)."""
    n_shares = check_int("n_shares", n_shares, low=0)
    if n_shares < plan.min_clients:
        raise InsufficientNoiseError(
            f"The secure sum would hold {n_shares} noise share(s), fewer than min_clients="
            f"{plan.min_clients}: its noise variance would be {n_shares}/{plan.min_clients} "
            "of the calibrated one. The sum is not released.")
    return n_shares


def decode(total: np.ndarray, plan: ModularSum, n_shares: int) -> np.ndarray:
    """The noisy sum in the data's units: centre the modular sum, divide by ``gamma``.

    Raises :class:`InsufficientNoiseError` if the sum holds fewer than
    ``plan.min_clients`` shares (its noise would be below the plan's variance).
    """
    check_shares(n_shares, plan)
    m = plan.modulus
    centred = np.mod(np.asarray(total, dtype=np.int64) + m // 2, m) - m // 2
    return centred.astype(np.float64) / plan.scale


def colluding_variance(plan: SkellamRelease, n_colluding: int) -> float:
    """Noise variance left in a sum of ``min_clients`` shares when ``c`` of them are known.

    Clients colluding with the server can subtract their own shares: what protects the
    others' records is ``(min_clients - c) / min_clients * v``.
    """
    c = check_int("n_colluding", n_colluding, low=0, high=plan.min_clients)
    return (plan.min_clients - c) / plan.min_clients * plan.noise_variance


# -- accounting ---------------------------------------------------------------------------------


def skellam_rdp(orders: np.ndarray | list[float], l2_sensitivity: float,
                l1_sensitivity: float, variance: float) -> np.ndarray:
    """The published RDP bound of the Skellam mechanism at each order (``inf`` at ``v = 0``).

    ``eps(alpha) = alpha D2^2/(2v) + min(((2 alpha - 1) D2^2 + 6 D1)/(4 v^2), 3 D1/(2v))``.
    """
    a = np.asarray(orders, dtype=np.float64)
    if variance == 0:
        return np.full(a.shape, np.inf)
    d2, d1, v = l2_sensitivity, l1_sensitivity, variance
    return a * d2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * d2 ** 2 + 6 * d1) / (4 * v * v),
                                              3 * d1 / (2 * v))


def skellam_event(l2_sensitivity: float, l1_sensitivity: float,
                  variance: float) -> dp_event.DpEvent:
    """The DpEvent of one Skellam release: a ``ZCDpEvent`` dominating :func:`skellam_rdp`.

    ``rho = D2^2/(2v) + D2^2/(2v^2)`` and ``xi = max(0, (6 D1 - D2^2)/(4 v^2)) + rho/2``
    (the extra ``rho/2`` extends the integer-order bound to every order: module
    docstring). Only the RDP accountant evaluates it.
    """
    check_positive("l2_sensitivity", l2_sensitivity)
    check_positive("l1_sensitivity", l1_sensitivity)
    check_positive("variance", variance, allow_zero=True, allow_inf=True)
    if variance == 0:
        return dp_event.NonPrivateDpEvent()
    if math.isinf(variance):
        return dp_event.NoOpDpEvent()
    d2, d1, v = l2_sensitivity, l1_sensitivity, variance
    rho = d2 ** 2 / (2 * v) + d2 ** 2 / (2 * v * v)
    xi = max(0.0, (6 * d1 - d2 ** 2) / (4 * v * v)) + rho / 2
    return dp_accounting.ZCDpEvent(rho=rho, xi=xi)


def plan_event(plan: SkellamRelease, variance: float | None = None) -> dp_event.DpEvent:
    """:func:`skellam_event` of a plan's sum (its calibrated variance unless given)."""
    v = plan.noise_variance if variance is None else variance
    return skellam_event(plan.l2_sensitivity, plan.l1_sensitivity, v)
