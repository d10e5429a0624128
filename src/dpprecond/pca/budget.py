"""From (epsilon, delta) and the budget split to noise multipliers and a DpEvent.

This module only turns hyperparameters into noise multipliers and ``dp_accounting``
events; every epsilon comes from :mod:`dpprecond.accounting` (its
:data:`~dpprecond.accounting.DEFAULT_ACCOUNTANT` by default; :func:`plan_select` needs the
Renyi accountant, the only one of ``dp_accounting`` 0.6 that supports
``RepeatAndSelectDpEvent``).

The split is expressed in *precision shares*: a Gaussian release with noise multiplier
``z`` has Renyi divergence ``alpha / (2 z^2)`` at every order ``alpha``, so Gaussians
compose additively in ``1/z^2``. With one scale factor ``c`` a release that gets share
``s`` of the budget has ``z = c / sqrt(s)``, and the shares of a plan sum to one. The
scale ``c`` is the only calibrated quantity: :func:`dpprecond.accounting.calibrate_noise`
finds the smallest ``c`` whose event meets ``(epsilon, delta)``.

Splits (choices, documented parameters with these defaults):

- ``mean_share`` (only with ``center="private"``, default 0.1): the private mean;
  the PCA gets the rest.
- ``init_share`` (default 1/2 for selection, 1/4 for the fixed method): Algorithm 1's
  release ``A^T A + W`` inside the PCA part;
  the remaining ``1 - init_share`` is one run's budget ``rho_run`` (noise multiplier
  ``z_run``).
- ``score_share`` (default 0.1, selection only): the noisy score of a trial. A trial with
  T = 0 (the fallback when iterating does not pay) spends the rest of its ``rho_run`` on a
  second release of ``A^T A`` averaged with the init's (Analyze Gauss with both budgets);
  the fixed method's T = 0 spends nothing beyond the init.
- ``h_share`` (default 1/2): the fraction of one iteration's budget given to ``H``; ``Z``
  gets the rest. One run's iteration budget is split evenly over its ``T`` iterations,
  so a trial with fewer iterations uses less noise per iteration.

Events (spec, accounting section):

- fixed (R, T): ``Composed([Gaussian(z0), SelfComposed(Composed([Gaussian(zH),
  Gaussian(zZ)]), T)])``;
- selection: ``Composed([Gaussian(z0), RepeatAndSelect(Gaussian(z_run), mean_trials,
  shape=1)])``. The inner Gaussian has exactly the Renyi divergence of any one trial
  (iterations plus score), because the precisions of a trial sum to ``1/z_run^2``;
- Analyze Gauss: ``Gaussian(z)``; DP power method: ``SelfComposed(Gaussian(z_p), T)``
  (plus ``Gaussian(z0)`` when it starts from Algorithm 1);
- with a private mean, ``Gaussian(z_mean)`` is composed in front.

Instead of an epsilon, a plan of only Gaussian releases (every method but selection) also
takes a :class:`GaussianScale`: the scale ``c`` itself, chosen by a caller that has already
calibrated a larger composition once (the pipeline splits one calibrated Gaussian between
its stages, :mod:`dpprecond.pipeline`). Since the shares of a plan sum to one, such a plan
is exactly one Gaussian mechanism with noise multiplier ``c`` (its releases' precisions
``1/z_i^2`` add up to ``1/c^2``); :func:`_calibrate` checks that identity on the built event
and refuses a plan for which it fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dp_accounting import dp_event

from dpprecond._validation import check_positive
from dpprecond.accounting import (
    DEFAULT_ACCOUNTANT,
    AccountantName,
    calibrate_noise,
    compose,
    epsilon_of,
    gaussian,
    gaussian_precision,
)
from dpprecond.secagg.sums import ROUNDING_INFLATION, skellam_release_events
from dpprecond.selection import repeat_and_select_event

__all__ = [
    "BudgetPlan",
    "GaussianScale",
    "plan_analyze_gauss",
    "plan_auto",
    "plan_epsilon",
    "plan_fixed",
    "plan_power",
    "plan_select",
    "secure_aggregation_plan",
    "trial_multipliers",
]


@dataclass(frozen=True)
class BudgetPlan:
    """Noise multipliers of one fit and the event describing all its releases.

    Attributes
    ----------
    scale : float
        The calibrated common scale factor ``c`` (``0`` when noise is off).
    noise_multipliers : dict
        Named noise multipliers (``z_mean``, ``z0``, ``z_run``, ``zH``, ``zZ``, ``z_power``
        as applicable); each is ``c / sqrt(share)``.
    event : dp_accounting.DpEvent
        The event of the full plan.
    init_event : dp_accounting.DpEvent
        The event of the releases made before the selection (private mean and Algorithm 1);
        what an early exit spends.
    """

    scale: float
    noise_multipliers: dict[str, float]
    event: dp_event.DpEvent
    init_event: dp_event.DpEvent = field(default_factory=dp_event.NoOpDpEvent)


@dataclass(frozen=True)
class GaussianScale:
    """A plan's scale ``c`` given directly: the whole fit is one Gaussian of multiplier ``c``.

    Passed to a ``plan_*`` function in place of the epsilon by a caller that calibrated a
    larger composition once (no second calibration, no tolerance between the two).
    """

    noise_multiplier: float

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)


#: What a ``plan_*`` function takes as its budget: an epsilon, a scale, or None (no noise).
Budget = float | GaussianScale | None


def _mean_events(z_mean: float | None) -> list[dp_event.DpEvent]:
    return [] if z_mean is None else [gaussian(z_mean)]


def _calibrate(build: Any, epsilon: Budget, delta: float,
               accountant: AccountantName) -> BudgetPlan:
    """Calibrate ``build(c) -> BudgetPlan``; ``epsilon=None`` turns noise off (c = 0).

    A :class:`GaussianScale` is used as ``c`` without calibration, after checking that the
    plan's event is one Gaussian of that multiplier (precisions adding to ``1/c^2``, up to
    the rounding of the shares); a plan with any other release is refused.
    """
    if epsilon is None:
        off = dp_event.NonPrivateDpEvent()
        return replace(build(0.0), event=off, init_event=off)
    if isinstance(epsilon, GaussianScale):
        c = float(epsilon.noise_multiplier)
        plan = build(c)
        precision = gaussian_precision(plan.event)
        if precision is None or not math.isclose(precision * c * c, 1.0, rel_tol=1e-12):
            raise ValueError(f"noise_multiplier={c:g} applies to a plan of Gaussian releases "
                             "only (its precisions summing to 1/noise_multiplier^2); this "
                             "method's plan is not one (selection's repeat-and-select is "
                             "not Gaussian): give target_epsilon instead.")
        return plan
    c = calibrate_noise(lambda s: build(s).event, epsilon, delta, accountant)
    return build(c)


def _z(c: float, share: float) -> float:
    return c / math.sqrt(share)


def trial_multipliers(z_run: float, n_iter: int, *, score_share: float | None,
                      h_share: float) -> dict[str, float]:
    """Noise multipliers of one run of Algorithm 2 with total budget ``1/z_run^2``.

    Parameters
    ----------
    z_run : float
        Noise multiplier of the whole run (``0``: noise off).
    n_iter : int
        Number of iterations ``T``. With ``T = 0`` and a score, the run's budget beyond the
        score goes to a second Gram release (``z_gram``).
    score_share : float or None
        Share of the run for the noisy selection score (``None``: no score, as in the fixed
        method).
    h_share : float
        Share of one iteration's budget given to ``H`` (``Z`` gets the rest).

    Returns
    -------
    dict with keys ``zH``, ``zZ`` (per iteration), ``z_score`` and ``z_gram`` (``inf``
    when absent).
    """
    out = {"zH": math.inf, "zZ": math.inf, "z_score": math.inf, "z_gram": math.inf}
    if score_share is not None:
        out["z_score"] = _z(z_run, score_share)
        if n_iter == 0:
            out["z_gram"] = _z(z_run, 1.0 - score_share)
    if n_iter > 0:
        it_share = 1.0 - (score_share or 0.0)
        out["zH"] = z_run * math.sqrt(n_iter / (it_share * h_share))
        out["zZ"] = z_run * math.sqrt(n_iter / (it_share * (1.0 - h_share)))
    return out


def plan_fixed(epsilon: Budget, delta: float, *, n_iter: int, init_share: float = 0.25,
               h_share: float = 0.5, mean_share: float | None = None,
               accountant: AccountantName = DEFAULT_ACCOUNTANT) -> BudgetPlan:
    """Budget of Algorithm 1 followed by Algorithm 2 with a fixed number of iterations."""
    pca = 1.0 - (mean_share or 0.0)

    def build(c: float) -> BudgetPlan:
        z_mean = None if mean_share is None else _z(c, mean_share)
        z0 = _z(c, pca * init_share) if n_iter > 0 else _z(c, pca)
        z_run = _z(c, pca * (1.0 - init_share))
        zs = trial_multipliers(z_run, n_iter, score_share=None, h_share=h_share)
        head = [*_mean_events(z_mean), gaussian(z0)]
        events = list(head)
        if n_iter > 0:
            it = dp_event.ComposedDpEvent([gaussian(zs["zH"]), gaussian(zs["zZ"])])
            events.append(dp_event.SelfComposedDpEvent(it, n_iter))
        z = {"z0": z0, "z_run": z_run if n_iter > 0 else math.inf,
             "zH": zs["zH"], "zZ": zs["zZ"]}
        if z_mean is not None:
            z["z_mean"] = z_mean
        return BudgetPlan(c, z, compose(events), compose(head))

    return _calibrate(build, epsilon, delta, accountant)


def plan_select(epsilon: Budget, delta: float, *, mean_trials: float,
                init_share: float = 0.25, mean_share: float | None = None,
                accountant: AccountantName = "rdp") -> BudgetPlan:  # RDP: repeat-and-select
    """Budget of Algorithm 1 followed by Algorithm 3 (repeat-and-select, geometric trials).

    ``noise_multipliers`` holds ``z0`` and ``z_run``; a trial's own multipliers follow from
    :func:`trial_multipliers` once its ``T`` is drawn.
    """

    def build(c: float) -> BudgetPlan:
        pca = 1.0 - (mean_share or 0.0)
        z_mean = None if mean_share is None else _z(c, mean_share)
        z0 = _z(c, pca * init_share)
        z_run = _z(c, pca * (1.0 - init_share))
        head = [*_mean_events(z_mean), gaussian(z0)]
        # the shared selection layer; noise off leaves the inner (non-private) event
        tail = repeat_and_select_event(gaussian(z_run), mean_trials, "geometric")
        z = {"z0": z0, "z_run": z_run}
        if z_mean is not None:
            z["z_mean"] = z_mean
        return BudgetPlan(c, z, compose([*head, tail]), compose(head))

    return _calibrate(build, epsilon, delta, accountant)


def plan_analyze_gauss(epsilon: Budget, delta: float, *, mean_share: float | None = None,
                       accountant: AccountantName = DEFAULT_ACCOUNTANT) -> BudgetPlan:
    """Budget of Analyze Gauss: one Gaussian release of the upper triangle of ``A^T A``."""

    def build(c: float) -> BudgetPlan:
        z_mean = None if mean_share is None else _z(c, mean_share)
        z0 = _z(c, 1.0 - (mean_share or 0.0))
        head = _mean_events(z_mean)
        z = {"z0": z0}
        if z_mean is not None:
            z["z_mean"] = z_mean
        return BudgetPlan(c, z, compose([*head, gaussian(z0)]), compose(head))

    return _calibrate(build, epsilon, delta, accountant)


def plan_power(epsilon: Budget, delta: float, *, n_iter: int, private_init: bool = False,
               init_share: float = 0.25, mean_share: float | None = None,
               accountant: AccountantName = DEFAULT_ACCOUNTANT) -> BudgetPlan:
    """Budget of the DP power method: the iteration budget split evenly over ``n_iter``."""

    def build(c: float) -> BudgetPlan:
        pca = 1.0 - (mean_share or 0.0)
        z_mean = None if mean_share is None else _z(c, mean_share)
        it_share = pca * (1.0 - init_share) if private_init else pca
        z_power = c * math.sqrt(n_iter / it_share)
        head = _mean_events(z_mean)
        z = {"z_power": z_power}
        if private_init:
            z["z0"] = _z(c, pca * init_share)
            head.append(gaussian(z["z0"]))
        if z_mean is not None:
            z["z_mean"] = z_mean
        tail = dp_event.SelfComposedDpEvent(gaussian(z_power), n_iter)
        if c == 0:
            tail = gaussian(0.0)
        return BudgetPlan(c, z, compose([*head, tail]), compose(head))

    return _calibrate(build, epsilon, delta, accountant)


def plan_auto(epsilon: Budget, delta: float, *,
              mean_share: float | None = None) -> BudgetPlan:
    """Budget of ``method="auto"``: one Gaussian's precision, calibrated exactly.

    Every release of the auto method (and the private mean, if any) is an unsampled
    Gaussian mechanism, so the whole fit is exactly one Gaussian mechanism whose precision
    ``1/z^2`` is the sum of the releases' precisions (mu-GDP composes as
    ``mu^2 = sum mu_i^2`` under adaptive composition; Dong, Roth and Su 2019, Cor. 3.3).
    The scale ``c`` is calibrated on that composition with the PLD path of
    :func:`dpprecond.accounting.epsilon_of`, which evaluates it exactly
    (``dp_accounting.get_epsilon_gaussian``); no Renyi slack.

    ``noise_multipliers`` holds ``z_pca = c / sqrt(1 - mean_share)``, the multiplier of the
    one Gaussian that :func:`dpprecond.pca.auto.fit_auto` splits over its releases, and
    ``z_mean = c / sqrt(mean_share)`` with a private mean. ``event`` is that two-release
    composition (equivalent, for accounting, to the releases the fit actually makes);
    ``init_event`` is the private mean's.
    """

    def build(c: float) -> BudgetPlan:
        z_mean = None if mean_share is None else _z(c, mean_share)
        z_pca = _z(c, 1.0 - (mean_share or 0.0))
        head = _mean_events(z_mean)
        z = {"z_pca": z_pca}
        if z_mean is not None:
            z["z_mean"] = z_mean
        return BudgetPlan(c, z, compose([*head, gaussian(z_pca)]), compose(head))

    return _calibrate(build, epsilon, delta, "pld")


def plan_epsilon(plan: BudgetPlan, delta: float,
                 accountant: AccountantName = DEFAULT_ACCOUNTANT) -> float:
    """Epsilon of a plan's event at ``delta`` (``inf`` when noise is off)."""
    if plan.scale == 0:
        return math.inf
    return epsilon_of(plan.event, delta, accountant)


def secure_aggregation_plan(plan: BudgetPlan, epsilon: float, delta: float, *,
                            inflation: float = ROUNDING_INFLATION) -> BudgetPlan:
    """A plan's releases as secure sums with distributed Skellam noise, recalibrated.

    Every noise multiplier of a plan is proportional to its scale ``c``, so the plan at
    scale ``c`` is ``plan`` with its multipliers times ``c / plan.scale``. Under
    ``trust="secure-aggregation"`` each Gaussian release with multiplier ``z`` becomes a
    secure sum whose event is :func:`dpprecond.secagg.sums.sum_event` (``ZCDpEvent``,
    an RDP bound); the scale is calibrated with the one calibrator
    (:func:`~dpprecond.accounting.calibrate_noise`) and dp_accounting's RDP accountant so
    that the composition meets ``(epsilon, delta)``. Returns the recalibrated plan: its
    ``noise_multipliers`` are the Gaussian plan's at the new scale (what the kernels draw
    with), its ``event`` and ``init_event`` the Skellam ones.
    """
    if plan.scale == 0:
        raise ValueError("trust='secure-aggregation' is a private mechanism; a fit without "
                         "noise uses trust='local'.")

    def event(c: float) -> dp_event.DpEvent:
        return skellam_release_events(plan.event, c / plan.scale, inflation)

    c = calibrate_noise(event, epsilon, delta, "rdp")
    f = c / plan.scale
    return BudgetPlan(c, {key: val * f for key, val in plan.noise_multipliers.items()},
                      event(c), skellam_release_events(plan.init_event, f, inflation))
