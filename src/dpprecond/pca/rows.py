"""The rows ``a_i`` of ``A``, computed block by block from the raw data.

Privacy unit: one row ``x_i`` of ``X`` (replace-one). Every private PCA release is a sum
over rows of a term whose size is bounded because ``||a_i|| <= 1``. That bound must hold for
the rows *as computed*, for every finite input (a row of norm ``1e300`` included), so every
release here is computed from the clipped rows themselves, materialized one block of rows
at a time (never the whole of ``A``, never ``X^T X`` minus a correction, which cancels
catastrophically for a huge row):

1. ``u_i = clip_1(x_i / row_norm)``: divide by the public bound and scale rows still above
   norm 1 down to norm 1 (:func:`dpprecond.clipping.unit_scale`, overflow-safe).
2. Optional centering by a public or released mean ``mu`` (in the units of ``u``):
   ``a_i = clip_1(u_i - mu)``; otherwise ``a_i = u_i``.

Both steps use only the row itself and public (or already released) values, so
neighbouring inputs stay neighbouring. As computed, ``||a_i|| <= 1`` (see
:mod:`dpprecond.clipping`; every row is also multiplied by ``SHRINK = 1 - 2^-30``).

Passes over the data (each one read of ``X``):

- :meth:`ClippedRows.gram`: ``A^T A`` as a sum of block Gram matrices. A block whose rows
  are all below the bound (no centering, ``1e-100 <= row_norm <= 1e100``) is multiplied as
  raw ``X_b^T X_b`` and scaled by the constant ``(SHRINK / row_norm)^2`` afterwards: the
  same sum up to rounding (the terms are bounded, no cancellation);
- :meth:`ClippedRows.column_sum`: ``sum_i u_i`` for the private mean;
- :meth:`ClippedRows.times`, :meth:`ClippedRows.t_times` and :meth:`ClippedRows.rows`: the
  products and row subsets of the power iteration.

Floating point: a release computed as a float64 sum of ``n`` terms of Frobenius norm at
most ``c`` differs from the exact sum by at most ``gamma_m n c`` (Higham; ``m`` the longest
chain of roundings of one entry, at most ``block_rows + n_blocks + 2``). Two neighbouring
inputs can therefore give computed releases that differ by at most
``sensitivity + 2 gamma_m n c``; :meth:`ClippedRows.rounding_slack` returns that relative
excess, and the callers inflate their noise by it (it is below ``1e-6`` for
``n <= 10^7``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dpprecond.clipping import (
    SHRINK,
    check_width,
    clip_to_radius,
    gamma,
    safe_row_norms,
    unit_scale,
)

__all__ = ["DEFAULT_BLOCK_BYTES", "ClippedRows", "DenseRows", "RowSource", "mean_sensitivity"]

#: Target size of one materialized block of rows (bytes).
DEFAULT_BLOCK_BYTES = 16 * 2**20
_RAW_RANGE = (1e-100, 1e100)


def mean_sensitivity(n_samples: int) -> float:
    """Replace-one l2 sensitivity of the mean of ``n_samples`` rows of norm <= 1: ``2/n``."""
    return 2.0 / n_samples


class RowSource(Protocol):
    """What the power iteration needs from the rows of ``A`` (each of norm <= 1)."""

    norms: np.ndarray

    @property
    def shape(self) -> tuple[int, int]: ...

    def times(self, M: np.ndarray) -> np.ndarray: ...

    def t_times(self, D: np.ndarray) -> np.ndarray: ...

    def rows(self, idx: np.ndarray) -> np.ndarray: ...


class DenseRows:
    """An in-memory ``A`` whose rows already have norm at most 1 (checked).

    For kernels called directly on a prepared matrix (tests, benchmarks); the library's own
    entry points build :class:`ClippedRows` from the raw data instead.
    """

    def __init__(self, A: np.ndarray) -> None:
        A = np.asarray(A, dtype=np.float64)
        nu, pre = safe_row_norms(A)
        if np.any(nu > pre * (1.0 + 1e-12)):
            raise ValueError("DenseRows expects rows of l2 norm at most 1; scale the data "
                             "with ClippedRows.from_data(X, row_norm) instead.")
        self.A = A
        self.norms = nu / pre

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``."""
        return self.A.shape

    def times(self, M: np.ndarray) -> np.ndarray:
        """``A @ M``."""
        return self.A @ M

    def t_times(self, D: np.ndarray) -> np.ndarray:
        """``A^T @ D``."""
        return self.A.T @ D

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of ``A`` (a copy)."""
        return self.A[idx]


def _block_rows(d: int, block_bytes: int) -> int:
    return max(64, block_bytes // (8 * max(d, 1)))


@dataclass
class ClippedRows:
    """The rows of ``A`` as a view of the raw data ``X`` (see the module docstring).

    Build with :meth:`from_data`; center with :meth:`centered`. ``X`` is never copied or
    modified; memory beyond it is a few vectors of length ``n`` and one block of rows.

    Attributes
    ----------
    X : ndarray of shape (n, d)
        The raw data (float64, finite; any array that supports row slicing, such as a
        memory-mapped ``.npy``).
    row_norm : float
        The public bound on the raw row norms.
    pre, post : ndarray of shape (n,)
        Step 1 as two factors, ``u_i = (x_i pre_i) post_i`` (``pre_i`` a power of two).
    n_clipped : int
        Rows scaled down in step 1 (a diagnostic for the data owner, not a release).
    mean : ndarray of shape (d,) or None
        The mean subtracted in step 2, in the units of ``u`` (``None``: uncentered).
    pre2, post2 : ndarray of shape (n,) or None
        Step 2 as two factors, ``a_i = ((u_i - mean) pre2_i) post2_i`` (computed by
        :meth:`centered`).
    n_clipped_centered : int
        Rows scaled down again after centering.
    norms : ndarray of shape (n,)
        l2 norms of the rows ``a_i`` (as computed).
    block_rows : int
        Rows per materialized block.
    """

    X: np.ndarray
    row_norm: float
    pre: np.ndarray
    post: np.ndarray
    n_clipped: int
    norms: np.ndarray
    block_rows: int
    mean: np.ndarray | None = None
    pre2: np.ndarray | None = None
    post2: np.ndarray | None = None
    n_clipped_centered: int = 0
    _unclipped_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @classmethod
    def from_data(cls, X: np.ndarray, row_norm: float, *,
                  block_bytes: int = DEFAULT_BLOCK_BYTES) -> ClippedRows:
        """Step 1 for validated finite data ``X`` and a public ``row_norm > 0``."""
        n, d = X.shape
        check_width("X", d)
        block_rows = _block_rows(d, block_bytes)
        pre = np.empty(n)
        post = np.empty(n)
        norms = np.empty(n)
        clipped = np.zeros(n, dtype=bool)
        for lo in range(0, n, block_rows):
            hi = min(n, lo + block_rows)
            nu, p = safe_row_norms(np.asarray(X[lo:hi]))
            q, c = unit_scale(nu, p, row_norm)
            pre[lo:hi], post[lo:hi], clipped[lo:hi] = p, q, c
            with np.errstate(under="ignore"):
                norms[lo:hi] = np.minimum(nu * q, 1.0)
        starts = np.arange(0, n, block_rows)
        unclipped = ~np.logical_or.reduceat(clipped, starts) if n else np.zeros(0, bool)
        return cls(X, float(row_norm), pre, post, int(clipped.sum()), norms, block_rows,
                   _unclipped_blocks=unclipped)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``."""
        return self.X.shape

    def _step1(self, lo: int, hi: int) -> np.ndarray:
        U = np.array(self.X[lo:hi], dtype=np.float64)  # a copy of the block
        pre = self.pre[lo:hi]
        if not np.all(pre == 1.0):
            U *= pre[:, None]
        with np.errstate(under="ignore"):
            U *= self.post[lo:hi, None]
        return U

    def block(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of ``A`` (a new array)."""
        U = self._step1(lo, hi)
        if self.mean is not None:
            U -= self.mean
            pre2 = self.pre2[lo:hi]
            if not np.all(pre2 == 1.0):
                U *= pre2[:, None]
            with np.errstate(under="ignore"):
                U *= self.post2[lo:hi, None]
        return U

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(lo, hi, A[lo:hi])`` for consecutive blocks of rows."""
        n = self.shape[0]
        for lo in range(0, n, self.block_rows):
            hi = min(n, lo + self.block_rows)
            yield lo, hi, self.block(lo, hi)

    def column_sum(self) -> np.ndarray:
        """``sum_i u_i`` (step 1 rows, before centering), shape (d,)."""
        out = np.zeros(self.shape[1])
        n = self.shape[0]
        for lo in range(0, n, self.block_rows):
            hi = min(n, lo + self.block_rows)
            out += self._step1(lo, hi).sum(axis=0)
        return out

    def centered(self, mean: np.ndarray) -> ClippedRows:
        """The same rows centered at ``mean`` (units of ``u``) and re-clipped to norm 1.

        One pass over ``X`` computes the new scale factors and norms. ``mean`` must be
        public or already released, and finite.
        """
        mean = np.asarray(mean, dtype=np.float64)
        n = self.shape[0]
        pre2 = np.empty(n)
        post2 = np.empty(n)
        norms = np.empty(n)
        n_over = 0
        for lo in range(0, n, self.block_rows):
            hi = min(n, lo + self.block_rows)
            nu, p = safe_row_norms(self._step1(lo, hi) - mean)
            q = clip_to_radius(nu, p, 1.0)
            pre2[lo:hi], post2[lo:hi] = p, q
            with np.errstate(under="ignore"):
                norms[lo:hi] = np.minimum(nu * q, 1.0)
            n_over += int(np.count_nonzero(nu > p))  # true norm nu / p above 1
        return ClippedRows(self.X, self.row_norm, self.pre, self.post, self.n_clipped, norms,
                           self.block_rows, mean, pre2, post2, n_over,
                           _unclipped_blocks=np.zeros_like(self._unclipped_blocks))

    def rounding_slack(self, n_terms: int | None = None) -> float:
        """Relative excess of a computed block-sum release over its exact sensitivity.

        ``2 gamma_m n`` with ``m = block_rows + n_blocks + d + 4`` chained roundings per
        entry (block product, accumulation over blocks, one product with an orthonormal
        matrix, scaling), for releases whose per-row terms are bounded by the sensitivity's
        own scale (see the module docstring). Noise standard deviations are multiplied by
        ``1 + rounding_slack()``.
        """
        n, d = self.shape
        n = n if n_terms is None else n_terms
        m = self.block_rows + (n // self.block_rows + 1) + d + 4
        return 2.0 * gamma(m) * n

    # -- passes ---------------------------------------------------------------------------

    def gram(self) -> np.ndarray:
        """``A^T A`` (symmetric, shape (d, d)), one pass over ``X``."""
        n, d = self.shape
        S = np.zeros((d, d))
        raw_ok = self.mean is None and _RAW_RANGE[0] <= self.row_norm <= _RAW_RANGE[1]
        c = SHRINK / self.row_norm
        raw = np.zeros((d, d))
        for j, lo in enumerate(range(0, n, self.block_rows)):
            hi = min(n, lo + self.block_rows)
            if raw_ok and self._unclipped_blocks[j] and np.all(self.pre[lo:hi] == 1.0):
                B = np.asarray(self.X[lo:hi], dtype=np.float64)
                raw += B.T @ B
            else:
                B = self.block(lo, hi)
                S += B.T @ B
        if raw_ok:
            with np.errstate(under="ignore"):
                S += raw * c * c
        return (S + S.T) * 0.5

    def times(self, M: np.ndarray) -> np.ndarray:
        """``A @ M``, shape (n, m), one pass over ``X``."""
        n = self.shape[0]
        out = np.empty((n, M.shape[1]))
        for lo, hi, B in self.blocks():
            np.matmul(B, M, out=out[lo:hi])
        return out

    def t_times(self, D: np.ndarray) -> np.ndarray:
        """``A^T @ D`` for ``D`` of shape (n, m), one pass over ``X``."""
        out = np.zeros((self.shape[1], D.shape[1]))
        for lo, hi, B in self.blocks():
            out += B.T @ D[lo:hi]
        return out

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """The rows ``idx`` of ``A`` (sorted indices), shape (len(idx), d)."""
        idx = np.asarray(idx)
        if idx.size == 0:
            return np.empty((0, self.shape[1]))
        out = np.empty((idx.size, self.shape[1]))
        starts = np.searchsorted(idx, np.arange(0, self.shape[0], self.block_rows))
        starts = np.append(starts, idx.size)
        for j, lo in enumerate(range(0, self.shape[0], self.block_rows)):
            a, b = starts[j], starts[j + 1]
            if a == b:
                continue
            hi = min(self.shape[0], lo + self.block_rows)
            out[a:b] = self.block(lo, hi)[idx[a:b] - lo]
        return out

    def materialize(self) -> np.ndarray:
        """All of ``A`` as one array (for metrics and tests; costs a copy of ``X``)."""
        out = np.empty(self.shape)
        for lo, hi, B in self.blocks():
            out[lo:hi] = B
        return out
