"""Secure aggregation with distributed noise: the server sees only a noisy sum.

:mod:`~dpprecond.secagg.skellam` is the mechanism (the distributed Skellam mechanism on
clipped, scaled, randomly rounded records, summed modulo ``2^bits``): each client adds its
share of the noise, and any sum of at least ``min_clients`` shares carries the calibrated
noise. :mod:`~dpprecond.secagg.fl` runs it for a federated gradient round. The threat
model (honest-but-curious server, dropouts, colluding clients) is in
docs/secure_aggregation.md.
"""

from dpprecond.secagg.skellam import (
    InsufficientNoiseError,
    SkellamPlan,
    aggregate,
    client_share,
    colluding_variance,
    conditional_round,
    decode,
    plan_event,
    plan_skellam,
    quantize_records,
    skellam_event,
    skellam_noise,
    skellam_rdp,
)

__all__ = [
    "InsufficientNoiseError",
    "SkellamPlan",
    "aggregate",
    "client_share",
    "colluding_variance",
    "conditional_round",
    "decode",
    "plan_event",
    "plan_skellam",
    "quantize_records",
    "skellam_event",
    "skellam_noise",
    "skellam_rdp",
]
