"""The per-round kernel of a linear softmax head: clipped per-client gradient sums, one pass.

For every client ``i`` it computes ``sum_{j in D_i} clip_C(x~_j r_j^T)`` (``x~ = [x, 1]``,
``r = softmax(W^T x~) - onehot(y)``) reading every row of ``X`` once: the rows are cut into
blocks that never straddle two clients, and for each block the logits ``X_b W``, the
residuals, the per-example clip factors ``min(1, C / (||x~|| ||r||))`` (the norm of the
per-example gradient ``x~ r^T``, so no per-example gradient is formed) and the block's
contribution ``X_b^T R_b`` are computed while the block is in cache. Everything per block
is held classes-major, ``k`` rows of one column per record: the logits as
``W^T X_b^T`` and the contribution as ``R_b^T X_b`` (the layouts in which OpenBLAS runs
these products with ``k = 10`` columns fastest; docs/performance.md), and the softmax's
reductions over the classes are elementwise operations on ``k`` contiguous rows. The
array work goes through an :class:`~dpprecond.fl.backend.ArrayBackend` (numpy, or torch on
the CPU or a GPU). With numpy the blocks run on a pool of threads (single-threaded BLAS
each; BLAS and the numpy loops release the GIL); each block's contribution is kept apart
and the contributions of a client are added in block order, so the result does not depend
on the scheduling.

**Floating point: what the sensitivity holds for.** The noise is calibrated to the
sensitivity ``2C`` of the *computed* sums. Write a client's computed sum as
``S(D) = E(D) + e(D)``, with ``E(D)`` the exact sum of the computed contributions
``c_j = x~_j a_j^T`` (``a_j`` the scaled residual as stored) and ``e(D)`` the rounding of
the summation. Two facts make the argument:

1. *Every computed contribution has norm at most C.* ``a_j`` depends on record ``j`` and the
   public parameters only, and is scaled by ``s_j SHRINK`` with
   ``s_j = min(2^e, C 2^e / n_j)`` (computed so, never subnormal),
   ``n_j`` the computed ``||x~_j|| ||r_j||`` and ``2^e`` an exact power of two that brings
   ``C' 2^e`` into ``[1, 2)``, ``C'`` the largest norm a contribution can have (float32:
   ``min(C, 2^100)``, always; float64: ``C``, only when it is outside ``[2^-500, 2^500]``,
   so the usual float64 run is unscaled); the sums are scaled back by ``2^-e`` in
   float64. float64 (rows float64): ``n_j`` is within ``(d + k + 4) u`` of the
   exact norm (``u = 2^-53``), and ``SHRINK = 1 - 2^-30`` covers it and the rounding of
   ``r_j s_j``. float32 (rows float32): the norms are computed in float64 from the float32
   values (their squares are exact in float64), and ``a_j`` is rounded to float32 once, a
   relative change of at most ``2^-24``, or an absolute one of at most ``2^-150`` per entry
   when it underflows; ``SHRINK32 = 1 - 2^-20`` covers the relative part, and rows with
   ``||x~|| >= 2^100 / sqrt(k)`` take the float64 overflow-safe path, so that the
   absolute part stays below ``2^-50`` of the scaled ``C' 2^e >= 1`` (float64: the same with
   ``2^-1075`` and ``||x~||^2 < 1e280``). Hence ``||E(D) - E(D')|| <= 2C`` for datasets
   differing in one record.
2. *The rounding of the sum is bounded.* For any order of summation, a sum of ``m`` terms in
   a precision with unit roundoff ``u`` is within ``gamma_m sum |t|`` of the exact sum,
   ``gamma_m = m u / (1 - m u)`` (Higham, Accuracy and Stability of Numerical Algorithms,
   3.1 and 4.2; the bound holds for dot products of length ``m`` with or without FMA, in
   any blocking, so for every BLAS), and in the Frobenius norm
   ``||sum_j |x~_j| |a_j|^T|| <= sum_j ||c_j|| <= n_i C``. float64: a block's product
   (depth ``b`` = the block's rows) and the float64 sum of the client's blocks (depth
   ``m``): ``||e(D)|| <= (gamma_b + gamma_m (1 + gamma_b)) n_i C``. float32: the products
   run in float32 on sub-blocks of :data:`F32_SUB_ROWS` rows, and the sub-blocks' partial
   sums are widened and added in float64 (depth at most ``n_i``):
   ``||e(D)|| <= (gamma32_s + gamma_n (1 + gamma32_s)) n_i C`` with ``s`` the sub-block
   rows. With the scaled ``C' 2^e >= 2^-500``, no float32 partial sum overflows, and the
   products that underflow (absolute error ``2^-150`` in float32, ``2^-1075`` in float64
   each) add less than ``2^-41 C`` for any data of fewer than ``2^38`` rows times
   ``sqrt(n_params)``.

So ``||S(D) - S(D')|| <= 2C + ||e(D)|| + ||e(D')|| <= 2C (1 + slack)`` with
``slack = n_max (gamma + gamma' (1 + gamma)) + 2^-40``, what :func:`rounding_slack` returns
and what the client mechanism multiplies its noise by (so the Gaussian mechanism's
guarantee holds for the numbers the code computes). In float64 this is about ``2e-9`` for
3,000-row clients (any blocking); in float32 about ``6e-3`` (:data:`F32_SUB_ROWS` = 32):
0.6% more noise, growing with the client's size, which is why float32 is an option and
not the default (summing whole 2,048-row blocks in float32 would cost about 37%). Before
issue 22 the slack counted the rounding of one of the two neighbouring datasets only
(``n gamma_b / 2``), and a clip factor of a tiny ``C`` could be subnormal (inexact).

Rows this fast path cannot handle (squared norm out of range, or logits that overflow) are
returned as "hard": the caller computes them with the overflow-safe float64 path of
:class:`dpprecond.fl.models.LinearSoftmax`.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, overload

import numpy as np

from dpprecond.fl.backend import NumpyBackend, backend_of

__all__ = ["DEFAULT_BLOCK_ROWS", "F32_SUB_ROWS", "SHRINK", "SHRINK32",
           "clipped_sums", "rounding_slack", "scale_exponent",
           "set_kernel_threads"]

#: Rows per block of the fused pass (numpy backend).
DEFAULT_BLOCK_ROWS = 2048
#: Rows per block with the torch backend (one block is one set of device kernels).
TORCH_BLOCK_ROWS = 16384
#: Rows of a float32 sub-block: the depth of a float32 partial sum (see the docstring).
F32_SUB_ROWS = 32
_SQ_LIMIT = 1e280
#: A block of fewer elements than this runs without the thread pool.
_SERIAL_ELEMENTS = 1 << 20

#: The factor every clipped contribution carries, float64 rows (see the module docstring).
SHRINK = 1.0 - 2.0**-30
#: The same for float32 rows (covers the rounding of the scaled residual to float32).
SHRINK32 = 1.0 - 2.0**-20

_U64 = 2.0**-53
_U32 = 2.0**-24


def _gamma(m: int, u: float) -> float:
    m = max(int(m), 1)
    return m * u / (1.0 - m * u)


def rounding_slack(max_client_rows: int, dtype: Any = np.float64,
                   block_rows: int | None = None) -> float:
    """Relative excess of the computed clipped sums' sensitivity over ``2C``.

    ``n (gamma + gamma' (1 + gamma)) + 2^-40`` with ``n = max_client_rows``. float32 rows:
    ``gamma = gamma32_s`` (``s = min(F32_SUB_ROWS, n)``) and ``gamma' = gamma_n``. float64
    rows: ``gamma = gamma_b`` and ``gamma' = gamma_m`` for blocks of ``b = block_rows``
    rows (``m`` blocks per client); ``block_rows=None`` takes the worst blocking
    (``b = m = n``), which holds for every backend and block size. ``dtype`` may be a
    numpy or a torch dtype. Derivation: the module docstring.
    """
    n = max(1, int(max_client_rows))
    if _as_np_dtype(dtype) == np.float32:
        g, g2 = _gamma(min(F32_SUB_ROWS, n), _U32), _gamma(n, _U64)
    elif block_rows is None:
        g = g2 = _gamma(n, _U64)
    else:
        b = max(1, min(int(block_rows), n))
        g, g2 = _gamma(b, _U64), _gamma(math.ceil(n / b), _U64)
    return n * (g + g2 * (1.0 + g)) + 2.0**-40


def scale_exponent(clip_norm: float, wide: bool) -> int:
    """``e`` with ``C' 2^e`` in ``[1, 2)``, ``C'`` the largest norm a fast-path contribution
    can have: ``min(C, 2^100)`` in float32 (rows of norm ``>= 2^100 / sqrt(k)`` are hard and
    ``||r|| <= sqrt(2)``), ``C`` in float64, scaled only outside ``[2^-500, 2^500]`` (the
    usual float64 run is unscaled, bit for bit)."""
    if not wide:
        return 0 if 2.0**-500 <= clip_norm <= 2.0**500 else 1 - math.frexp(clip_norm)[1]
    return 1 - math.frexp(min(clip_norm, 2.0**100))[1]


# -- the thread pool ------------------------------------------------------------------------

_THREADS: int | None = None
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def set_kernel_threads(n_threads: int | None) -> None:
    """Threads of the numpy kernel's pool (``None``: ``os.cpu_count()``; 1: no pool)."""
    global _THREADS
    _THREADS = None if n_threads is None else max(1, int(n_threads))


def _pool(size: int) -> ThreadPoolExecutor:
    """A pool kept between rounds (starting threads every round cost ~1 ms on small data)."""
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE != size:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL, _POOL_SIZE = ThreadPoolExecutor(max_workers=size,
                                                   thread_name_prefix="dpprecond-kernel"), size
        return _POOL


def _forget_pool() -> None:  # a forked child has no pool threads: start its own
    global _POOL, _POOL_SIZE
    _POOL, _POOL_SIZE = None, 0


os.register_at_fork(after_in_child=_forget_pool)


def _units(bounds: np.ndarray, block_rows: int) -> list[tuple[int, int, int]]:
    units = []
    for i in range(len(bounds) - 1):
        for lo in range(int(bounds[i]), int(bounds[i + 1]), block_rows):
            units.append((i, lo, min(int(bounds[i + 1]), lo + block_rows)))
    return units


def _as_np_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a numpy or a torch dtype."""
    if type(dtype).__module__.startswith("torch"):
        return np.dtype(str(dtype).removeprefix("torch."))
    return np.dtype(dtype)


def _dtype_of(X: Any) -> np.dtype:
    return _as_np_dtype(X.dtype)


@overload
def clipped_sums(X: Any, y: np.ndarray, W: np.ndarray, bounds: np.ndarray,
                 clip_norm: float, x_sq_norms: Any, *, block_rows: int | None = ...,
                 n_threads: int | None = ..., return_counts: Literal[False] = ...
                 ) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def clipped_sums(X: Any, y: np.ndarray, W: np.ndarray, bounds: np.ndarray,
                 clip_norm: float, x_sq_norms: Any, *, block_rows: int | None = ...,
                 n_threads: int | None = ..., return_counts: Literal[True]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def clipped_sums(X: Any, y: np.ndarray, W: np.ndarray, bounds: np.ndarray,
                 clip_norm: float, x_sq_norms: Any, *,
                 block_rows: int | None = None,
                 n_threads: int | None = None,
                 return_counts: bool = False) -> Any:
    """Per-client clipped gradient sums of a linear softmax head, and the hard rows.

    Parameters
    ----------
    X : array of shape (n, d), float64 or float32
        Client-contiguous rows: a numpy array, or a torch tensor (the torch backend; the
        kernel runs on its device).
    y : ndarray of shape (n,)
        Labels.
    W : ndarray of shape (d + 1, k) or (K, d + 1, k)
        Shared parameters, or one set per client (last row: the bias).
    bounds : ndarray of shape (K + 1,)
        Client boundaries.
    clip_norm : float
        ``C`` (``inf``: no clipping, no shrink).
    x_sq_norms : array of shape (n,), float64
        ``||x_j||^2`` of the rows as given (of the float32 rows when ``X`` is float32), on
        the same backend as ``X``.
    block_rows, n_threads
        Block size (``None``: 2,048 rows with numpy, 16,384 with torch) and pool size
        (``None``: :func:`set_kernel_threads`'s setting, else ``os.cpu_count()``).
    return_counts : bool
        Also count, per client, the rows whose per-example gradient norm is at most
        ``clip_norm`` (adaptive clipping's statistic,
        :class:`~dpprecond.fl.tasks.RecordCountTask`), from the norms ``||x~_j|| ||r_j||``
        the clip factors are computed from: no second pass over ``X``.

    Returns
    -------
    sums : ndarray of shape (K, d + 1, k), float64
        Without the hard rows (host numpy array whatever the backend).
    hard : ndarray of int
        Indices of the rows left out (to be handled by the overflow-safe path).
    counts : ndarray of shape (K,), float64
        Only with ``return_counts``: each client's rows, hard rows left out, with computed
        norm ``<= clip_norm`` (every row when ``clip_norm`` is infinite). A row's
        indicator is a function of that row and the public parameters alone, so the
        count's replace-one sensitivity is 1 whatever the rounding of the norm.
    """
    be = backend_of(X)
    numpy = isinstance(be, NumpyBackend)
    dtype = _dtype_of(X)
    wide = dtype != np.float64
    d = X.shape[1]
    k = W.shape[-1]
    per_client = W.ndim == 3
    Ws = W if per_client else W[None]
    # the classes-major layout (k, rows): the logits as W^T X_b^T and the sum as A X_b
    # (A = R_b^T, the clipped residuals), the faster layouts with OpenBLAS (the softmax's
    # reductions over the classes become elementwise operations over k contiguous rows)
    WxT = be.asarray(np.ascontiguousarray(Ws[:, :-1].transpose(0, 2, 1), dtype=dtype))
    bias = be.asarray(np.ascontiguousarray(Ws[:, -1, :, None], dtype=dtype))
    clip = not np.isinf(clip_norm)
    # float32: rows of norm >= 2^100 / sqrt(k) take the safe path (docstring, 1.)
    sq_limit = min(_SQ_LIMIT, 2.0**200 / k) if wide else _SQ_LIMIT
    e = scale_exponent(clip_norm, wide) if clip else 0
    top, scaled_clip = 2.0**e, clip_norm * 2.0**e  # exact powers of two (docstring, 1.)
    shrink = SHRINK32 if wide else SHRINK
    if block_rows is None:
        block_rows = DEFAULT_BLOCK_ROWS if numpy else TORCH_BLOCK_ROWS
    units = _units(bounds, block_rows)
    partial = be.zeros((len(units), k, d + 1), np.float64)  # transposed contributions
    hard_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(units)
    inside = np.zeros(len(units), dtype=np.int64)  # per block: rows within the clip
    labels = be.label_index(y)
    columns = be.label_index(np.arange(max((hi - lo for _, lo, hi in units), default=0)))

    def one(u: int) -> None:
        i, lo, hi = units[u]
        w = i if per_client else 0
        Xb = X[lo:hi]
        with be.errstate():  # such rows become "hard"
            L = WxT[w] @ Xb.T  # (k, rows): the logits, one column per row
            L += bias[w]
            top_logit = be.col_max(L)
        sq = x_sq_norms[lo:hi]
        hard = ~be.isfinite(top_logit) | ~(sq < sq_limit)
        with be.errstate():
            L -= top_logit
            be.exp_(L)
            L /= be.col_sum(L)
        L[labels[lo:hi], columns[:hi - lo]] -= 1.0
        if wide:  # clip factors from float64 norms of the float32 values (docstring, 1.)
            L = be.astype(L, np.float64)
        if clip:
            r = be.sqrt(be.col_sq_norms(L))
            with be.errstate():  # min(1, C / n_j) 2^e, never subnormal (docstring, 1.)
                norms = be.sqrt(sq + 1.0) * r
                factor = be.minimum(scaled_clip / norms, top)
            L *= be.where(be.isfinite(factor), factor, top) * shrink
        hard_np = be.to_numpy(hard)
        if return_counts:  # a hard row is counted by the caller, from the safe path
            within = ~hard_np if not clip else be.to_numpy(norms <= clip_norm) & ~hard_np
            inside[u] = int(np.count_nonzero(within))
        if hard_np.any():
            L[:, hard] = 0.0
            hard_parts[u] = np.flatnonzero(hard_np) + lo
        with be.errstate():  # hard rows' entries are zeroed
            if wide:
                A = be.astype(L, dtype)  # one rounding of the scaled residual (docstring)
                partial[u, :, :-1] = be.sub_block_sums(A, Xb, F32_SUB_ROWS)
                partial[u, :, -1] = be.astype(A, np.float64).sum(1)
            else:
                partial[u, :, :-1] = L @ Xb
                partial[u, :, -1] = L.sum(1)

    threads = min(n_threads or _THREADS or os.cpu_count() or 1, len(units))
    small = X.shape[0] * d < _SERIAL_ELEMENTS
    if threads <= 1 or not numpy or small:
        for u in range(len(units)):
            one(u)
    else:
        from dpprecond._threads import serial_blas

        with serial_blas():
            list(_pool(threads).map(one, range(len(units))))
    K = len(bounds) - 1
    out = be.zeros((K, k, d + 1), np.float64)
    for u, (i, _, _) in enumerate(units):  # in block order: independent of the scheduling
        out[i] += partial[u]
    if e:
        out *= 2.0**-e
    hard_rows = np.concatenate(hard_parts) if units else np.zeros(0, dtype=np.int64)
    sums = np.ascontiguousarray(be.to_numpy(out).transpose(0, 2, 1))
    if not return_counts:
        return sums, hard_rows
    counts = np.zeros(K, dtype=np.float64)
    for u, (i, _, _) in enumerate(units):
        counts[i] += inside[u]
    return sums, hard_rows, counts
