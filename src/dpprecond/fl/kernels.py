"""The per-round kernel of a linear softmax head: clipped per-client gradient sums, one pass.

For every client ``i`` it computes ``sum_{j in D_i} clip_C(x~_j r_j^T)`` (``x~ = [x, 1]``,
``r = softmax(W^T x~) - onehot(y)``) reading every row of ``X`` once: the rows are cut into
blocks that never straddle two clients, and for each block the logits ``X_b W``, the
residuals, the per-example clip factors ``min(1, C / (||x~|| ||r||))`` and the block's
contribution ``X_b^T R_b`` are computed while the block is in cache. Blocks run on a pool
of threads (single-threaded BLAS each; BLAS and the numpy loops release the GIL), each
block's contribution is kept apart and the contributions of a client are added in block
order, so the result does not depend on the scheduling.

Precision. The rows may be float64 or float32. With float32 rows the logits and residuals
are computed in float32 (a per-record computation: its rounding changes which gradient a
record contributes, not how much any record can contribute) and the block's rows are
widened to float64 for the clipped sum. The clip factors are computed in float64, every
clipped contribution carries the factor ``1 - 2^-30`` so that its norm is at most ``C`` as
computed, and all sums are float64. Rounding inside a block's sum of ``b`` contributions
of norm ``<= C`` is at most ``gamma_b b C`` in norm (Higham), so a client's sum of
``n_i`` rows is within ``n_i gamma_b C`` of the exact sum of its contributions:
:func:`rounding_slack` returns ``n_max gamma_b / 2``, the relative excess over the
sensitivity ``2C`` that the client mechanism adds to its noise (about ``3e-10`` for
3,000-row clients and 2,048-row blocks). Summing in float32 instead would make that bound
about 18%, which is why the sums stay in float64.

Rows this fast path cannot handle (squared norm out of range, or logits that overflow) are
returned as "hard": the caller computes them with the overflow-safe path of
:class:`dpprecond.fl.models.LinearSoftmax`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["DEFAULT_BLOCK_ROWS", "SHRINK", "clipped_sums", "rounding_slack"]

#: Rows per block of the fused pass.
DEFAULT_BLOCK_ROWS = 2048
_SQ_LIMIT = 1e280


#: The factor every clipped contribution carries (see the module docstring).
SHRINK = 1.0 - 2.0**-30


def rounding_slack(max_client_rows: int, dtype: np.dtype | type = np.float64,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> float:
    """Relative excess of a client's computed clipped sum over the sensitivity ``2C``.

    The sums are float64 whatever the rows' dtype (see the module docstring).
    """
    del dtype
    u = 2.0**-53
    b = max(1, min(block_rows, max_client_rows))
    gamma = b * u / (1.0 - b * u)
    return max_client_rows * gamma / 2.0


def _units(bounds: np.ndarray, block_rows: int) -> list[tuple[int, int, int]]:
    units = []
    for i in range(len(bounds) - 1):
        for lo in range(int(bounds[i]), int(bounds[i + 1]), block_rows):
            units.append((i, lo, min(int(bounds[i + 1]), lo + block_rows)))
    return units


def clipped_sums(X: np.ndarray, y: np.ndarray, W: np.ndarray, bounds: np.ndarray,
                 clip_norm: float, x_sq_norms: np.ndarray, *,
                 block_rows: int = DEFAULT_BLOCK_ROWS,
                 n_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-client clipped gradient sums of a linear softmax head, and the hard rows.

    Parameters
    ----------
    X : ndarray of shape (n, d), float64 or float32
        Client-contiguous rows.
    y : ndarray of shape (n,)
        Labels.
    W : ndarray of shape (d + 1, k) or (K, d + 1, k)
        Shared parameters, or one set per client (last row: the bias).
    bounds : ndarray of shape (K + 1,)
        Client boundaries.
    clip_norm : float
        ``C`` (``inf``: no clipping, no shrink).
    x_sq_norms : ndarray of shape (n,), float64
        ``||x_j||^2`` of the rows as given (of the float32 rows when ``X`` is float32).
    block_rows, n_threads
        Block size and pool size (``None``: ``os.cpu_count()``).

    Returns
    -------
    sums : ndarray of shape (K, d + 1, k), float64
        Without the hard rows.
    hard : ndarray of int
        Indices of the rows left out (to be handled by the overflow-safe path).
    """
    dtype = X.dtype
    d = X.shape[1]
    k = W.shape[-1]
    per_client = W.ndim == 3
    Ws = W if per_client else W[None]
    Wx = np.ascontiguousarray(Ws[:, :-1], dtype=dtype)
    bias = np.asarray(Ws[:, -1], dtype=dtype)
    clip = not np.isinf(clip_norm)
    wide = dtype != np.float64
    units = _units(bounds, block_rows)
    partial = np.zeros((len(units), d + 1, k))
    hard_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(units)

    def one(u: int) -> None:
        i, lo, hi = units[u]
        w = i if per_client else 0
        Xb = X[lo:hi]
        with np.errstate(over="ignore", invalid="ignore"):  # such rows become "hard"
            L = Xb @ Wx[w]
            L += bias[w]
            top = L.max(axis=1)
        sq = x_sq_norms[lo:hi]
        hard = ~np.isfinite(top) | ~(sq < _SQ_LIMIT)
        with np.errstate(invalid="ignore", over="ignore"):
            L -= top[:, None]
            np.exp(L, out=L)
            L /= L.sum(axis=1, keepdims=True)
        L[np.arange(hi - lo), y[lo:hi]] -= 1.0
        if wide:  # the sums are float64 (see the module docstring)
            L = L.astype(np.float64)
            Xb = Xb.astype(np.float64)
        if clip:
            r = np.sqrt(np.einsum("ij,ij->i", L, L))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                factor = np.minimum(1.0, clip_norm / (np.sqrt(sq + 1.0) * r))
            L *= (np.where(np.isfinite(factor), factor, 1.0) * SHRINK)[:, None]
        if hard.any():
            L[hard] = 0.0
            hard_parts[u] = np.flatnonzero(hard) + lo
        with np.errstate(over="ignore", invalid="ignore"):  # hard rows' entries are zeroed
            partial[u, :-1] = Xb.T @ L
        partial[u, -1] = L.sum(axis=0)

    threads = min(n_threads or os.cpu_count() or 1, len(units))
    if threads <= 1:
        for u in range(len(units)):
            one(u)
    else:
        from dpprecond._threads import serial_blas

        with serial_blas(), \
                ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(len(units))))
    K = len(bounds) - 1
    out = np.zeros((K, d + 1, k))
    for u, (i, _, _) in enumerate(units):  # in block order: independent of the scheduling
        out[i] += partial[u]
    hard_rows = np.concatenate(hard_parts) if units else np.zeros(0, dtype=np.int64)
    return out, hard_rows
