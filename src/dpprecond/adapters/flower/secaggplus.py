"""Flower's SecAgg+ made exact on integer messages: the arithmetic both secure adapters use.

A secure sum's messages are integers modulo ``m = 2^bits``; SecAgg+ quantizes floats. The
settings below make its arithmetic exact (:mod:`dpprecond.adapters.flower.secagg`'s
docstring derives them): every client reports ``num_examples = 1`` and the workflow runs
with ``max_weight = q`` (``q`` the quantization range, a power of two that ``m`` divides,
below SecAgg+'s modulus ``M = 2^31``), so each weight factor is 1; the client sends
``q x_i`` with ``x_i`` its message centred in ``[-m/2, m/2)`` (:func:`exact_vector`);
with ``clipping_range = q/2`` the quantization maps ``x_i`` to ``x_i + q/2`` exactly, and
SecAgg+ hands the server ``(S - K' q/2) q / K'`` for ``K'`` survivors, from which
:func:`recovered_sum` reads the integer ``S - K' q/2``, congruent to ``sum_i x_i``
modulo ``M`` and hence modulo ``m``. Plans of at most 30 bits run on it
(:data:`~dpprecond.secagg.fl.FIT_BITS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import Context, Message, MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.server.workflow import SecAggPlusWorkflow

__all__ = ["SECAGG_MODULUS", "centred", "exact_vector", "exact_workflow", "recovered_sum",
           "secaggplus_when_asked"]

#: SecAgg+'s modulus ``M`` (Flower requires a power of two below ``2^32``, above the
#: quantization range ``m = 2^bits``): plans of at most 30 bits run on it.
SECAGG_MODULUS = 1 << 31


def centred(share: np.ndarray, m: int) -> np.ndarray:
    """``share`` modulo ``m``, centred in ``[-m/2, m/2)``."""
    return np.mod(share + m // 2, m) - m // 2


def exact_vector(message: np.ndarray, m: int, q: int, extra: Sequence[int] = ()) -> np.ndarray:
    """What a client hands ``secaggplus_mod``: its message modulo ``m`` centred, then
    ``extra`` integers (an FL round's record count), times ``q`` (exact: a power of two;
    SecAgg+ multiplies by the weight ``1/q``)."""
    vector = np.concatenate([centred(np.asarray(message, dtype=np.int64), m),
                             np.asarray(extra, dtype=np.int64)]).astype(np.float64)
    return vector * float(q)


def recovered_sum(average: np.ndarray, n_shares: int, q: int) -> np.ndarray:
    """The integer sum of the clients' vectors modulo ``M`` (int64) from what SecAgg+
    hands the strategy, ``(S - K' q/2) q / K'`` (rounded to the nearest integer; the float
    error is below ``2^-8``)."""
    return np.rint(np.asarray(average, dtype=np.float64) * (n_shares / q)).astype(np.int64)


def exact_workflow(q: int, *, min_clients: int, n_clients: int,
                   timeout: float | None = None) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ workflow with the settings that keep the shares exact (one share
    per neighbour; the reconstruction threshold ``min_clients``, or every client)."""
    return SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=min_clients
                              if min_clients < n_clients else 1.0,
                              max_weight=float(q), clipping_range=float(q // 2),
                              quantization_range=q, modulus_range=SECAGG_MODULUS,
                              timeout=timeout)


def secaggplus_when_asked(msg: Message, ctxt: Context, call_next: Any) -> Message:
    """``secaggplus_mod`` for SecAgg+ messages; every other message goes straight on."""
    if msg.metadata.message_type == MessageType.TRAIN \
            and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)
