"""Private selection by repeat-and-select: a random number of trials, the best one released.

The one selection layer of the package, shared by PCA's ``method="select"``
(:func:`dpprecond.pca.core.select`) and the federated tuner
(:func:`dpprecond.fl.tuning.tune_private`).

Papernot and Steinke (2022, "Hyperparameter tuning with Renyi differential privacy";
Liu and Talwar 2019 for the geometric case): run a randomized mechanism ``M`` (here: draw
a candidate at random, train, release a noisy score) ``K`` times, ``K`` itself random and
hidden, and release only the output of the best score. If ``M`` is
``(alpha, eps(alpha))``-RDP, the whole selection is RDP with the bound of their Theorem 2
(truncated negative binomial ``K``) or Theorem 6 (Poisson ``K``), which dp_accounting
evaluates for ``RepeatAndSelectDpEvent(M's event, mean, shape)`` with its Renyi
accountant (the only one that supports it). The distribution of ``K``:

=====================  =======  ==================================================
``trials``             shape    ``P(K = k)``
=====================  =======  ==================================================
``"geometric"``        1        ``gamma (1 - gamma)^(k-1)``, ``k >= 1`` (mean ``1/gamma``)
``"logarithmic"``      0        ``(1 - gamma)^k / (k log(1/gamma))``, ``k >= 1``
a float ``eta > 0``    ``eta``  truncated negative binomial, ``k >= 1``
``"poisson"``          inf      ``Poisson(mean)``, ``k >= 0`` (``k = 0`` releases nothing)
=====================  =======  ==================================================

``gamma`` is solved from the requested mean. The number of trials must stay hidden (it is
not covered by the guarantee): results keep it as a private diagnostic only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from dp_accounting import dp_event
from scipy import optimize

from dpprecond._validation import check_positive
from dpprecond.accounting import calibrate_noise, gaussian

__all__ = [
    "TRIAL_SHAPES",
    "calibrate_selection",
    "draw_trial_count",
    "repeat_and_select_event",
    "trial_gamma",
    "trial_shape",
]

#: Named distributions of the number of trials and their dp_accounting shapes.
TRIAL_SHAPES: dict[str, float] = {"geometric": 1.0, "logarithmic": 0.0, "poisson": math.inf}


def trial_shape(trials: str | float) -> float:
    """The dp_accounting shape of a named distribution, or a shape ``eta >= 0`` itself."""
    if isinstance(trials, str):
        if trials not in TRIAL_SHAPES:
            raise ValueError(f"Unknown trials={trials!r}; expected one of "
                             f"{sorted(TRIAL_SHAPES)} or a negative-binomial shape > 0.")
        return TRIAL_SHAPES[trials]
    if isinstance(trials, bool) or not isinstance(trials, (int, float)) or \
            not (trials >= 0) or math.isnan(trials):
        raise ValueError(f"Expected trials to be a distribution name or a shape >= 0, got "
                         f"{trials!r}.")
    return float(trials)


def _check_mean(mean: float) -> float:
    mean = check_positive("mean_trials", mean)
    if mean < 1:
        raise ValueError(f"Expected mean_trials >= 1 (the mean number of trials), got "
                         f"mean_trials={mean:g}.")
    return mean


def trial_gamma(mean: float, shape: float) -> float:
    """``gamma`` of the truncated negative binomial with shape ``eta`` and the given mean.

    ``E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta))`` (``eta > 0``), and
    ``(1 - gamma) / (gamma log(1/gamma))`` for the logarithmic distribution (``eta = 0``).
    """
    mean = _check_mean(mean)
    if shape == 1.0:
        return 1.0 / mean
    if mean == 1.0:
        return 1.0

    def mean_of(g: float) -> float:
        if shape == 0.0:
            return (1.0 - g) / (g * math.log(1.0 / g))
        return shape * (1.0 - g) / (g * (1.0 - g**shape))

    return float(optimize.brentq(lambda g: mean_of(g) - mean, 1e-300, 1.0 - 1e-15,
                                 xtol=1e-300, rtol=1e-14, maxiter=500))


def _inverse_cdf(u: float, pmf: Callable[[int], float], start: int) -> int:
    k, total = start, 0.0
    while True:
        total += pmf(k)
        if u <= total or k > 10**7:
            return k
        k += 1


def draw_trial_count(rng: Any, mean: float, trials: str | float = "geometric") -> int:
    """Draw the number of trials ``K`` (see the module docstring).

    ``rng`` is a numpy Generator (its own samplers; the geometric case is
    ``rng.geometric(1/mean)``) or a :class:`dpprecond.secure.SecureGenerator` (inverse
    transform of one uniform from the OS CSPRNG).
    """
    shape = trial_shape(trials)
    mean = _check_mean(mean)
    numpy_rng = isinstance(rng, np.random.Generator)
    if shape == math.inf:
        if numpy_rng:
            return int(rng.poisson(mean))
        return _inverse_cdf(float(rng.random()),
                            lambda k: math.exp(k * math.log(mean) - mean - math.lgamma(k + 1)),
                            0)
    gamma = trial_gamma(mean, shape)
    if gamma >= 1.0:
        return 1
    if numpy_rng:
        if shape == 1.0:
            return int(rng.geometric(gamma))
        if shape == 0.0:
            return int(rng.logseries(1.0 - gamma))
        while True:  # the negative binomial, truncated at k >= 1
            k = int(rng.negative_binomial(shape, gamma))
            if k >= 1:
                return k
    log_q = math.log1p(-gamma)
    if shape == 0.0:
        norm = math.log(1.0 / gamma)
        return _inverse_cdf(float(rng.random()), lambda k: math.exp(k * log_q) / (k * norm), 1)
    log_norm = math.log(gamma ** -shape - 1.0)
    return _inverse_cdf(float(rng.random()), lambda k: math.exp(
        k * log_q - log_norm + math.lgamma(k + shape) - math.lgamma(shape)
        - math.lgamma(k + 1)), 1)


def repeat_and_select_event(inner: dp_event.DpEvent, mean: float,
                            trials: str | float = "geometric") -> dp_event.DpEvent:
    """``RepeatAndSelectDpEvent(inner, mean, shape)``; a non-private or no-op ``inner`` is
    returned as it is (the selection is then non-private, or free)."""
    mean = _check_mean(mean)
    shape = trial_shape(trials)
    if isinstance(inner, (dp_event.NonPrivateDpEvent, dp_event.NoOpDpEvent)):
        return inner
    return dp_event.RepeatAndSelectDpEvent(inner, mean, shape)


def calibrate_selection(epsilon: float, delta: float, mean: float,
                        trials: str | float = "geometric") -> float:
    """The noise multiplier ``z`` of one trial, seen as one Gaussian mechanism, such that
    repeat-and-select over ``Gaussian(z)`` trials is ``(epsilon, delta)``-DP (Renyi
    accountant, :func:`dpprecond.accounting.calibrate_noise`)."""
    mean = _check_mean(mean)
    shape = trial_shape(trials)
    return calibrate_noise(lambda z: repeat_and_select_event(gaussian(z), mean, shape),
                           epsilon, delta, "rdp")
