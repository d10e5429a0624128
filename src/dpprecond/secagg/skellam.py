"""The distributed Skellam mechanism: noise that adds up under secure aggregation.

Agarwal, Kairouz and Liu, "The Skellam Mechanism for Differentially Private Federated
Learning" (NeurIPS 2021), with the conditional randomized rounding of Kairouz, Liu and
Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation" (ICML 2021).

One release is the sum, over the clients of a round, of their records' contributions
(per-example clipped gradients, norm at most ``C``). The server sees only the sum, through
secure aggregation (sums modulo ``m = 2^bits``), so the noise is split among the clients:

1. **Quantize** (on the client, per record): scale by ``gamma`` and round each coordinate
   up or down at random (unbiased), redrawing a record's rounding until its integer vector
   has norm at most :attr:`SkellamPlan.record_bound` (conditional randomized rounding). The
   bound holds for every record, deterministically.
2. **Share the noise** (on the client): add ``Sk(lam, lam) = Poisson(lam) - Poisson(lam)``
   to every coordinate of the client's integer sum, ``lam = variance / (2 * min_clients)``.
   A sum of independent Skellam variables is Skellam: a sum holding ``k >= min_clients``
   shares carries ``Sk(k lam, k lam)``, variance ``k / min_clients * variance >=
   variance``. A round whose sum would hold fewer shares must not be released
   (:func:`decode` refuses it).
3. **Encode** modulo ``m`` and aggregate (secure aggregation computes exactly the modular
   sum); :func:`decode` centres the sum into ``[-m/2, m/2)`` and divides by ``gamma``.

Privacy unit and sensitivity: one record, replace-one. Replacing a record changes the
integer sum by ``r(x) - r(x')`` with both rounded vectors of norm at most ``B`` (the record
bound), so the L2 sensitivity is ``2 B`` and, the difference being an integer vector, the
L1 sensitivity is at most ``min(sqrt(d) * 2 B, (2 B)^2)`` (for an integer vector
``||w||_1 <= ||w||_2^2``). The randomness of the rounding is independent of everything
else; conditioning on it (a mixture over pairs of outcomes, each pair within these
sensitivities) the Renyi divergence is at most that of the worst pair (joint
quasi-convexity).

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
but a coordinate outside ``[-m/2, m/2)`` decodes wrongly. :meth:`SkellamPlan.wrap_probability`
bounds that probability (deterministic signal bound plus Bernstein's inequality for the
Skellam tail, union over coordinates) and :func:`plan_skellam` picks the smallest modulus
meeting a target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import check_int, check_positive
from dpprecond.clipping import clip_rows_safely

__all__ = [
    "InsufficientNoiseError",
    "ModularSum",
    "SkellamPlan",
    "aggregate",
    "client_share",
    "colluding_variance",
    "conditional_round",
    "decode",
    "modular_wrap_bound",
    "plan_event",
    "plan_skellam",
    "quantize_records",
    "skellam_event",
    "skellam_noise",
    "skellam_rdp",
]

#: Default fraction of a record's rounding draws that may exceed the conditional bound
#: (``beta`` of Kairouz, Liu and Steinke; ``exp(-1/2)`` makes ``sqrt(2 log(1/beta)) = 1``).
DEFAULT_BETA = math.exp(-0.5)
#: Largest modulus: shares and sums stay below ``2^63`` in int64 arithmetic.
MAX_BITS = 62
#: Most redraws of a record's rounding before giving up (each fails with probability
#: at most ``beta``; 200 failures in a row have probability below ``0.61^200 < 1e-42``).
MAX_ROUNDING_TRIES = 200


class InsufficientNoiseError(RuntimeError):
    """A secure sum would hold fewer noise shares than its plan needs; it is not released."""


class ModularSum(Protocol):
    """What :func:`aggregate` and :func:`decode` read from a plan (``SkellamPlan`` or the
    plan of a federated-PCA sum, :class:`dpprecond.secagg.sums.SumPlan`)."""

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


@dataclass(frozen=True)
class SkellamPlan:
    """What every client and the server of a secure-aggregation round agree on.

    Parameters
    ----------
    clip_norm : float
        ``C``: L2 bound of one record's contribution before scaling.
    dim : int
        ``d``: length of the summed vectors.
    scale : float
        ``gamma``: a contribution ``x`` becomes the integer vector ``r(gamma x)``.
    noise_variance : float
        ``v``: variance per coordinate (integer units) of the noise of a sum holding
        ``min_clients`` shares.
    min_clients : int
        Fewest clients whose shares a released sum holds (each share has variance
        ``v / min_clients``).
    bits : int
        Modulus ``m = 2^bits`` of the secure sum.
    beta : float
        Conditional rounding's per-draw failure probability in the norm bound.
    """

    clip_norm: float
    dim: int
    scale: float
    noise_variance: float
    min_clients: int
    bits: int
    beta: float = DEFAULT_BETA

    def __post_init__(self) -> None:
        check_positive("clip_norm", self.clip_norm)
        check_int("dim", self.dim, low=1)
        check_positive("scale", self.scale)
        check_positive("noise_variance", self.noise_variance, allow_zero=True)
        check_int("min_clients", self.min_clients, low=1)
        check_int("bits", self.bits, low=2, high=MAX_BITS)
        if not 0.0 < self.beta < 1.0:
            raise ValueError(f"Expected beta in (0, 1), got beta={self.beta!r}.")

    @property
    def modulus(self) -> int:
        """``m = 2^bits``."""
        return 1 << self.bits

    @property
    def record_bound(self) -> float:
        """``B``: the norm bound every rounded record meets (conditional rounding).

        ``B^2 = min((gamma C + sqrt(d))^2, gamma^2 C^2 + d/4 + sqrt(2 log(1/beta)) (gamma C
        + sqrt(d)/2))`` (Kairouz, Liu and Steinke 2021); the first term holds for every
        draw (each coordinate moves by less than 1), the second for all but a fraction
        ``beta`` of draws, which are redrawn.
        """
        gc = self.scale * self.clip_norm
        d = float(self.dim)
        always = (gc + math.sqrt(d)) ** 2
        likely = gc ** 2 + d / 4 + math.sqrt(2 * math.log(1 / self.beta)) * (gc + math.sqrt(d) / 2)
        return math.sqrt(min(always, likely))

    @property
    def l2_sensitivity(self) -> float:
        """Replace-one L2 sensitivity of the integer sum: ``2 B``."""
        return 2.0 * self.record_bound

    @property
    def l1_sensitivity(self) -> float:
        """Replace-one L1 sensitivity of the integer sum: ``min(sqrt(d) 2B, (2B)^2)``."""
        d2 = self.l2_sensitivity
        return min(math.sqrt(self.dim) * d2, d2 ** 2)

    @property
    def share_parameter(self) -> float:
        """``lam``: each client adds ``Poisson(lam) - Poisson(lam)`` per coordinate."""
        return self.noise_variance / (2.0 * self.min_clients)

    @property
    def noise_multiplier(self) -> float:
        """``sqrt(v) / (2B)``: the noise std over the sensitivity (the Gaussian analogue)."""
        return math.sqrt(self.noise_variance) / self.l2_sensitivity

    def noise_std(self) -> float:
        """Std per coordinate of the decoded sum's noise, in the data's units."""
        return math.sqrt(self.noise_variance) / self.scale

    def wrap_probability(self, n_records: int, n_shares: int) -> float:
        """Upper bound on the probability that a decoded sum is wrong (wrap-around).

        A coordinate of the integer sum is the records' part, at most ``n_records * B`` in
        absolute value (``||r(x)||_inf <= ||r(x)||_2 <= B``), plus Skellam noise of
        variance ``V = n_shares / min_clients * v``. Bernstein's inequality (a Poisson
        difference is a limit of sums of centred terms bounded by 1) gives ``P(|noise| >=
        t) <= 2 exp(-t^2 / (2 (V + t/3)))``; a union over the ``d`` coordinates with
        ``t = m/2 - n_records * B`` bounds the probability that any coordinate leaves
        ``[-m/2, m/2)``. Returns 1 when the records alone may not fit.
        """
        n_records = check_int("n_records", n_records, low=0)
        n_shares = check_int("n_shares", n_shares, low=1)
        return modular_wrap_bound(self.dim, n_records * self.record_bound,
                                  n_shares / self.min_clients * self.noise_variance,
                                  self.modulus)


def plan_skellam(clip_norm: float, dim: int, noise_multiplier: float, min_clients: int,
                 max_records: int, *, max_clients: int | None = None,
                 resolution: float = 1024.0, beta: float = DEFAULT_BETA,
                 max_wrap_probability: float = 1e-12) -> SkellamPlan:
    """The plan of a round: scale ``gamma = resolution / C``, noise and the modulus.

    Parameters
    ----------
    clip_norm, dim : float, int
        ``C`` and ``d``.
    noise_multiplier : float
        ``z``: the sum's noise std is ``z * 2B`` (integer units), ``v = (z 2B)^2``.
    min_clients : int
        Fewest clients whose shares a released sum holds.
    max_records : int
        Largest number of records in one sum (all clients together; it bounds the signal
        for the modulus).
    max_clients : int, optional
        Most shares in one sum (default ``min_clients``): more shares, more noise.
    resolution : float, default=1024
        ``gamma C``: integer levels per clip norm (rounding error std per coordinate of one
        record is at most 1/2, against a sensitivity of about ``2 * resolution``).
    beta : float
        Conditional rounding's failure probability (:class:`SkellamPlan`).
    max_wrap_probability : float, default=1e-12
        The modulus is the smallest power of two whose wrap-around bound is below it.
    """
    check_positive("clip_norm", clip_norm)
    check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    check_positive("resolution", resolution)
    max_records = check_int("max_records", max_records, low=0)
    shares = min_clients if max_clients is None else check_int("max_clients", max_clients,
                                                                  low=min_clients)
    check_positive("max_wrap_probability", max_wrap_probability)
    plan = SkellamPlan(clip_norm, dim, resolution / clip_norm, 0.0, min_clients, 2, beta)
    variance = (noise_multiplier * plan.l2_sensitivity) ** 2
    for bits in range(2, MAX_BITS + 1):
        plan = SkellamPlan(clip_norm, dim, resolution / clip_norm, variance, min_clients,
                           bits, beta)
        if plan.wrap_probability(max_records, shares) <= max_wrap_probability:
            return plan
    raise ValueError(f"No modulus up to 2^{MAX_BITS} keeps the wrap-around probability of a "
                     f"sum of {max_records} records below {max_wrap_probability:g} (noise "
                     f"multiplier {noise_multiplier:g}, resolution {resolution:g}); lower "
                     "the resolution or the number of records per sum.")


# -- the client's half --------------------------------------------------------------------


def conditional_round(Y: np.ndarray, bound: float, rng: Any) -> np.ndarray:
    """Unbiased randomized rounding of each row, redrawn until its norm is at most ``bound``.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
        Finite real rows (already scaled).
    bound : float
        Norm every returned row meets.
    rng : numpy Generator
        The rounding's randomness.

    Returns
    -------
    ndarray of shape (n, d), int64
    """
    # The test is exact: a row passes iff its integer squared norm is at most the largest
    # integer <= bound^2 (the float bound read as the exact rational it is). float64
    # sums of integer squares are exact below 2^53, and a larger sum never rounds below
    # 2^53, so the float comparison decides exactly (``bound * bound`` rounded may exceed
    # bound^2 and admit a row of norm just above the bound the sensitivity is built on).
    limit = math.floor(Fraction(bound) ** 2)
    if limit >= 2 ** 53:
        raise ValueError(f"Expected a rounding bound below 2^26.5 (about 9.5e7), got "
                         f"bound={bound:g}: squared norms would not be exact in float64. "
                         "Lower the resolution.")
    floor = np.floor(Y)
    frac = Y - floor
    base = floor.astype(np.int64)
    out = np.empty_like(base)
    todo = np.arange(Y.shape[0])
    for _ in range(MAX_ROUNDING_TRIES):
        if todo.size == 0:
            return out
        up = rng.random((todo.size, Y.shape[1])) < frac[todo]
        draw = base[todo] + up
        ok = np.einsum("ij,ij->i", draw.astype(np.float64), draw.astype(np.float64)) \
            <= float(limit)
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
    raise RuntimeError(f"{todo.size} row(s) failed the rounding bound {bound:g} "
                       f"{MAX_ROUNDING_TRIES} times; a row's norm exceeds the plan's "
                       "scaled clip norm.")


def quantize_records(G: np.ndarray, plan: SkellamPlan, rng: Any) -> np.ndarray:
    """Clip each record's contribution to ``C``, scale by ``gamma`` and round it.

    Rows with non-finite entries are replaced by zero, as the engine's clipping does (a
    deterministic function of the record); a huge finite row (``1e300``) is clipped
    without overflow. Returns int64 rows of norm at most ``plan.record_bound``.
    """
    G = np.asarray(G, dtype=np.float64)
    if G.ndim != 2 or G.shape[1] != plan.dim:
        raise ValueError(f"Expected G of shape (n, {plan.dim}), got {G.shape}.")
    clipped = clip_rows_safely(G, plan.clip_norm)
    return conditional_round(clipped * plan.scale, plan.record_bound, rng)


def skellam_noise(lam: float, size: int, rng: Any) -> np.ndarray:
    """``Poisson(lam) - Poisson(lam)`` per coordinate (int64); zeros for ``lam = 0``."""
    lam = check_positive("lam", lam, allow_zero=True)
    if lam == 0:
        return np.zeros(size, dtype=np.int64)
    return (rng.poisson(lam, size) - rng.poisson(lam, size)).astype(np.int64)


def client_share(G: np.ndarray, plan: SkellamPlan, rng: Any) -> np.ndarray:
    """One client's message: its rounded records' sum plus its noise share, modulo ``m``.

    Parameters
    ----------
    G : ndarray of shape (n_i, d)
        The client's per-record contributions (clipped here to ``C``).
    plan : SkellamPlan
    rng : numpy Generator
        The client's own randomness (rounding, then noise).

    Returns
    -------
    ndarray of shape (d,), int64 in ``[0, m)``
    """
    Q = quantize_records(G, plan, rng)
    total = Q.sum(axis=0, dtype=np.int64) if Q.shape[0] else np.zeros(plan.dim, np.int64)
    total = total + skellam_noise(plan.share_parameter, plan.dim, rng)
    return np.mod(total, plan.modulus)


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


def decode(total: np.ndarray, plan: ModularSum, n_shares: int) -> np.ndarray:
    """The noisy sum in the data's units: centre the modular sum, divide by ``gamma``.

    Raises :class:`InsufficientNoiseError` if the sum holds fewer than
    ``plan.min_clients`` shares (its noise would be below the plan's variance).
    """
    n_shares = check_int("n_shares", n_shares, low=0)
    if n_shares < plan.min_clients:
        raise InsufficientNoiseError(
            f"The secure sum holds {n_shares} noise share(s), fewer than min_clients="
            f"{plan.min_clients}: its noise variance would be {n_shares}/{plan.min_clients} "
            "of the calibrated one. The round is not released.")
    m = plan.modulus
    centred = np.mod(np.asarray(total, dtype=np.int64) + m // 2, m) - m // 2
    return centred.astype(np.float64) / plan.scale


def colluding_variance(plan: SkellamPlan, n_colluding: int) -> float:
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


def plan_event(plan: SkellamPlan, variance: float | None = None) -> dp_event.DpEvent:
    """:func:`skellam_event` of a plan's sum (its calibrated variance unless given)."""
    v = plan.noise_variance if variance is None else variance
    return skellam_event(plan.l2_sensitivity, plan.l1_sensitivity, v)
