"""Distributed Skellam noise for sums of client parts: federated PCA and federated rounds.

Federated PCA (:mod:`dpprecond.pca.federated`) releases sums over clients: the Gram matrix
(its upper triangle), products with a broadcast iterate, clipped sums, ``auto``'s probe
histogram, the private mean; a federated gradient round (:mod:`dpprecond.secagg.fl`)
releases the sum of the clients' clipped gradient sums (privacy unit one record, part
sensitivity ``2C`` times the kernel's rounding slack; that module's docstring). Under
``trust="secure-aggregation"`` each such release is
a secure sum: every client computes its *part* (from its own rows and public values),
scales it by ``gamma``, rounds it to integers at random, adds its Skellam share and sends
the result modulo ``2^bits``; the server learns only the modular sum, centres it and
divides by ``gamma``.

Rounding (shared-uniform stochastic rounding, per coordinate): with ``U`` uniform on
``[0, 1)`` drawn by the client, ``R(y) = floor(y) + [U <= y - floor(y)]``, which is
``floor(y + V)`` with ``V = 1 - U`` in ``(0, 1]`` (unbiased up to the 2^-53 grid of ``U``).
``gamma`` is a power of two, so ``y = gamma p`` is exact, and ``floor``, ``y - floor(y)``
and the comparison are exact for ``|y| < 2^52`` (checked): the rounding is computed
exactly.

Privacy unit and sensitivity: one row, replace-one, rows of norm ``<= 1`` as in central
PCA. A row belongs to one client, so a neighbouring input changes that client's part
``p`` to ``p'`` with ``||p - p'||_2 <= Delta`` (the release's central sensitivity, times
``1 + rounding slack`` for the float computation of the part, :mod:`dpprecond.pca.rows`)
and leaves every other part, hence its rounding, unchanged. Couple the two inputs through
the same ``V``: for reals ``a, b`` and any ``V``, ``|floor(a + V) - floor(b + V)| <=
ceil(|a - b|)``, so the rounded parts differ by an integer vector ``w`` with ``|w_j| <=
ceil(gamma |p_j - p'_j|) <= gamma |p_j - p'_j| + 1`` on the ``m`` released coordinates and

    ||w||_2 <= gamma Delta + sqrt(m) =: D2,        ||w||_1 <= min(sqrt(m) D2, D2^2).

Given the rounding draws, the two outputs are the Skellam mechanism on integer inputs
within these sensitivities; the output is the mixture over the draws (the same mixing law
on both sides), and Renyi divergence is jointly quasi-convex, so the Skellam RDP bound at
``(D2, D1)`` holds for the release (:func:`dpprecond.secagg.skellam.skellam_rdp`).

Scale: ``gamma`` is the smallest power of two with ``sqrt(m) / (gamma Delta) <=
inflation`` (:data:`ROUNDING_INFLATION`, ``2^-10``, by default), and at least 1 (a plan
coarsened to fit a modulus cap may go below 1, :func:`plan_sum`). The
noise is calibrated in integer units as ``noise_multiplier * D2``, i.e. ``z Delta (1 +
sqrt(m) / (gamma Delta))`` in the data's units: at most ``1 + inflation`` times the
central Gaussian std of the same release (0.1% by default). The rounding itself adds at
most ``1/4`` variance per coordinate per client (integer units), below ``1e-8`` of the
noise variance at the default scale.

Noise shares: each client adds ``Sk(lam, lam)`` per coordinate with ``lam = v / (2
k_min)``; a sum of ``k >= k_min`` shares has variance ``k / k_min * v >= v``; a sum of
fewer is refused (:class:`~dpprecond.secagg.skellam.InsufficientNoiseError`), as in the
federated rounds.

Accounting (:func:`sum_event`): with ``v = (z D2)^2`` and ``D2 >= (1/inflation + 1)
sqrt(m) >= 6 sqrt(m)``, ``6 D1 <= 6 sqrt(m) D2 <= D2^2`` and the published bound is at
most ``alpha / (2 z^2) + alpha / (2 z^4 D2^2) <= alpha (1/(2 z^2) + 1/(2 z^4 D^2))`` with
``D = 1/inflation + 1`` (the bound decreases in ``D2``, and ``D2 >= D`` for every
``m >= 1``). So every release with noise multiplier ``z`` is dominated by
:func:`~dpprecond.secagg.skellam.skellam_event` at ``(D, D, (z D)^2)``: the
``ZCDpEvent(rho, rho / 2)`` with ``rho = 1/(2 z^2) + 1/(2 z^4 D^2)`` (the ``rho / 2``
extends the integer-order bound to every order, as in the federated rounds). The event
depends only on ``z`` and the inflation, so a fit's plan is known before any data is
touched. Its first term is the Gaussian mechanism's RDP at the same ``z``.

Wrap-around: a coordinate of the integer sum is at most ``gamma n Delta + K`` in absolute
value (every per-row term of these releases has norm at most ``Delta``, and rounding adds
less than 1 per client) plus the noise;
:func:`~dpprecond.secagg.skellam.modular_wrap_bound` bounds the probability that any
coordinate leaves ``[-m/2, m/2)`` and :func:`plan_sum` takes the smallest modulus whose
bound is at most ``max_wrap_probability`` (``1e-12``). A wrap costs no privacy (the
modular sum is a function of the integer sum), only accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._poisson import MAX_LAM
from dpprecond._validation import check_int, check_positive
from dpprecond.secagg.skellam import (
    MAX_BITS,
    aggregate,
    check_shares,
    decode,
    modular_wrap_bound,
    skellam_event,
    skellam_noise,
)

__all__ = [
    "MAX_WRAP_PROBABILITY",
    "PCA_MIN_SCALE",
    "ROUNDING_INFLATION",
    "ClientParts",
    "SecureSums",
    "SumPlan",
    "check_release_args",
    "client_message",
    "flatten_release",
    "plan_sum",
    "plans_summary",
    "release_dim",
    "release_plan",
    "round_shared",
    "secure_sum",
    "skellam_release_events",
    "sum_event",
    "unflatten_release",
]

#: Default bound on the rounding's relative inflation of a release's noise std:
#: ``sqrt(m) / (gamma Delta) <= 2^-10``.
ROUNDING_INFLATION = 2.0**-10
#: The smallest scale a PCA release's capped plan coarsens to (:func:`release_plan`,
#: and the client's re-derivation, :func:`~dpprecond.pca.remote_secure.plan_from_request`):
#: none, so that its ``gamma Delta`` stays below ``2 sqrt(m) / max_inflation`` for every
#: sensitivity (the federated rounds keep ``plan_sum``'s default, 1).
PCA_MIN_SCALE = 0.0
#: Default bound on the wrap-around probability of one secure sum.
MAX_WRAP_PROBABILITY = 1e-12
#: Scaled parts must stay below this in absolute value (exact floor and int64 cast).
EXACT_LIMIT = 2.0**52
#: The largest Skellam share mean: above it a float64 mean no longer places a Poisson
#: variate on every integer (numpy's sampler returns only multiples of the mean's ulp
#: above 2^53, which would put the summed noise on a lattice and release the sum's low
#: bits exactly); secure mode's sampler refuses larger means (``_poisson.MAX_LAM``).
MAX_SHARE_PARAMETER = MAX_LAM


class ClientParts:
    """A sum over clients held as its ``K`` parts: the statistic secure aggregation sums.

    ``parts[i]`` is client ``i``'s part, computed from its own rows and public values.
    Linear maps with public arrays (``@`` on either side, transposition, indexing,
    reshaping, sums of two such values, scalar factors) apply to every part, so a PCA
    kernel computes a release's parts with the code that computes its central value. Any
    other use (a numpy function, ``float``, ``np.asarray``) raises ``TypeError``: the
    only way out is :func:`dpprecond.noise.release` with a :class:`SecureSums` source.
    """

    __array_ufunc__ = None  # numpy defers to the reflected operators below

    def __init__(self, parts: Any) -> None:
        self.parts = np.asarray(parts, dtype=np.float64)
        if self.parts.ndim < 2:
            raise ValueError(f"Expected parts of shape (K, ...) with K >= 1, got shape "
                             f"{self.parts.shape}.")

    @property
    def n_clients(self) -> int:
        """Number of parts ``K``."""
        return int(self.parts.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one part (of the summed statistic)."""
        return tuple(self.parts.shape[1:])

    @property
    def ndim(self) -> int:
        """Dimensions of one part."""
        return self.parts.ndim - 1

    def total(self) -> np.ndarray:
        """The exact sum of the parts: a private value, for diagnostics only (never
        released: clipped-row counts)."""
        return self.parts.sum(axis=0)

    def _same(self, other: Any) -> ClientParts:
        if not isinstance(other, ClientParts) or other.n_clients != self.n_clients:
            raise TypeError("Only two sums over the same clients can be added; got "
                            f"{type(other).__name__}.")
        return other

    def __add__(self, other: Any) -> ClientParts:
        return ClientParts(self.parts + self._same(other).parts)

    def __sub__(self, other: Any) -> ClientParts:
        return ClientParts(self.parts - self._same(other).parts)

    def __neg__(self) -> ClientParts:
        return ClientParts(-self.parts)

    def __mul__(self, factor: Any) -> ClientParts:
        if np.ndim(factor) != 0 or isinstance(factor, ClientParts):
            raise TypeError("A sum over clients is multiplied by public scalars only.")
        return ClientParts(self.parts * float(factor))

    __rmul__ = __mul__

    def __truediv__(self, factor: Any) -> ClientParts:
        if np.ndim(factor) != 0 or isinstance(factor, ClientParts):
            raise TypeError("A sum over clients is divided by public scalars only.")
        return ClientParts(self.parts / float(factor))

    def __matmul__(self, other: Any) -> ClientParts:
        if isinstance(other, ClientParts):
            raise TypeError("The product of two sums over clients is not a sum over clients.")
        return ClientParts(self.parts @ np.asarray(other, dtype=np.float64))

    def __rmatmul__(self, other: Any) -> ClientParts:
        return ClientParts(np.asarray(other, dtype=np.float64) @ self.parts)

    @property
    def T(self) -> ClientParts:
        """Every part transposed (a vector part is its own transpose)."""
        if self.ndim == 1:
            return self
        if self.ndim != 2:
            raise ValueError(f"Transpose of parts of shape {self.shape} is ambiguous.")
        return ClientParts(np.swapaxes(self.parts, 1, 2))

    def __getitem__(self, key: Any) -> ClientParts:
        key = key if isinstance(key, tuple) else (key,)
        return ClientParts(self.parts[(slice(None), *key)])

    def reshape(self, *shape: Any) -> ClientParts:
        """Every part reshaped to ``shape``."""
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return ClientParts(self.parts.reshape(self.n_clients, *dims))

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("A sum held by the clients is not released: only "
                        "dpprecond.noise.release with a SecureSums source reads it.")

    def __repr__(self) -> str:
        return f"ClientParts(K={self.n_clients}, shape={self.shape})"


def round_shared(y: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``floor(y) + [u <= y - floor(y)]`` (int64), computed exactly (module docstring).

    Equal to ``floor(y + 1 - u)``; with ``u`` uniform on ``[0, 1)`` an unbiased rounding of
    ``y``, and for a fixed ``u`` two inputs ``y, y'`` round to integers at most
    ``ceil(|y - y'|)`` apart. Requires ``|y| < 2^52``.
    """
    y = np.asarray(y, dtype=np.float64)
    if not np.all(np.abs(y) < EXACT_LIMIT):
        raise ValueError("Expected scaled parts below 2^52 in absolute value (exact "
                         "rounding); the plan's scale is too large for this release.")
    f = np.floor(y)
    return f.astype(np.int64) + (np.asarray(u) <= y - f)


@dataclass(frozen=True)
class SumPlan:
    """What every client and the server agree on for one secure sum.

    Parameters
    ----------
    dim : int
        ``m``: released coordinates (the upper triangle of a symmetric statistic).
    sensitivity : float
        ``Delta``: replace-one L2 bound on the change of one client's computed part
        (float slack included).
    noise_multiplier : float
        ``z``: the sum's noise std is ``z * D2`` in integer units.
    scale : float
        ``gamma``, a power of two (``>= 1`` unless coarsened under a cap).
    n_rows : int
        ``n``: rows of all clients (bounds the signal).
    n_clients : int
        ``K``: clients that send a share (all of them in the simulation).
    min_clients : int
        Fewest shares a released sum may hold (each has ``1 / min_clients`` of ``v``).
    bits : int
        Modulus ``2^bits``.
    """

    dim: int
    sensitivity: float
    noise_multiplier: float
    scale: float
    n_rows: int
    n_clients: int
    min_clients: int
    bits: int

    @property
    def modulus(self) -> int:
        """``2^bits``."""
        return 1 << self.bits

    @property
    def l2_sensitivity(self) -> float:
        """``D2 = gamma Delta + sqrt(m)`` (integer units; rounded up by ``2^-40``)."""
        return (self.scale * self.sensitivity + math.sqrt(self.dim)) * (1.0 + 2.0**-40)

    @property
    def l1_sensitivity(self) -> float:
        """``D1 = min(sqrt(m) D2, D2^2)``."""
        d2 = self.l2_sensitivity
        return min(math.sqrt(self.dim) * d2, d2 * d2)

    @property
    def noise_variance(self) -> float:
        """``v = (z D2)^2`` per coordinate, integer units (a sum of ``min_clients``
        shares)."""
        return (self.noise_multiplier * self.l2_sensitivity) ** 2

    @property
    def share_parameter(self) -> float:
        """``lam``: each client adds ``Poisson(lam) - Poisson(lam)`` per coordinate."""
        return self.noise_variance / (2.0 * self.min_clients)

    @property
    def inflation(self) -> float:
        """``sqrt(m) / (gamma Delta)``: the decoded noise std over ``z Delta``, minus 1."""
        return math.sqrt(self.dim) / (self.scale * self.sensitivity)

    @property
    def signal_bound(self) -> float:
        """Bound on a coordinate of the sum of the rounded parts: ``gamma n Delta + K``."""
        return self.scale * self.n_rows * self.sensitivity + self.n_clients

    def wrap_probability(self, n_shares: int | None = None) -> float:
        """Bound on the probability that the decoded sum is wrong (all ``K`` shares by
        default; :func:`~dpprecond.secagg.skellam.modular_wrap_bound`)."""
        k = self.n_clients if n_shares is None else n_shares
        return modular_wrap_bound(self.dim, self.signal_bound,
                                  k / self.min_clients * self.noise_variance, self.modulus)

    def noise_std(self, n_shares: int | None = None) -> float:
        """Std per coordinate of the decoded sum's noise, in the data's units."""
        k = self.n_clients if n_shares is None else n_shares
        return math.sqrt(k / self.min_clients * self.noise_variance) / self.scale

    def event(self) -> dp_event.DpEvent:
        """The Skellam event of this sum at its own ``(D2, D1, v)`` (dominated by
        :func:`sum_event` at the plan's inflation; tested)."""
        return skellam_event(self.l2_sensitivity, self.l1_sensitivity, self.noise_variance)


def plan_sum(dim: int, sensitivity: float, noise_multiplier: float, *, n_rows: int,
             n_clients: int, min_clients: int, inflation: float = ROUNDING_INFLATION,
             max_wrap_probability: float = MAX_WRAP_PROBABILITY,
             fit_bits: int | None = None, max_inflation: float | None = None,
             min_scale: float = 1.0) -> SumPlan:
    """The plan of one secure sum: ``gamma`` from the inflation, the smallest modulus.

    With ``fit_bits`` (and ``max_inflation``, at least ``inflation``): when the plan at
    ``inflation`` needs a modulus above ``2^fit_bits``, ``gamma`` is halved, one bit of
    the modulus at a time, while the plan's own inflation ``sqrt(m) / (gamma Delta)``
    stays at most ``max_inflation`` and ``gamma >= min_scale``; the first plan that fits is
    returned, and the plan at ``inflation`` when none does. ``min_scale`` is 1 for the
    federated rounds (a huge clip keeps ``gamma = 1``); a PCA fit's capped sums pass 0
    (:func:`release_plan`), so that the coarsest candidate has ``gamma Delta < 2 sqrt(m) /
    max_inflation`` whatever ``Delta``, as the fit's pre-check assumes
    (:func:`~dpprecond.pca.secure_plan.sum_modulus_bits`). A
    smaller ``gamma`` costs only noise (the decoded std is ``z Delta (1 + inflation)``);
    the accounting must cover the largest inflation a plan may take (:func:`sum_event` at
    ``max_inflation``).

    Raises ``ValueError`` naming the quantity when no exact plan exists (a scale that
    overflows, scaled parts beyond ``2^52``, no modulus up to ``2^62``).
    """
    dim = check_int("dim", dim, low=1)
    sensitivity = check_positive("sensitivity", sensitivity)
    z = check_positive("noise_multiplier", noise_multiplier)
    n_rows = check_int("n_rows", n_rows, low=1)
    n_clients = check_int("n_clients", n_clients, low=1)
    min_clients = check_int("min_clients", min_clients, low=1, high=n_clients)
    inflation = check_inflation(inflation)
    check_positive("max_wrap_probability", max_wrap_probability)
    with np.errstate(over="ignore"):
        target = math.sqrt(dim) / (inflation * sensitivity)
    if not math.isfinite(target) or target >= 2.0**1000:
        raise ValueError(f"sensitivity={sensitivity:g} is too small for an exact integer "
                         "scale of the secure sum; give a larger clip radius.")
    scale = max(1.0, 2.0 ** math.ceil(math.log2(target)))
    while scale * sensitivity * inflation < math.sqrt(dim):  # log2 may round down
        scale *= 2.0
    plan = _plan_at_scale(dim, sensitivity, z, scale, n_rows, n_clients, min_clients,
                          max_wrap_probability)
    if fit_bits is None or plan.bits <= fit_bits:
        return plan
    fit_bits = check_int("fit_bits", fit_bits, low=2, high=MAX_BITS)
    cap = check_inflation(inflation if max_inflation is None else max_inflation)
    if cap < inflation:
        raise ValueError(f"Expected max_inflation >= inflation ({inflation!r}), got "
                         f"max_inflation={max_inflation!r}.")
    floor = check_positive("min_scale", min_scale, allow_zero=True)
    # With min_scale < 1, below gamma = 1 too: a sensitivity above sqrt(m) / max_inflation
    # starts at gamma = 1 with gamma Delta = Delta, above the 2 sqrt(m) / max_inflation a
    # PCA fit's pre-check bounds; every candidate keeps gamma Delta >= sqrt(m) /
    # max_inflation, so the coarsest has gamma Delta < 2 sqrt(m) / max_inflation.
    coarser = scale / 2.0
    while coarser >= floor and math.sqrt(dim) <= cap * coarser * sensitivity:
        candidate = _plan_at_scale(dim, sensitivity, z, coarser, n_rows, n_clients,
                                   min_clients, max_wrap_probability)
        if candidate.bits <= fit_bits:
            return candidate
        coarser /= 2.0
    return plan


def _plan_at_scale(dim: int, sensitivity: float, z: float, scale: float, n_rows: int,
                   n_clients: int, min_clients: int, max_wrap_probability: float) -> SumPlan:
    """The plan at ``gamma = scale``: the smallest modulus within the wrap bound."""
    plan = SumPlan(dim, sensitivity, z, scale, n_rows, n_clients, min_clients, 2)
    if plan.signal_bound >= EXACT_LIMIT:
        raise ValueError(f"A secure sum of {n_rows} rows at sensitivity {sensitivity:g} "
                         f"needs integers up to {plan.signal_bound:.3g}, beyond 2^52 (exact "
                         "rounding): lower the number of rows per fit or the clip radius.")
    if plan.share_parameter > MAX_SHARE_PARAMETER:
        raise ValueError(f"noise_multiplier={z:g} needs Skellam shares of mean "
                         f"{plan.share_parameter:.3g} > 2^50, the largest the Poisson "
                         "samplers draw on every integer in float64; raise epsilon or "
                         "min_clients.")
    for bits in range(2, MAX_BITS + 1):
        plan = SumPlan(dim, sensitivity, z, scale, n_rows, n_clients, min_clients, bits)
        if plan.wrap_probability() <= max_wrap_probability:
            return plan
    raise ValueError(f"No modulus up to 2^{MAX_BITS} keeps the wrap-around probability of "
                     f"a secure sum of {n_rows} rows below {max_wrap_probability:g} (noise "
                     f"multiplier {z:g}); raise epsilon or lower the number of rows.")


#: The plans of the sums a fit makes repeat (same size, sensitivity and noise multiplier
#: for every iteration); a plan is a pure function of its arguments.
_cached_plan = lru_cache(maxsize=1024)(plan_sum)


def check_inflation(inflation: float) -> float:
    """``inflation`` in ``(0, 1/5]`` (so that ``D2 >= 6 sqrt(m)``, module docstring)."""
    inflation = check_positive("inflation", inflation)
    if inflation > 0.2:
        raise ValueError(f"Expected inflation <= 0.2 (the accounting needs gamma Delta >= "
                         f"5 sqrt(m)), got inflation={inflation!r}.")
    return inflation


# -- the client's half and the server's half ------------------------------------------------


def client_message(part: np.ndarray, plan: SumPlan, rng: Any) -> np.ndarray:
    """One client's message: its rounded scaled part plus its noise share, modulo ``m``.

    ``rng`` draws the rounding's uniforms first, then the Skellam share (int64 in
    ``[0, 2^bits)``).
    """
    part = np.asarray(part, dtype=np.float64)
    if part.shape != (plan.dim,):
        raise ValueError(f"Expected a part of shape ({plan.dim},), got {part.shape}.")
    q = round_shared(part * plan.scale, rng.random(plan.dim))  # exact: scale = 2^j
    return np.mod(q + skellam_noise(plan.share_parameter, plan.dim, rng), plan.modulus)


def secure_sum(parts: np.ndarray, plan: SumPlan, rngs: Sequence[Any],
               clients: Sequence[int] | None = None) -> np.ndarray:
    """The decoded secure sum of the parts ``(K, m)``, in the data's units.

    Client ``i`` computes its message with ``rngs[i]`` (:func:`client_message`);
    ``clients`` lists those whose messages reach the sum (default all; fewer than
    ``plan.min_clients`` raises :class:`~dpprecond.secagg.skellam.InsufficientNoiseError`
    before any message is formed).
    """
    parts = np.asarray(parts, dtype=np.float64)
    ids = list(range(parts.shape[0])) if clients is None else [int(i) for i in clients]
    check_shares(len(ids), plan)
    messages = [client_message(parts[i], plan, rngs[i]) for i in ids]
    return decode(aggregate(messages, plan), plan, len(messages))


# -- accounting -------------------------------------------------------------------------


def sum_event(noise_multiplier: float,
              inflation: float = ROUNDING_INFLATION) -> dp_event.DpEvent:
    """The event that dominates every secure sum with noise multiplier ``z``.

    :func:`~dpprecond.secagg.skellam.skellam_event` at ``D2 = D1 = D = 1/inflation + 1``
    and ``v = (z D)^2`` (module docstring): ``ZCDpEvent(rho, rho/2)``, ``rho = 1/(2 z^2) +
    1/(2 z^4 D^2)``. ``z = inf`` is no release.
    """
    z = check_positive("noise_multiplier", noise_multiplier, allow_inf=True)
    if math.isinf(z):
        return dp_event.NoOpDpEvent()
    d = 1.0 / check_inflation(inflation) + 1.0
    return skellam_event(d, d, (z * d) ** 2)


def skellam_release_events(event: dp_event.DpEvent, factor: float = 1.0,
                           inflation: float = ROUNDING_INFLATION) -> dp_event.DpEvent:
    """A plan's Gaussian releases as secure sums: every ``GaussianDpEvent(z)`` of
    ``event`` becomes :func:`sum_event` at ``factor * z``; compositions are kept."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return sum_event(event.noise_multiplier * factor, inflation)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([skellam_release_events(e, factor, inflation)
                                         for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(
            skellam_release_events(event.event, factor, inflation), event.count)
    if isinstance(event, dp_event.NoOpDpEvent):
        return event
    raise ValueError(f"{type(event).__name__} is not a release secure aggregation runs "
                     "(only unsampled Gaussian sums are).")


# -- a PCA release as a secure sum: its plan, its layout, its summary ----------------------


def release_plan(dim: int, std: float, sensitivity: float, *, fp: float, n_rows: int,
                 n_clients: int, min_clients: int, inflation: float = ROUNDING_INFLATION,
                 max_wrap_probability: float = MAX_WRAP_PROBABILITY,
                 fit_bits: int | None = None, max_inflation: float | None = None) -> SumPlan:
    """The plan of a PCA release of ``dim`` coordinates with central noise std ``std``.

    The sum's sensitivity is ``Delta fp`` (the release's central sensitivity times the
    rows' rounding factor, :func:`~dpprecond.pca.rows.noise_inflation`) and its noise
    multiplier ``z = std / (Delta fp)``, nudged up by ``2^-40`` (``std`` was formed as
    ``(z fp) Delta`` in floating point, and the sum must carry at least the accounted
    ``z``). With ``fit_bits`` the scale coarsens to fit ``2^fit_bits`` while the inflation
    stays at most ``max_inflation``, below ``gamma = 1`` if need be (:func:`plan_sum` at
    ``min_scale =`` :data:`PCA_MIN_SCALE`; the fit's events are calibrated at that bound,
    :mod:`dpprecond.pca.secure_plan`); a capped plan that still needs more is refused
    (``ValueError``), in process as on a deployment whose transport carries no more. The
    one derivation of
    :class:`SecureSums` and of a fit over a network (:mod:`dpprecond.pca.remote_secure`),
    so both plan the same sums.
    """
    delta_fp = float(sensitivity) * fp
    z = std / delta_fp * (1.0 + 2.0**-40)
    try:
        plan = _cached_plan(int(dim), delta_fp, z, n_rows=n_rows, n_clients=n_clients,
                            min_clients=min_clients, inflation=inflation,
                            max_wrap_probability=max_wrap_probability, fit_bits=fit_bits,
                            max_inflation=max_inflation, min_scale=PCA_MIN_SCALE)
        if fit_bits is not None and plan.bits > fit_bits:  # the fit's pre-check bounds it
            raise ValueError(f"A secure sum of {dim} coordinates at sensitivity "
                             f"{delta_fp:g} needs a modulus of 2^{plan.bits} even at the "
                             f"coarsest scale within the inflation bound {max_inflation!r}, "
                             f"above the fit's cap 2^{fit_bits} (max_modulus_bits); raise "
                             "the cap.")
        return plan
    except ValueError as exc:  # planned when the release is made, after the fit's charge
        raise ValueError(f"{exc} This release ({dim} coordinates) was planned during the "
                         "fit: nothing of it was released, but the fit's planned event was "
                         "charged when the fit began (and any earlier release of it was made).") \
            from exc


def check_release_args(std: float, sensitivity: float | None) -> float:
    """A secure release's own arguments: its sensitivity given (returned), its noise std
    ``> 0`` (the checks of :meth:`SecureSums.release_sum` and of a fit over a network)."""
    if sensitivity is None:
        raise TypeError("A secure sum needs the release's sensitivity "
                        "(release(..., sensitivity=...)).")
    if not std > 0:
        raise ValueError(f"Expected a noise std > 0 under trust='secure-aggregation', "
                         f"got std={std!r}.")
    return sensitivity


def release_dim(shape: tuple[int, ...], symmetric: bool) -> int:
    """Coordinates a release of ``shape`` sends: the upper triangle (diagonal included)
    of a symmetric ``(d, d)`` statistic, else every entry."""
    shape = tuple(int(s) for s in shape)
    if symmetric:
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"Expected a square value for symmetric=True, got shape {shape}.")
        return shape[0] * (shape[0] + 1) // 2
    return int(np.prod(shape, dtype=np.int64))


def flatten_release(part: np.ndarray, symmetric: bool) -> np.ndarray:
    """One client's part as the sum's coordinates (the upper triangle when ``symmetric``)."""
    part = np.asarray(part, dtype=np.float64)
    if symmetric:
        release_dim(part.shape, True)
        return part[np.triu_indices(part.shape[0])]
    return part.reshape(-1)


def unflatten_release(flat: np.ndarray, shape: tuple[int, ...], symmetric: bool
                      ) -> np.ndarray:
    """The decoded sum in the release's shape (a symmetric one mirrored from its upper
    triangle: post-processing)."""
    if symmetric:
        M = np.zeros(shape)
        M[np.triu_indices(shape[0])] = flat
        return M + np.triu(M, 1).T
    return np.asarray(flat).reshape(shape)


def plans_summary(plans: Sequence[SumPlan], min_clients: int) -> dict[str, Any]:
    """Public facts of a fit's secure sums: count, modulus bits, wrap bound (union over
    the sums), largest rounding inflation."""
    return {"min_clients": min_clients, "n_sums": len(plans),
            "modulus_bits": [p.bits for p in plans],
            "wrap_probability": float(sum(p.wrap_probability() for p in plans)),
            "rounding_inflation": max((p.inflation for p in plans), default=0.0)}


# -- the noise source of the PCA kernels ---------------------------------------------------


class SecureSums:
    """Stands in for a noise source in the PCA kernels under ``trust="secure-aggregation"``.

    :func:`dpprecond.noise.release` hands it every release (``release_sum``): the value
    must be a :class:`ClientParts`, the release's central sensitivity is given, and the
    release is the decoded secure sum (:func:`secure_sum`) whose noise multiplier is
    ``std / (sensitivity * fp)``. Client ``i`` draws its rounding and its share from
    ``streams[i]``. ``standard_normal`` is the server's *public* randomness (a
    data-independent start, broadcast); it never draws noise (:mod:`dpprecond.noise`
    refuses a Gaussian draw from this source). Every sum's plan is appended to ``plans``
    (shared with spawned children): public values (functions of ``n``, ``K``, the
    sensitivities and the noise multipliers).
    """

    def __init__(self, streams: Sequence[Any], public: Any, *, n_rows: int, fp: float,
                 min_clients: int | None = None, inflation: float = ROUNDING_INFLATION,
                 max_wrap_probability: float = MAX_WRAP_PROBABILITY,
                 plans: list[SumPlan] | None = None, fit_bits: int | None = None,
                 max_inflation: float | None = None) -> None:
        self.streams = list(streams)
        self.public = public
        self.n_rows = check_int("n_rows", n_rows, low=1)
        self.fp = check_positive("fp", fp)
        K = len(self.streams)
        self.min_clients = K if min_clients is None else check_int(
            "min_clients", min_clients, low=1, high=K)
        self.inflation = check_inflation(inflation)
        self.max_wrap_probability = max_wrap_probability
        #: With ``fit_bits``, every sum fits ``2^fit_bits``, coarsening its scale up to the
        #: inflation ``max_inflation`` (:mod:`dpprecond.pca.secure_plan`).
        self.fit_bits, self.max_inflation = fit_bits, max_inflation
        self.plans: list[SumPlan] = [] if plans is None else plans

    @property
    def noise_amplification(self) -> float:
        """``sqrt(K / min_clients)``: the sum's noise std over the calibrated one (all
        ``K`` shares; the rounding's inflation, at most ``inflation``, aside)."""
        return math.sqrt(len(self.streams) / self.min_clients)

    @property
    def secure(self) -> bool:
        """True when every client's stream is secure mode's CSPRNG (its rounding and
        Skellam shares from :class:`~dpprecond.secure.SecureGenerator`)."""
        from dpprecond.secure import is_secure

        return all(is_secure(s) for s in self.streams)

    def standard_normal(self, size: Any = None) -> Any:
        """Public randomness of the server (never a release's noise)."""
        return self.public.standard_normal(size)

    def release_sum(self, value: Any, std: float, *, symmetric: bool = False,
                    sensitivity: float | None = None) -> np.ndarray:
        """The release of ``value`` (a :class:`ClientParts`) as a secure sum.

        ``std`` is the central noise std ``z * sensitivity * fp``; ``symmetric`` releases
        the upper triangle (diagonal included) of a symmetric ``(d, d)`` statistic and
        mirrors it. Returns the decoded sum in the value's shape.
        """
        if not isinstance(value, ClientParts):
            raise TypeError(f"Under trust='secure-aggregation' every release is a sum of "
                            f"client parts; got {type(value).__name__} (a value no client "
                            "holds a part of cannot be securely aggregated).")
        sensitivity = check_release_args(std, sensitivity)
        parts = value.parts
        K = value.n_clients
        if K != len(self.streams):
            raise ValueError(f"Expected {len(self.streams)} client parts, got {K}.")
        if symmetric:
            d = value.shape[0]
            if value.shape != (d, d):
                raise ValueError(f"Expected a square value for symmetric=True, got shape "
                                 f"{value.shape}.")
            iu = np.triu_indices(d)
            flat = parts[:, iu[0], iu[1]]
        else:
            flat = parts.reshape(K, -1)
        plan = release_plan(flat.shape[1], std, sensitivity, fp=self.fp, n_rows=self.n_rows,
                            n_clients=K, min_clients=self.min_clients,
                            inflation=self.inflation,
                            max_wrap_probability=self.max_wrap_probability,
                            fit_bits=self.fit_bits, max_inflation=self.max_inflation)
        self.plans.append(plan)
        return unflatten_release(secure_sum(flat, plan, self.streams), value.shape, symmetric)

    def spawn(self, n_children: int) -> list[SecureSums]:
        """Children with one independent stream per client (and a public one), sharing
        ``plans``."""
        per_client = [s.spawn(n_children) for s in self.streams]
        public = self.public.spawn(n_children)
        return [SecureSums([c[j] for c in per_client], public[j], n_rows=self.n_rows,
                           fp=self.fp, min_clients=self.min_clients, inflation=self.inflation,
                           max_wrap_probability=self.max_wrap_probability, plans=self.plans,
                           fit_bits=self.fit_bits, max_inflation=self.max_inflation)
                for j in range(int(n_children))]

    def summary(self) -> dict[str, Any]:
        """Public facts of the sums made: count, modulus bits, scales, wrap bound (union
        over the sums), largest rounding inflation, and ``secure`` (:attr:`secure`)."""
        return {**plans_summary(self.plans, self.min_clients), "secure": self.secure}

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"SecureSums has no {name!r}: under trust='secure-aggregation' "
                             "only secure sums and public draws run.")
