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
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
)
from flwr.server.workflow import SecAggPlusWorkflow

__all__ = ["MAX_SECAGG_CLIENTS", "SECAGG_MODULUS", "centred", "check_secaggplus_state",
           "exact_vector", "exact_workflow", "recovered_sum", "ring_threshold",
           "secaggplus_when_asked"]

#: SecAgg+'s modulus ``M`` (Flower requires a power of two below ``2^32``, above the
#: quantization range ``m = 2^bits``): plans of at most 30 bits run on it.
SECAGG_MODULUS = 1 << 31

#: Largest federation a secure sum runs on (FL rounds and PCA releases): SecAgg+ hands
#: ``T q / K'`` in float64 (``T = S - K' q/2``, ``|T| <= K' q/2 + M``), and reading ``T``
#: back (:func:`recovered_sum`) errs by at most ``3 2^-53 |T|`` (three roundings): below
#: ``2^-8`` for ``K' <= 2^14`` at ``q <= 2^30``; at about 10^7 clients the recovered
#: integer would be wrong.
MAX_SECAGG_CLIENTS = 1 << 14


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


def ring_threshold(num_shares: int, min_clients: int, n_clients: int) -> int:
    """SecAgg+'s reconstruction threshold ``t`` for neighbourhoods of ``s = num_shares``
    among ``K = n_clients``: ``ceil(s k_min / K)``, at least 2 and at most ``s``.

    SecAgg+ goes on with a round only if every node keeps ``t`` surviving neighbours, and
    each survivor is a neighbour of ``s`` nodes, so ``K t <= s K'``: with ``t K >= s
    k_min`` no round completes with fewer than ``min_clients`` survivors. ``t = k_min``
    when every client shares (``s = K``); ``t = s`` when ``min_clients = K`` (no dropout is
    recovered, as no sum of fewer than ``K`` shares may be released).
    """
    return min(num_shares, max(2, -(-num_shares * min_clients // n_clients)))  # exact ceil


def exact_workflow(q: int, *, min_clients: int, n_clients: int,
                   num_shares: int | None = None,
                   timeout: float | None = None) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ workflow with the settings that keep the shares exact.

    ``num_shares``: each client's neighbourhood (an odd ``s`` up to ``K``; ``None``: every
    client), with the threshold :func:`ring_threshold`. ``s`` is passed as the fraction
    ``s / K`` (Flower rounds it back to ``s``), so Flower's constructor does not warn of an
    overflow of its modular sum: the server reads that sum modulo the plan's ``m``, which
    is exact (module docstring).
    """
    s = n_clients if num_shares is None else num_shares
    t = ring_threshold(s, min_clients, n_clients)
    threshold: int | float = 1.0 if t == s else t  # Flower's int t must be below s
    return SecAggPlusWorkflow(num_shares=s / n_clients, reconstruction_threshold=threshold,
                              max_weight=float(q), clipping_range=float(q // 2),
                              quantization_range=q, modulus_range=SECAGG_MODULUS,
                              timeout=timeout)


def check_secaggplus_state(ctxt: Context, q: int, min_clients: int) -> None:
    """Refuse to answer unless this node's SecAgg+ setup is :func:`exact_workflow`'s.

    The settings the node received in SecAgg+'s setup stage (its state record) must be
    the exact ones for the quantization range ``q`` (``quantization_range = max_weight =
    q``, ``clipping_range = q/2``, ``modulus_range = 2^31``: otherwise SecAgg+'s
    quantization clips or rescales each share before the sum), with a reconstruction
    threshold ``t`` that keeps at least ``min_clients`` survivors in every round SecAgg+
    completes (``t K >= s k_min`` for neighbourhoods of ``s`` among ``K``; see
    :func:`ring_threshold`). ``ValueError`` naming what differs.
    """
    state = ctxt.state.config_records.get(RECORD_KEY_STATE)
    if state is None:
        raise ValueError("No SecAgg+ setup state on this node for a secure-sum fit request; "
                         "refusing to answer.")
    expected = {"target_range": q, "max_weight": float(q), "clipping_range": float(q // 2),
                "mod_range": SECAGG_MODULUS}
    for key, want in expected.items():
        got = state.get(key)
        if got != want:
            raise ValueError(f"SecAgg+'s {key}={got!r} is not the {want!r} that makes this "
                             f"client's share exact at secagg-range={q} (exact_workflow); "
                             "refusing to answer.")
    # SecAgg+ goes on only if every node has t surviving neighbours; each survivor is a
    # neighbour of s nodes (Flower's ring: s odd, or raised to odd after sending it), so
    # K t <= s K': t K >= s k_min gives K' >= k_min survivors
    t, K, s = state.get("threshold"), state.get("sample_num"), state.get("share_num")
    if not (isinstance(t, int) and isinstance(K, int) and isinstance(s, int)):
        raise ValueError("SecAgg+'s setup state has no integer threshold, sample and share "
                         "numbers; refusing to answer.")
    ring = min(K, s + 1 if s != K and s % 2 == 0 else s)
    if t * K < ring * min_clients:
        raise ValueError(f"SecAgg+'s reconstruction threshold {t} over neighbourhoods of "
                         f"{ring} in {K} clients lets a round go on with fewer than the "
                         f"plan's min_clients={min_clients} survivors (it needs t >= s k_min "
                         "/ K): a sum of fewer shares than its noise needs could be "
                         "unmasked; refusing to answer.")


def secaggplus_when_asked(msg: Message, ctxt: Context, call_next: Any) -> Message:
    """``secaggplus_mod`` for SecAgg+ messages; every other message goes straight on."""
    if msg.metadata.message_type == MessageType.TRAIN \
            and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)
