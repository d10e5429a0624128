"""What a federated client releases, as DpEvents, and the noise that meets a target.

This module only turns hyperparameters into ``dp_accounting`` events; every epsilon comes
from :func:`dpprecond.accounting.epsilon_of` and every calibration from
:func:`dpprecond.accounting.calibrate_noise` (the jax_privacy split). The privacy unit is
one record of one client (replace-one adjacency, the paper's) unless stated otherwise.

Client mechanisms (per round, noise multiplier ``z``):

``"full-batch"`` (the paper; record-level, replace-one)
    Each round every client releases ``(sum_x clip_C(g(x)) + N(0, (2 z C)^2 I)) / |D_i|``.
    Replacing one record changes the clipped sum by at most ``2C`` in l2, so the release is
    a Gaussian mechanism with noise multiplier ``z``; ``T`` rounds are a T-fold composition
    (exactly ``sqrt(T)/z``-GDP). Event per round: ``GaussianDpEvent(z)``.
``"poisson"`` (record-level, add/remove-one)
    Each of ``local_steps`` local steps samples every record independently with probability
    ``q`` and releases (inside the local trajectory) the clipped sum plus ``N(0, (z C)^2)``.
    dp_accounting analyses Poisson-subsampled Gaussians for add/remove-one adjacency only,
    so this option protects the presence of a record (sensitivity ``C``), not replacement.
    Event per round: ``SelfComposed(PoissonSampled(q, Gaussian(z)), local_steps)``.
``"client-level"`` (client-level, replace-one client, trusted aggregator)
    Each client's whole update is clipped to ``C``; the server adds ``N(0, (2 z C)^2)`` once
    to the sum. Event per round: ``GaussianDpEvent(z)``.

Methods with more releases than one per round (:class:`Schedule`): DP-FedAvg and
DP-SCAFFOLD release one full-batch Gaussian per *local step* (``T * L`` in all); DP-FedFC
and DP-FedNew release one covariance (``Gaussian(z_cov)``) and then ``T`` gradients
(``Gaussian(z_grad)``), with the budget split by a share ``s`` of the GDP precision:
``z_cov = c / sqrt(s)``, ``z_grad = c sqrt(T / (1 - s))`` for one calibrated scale ``c``.
The server optimizer only post-processes the released messages, so it costs nothing.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from dp_accounting import dp_event

from dpprecond import accounting
from dpprecond._validation import (
    check_choice,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
)

if TYPE_CHECKING:
    from dpprecond.fl.config import FLConfig

__all__ = [
    "MECHANISMS",
    "Schedule",
    "calibrate",
    "check_privacy_level",
    "resolve_scale",
    "round_event",
    "training_event",
]

logger = logging.getLogger(__name__)

Mechanism = Literal["full-batch", "poisson", "client-level"]
MECHANISMS: tuple[str, ...] = ("full-batch", "poisson", "client-level")


def check_privacy_level(target_epsilon: float | None,
                        noise_multiplier: float | None) -> None:
    """Exactly one of ``target_epsilon`` and ``noise_multiplier`` (``0``: non-private).

    Raises ``ValueError`` when both or neither are given, naming both, and checks the one
    given (``target_epsilon > 0`` finite, ``noise_multiplier >= 0`` finite).
    """
    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError(
            f"Give target_epsilon or noise_multiplier, not both (got "
            f"target_epsilon={target_epsilon!r}, noise_multiplier={noise_multiplier!r}): "
            "target_epsilon calibrates the noise, noise_multiplier sets it (0 = non-private).")
    if target_epsilon is None and noise_multiplier is None:
        raise ValueError("Give the privacy level: target_epsilon=... (the noise is calibrated "
                         "to it) or noise_multiplier=... (explicit noise; noise_multiplier=0 "
                         "asks for a non-private run).")
    if target_epsilon is not None:
        check_epsilon("target_epsilon", target_epsilon)
    else:
        check_positive("noise_multiplier", noise_multiplier, allow_zero=True)


def round_event(noise_multiplier: float, mechanism: Mechanism = "full-batch", *,
                sampling_rate: float = 1.0, local_steps: int = 1) -> dp_event.DpEvent:
    """The DpEvent of one client's releases in one round (see the module docstring).

    ``noise_multiplier = 0`` gives a non-private event, ``inf`` a no-op.
    """
    check_choice("mechanism", mechanism, MECHANISMS)
    base = accounting.gaussian(noise_multiplier)
    if mechanism != "poisson":
        return base
    q = check_fraction("sampling_rate", sampling_rate, low_open=True, high_open=False)
    steps = check_int("local_steps", local_steps, low=1)
    sampled = base if q == 1.0 or not isinstance(base, dp_event.GaussianDpEvent) \
        else dp_event.PoissonSampledDpEvent(q, base)
    return sampled if steps == 1 else dp_event.SelfComposedDpEvent(sampled, steps)


def training_event(noise_multiplier: float, n_rounds: int, mechanism: Mechanism = "full-batch",
                   *, sampling_rate: float = 1.0, local_steps: int = 1) -> dp_event.DpEvent:
    """All ``n_rounds`` rounds of one client as one composed event."""
    n_rounds = check_int("n_rounds", n_rounds, low=1)
    ev = round_event(noise_multiplier, mechanism, sampling_rate=sampling_rate,
                     local_steps=local_steps)
    return ev if n_rounds == 1 else dp_event.SelfComposedDpEvent(ev, n_rounds)


@dataclass(frozen=True)
class Schedule:
    """One client's releases over a run, as a function of one noise scale ``c``.

    ``kind`` is ``"rounds"`` (one mechanism release per round, ``z = c``), ``"local-steps"``
    (``steps`` full-batch Gaussian releases per round, ``z = c``) or ``"covariance"`` (one
    covariance release then one gradient per round, split by ``share``). Hashable, so that
    calibrations are cached across the runs of a sweep.
    """

    kind: Literal["rounds", "local-steps", "covariance"]
    n_rounds: int
    mechanism: Mechanism = "full-batch"
    sampling_rate: float = 1.0
    steps: int = 1
    share: float = 0.0

    @classmethod
    def rounds(cls, config: FLConfig) -> Schedule:
        """One release of ``config.mechanism`` per round."""
        return cls("rounds", int(config.n_rounds), config.mechanism,
                   float(config.sampling_rate), int(config.local_steps))

    def multipliers(self, scale: float) -> dict[str, float]:
        """Named noise multipliers at scale ``c`` (``z``; or ``z_cov`` and ``z_grad``)."""
        if self.kind != "covariance":
            return {"z": float(scale)}
        s = check_fraction("covariance_share", self.share, low_open=True)
        if scale == 0:
            return {"z_cov": 0.0, "z_grad": 0.0}
        return {"z_cov": scale / math.sqrt(s),
                "z_grad": scale * math.sqrt(self.n_rounds / (1.0 - s))}

    def event(self, scale: float) -> dp_event.DpEvent:
        """All releases of one client over the run, composed."""
        if self.kind == "rounds":
            return training_event(scale, self.n_rounds, self.mechanism,
                                  sampling_rate=self.sampling_rate, local_steps=self.steps)
        if self.kind == "local-steps":
            n = self.n_rounds * self.steps
            g = accounting.gaussian(scale)
            return g if n == 1 else dp_event.SelfComposedDpEvent(g, n)
        z = self.multipliers(scale)
        grads = accounting.gaussian(z["z_grad"])
        return accounting.compose([
            accounting.gaussian(z["z_cov"]),
            grads if self.n_rounds == 1 else dp_event.SelfComposedDpEvent(grads,
                                                                          self.n_rounds)])


@lru_cache(maxsize=512)
def calibrate(schedule: Schedule, target_epsilon: float, target_delta: float,
              accountant: accounting.AccountantName = "pld") -> float:
    """Smallest scale ``c`` such that ``schedule.event(c)`` is (epsilon, delta)-DP.

    :func:`dpprecond.accounting.calibrate_noise` on the schedule's event; cached, because
    sweeps calibrate the same setting many times.
    """
    return accounting.calibrate_noise(schedule.event, target_epsilon, target_delta,
                                      accountant)


def resolve_scale(schedule: Schedule, config: FLConfig) -> float:
    """The run's noise scale: ``config.noise_multiplier`` or calibrated to its target.

    ``noise_multiplier=0`` (the explicit non-private run) is logged as a warning.
    """
    if config.noise_multiplier is not None:
        if config.noise_multiplier == 0:
            logger.warning("noise_multiplier=0: a non-private run, with no privacy "
                           "guarantee.")
        return float(config.noise_multiplier)
    if config.target_epsilon is None:
        raise ValueError("Give target_epsilon or noise_multiplier (FLConfig.validated()).")
    return calibrate(schedule, float(config.target_epsilon), float(config.target_delta),
                     config.accountant)
