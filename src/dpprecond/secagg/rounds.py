"""The plan and the event of one federated secure sum, shared by every secure round.

:func:`round_plan` fits :func:`~dpprecond.secagg.sums.plan_sum` to the modulus Flower's
SecAgg+ carries (:data:`FIT_BITS`) within the accounted rounding inflation
(:data:`ACCOUNTED_INFLATION`); :func:`round_event` is the event that dominates every such
plan; :func:`part_sensitivity` is a record-level part's (a client's clipped gradient sum)
replace-one bound. :mod:`dpprecond.secagg.fl` (the rounds) and
:mod:`dpprecond.secagg.adaptive` (the rounds with adaptive clipping's count) both plan
with them; the arguments and the proofs are in :mod:`dpprecond.secagg.fl`'s docstring.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import check_int, check_positive
from dpprecond.fl import client as client_mod
from dpprecond.fl.models import FLModel
from dpprecond.secagg.sums import SumPlan, plan_sum, sum_event

__all__ = ["ACCOUNTED_INFLATION", "FIT_BITS", "part_sensitivity", "round_event",
           "round_plan"]

#: The largest modulus a federated sum's plan prefers: ``2^30``, the largest that
#: Flower's SecAgg+ carries exactly (its ``modulus_range`` is a power of two below
#: ``2^32`` and above the quantization range ``2^bits``;
#: :mod:`dpprecond.adapters.flower.secagg`). The simulator plans the same sums.
FIT_BITS = 30
#: The rounding inflation the federated sums' accounting covers (:func:`round_event`): a
#: plan starts at :data:`~dpprecond.secagg.sums.ROUNDING_INFLATION` (``2^-10``) and
#: coarsens its scale up to this bound, ``2^-6`` (the decoded noise std at most 1.6% above
#: the central Gaussian's), only when that fits the modulus in :data:`FIT_BITS`.
ACCOUNTED_INFLATION = 2.0**-6


def round_plan(dim: int, sensitivity: float, noise_multiplier: float, *, n_rows: int,
               n_clients: int, min_clients: int) -> SumPlan:
    """The plan of a federated secure sum (a round's gradients or the setup's moments):
    :func:`~dpprecond.secagg.sums.plan_sum` fitted to :data:`FIT_BITS` within
    :data:`ACCOUNTED_INFLATION`. The simulator, the SecAgg+ server and its clients all plan
    with it, so they agree on the scale and the modulus."""
    return plan_sum(dim, sensitivity, noise_multiplier, n_rows=n_rows, n_clients=n_clients,
                    min_clients=min_clients, fit_bits=FIT_BITS,
                    max_inflation=ACCOUNTED_INFLATION)


def round_event(noise_multiplier: float) -> dp_event.DpEvent:
    """The event of a federated secure sum with noise multiplier ``z``:
    :func:`~dpprecond.secagg.sums.sum_event` at :data:`ACCOUNTED_INFLATION`, which
    dominates every plan of :func:`round_plan` (its inflation is at most that bound)."""
    return sum_event(noise_multiplier, ACCOUNTED_INFLATION)


def part_sensitivity(model: FLModel, clip_norm: float, max_client_rows: int,
                     dtype: Any = np.float64) -> float:
    """``Delta``: replace-one L2 bound on the change of one client's computed part.

    ``2 C`` times :func:`dpprecond.fl.client.noise_inflation` for clients of at most
    ``max_client_rows`` rows of ``dtype`` (the bound on the floating-point rounding of the
    computed clipped sums that the local mechanism's noise carries too).
    """
    clip_norm = check_positive("clip_norm", clip_norm)
    n = check_int("max_client_rows", max_client_rows, low=0)
    fp = client_mod.noise_inflation(model, np.empty((0, 0), dtype=dtype),
                                    np.array([0, max(n, 1)]))
    return 2.0 * clip_norm * fp
