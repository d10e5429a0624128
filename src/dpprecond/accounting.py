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

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Final, Literal

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from scipy import optimize

from dpprecond._validation import check_delta, check_epsilon, check_target_delta

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "MAX_NOISE_SCALE",
    "MIN_NOISE_SCALE",
    "Accountant",
    "NoiseFloorWarning",
    "PrivacyBudgetExceededError",
    "PrivacyLedger",
    "calibrate_noise",
    "compose",
    "epsilon_of",
    "event_from_dict",
    "event_to_dict",
    "gaussian",
    "gaussian_precision",
    "make_accountant",
]

#: The ``dp_accounting`` accountants events are composed with: ``"pld"`` (privacy-loss
#: distributions; exact for compositions of unsampled Gaussians, tight for subsampled ones)
#: and ``"rdp"`` (Renyi; the one that supports ``RepeatAndSelectDpEvent``). The registry of
#: accountant names: the CLI's choices, the config schemas and the options come from it.
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
#: The default accountant of every entry point (the PCA methods, the federated runs, the
#: pipeline, the CLI, the experiment configs). A ledger's ``"auto"`` is this accountant for
#: every event it supports, else RDP; ``method="select"`` needs RDP (repeat-and-select).
DEFAULT_ACCOUNTANT: Final = "pld"
#: One of :data:`ACCOUNTANTS` (for annotations; a test checks they agree).
Accountant = Literal["pld", "rdp"]
#: An accountant name: one of :data:`ACCOUNTANTS`, or ``"auto"`` (see
#: :func:`resolve_accountant`).
AccountantName = Literal["rdp", "pld", "auto"]

#: RDP orders: dense at small orders (where tight epsilons live) and long enough for tiny
#: deltas and small epsilons (the optimal order is about 2 ln(1/delta) / epsilon, 5,500 at
#: epsilon 0.01 and delta 1e-12). RepeatAndSelect needs fractional orders near 1 as well.
RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 20.0 for x in range(1, 100)] + list(range(6, 64))
    + [64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
       8192, 12288, 16384, 32768, 65536]
)
#: Largest noise scale :func:`calibrate_noise` will try before giving up.
MAX_NOISE_SCALE = 1e12
#: Smallest noise scale :func:`calibrate_noise` returns (see there).
MIN_NOISE_SCALE = 0.05


class NoiseFloorWarning(UserWarning):
    """A target epsilon beyond what :data:`MIN_NOISE_SCALE` allows: less is spent."""


class PrivacyBudgetExceededError(RuntimeError):
    """Raised when a ledger refuses a release: it would take the spent epsilon above the
    declared budget, or the ledger is a detached copy that could not record it
    (:meth:`PrivacyLedger.attach`)."""


#: Value discretization of the PLD accountant (used for events other than compositions of
#: unsampled Gaussians, which are evaluated exactly). dp_accounting's discretization is
#: pessimistic, so every epsilon it reports is an upper bound; 1e-3 is within about 1e-3
#: of the finer 1e-4 and about 10x faster on Poisson-subsampled Gaussians at small noise
#: (6.5 s against 0.5 s per evaluation at q = 1e-6, z = 0.18).
PLD_DISCRETIZATION = 1e-3


def make_accountant(kind: AccountantName) -> dp_accounting.PrivacyAccountant:
    """Return a fresh ``dp_accounting`` accountant.

    ``"rdp"`` is the Renyi accountant (the only one that supports
    ``RepeatAndSelectDpEvent``); ``"pld"`` is the privacy-loss-distribution accountant,
    tighter for long compositions of subsampled Gaussians (discretized at
    :data:`PLD_DISCRETIZATION`).
    """
    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant(
            value_discretization_interval=PLD_DISCRETIZATION)
    raise ValueError(f"Unknown accountant={kind!r}; expected one of {list(ACCOUNTANTS)}.")


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
    ``mu^2 = sum mu_i^2``, also under adaptive composition; Dong, Roth and Su, 2019,
    Cor. 3.3). :func:`epsilon_of` with the PLD accountant uses this to return dp_accounting's
    exact Gaussian-mechanism epsilon (Balle and Wang, 2018) instead of a discretized FFT
    composition: the same privacy loss distribution, without the rounding error, in
    microseconds instead of about a second per evaluation. Subsampled Gaussians and every
    other event go to the accountant.
    """
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.GaussianDpEvent):
        z = float(event.noise_multiplier)
        if z == math.inf:
            return 0.0
        return (1.0 / z) ** 2 if z > 0 else None  # no overflow for huge z
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


def _contains_nonprivate(event: dp_event.DpEvent) -> bool:
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_contains_nonprivate(e) for e in event.events)
    inner = getattr(event, "event", None)
    return inner is not None and _contains_nonprivate(inner)


def resolve_accountant(event: dp_event.DpEvent, accountant: AccountantName) -> str:
    """The accountant that evaluates ``event``: ``"auto"`` is PLD when it supports the event
    (tighter), else RDP (for example ``RepeatAndSelectDpEvent``)."""
    if accountant in ACCOUNTANTS:
        return accountant
    if accountant != "auto":
        raise ValueError(f"Unknown accountant={accountant!r}; expected one of "
                         f"{[*ACCOUNTANTS, 'auto']}.")
    if gaussian_precision(event) is not None:
        return "pld"
    return "pld" if make_accountant("pld").supports(event) else "rdp"


def epsilon_of(event: dp_event.DpEvent | Sequence[dp_event.DpEvent], delta: float,
               accountant: AccountantName = DEFAULT_ACCOUNTANT) -> float:
    """Epsilon at ``delta`` of an event (or of the composition of a list of events).

    Returns ``inf`` for a non-private event and ``0`` for a no-op. With ``"pld"`` (or
    ``"auto"``), a composition of unsampled Gaussian releases is evaluated exactly as one
    Gaussian mechanism (:func:`gaussian_precision`); anything else goes through the
    accountant, and the result is cached (sweeps evaluate the same events many times).
    """
    delta = check_delta("delta", delta)
    if not isinstance(event, dp_event.DpEvent):
        event = compose(list(event))
    if _contains_nonprivate(event):
        return math.inf
    kind = resolve_accountant(event, accountant)
    if kind == "pld":
        precision = gaussian_precision(event)
        if precision is not None:
            # Exact: the composition is one Gaussian mechanism (see gaussian_precision).
            return 0.0 if precision == 0 else float(
                _exact_gaussian_epsilon(precision ** -0.5, delta))
    return _accountant_epsilon(repr(event), event, delta, kind)


@functools.lru_cache(maxsize=65536)  # calibrations revisit the same scales on every fit
def _exact_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        return float(dp_accounting.get_epsilon_gaussian(noise_multiplier, delta))


def _accountant_epsilon(key: str, event: dp_event.DpEvent, delta: float, kind: str) -> float:
    cached = _EPS_CACHE.get((key, delta, kind))
    if cached is None:
        acc = make_accountant(kind)  # type: ignore[arg-type]
        if not acc.supports(event):
            raise ValueError(f"The {kind!r} accountant does not support {event!r}; use "
                             "accountant='rdp' (or 'auto').")
        acc.compose(event)
        cached = float(acc.get_epsilon(delta))
        if len(_EPS_CACHE) > 65536:
            _EPS_CACHE.clear()
        _EPS_CACHE[(key, delta, kind)] = cached
    return cached


_EPS_CACHE: dict[tuple[str, float, str], float] = {}


def calibrate_noise(make_event: Callable[[float], dp_event.DpEvent], epsilon: float,
                    delta: float, accountant: AccountantName = DEFAULT_ACCOUNTANT,
                    rel_tol: float = 1e-4) -> float:
    """Smallest noise scale ``s`` such that ``make_event(s)`` is ``(epsilon, delta)``-DP.

    The one calibration function of the package. ``make_event`` must be monotone: more
    scale, less privacy loss (a noise multiplier, or a common factor of several noise
    multipliers). The returned scale meets the target: ``epsilon_of(make_event(s), delta)
    <= epsilon`` (checked, and nudged up by the tolerance when the root finder lands a hair
    below). Raises ``ValueError`` naming epsilon and delta when no scale up to
    :data:`MAX_NOISE_SCALE` reaches the target.

    The search never goes below :data:`MIN_NOISE_SCALE`: when that scale already meets the
    target, it is returned and the mechanism spends less than ``epsilon`` (the epsilon
    reported for it is its own, smaller one), and a :class:`NoiseFloorWarning` says so,
    naming the target and what is spent (``target_epsilon=1000`` used to spend 294 without
    a word). Below it the PLD accountant's memory and time grow as ``1/scale^2`` for
    subsampled events (a Poisson rate of 1e-6 used to walk the scale down to 1e-6 and run
    out of 20 GB), and a noise std of 5% of the sensitivity protects next to nothing anyway.
    """
    epsilon = check_epsilon("epsilon", epsilon)
    delta = check_delta("delta", delta)

    def eps_at(scale: float) -> float:
        try:
            return epsilon_of(make_event(scale), delta, accountant)
        except (ValueError, OverflowError, ArithmeticError) as exc:
            raise ValueError(f"Cannot calibrate the noise for epsilon={epsilon:g}, "
                             f"delta={delta:g}: the accountant failed at noise scale "
                             f"{scale:g} ({exc}). Raise epsilon or lower delta.") from None

    # Bracket the root on a log scale, starting at 1 and moving by factors of 2: epsilon
    # decreases in the scale, and tiny scales (huge privacy losses) are slow to account
    # with the PLD accountant, so they are only visited when the target needs them.
    lo, hi = 0.5, 1.0
    if eps_at(hi) > epsilon:
        while eps_at(hi) > epsilon:
            lo, hi = hi, hi * 2.0
            if hi > MAX_NOISE_SCALE:
                raise ValueError(
                    f"Cannot reach epsilon={epsilon:g} at delta={delta:g}: even a noise "
                    f"scale of {MAX_NOISE_SCALE:g} is not enough. Raise epsilon or delta.")
    else:
        while eps_at(lo) <= epsilon:
            if lo <= MIN_NOISE_SCALE:
                spent = eps_at(MIN_NOISE_SCALE)
                if spent < epsilon * (1.0 - rel_tol):
                    warnings.warn(
                        f"epsilon={epsilon:g} is beyond the noise floor: the calibration "
                        f"never uses a noise scale below MIN_NOISE_SCALE={MIN_NOISE_SCALE:g} "
                        f"(a noise std of {MIN_NOISE_SCALE:g} times the sensitivity), which "
                        f"already spends only epsilon={spent:.6g} at delta={delta:g}. The "
                        "mechanism spends (and reports) that, less than asked (less noise "
                        "would protect next to nothing).", NoiseFloorWarning,
                        stacklevel=2)
                return MIN_NOISE_SCALE
            hi, lo = lo, max(lo / 2.0, MIN_NOISE_SCALE)
    # log(epsilon) is closer to linear in log(scale); a zero epsilon (large delta) is
    # floored so that the logarithm stays finite.
    try:
        root = optimize.brentq(lambda s: math.log(max(eps_at(s), 1e-300))
                               - math.log(epsilon), lo, hi, rtol=rel_tol / 10, xtol=1e-12)
    except ValueError:  # the target is below what the accountant resolves
        raise ValueError(f"Cannot reach epsilon={epsilon:g} at delta={delta:g}: the "
                         "accountant does not resolve epsilons this small. Raise epsilon."
                         ) from None
    scale = root
    for _ in range(50):
        if eps_at(scale) <= epsilon:
            return float(scale)
        scale *= 1.0 + rel_tol / 10
    raise RuntimeError("calibrate_noise failed to meet the target; please report this bug.")


def event_to_dict(event: dp_event.DpEvent) -> dict:
    """A JSON-ready description of the events this package produces (see
    :func:`event_from_dict`): Gaussian, zero-concentrated (the secure sums' Skellam bound),
    Poisson-sampled, self-composed, composed, repeat-and-select, non-private and no-op
    events."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return {"gaussian": float(event.noise_multiplier)}
    if isinstance(event, dp_event.ZCDpEvent):
        return {"zcdp": [float(event.rho), float(event.xi)]}
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return {"poisson": float(event.sampling_probability),
                "event": event_to_dict(event.event)}
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return {"self_composed": int(event.count), "event": event_to_dict(event.event)}
    if isinstance(event, dp_event.ComposedDpEvent):
        return {"composed": [event_to_dict(e) for e in event.events]}
    if isinstance(event, dp_event.RepeatAndSelectDpEvent):
        return {"repeat_and_select": [float(event.mean), float(event.shape)],
                "event": event_to_dict(event.event)}
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return {"non_private": True}
    if isinstance(event, dp_event.NoOpDpEvent):
        return {"no_op": True}
    raise TypeError(f"Cannot serialize {event!r}.")


def event_from_dict(data: dict) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_dict` (``ValueError`` for anything else)."""
    if "gaussian" in data:
        return dp_event.GaussianDpEvent(float(data["gaussian"]))
    if "zcdp" in data:
        rho, xi = (float(v) for v in data["zcdp"])
        if not (math.isfinite(rho) and math.isfinite(xi) and rho >= 0 and xi >= 0):
            raise ValueError(f"Not a serialized ZCDpEvent: rho={rho!r}, xi={xi!r} (finite, "
                             ">= 0 expected).")
        return dp_event.ZCDpEvent(rho, xi)
    if "poisson" in data:
        return dp_event.PoissonSampledDpEvent(float(data["poisson"]),
                                              event_from_dict(data["event"]))
    if "self_composed" in data:
        return dp_event.SelfComposedDpEvent(event_from_dict(data["event"]),
                                            int(data["self_composed"]))
    if "composed" in data:
        return dp_event.ComposedDpEvent([event_from_dict(e) for e in data["composed"]])
    if "repeat_and_select" in data:
        mean, shape = data["repeat_and_select"]
        return dp_event.RepeatAndSelectDpEvent(event_from_dict(data["event"]), mean, shape)
    if data.get("non_private"):
        return dp_event.NonPrivateDpEvent()
    if data.get("no_op"):
        return dp_event.NoOpDpEvent()
    raise ValueError(f"Not a serialized DpEvent: {data!r}")


class PrivacyLedger:
    """Running record of the releases of one privacy unit, with an optional budget cap.

    The stateful companion of the pure functions above (the Opacus split). Every fit and
    run of the package records its releases here (``ledger=`` argument); one ledger can be
    passed to several fits and runs on the same records (a private PCA followed by
    federated training), and :attr:`epsilon` is their composition from ``dp_accounting``.

    With ``max_epsilon`` set, :meth:`check` refuses, *before any data is touched*, a plan
    whose releases would take the total above it (the callers check their whole plan
    first), and :meth:`spend` refuses a single release the same way; a refused event is not
    recorded. Both raise :class:`PrivacyBudgetExceededError`.

    Consecutive identical events are stored as one ``SelfComposedDpEvent``, so a run of
    ``T`` identical rounds costs one accountant evaluation, not ``T``.

    **One ledger, one record.** A ledger is shared by reference, never copied:
    ``sklearn.base.clone`` (``__sklearn_clone__``), ``copy.copy`` and ``copy.deepcopy``
    return the ledger itself, so every clone of an estimator that a model-selection tool
    fits (``GridSearchCV``, ``cross_validate``) records in the one ledger and is refused by
    its cap. A ledger that is pickled and loaded (for example sent to a worker process by
    ``GridSearchCV(n_jobs=2)``, whose records would never reach the original) is a
    *detached copy*: it reports what was recorded, but :meth:`check` and :meth:`spend`
    refuse (:class:`PrivacyBudgetExceededError`) until :meth:`attach` declares it the
    one live record (a ledger saved to disk and loaded in a new session).

    Parameters
    ----------
    delta : float
        The delta at which epsilons are reported, in (0, 0.01] (a cap at a larger delta
        protects no one; :func:`dpprecond._validation.check_target_delta`).
    max_epsilon : float or None
        Maximum total epsilon at ``delta``; ``None`` records without a limit.
    accountant : {"auto", "pld", "rdp"}
        Which ``dp_accounting`` accountant composes the events; ``"auto"`` (default) uses
        :data:`DEFAULT_ACCOUNTANT` (PLD: exact for Gaussian compositions) unless an event
        needs RDP (a ledger holds the events of every method).
    """

    def __init__(self, delta: float, max_epsilon: float | None = None,
                 accountant: AccountantName = "auto") -> None:
        self.delta = check_target_delta("delta", delta)
        self.max_epsilon = None if max_epsilon is None else check_epsilon("max_epsilon",
                                                                          max_epsilon)
        if accountant not in ("auto", *ACCOUNTANTS):
            raise ValueError(f"Unknown accountant={accountant!r}; expected one of "
                             f"{['auto', *ACCOUNTANTS]}.")
        self.accountant: AccountantName = accountant
        self._runs: list[list] = []  # [event, count]
        self._detached = False

    # -- identity: shared, never copied (see the class docstring) -------------------------

    def __sklearn_clone__(self) -> PrivacyLedger:
        return self

    def __copy__(self) -> PrivacyLedger:
        return self

    def __deepcopy__(self, memo: dict) -> PrivacyLedger:
        return self

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._detached = True  # a copy: what it records would not reach the original

    @property
    def detached(self) -> bool:
        """True for a copy made by pickling, which refuses to record until :meth:`attach`."""
        return self._detached

    def attach(self) -> PrivacyLedger:
        """Declare this (unpickled) copy the one live record of its releases; returns self."""
        self._detached = False
        return self

    def _refuse_if_detached(self) -> None:
        if self._detached:
            raise PrivacyBudgetExceededError(
                "This PrivacyLedger is a copy made by pickling (for example sent to a worker "
                "process by GridSearchCV(n_jobs=2) or joblib): releases recorded here would "
                "never reach the original ledger, so nothing was released. Fit in the "
                "ledger's own process (n_jobs=1), or, if this copy is the only one in use "
                "(a ledger saved and loaded in a new session), call ledger.attach() first.")

    def __repr__(self) -> str:
        cap = "" if self.max_epsilon is None else f", max_epsilon={self.max_epsilon:g}"
        return (f"PrivacyLedger(delta={self.delta:g}{cap}, releases={self.n_releases}, "
                f"epsilon={self.epsilon:.4g})")

    @property
    def events(self) -> list[dp_event.DpEvent]:
        """Every recorded release, in order (identical consecutive events repeated)."""
        return [e for e, c in self._runs for _ in range(c)]

    @property
    def n_releases(self) -> int:
        """How many releases were recorded."""
        return sum(c for _, c in self._runs)

    @property
    def event(self) -> dp_event.DpEvent:
        """All releases so far as one composed event."""
        return compose([e if c == 1 else dp_event.SelfComposedDpEvent(e, c)
                        for e, c in self._runs])

    def epsilon_with(self, event: dp_event.DpEvent | None = None) -> float:
        """The total epsilon if ``event`` were released too (``None``: as recorded)."""
        total = self.event if event is None else compose([self.event, event])
        return epsilon_of(total, self.delta, self.accountant)

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far at :attr:`delta`."""
        return 0.0 if not self._runs else self.epsilon_with()

    def check(self, event: dp_event.DpEvent) -> float:
        """Raise :class:`PrivacyBudgetExceededError` if ``event`` would exceed the budget.

        Returns the total epsilon after ``event`` (without recording it).
        """
        self._refuse_if_detached()
        eps = self.epsilon_with(event)
        # A relative slack absorbs the calibration tolerance of a planned schedule.
        if self.max_epsilon is not None and eps > self.max_epsilon * (1 + 1e-6):
            raise PrivacyBudgetExceededError(
                f"This release would take the total epsilon to {eps:.4g} > max_epsilon="
                f"{self.max_epsilon:.4g} at delta={self.delta:g} (already spent "
                f"{self.epsilon:.4g}); nothing was released. Lower the release's budget or "
                "raise max_epsilon.")
        return eps

    def spend(self, event: dp_event.DpEvent, count: int = 1) -> float:
        """Record ``count`` releases of ``event`` and return the epsilon spent so far."""
        if count < 1:
            raise ValueError(f"Expected count >= 1, got count={count}.")
        self._refuse_if_detached()
        if isinstance(event, dp_event.NoOpDpEvent):
            return self.epsilon
        full = event if count == 1 else dp_event.SelfComposedDpEvent(event, count)
        if self.max_epsilon is not None:
            self.check(full)
        if self._runs and self._runs[-1][0] == event:
            self._runs[-1][1] += count
        else:
            self._runs.append([event, count])
        return self.epsilon
