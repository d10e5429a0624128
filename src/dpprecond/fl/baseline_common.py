"""Pieces shared by the DP federated baselines (SCAFFOLD/FedAvg, FedFC, FedNew).

- :class:`BaselineResult`: an :class:`~dpprecond.fl.simulator.FLResult` that also lists the
  client's releases as DpEvents, in the order they were made (one entry per release), so
  tests and users can check that what was charged is what was released.
- :func:`covariance_split_event` / :func:`calibrate_covariance_split`: the accounting of a
  method that releases one private feature second-moment matrix and then ``T`` noisy
  gradients, with a documented split of the budget between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from dp_accounting import dp_event
from scipy import optimize

from dpprecond import accounting
from dpprecond._validation import (
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
)
from dpprecond.fl.accounting import check_privacy_level
from dpprecond.fl.models import FLModel
from dpprecond.fl.simulator import FLResult

__all__ = [
    "BaselineResult",
    "calibrate_covariance_split",
    "check_privacy",
    "covariance_split_event",
    "covariance_split_noise",
    "history_record",
]


@dataclass
class BaselineResult(FLResult):
    """:class:`FLResult` plus ``events``: one DpEvent per private release of one client."""

    events: list[dp_event.DpEvent] = field(default_factory=list)

    @property
    def n_releases(self) -> int:
        """How many private releases each client made."""
        return len(self.events)


def check_privacy(clip_norm: float, target_epsilon: float | None, target_delta: float,
                  noise_multiplier: float | None) -> None:
    """Validate the privacy arguments shared by the baselines (names the bad one).

    Exactly one of ``target_epsilon`` and ``noise_multiplier`` (``0``: non-private, logged).
    """
    check_positive("clip_norm", clip_norm, allow_inf=True)
    check_privacy_level(target_epsilon, noise_multiplier)
    check_delta(target_delta, "target_delta")
    private = target_epsilon is not None or bool(noise_multiplier)
    if private and math.isinf(clip_norm):
        raise ValueError("A private run needs a finite clip_norm (the sensitivity is "
                         "2 * clip_norm); got clip_norm=inf.")


def history_record(model: FLModel, params: np.ndarray, X_test: np.ndarray, y_test: np.ndarray,
                   t: int, epsilon: float, update: np.ndarray,
                   seconds: float) -> dict[str, float]:
    """One round's record, with the same keys as :func:`dpprecond.fl.simulator.simulate`."""
    loss, acc = model.evaluate(params, X_test, y_test)
    return {"round": t + 1, "test_accuracy": acc, "test_loss": loss, "epsilon": epsilon,
            "update_norm": float(np.linalg.norm(update)), "seconds": seconds}


def covariance_split_noise(scale: float, n_rounds: int,
                           covariance_share: float) -> tuple[float, float]:
    """Noise multipliers ``(z_cov, z_grad)`` of the split with overall scale ``scale``.

    A composition of Gaussian mechanisms with multipliers ``z_j`` is ``mu``-GDP with
    ``mu^2 = sum_j 1 / z_j^2``. We give the one covariance release the share ``s`` of
    ``mu^2`` and the ``T`` gradient releases the rest, equally:
    ``z_cov = scale / sqrt(s)``, ``z_grad = scale * sqrt(T / (1 - s))``, so the whole run is
    ``1/scale``-GDP. The epsilon itself is always computed by dp_accounting on the composed
    events (:func:`covariance_split_event`), not from this formula.
    """
    s = check_fraction("covariance_share", covariance_share, low_open=True)
    T = check_int("n_rounds", n_rounds, low=1)
    if scale == 0:
        return 0.0, 0.0
    return scale / math.sqrt(s), scale * math.sqrt(T / (1.0 - s))


def covariance_split_event(z_cov: float, z_grad: float, n_rounds: int) -> dp_event.DpEvent:
    """``Compose(Gaussian(z_cov), SelfComposed(Gaussian(z_grad), T))`` for one client."""
    T = check_int("n_rounds", n_rounds, low=1)
    grads = accounting.gaussian(z_grad)
    return accounting.compose([accounting.gaussian(z_cov),
                               grads if T == 1 else dp_event.SelfComposedDpEvent(grads, T)])


@lru_cache(maxsize=256)
def calibrate_covariance_split(target_epsilon: float, target_delta: float, n_rounds: int,
                               covariance_share: float = 0.2,
                               accountant: str = "pld") -> tuple[float, float]:
    """``(z_cov, z_grad)`` meeting ``(target_epsilon, target_delta)`` for the whole run.

    The overall scale is the root of ``epsilon_of(covariance_split_event(...)) = target``
    computed by dp_accounting (the chosen accountant) on the composed events, exact for the
    chosen split. The root is bracketed around the scale ``1/mu`` of the closed-form GDP
    value (:func:`dpprecond.accounting.gaussian_gdp_epsilon`), which is only a starting
    point: a blind bracket would evaluate the PLD accountant at tiny noise, where it is
    very slow. The returned scale is checked against the target with dp_accounting.
    """
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    target_delta = check_delta(target_delta, "target_delta")

    def eps_at(scale: float) -> float:
        ev = covariance_split_event(*covariance_split_noise(scale, n_rounds, covariance_share),
                                    n_rounds)
        return accounting.epsilon_of(ev, target_delta, accountant)  # type: ignore[arg-type]

    mu = optimize.brentq(lambda m: accounting.gaussian_gdp_epsilon(m, target_delta)
                         - target_epsilon, 1e-3, 20.0, xtol=1e-12)
    lo = hi = 1.0 / mu
    for _ in range(60):
        if eps_at(hi) <= target_epsilon:
            break
        lo, hi = hi, hi * 1.02
    else:  # pragma: no cover - the accountants agree with GDP to well within 2^60 %
        raise RuntimeError("calibrate_covariance_split: no bracket; please report this bug.")
    while lo == hi or eps_at(lo) <= target_epsilon:
        hi, lo = lo, lo / 1.02
    scale = optimize.brentq(lambda s: eps_at(s) - target_epsilon, lo, hi, rtol=1e-5)
    while eps_at(scale) > target_epsilon:
        scale *= 1.0 + 1e-5
    return covariance_split_noise(scale, n_rounds, covariance_share)


@lru_cache(maxsize=8192)
def split_epsilon_after(z_cov: float, z_grad: float, n_grad_releases: int, delta: float,
                        accountant: str) -> float:
    """Epsilon after the covariance release and ``n_grad_releases`` gradient releases."""
    if z_cov == 0 or z_grad == 0:
        return math.inf
    if n_grad_releases == 0:
        ev: Any = accounting.gaussian(z_cov)
    else:
        ev = covariance_split_event(z_cov, z_grad, n_grad_releases)
    return accounting.epsilon_of(ev, delta, accountant)  # type: ignore[arg-type]
