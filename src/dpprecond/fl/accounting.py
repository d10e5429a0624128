"""What a federated client releases, as DpEvents, and the noise that meets a target.

This module only turns hyperparameters into ``dp_accounting`` events and delegates every
epsilon to :mod:`dpprecond.accounting` (the jax_privacy split). Three client mechanisms:

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

The server optimizer only post-processes the released messages, so it costs nothing.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

from dp_accounting import dp_event

from dpprecond import accounting
from dpprecond._validation import (
    check_choice,
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
)

__all__ = [
    "MECHANISMS",
    "calibrate_noise_multiplier",
    "check_privacy_level",
    "gdp_epsilon",
    "round_event",
    "training_event",
]

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
        check_epsilon(target_epsilon, "target_epsilon")
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


@lru_cache(maxsize=256)
def calibrate_noise_multiplier(target_epsilon: float, target_delta: float, n_rounds: int,
                               mechanism: Mechanism = "full-batch", *,
                               sampling_rate: float = 1.0, local_steps: int = 1,
                               accountant: accounting.AccountantName = "pld") -> float:
    """Smallest noise multiplier ``z`` such that ``n_rounds`` rounds are (eps, delta)-DP.

    Uses :func:`dpprecond.accounting.calibrate_noise` on :func:`training_event`; cached,
    because sweeps calibrate the same setting many times.
    """
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    target_delta = check_delta(target_delta, "target_delta")
    check_int("n_rounds", n_rounds, low=1)
    return accounting.calibrate_noise(
        lambda z: training_event(z, n_rounds, mechanism, sampling_rate=sampling_rate,
                                 local_steps=local_steps),
        target_epsilon, target_delta, accountant)


def gdp_epsilon(noise_multiplier: float, n_rounds: int, delta: float) -> float:
    """Closed-form cross-check for Gaussian mechanisms: ``mu = sqrt(T) / z`` GDP -> epsilon.

    Valid for the ``"full-batch"`` and ``"client-level"`` mechanisms only.
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    n_rounds = check_int("n_rounds", n_rounds, low=1)
    return accounting.gaussian_gdp_epsilon(math.sqrt(n_rounds) / z, delta)
