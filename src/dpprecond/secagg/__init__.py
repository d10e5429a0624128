"""Secure aggregation with distributed noise: the server sees only a noisy sum.

:mod:`~dpprecond.secagg.sums` is the mechanism of every secure sum: each client scales its
part of the sum by a power of two, rounds it with shared-uniform stochastic rounding, adds
its share of the Skellam noise and sends the result modulo ``2^bits``; any sum of at least
``min_clients`` shares carries the calibrated noise. :mod:`~dpprecond.secagg.skellam` is
the Skellam arithmetic (noise shares, modular sum, decoding, wrap-around, accounting).
Federated PCA's releases (:mod:`dpprecond.pca.federated`) and the federated gradient
rounds (:mod:`~dpprecond.secagg.fl`, each client's part its clipped gradient sum) are such
sums. The threat model (honest-but-curious server, dropouts, colluding clients) is in
docs/secure_aggregation.md.
"""

from dpprecond.secagg.skellam import (
    InsufficientNoiseError,
    aggregate,
    colluding_variance,
    decode,
    plan_event,
    skellam_event,
    skellam_noise,
    skellam_rdp,
)
from dpprecond.secagg.sums import SumPlan, client_message, plan_sum, secure_sum, sum_event

__all__ = [
    "InsufficientNoiseError",
    "SumPlan",
    "aggregate",
    "client_message",
    "colluding_variance",
    "decode",
    "plan_event",
    "plan_sum",
    "secure_sum",
    "skellam_event",
    "skellam_noise",
    "skellam_rdp",
    "sum_event",
]
