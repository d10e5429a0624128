"""The accounting layer: DpEvents in, epsilons and calibrated noise out.

Algorithms in dpprecond only *describe* what they release, as immutable
``dp_accounting.DpEvent`` objects. This module is the one place that turns events into
an epsilon (through a ``dp_accounting`` accountant) and calibrates a noise scale so that
a family of events meets a target ``(epsilon, delta)``. No algorithm computes an epsilon
by hand.

Convention for Gaussian events: ``noise_multiplier = noise std / l2 sensitivity``, where
the sensitivity is the one of the algorithm's own privacy unit and adjacency (replace-one
for every mechanism in this package unless its docstring says otherwise). For a Gaussian
release the privacy loss depends only on that ratio, so accountants are built with
dp_accounting's default relation; sensitivities are never hidden in the accountant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import dp_accounting
from dp_accounting import dp_event
from scipy import optimize, stats

from dpprecond._validation import check_delta, check_epsilon, check_positive

__all__ = [
    "PrivacyBudgetExceededError",
    "PrivacyLedger",
    "calibrate_noise",
    "compose",
    "epsilon_of",
    "gaussian",
    "gaussian_gdp_epsilon",
    "gaussian_precision",
    "make_accountant",
]

AccountantName = Literal["rdp", "pld"]

#: RDP orders: dense at small orders (where tight epsilons live) and long enough for tiny
#: deltas. RepeatAndSelect needs fractional orders near 1 as well.
RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 20.0 for x in range(1, 100)] + list(range(6, 64)) + [64, 80, 96, 128, 160, 192,
                                                                    256, 384, 512, 768, 1024]
)


class PrivacyBudgetExceededError(RuntimeError):
    """Raised when a release would take the spent epsilon above the declared budget."""


def make_accountant(kind: AccountantName = "rdp") -> dp_accounting.PrivacyAccountant:
    """Return a fresh ``dp_accounting`` accountant.

    ``"rdp"`` is the Renyi accountant (the only one that supports
    ``RepeatAndSelectDpEvent``); ``"pld"`` is the privacy-loss-distribution accountant,
    tighter for long compositions of Gaussians.
    """
    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    raise ValueError(f"Unknown accountant={kind!r}; expected 'rdp' or 'pld'.")


def gaussian(noise_multiplier: float) -> dp_event.DpEvent:
    """One Gaussian release with ``noise_multiplier = std / l2 sensitivity``.

    A noise multiplier of ``0`` or ``inf`` describes a non-private or a no-op release.
    """
    if math.isinf(noise_multiplier):
        return dp_event.NoOpDpEvent()
    if noise_multiplier == 0:
        return dp_event.NonPrivateDpEvent()
    return dp_event.GaussianDpEvent(float(noise_multiplier))


def compose(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    """Compose a sequence of events (flattening the trivial cases)."""
    events = [e for e in events if not isinstance(e, dp_event.NoOpDpEvent)]
    if not events:
        return dp_event.NoOpDpEvent()
    if len(events) == 1:
        return events[0]
    return dp_event.ComposedDpEvent(list(events))


def gaussian_precision(event: dp_event.DpEvent) -> float | None:
    """``sum_i z_i^-2`` if ``event`` composes only Gaussian releases (and no-ops), else None.

    A composition of Gaussian mechanisms without subsampling, with noise multipliers
    ``z_i``, has exactly the privacy loss distribution of *one* Gaussian mechanism with
    multiplier ``(sum_i z_i^-2)^(-1/2)``: each privacy loss is ``N(1/(2 z_i^2), 1/z_i^2)``
    and independent normals add to a normal (equivalently, mu-GDP composes as
    ``mu^2 = sum mu_i^2``; Dong, Roth and Su, 2019, Cor. 3.3). :func:`epsilon_of` with the
    PLD accountant uses this to return dp_accounting's exact Gaussian-mechanism epsilon
    (Balle and Wang, 2018) instead of a discretized FFT composition: the same privacy loss
    distribution, without the rounding error, in microseconds instead of about a second per
    evaluation. Subsampled Gaussians and every other event go to the accountant.
    """
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.GaussianDpEvent):
        z = float(event.noise_multiplier)
        if z == math.inf:
            return 0.0
        return 1.0 / z**2 if z > 0 else None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = gaussian_precision(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        total = 0.0
        for e in event.events:
            inner = gaussian_precision(e)
            if inner is None:
                return None
            total += inner
        return total
    return None


def epsilon_of(event: dp_event.DpEvent | Sequence[dp_event.DpEvent], delta: float,
               accountant: AccountantName = "rdp") -> float:
    """Epsilon at ``delta`` of an event (or of the composition of a list of events).

    Returns ``inf`` for a non-private event and ``0`` for a no-op. With ``"pld"``, a
    composition of unsampled Gaussian releases is evaluated exactly as one Gaussian
    mechanism (:func:`gaussian_precision`); anything else goes through the accountant.
    """
    delta = check_delta(delta)
    if not isinstance(event, dp_event.DpEvent):
        event = compose(list(event))
    if accountant == "pld":
        precision = gaussian_precision(event)
        if precision is not None:
            # Exact: the composition is one Gaussian mechanism (see gaussian_precision).
            return 0.0 if precision == 0 else float(
                dp_accounting.get_epsilon_gaussian(precision ** -0.5, delta))
    acc = make_accountant(accountant)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def calibrate_noise(make_event: Callable[[float], dp_event.DpEvent], epsilon: float,
                    delta: float, accountant: AccountantName = "rdp",
                    rel_tol: float = 1e-4) -> float:
    """Smallest noise scale ``s`` such that ``make_event(s)`` is ``(epsilon, delta)``-DP.

    ``make_event`` must be monotone: more scale, less privacy loss (for example a noise
    multiplier, or a common factor of several noise multipliers). The returned scale meets
    the target: ``epsilon_of(make_event(s), delta) <= epsilon`` (checked, and nudged up by
    the tolerance when the root finder lands a hair below).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)

    def eps_at(scale: float) -> float:
        return epsilon_of(make_event(scale), delta, accountant)

    # Bracket the root on a log scale, starting at 1 and moving by factors of 2: epsilon
    # decreases in the scale, and tiny scales (huge privacy losses) are slow to account
    # with the PLD accountant, so they are only visited when the target needs them.
    lo, hi = 0.5, 1.0
    if eps_at(hi) > epsilon:
        while eps_at(hi) > epsilon:
            lo, hi = hi, hi * 2.0
            if hi > 1e7:
                raise ValueError(f"Cannot reach epsilon={epsilon} at delta={delta}: even a "
                                 "noise scale of 1e7 is not enough. Raise epsilon or delta.")
    else:
        while eps_at(lo) <= epsilon:
            hi, lo = lo, lo / 2.0
            if lo < 1e-6:
                return hi
    root = optimize.brentq(lambda s: math.log(eps_at(s)) - math.log(epsilon), lo, hi,
                           rtol=rel_tol / 10, xtol=1e-12)
    scale = root
    for _ in range(50):
        if eps_at(scale) <= epsilon:
            return float(scale)
        scale *= 1.0 + rel_tol / 10
    raise RuntimeError("calibrate_noise failed to meet the target; please report this bug.")


def gaussian_gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon of a ``mu``-GDP mechanism at ``delta`` (Dong, Roth and Su, 2019, Cor. 2.13).

    Used only as an independent cross-check of the accountants: T Gaussian releases with
    noise multiplier ``z`` are exactly ``sqrt(T)/z``-GDP.
    """
    mu = check_positive("mu", mu)
    delta = check_delta(delta)

    def delta_of(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2)
                     - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))

    if delta_of(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_of(hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: delta_of(e) - delta, 0.0, hi, xtol=1e-12))


@dataclass
class PrivacyLedger:
    """Running record of the releases of one privacy unit, with an optional budget.

    The stateful companion of the pure functions above (the Opacus split): a trainer
    calls :meth:`spend` before each release and reads :attr:`epsilon` after it. When a
    ``budget`` is set, a release that would exceed it raises
    :class:`PrivacyBudgetExceededError` and is *not* recorded.

    Parameters
    ----------
    delta : float
        The delta at which epsilons are reported.
    budget : float or None
        Maximum epsilon; ``None`` records without a limit.
    accountant : {"rdp", "pld"}
        Which ``dp_accounting`` accountant composes the events.
    """

    delta: float
    budget: float | None = None
    accountant: AccountantName = "rdp"
    events: list[dp_event.DpEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.delta = check_delta(self.delta)
        if self.budget is not None:
            self.budget = check_epsilon(self.budget, "budget")
        self._acc = make_accountant(self.accountant)

    def spend(self, event: dp_event.DpEvent) -> float:
        """Record ``event`` and return the epsilon spent so far."""
        if self.budget is not None:
            trial = make_accountant(self.accountant)
            trial.compose(compose([*self.events, event]))
            eps = float(trial.get_epsilon(self.delta))
            # A relative slack absorbs the calibration tolerance of a planned schedule.
            if eps > self.budget * (1 + 1e-6):
                raise PrivacyBudgetExceededError(
                    f"This release would spend epsilon={eps:.4g} > budget={self.budget:.4g} "
                    f"at delta={self.delta:g}; stop training or raise the budget.")
        self._acc.compose(event)
        self.events.append(event)
        return self.epsilon

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far at :attr:`delta`."""
        if not self.events:
            return 0.0
        return float(self._acc.get_epsilon(self.delta))

    @property
    def event(self) -> dp_event.DpEvent:
        """All releases so far as one composed event."""
        return compose(self.events)
