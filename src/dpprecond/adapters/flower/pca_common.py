"""What the two trust models of PCA on Flower share: the client's state, its rows, the
refusal of a secure fit that SecAgg+ cannot carry (:mod:`dpprecond.adapters.flower.pca`,
:mod:`dpprecond.adapters.flower.pca_secagg`)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from dpprecond.adapters.flower.client_app import LocalData
from dpprecond.pca.remote import ClientState

__all__ = ["SECURE_AGGREGATION_REFUSAL", "SecureAggregationUnavailableError"]

_STATE, _DRAWS = "dpprecond-pca-state", "dpprecond-pca-draws"


class SecureAggregationUnavailableError(ValueError):
    """``trust="secure-aggregation"`` for PCA on Flower: the fit's secure sums need a larger
    modulus than Flower's SecAgg+ carries."""


SECURE_AGGREGATION_REFUSAL = (
    "Flower's SecAgg+ (flwr 1.42 SecAggPlusWorkflow, modulus_range 2^31) carries secure "
    "sums of at most 2^30 (dpprecond.secagg.fl.FIT_BITS). A PCA secure sum starts at the "
    "in-process fit's 2^-10 rounding inflation (dpprecond.secagg.sums.plan_sum, "
    "wrap-around probability <= 1e-12) and, where that needs more bits, coarsens its "
    "scale down to an inflation of 2^-3 (noise std at most 12.5% above the central "
    "Gaussian's; the fit's events are calibrated at that bound: "
    "dpprecond.pca.secure_plan). Its Gram sum (d(d+1)/2 coordinates) needs about "
    "log2(n) + log2(sqrt(d(d+1)/2)) + 13 bits at 2^-10 and 7 fewer at 2^-3: digits (d = "
    "64, 1,437 training rows, 28 to 29 bits) runs at 2^-10, Fashion-MNIST's pixels (d = "
    "784, 60,000 rows, 37 bits) at 2^-3 (30 bits, at epsilon 1 with up to 20 clients; "
    "ten times the rows, 34 bits at 2^-3, or epsilon 0.5 with 100 clients, is refused). "
    "Run the "
    "secure-aggregation fit in process, fit_private_pca(X, clients=bounds, "
    "trust='secure-aggregation') (docs/secure_aggregation.md), or use trust='local' on "
    "Flower (every client adds its own noise).")


def _local_rows(data: Any) -> np.ndarray:
    X = data.X if isinstance(data, LocalData) else data
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"Expected this client's rows as a 2-D array with at least one row, "
                         f"got shape {X.shape}.")
    return X


def _load_state(context: Context) -> ClientState:
    if _STATE not in context.state:
        return ClientState()
    meta = str(context.state[_STATE]["meta"])
    saved = cast(ArrayRecord, context.state[_DRAWS]) if _DRAWS in context.state else None
    draws = {k: np.asarray(v.numpy()) for k, v in saved.items()} if saved is not None else {}
    return ClientState.load(meta, draws)


def _keep_state(context: Context, state: ClientState) -> None:
    context.state[_STATE] = ConfigRecord({"meta": state.meta()})
    context.state[_DRAWS] = ArrayRecord({k: Array(np.asarray(v))
                                         for k, v in state.draws.items()})
