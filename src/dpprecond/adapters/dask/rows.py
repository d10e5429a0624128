"""The clipped rows of ``A`` over a dask array: every pass is a sum of per-chunk terms.

:class:`DaskRows` is :class:`dpprecond.pca.rows.ClippedRows` for a dask array ``X``: the
same row map (step 1, optional centering, see :mod:`dpprecond.pca.rows`), the same passes,
the same interface. A pass maps one pure block function of :mod:`dpprecond.pca.rows` over
the row chunks of ``X`` (``map_blocks``/``blockwise``), so each term is computed on the
worker that reads the chunk, and adds the per-chunk terms with dask's reduction tree (on
the workers too); only the sums (``d x d``, ``d``, a few counts) or the per-row results the
power iteration asks for (``A M``, the norms, a few rows) come back to the driver as numpy
arrays. The methods of :mod:`dpprecond.pca.methods` then draw all noise on the driver from
their own generator, exactly as for in-memory data.

Whole rows per chunk: clipping scales a row by a factor computed from the whole row, so a
chunk that held part of a row would clip the part (silently wrong, and the sensitivity
bound would no longer hold). :func:`whole_rows` rechunks the column axis to a single chunk
(the row chunks are kept: one chunk is one block, and its size sets the memory per task).

Privacy: the per-chunk terms and the sums that leave the workers are exact functions of
the clipped rows, not private releases. The workers, the scheduler and the network between
them must be trusted like the data owner's own machine; only the driver's outputs (the
noisy releases) are differentially private.

Floating point: the terms are the same as in memory; only their summation order differs
(a tree over chunks instead of a loop over blocks). :meth:`DaskRows.rounding_slack`
bounds the rounding with the largest chunk and the number of chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from dpprecond._validation import is_dask_array
from dpprecond.clipping import check_width
from dpprecond.pca.rows import (
    DEFAULT_BLOCK_BYTES,
    block_gram,
    block_rows_for,
    clip_rows,
    count_recentered_clipped,
    finish_gram,
    nonfinite_error,
    norms_of,
    raw_gram_allowed,
    rounding_slack_bound,
    rows_t_times,
    rows_times,
    scale_rows,
    scan_rows,
)

__all__ = ["DaskRows", "whole_rows"]

_F64 = np.dtype(np.float64)


def whole_rows(X: da.Array) -> da.Array:
    """``X`` with its column axis in one chunk, so that every chunk holds whole rows."""
    return X if X.numblocks[1] == 1 else X.rechunk({1: -1})


# -- the per-chunk tasks: packaging around the pure functions of pca/rows.py -------------
# (module-level, so that distributed workers unpickle them by reference)


def _scan_task(raw: np.ndarray, row_norm: float) -> np.ndarray:
    scan = scan_rows(raw, row_norm)
    row, col = scan.first_bad if scan.first_bad is not None else (-1, -1)
    return np.array([[scan.n_clipped, int(scan.unclipped), row, col]], dtype=np.int64)


def _column_sum_task(raw: np.ndarray, row_norm: float) -> np.ndarray:
    return scale_rows(raw, row_norm).sum(axis=0)[None]


def _recentered_task(raw: np.ndarray, row_norm: float, mean: np.ndarray) -> np.ndarray:
    return np.array([[count_recentered_clipped(raw, row_norm, mean)]], dtype=np.int64)


def _gram_task(raw: np.ndarray, row_norm: float, mean: np.ndarray | None,
               use_raw: np.ndarray, block_id: tuple[int, ...] | None = None) -> np.ndarray:
    d = raw.shape[1]
    raw_block = bool(use_raw[block_id[0]]) if block_id is not None else False
    out = np.zeros((1, 2, d, d))  # [clipped-row terms, raw-row terms] (see finish_gram)
    out[0, int(raw_block)] = block_gram(raw, row_norm, mean, raw_block)
    return out


def _norms_task(raw: np.ndarray, row_norm: float, mean: np.ndarray | None) -> np.ndarray:
    return norms_of(clip_rows(raw, row_norm, mean))


def _times_task(raw: np.ndarray, M: np.ndarray, row_norm: float,
                mean: np.ndarray | None) -> np.ndarray:
    return rows_times(clip_rows(raw, row_norm, mean), M)


def _t_times_task(raw: np.ndarray, D: np.ndarray, row_norm: float,
                  mean: np.ndarray | None) -> np.ndarray:
    return rows_t_times(clip_rows(raw, row_norm, mean), D)[None]


def _block_sum_task(raw: np.ndarray, func: Any, row_norm: float, mean: np.ndarray | None,
                    *args: Any) -> np.ndarray:
    return func(clip_rows(raw, row_norm, mean), *args)[None]


def _rows_task(raw: np.ndarray, local: np.ndarray, row_norm: float,
               mean: np.ndarray | None) -> np.ndarray:
    return clip_rows(raw, row_norm, mean)[local]


@dataclass
class DaskRows:
    """The rows of ``A`` as a view of a dask array ``X`` (see the module docstring).

    Build with :meth:`from_data`; center with :meth:`centered`. Nothing is persisted: every
    pass reads ``X`` through its graph again (from disk, zarr or wherever it lives), one
    row chunk per task, so the memory of a worker is a few chunks whatever ``n``.

    Attributes
    ----------
    X : dask.array.Array of shape (n, d)
        The raw data with its column axis in one chunk (:func:`whole_rows`); any real
        dtype (each chunk is read as float64 by the task). NaN or infinity is refused by
        the first pass (:meth:`from_data`).
    row_norm : float
        The public bound on the raw row norms.
    block_rows : int
        Bound on the rows of one block in :meth:`rounding_slack`: the largest row chunk,
        and at least the in-memory block length of ``block_bytes`` (so that both paths
        inflate their noise alike; a larger bound is still a bound).
    n_clipped : int
        Rows scaled down in step 1 (a diagnostic for the data owner, not a release).
    mean : ndarray of shape (d,) or None
        The mean subtracted in step 2, in the units of ``u`` (``None``: uncentered).
    n_clipped_centered : int
        Rows scaled down again after centering.
    """

    X: Any  # a dask array (Any: dask's map_blocks stubs reject module-level tasks)
    row_norm: float
    block_rows: int
    n_clipped: int
    mean: np.ndarray | None = None
    n_clipped_centered: int = 0
    _unclipped_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _norms: np.ndarray | None = None

    @classmethod
    def from_data(cls, X: Any, row_norm: float, *,
                  block_bytes: int = DEFAULT_BLOCK_BYTES) -> DaskRows:
        """Step 1 for a real 2-D dask array ``X`` and a public ``row_norm > 0``.

        The column axis is rechunked to one chunk (:func:`whole_rows`). This first pass
        (one task per row chunk) also checks the values: ``ValueError`` naming the first
        NaN or infinity in row order, as for in-memory data.
        """
        if not is_dask_array(X):
            raise TypeError(f"DaskRows needs a dask.array.Array, got {type(X).__name__}; "
                            "use dpprecond.pca.rows.ClippedRows (or make_rows) for numpy "
                            "and memory-mapped arrays.")
        if X.ndim != 2:
            raise ValueError(f"Expected X to be a 2-D dask array, got shape {X.shape}.")
        X = whole_rows(X)
        d = int(X.shape[1])
        check_width("X", d)
        row_norm = float(row_norm)
        nb = X.numblocks[0]
        scans = X.map_blocks(_scan_task, row_norm, chunks=((1,) * nb, (4,)), dtype=np.int64,
                             meta=np.empty((0, 0), dtype=np.int64)).compute()
        bad = np.flatnonzero(scans[:, 2] >= 0)
        if bad.size:
            j = int(bad[0])
            offset = int(sum(X.chunks[0][:j]))
            raise nonfinite_error(offset + int(scans[j, 2]), int(scans[j, 3]))
        block_rows = max(block_rows_for(d, block_bytes), max(X.chunks[0], default=0))
        return cls(X, row_norm, block_rows, int(scans[:, 0].sum()),
                   _unclipped_blocks=scans[:, 1].astype(bool))

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``."""
        n, d = self.X.shape
        return int(n), int(d)

    @property
    def n_blocks(self) -> int:
        """Number of row chunks (one task each per pass)."""
        return int(self.X.numblocks[0])

    def _per_block(self, func: Any, *args: Any, width: tuple[int, ...],
                   dtype: Any = _F64) -> da.Array:
        """``func`` on every chunk, each giving one ``(1, *width)`` term (not yet summed)."""
        chunks = ((1,) * self.n_blocks, *((w,) for w in width))
        new_axis = list(range(2, 1 + len(width))) or None
        return self.X.map_blocks(func, *args, chunks=chunks, new_axis=new_axis, dtype=dtype,
                                 meta=np.empty((0,) * (1 + len(width)), dtype=dtype))

    @property
    def norms(self) -> np.ndarray:
        """l2 norms of the rows of ``A`` as computed, shape (n,) (one pass, then cached)."""
        if self._norms is None:
            self._norms = self.X.map_blocks(
                _norms_task, self.row_norm, self.mean, drop_axis=1, dtype=_F64,
                chunks=(self.X.chunks[0],), meta=np.empty((0,), dtype=_F64)).compute()
        return self._norms

    def column_sum(self) -> np.ndarray:
        """``sum_i u_i`` (step 1 rows, before centering), shape (d,)."""
        d = self.shape[1]
        return self._per_block(_column_sum_task, self.row_norm, width=(d,)).sum(
            axis=0).compute()

    def centered(self, mean: np.ndarray) -> DaskRows:
        """The same rows centered at ``mean`` (units of ``u``) and re-clipped to norm 1.

        ``mean`` must be public or already released, and finite. One pass counts the rows
        clipped again (a diagnostic).
        """
        mean = np.asarray(mean, dtype=np.float64)
        n_over = int(self._per_block(_recentered_task, self.row_norm, mean, width=(1,),
                                     dtype=np.int64).sum().compute())
        return DaskRows(self.X, self.row_norm, self.block_rows, self.n_clipped, mean, n_over,
                        _unclipped_blocks=np.zeros_like(self._unclipped_blocks))

    def rounding_slack(self, n_terms: int | None = None) -> float:
        """Relative excess of a computed chunk-sum release over its exact sensitivity.

        :func:`dpprecond.pca.rows.rounding_slack_bound` with ``block_rows`` and the number
        of chunks (the reduction tree adds at most that many partial sums along one
        chain). Noise standard deviations are multiplied by ``1 + rounding_slack()``.
        """
        n, d = self.shape
        n = n if n_terms is None else n_terms
        return rounding_slack_bound(n, d, self.block_rows, self.n_blocks)

    # -- passes ---------------------------------------------------------------------------

    def gram(self) -> np.ndarray:
        """``A^T A`` (symmetric, shape (d, d)), one pass over ``X``."""
        d = self.shape[1]
        raw_ok = raw_gram_allowed(self.row_norm, self.mean)
        use_raw = self._unclipped_blocks & raw_ok
        parts = self._per_block(_gram_task, self.row_norm, self.mean, use_raw,
                                width=(2, d, d)).sum(axis=0).compute()
        return finish_gram(parts[0], parts[1], self.row_norm, raw_ok)

    def block_sum(self, func: Any, *args: Any, shape: tuple[int, ...],
                  row_scaled: bool = False, row_sq: bool = False) -> np.ndarray:
        """``sum_b func(A_b, *args)`` over the row chunks, each term computed on a worker.

        ``func`` must be a module-level function (workers unpickle it by reference).
        ``row_scaled`` and ``row_sq`` are accepted for the interface and not used (every
        chunk's rows are materialized on its worker).
        """
        del row_scaled, row_sq
        return self._per_block(_block_sum_task, func, self.row_norm, self.mean, *args,
                               width=tuple(shape)).sum(axis=0).compute()

    def times(self, M: np.ndarray) -> np.ndarray:
        """``A @ M``, shape (n, m), one pass over ``X`` (the result comes to the driver)."""
        M = np.asarray(M, dtype=np.float64)
        return self.X.map_blocks(_times_task, M, self.row_norm, self.mean, dtype=_F64,
                                 chunks=(self.X.chunks[0], (M.shape[1],)),
                                 meta=np.empty((0, 0), dtype=_F64)).compute()

    def t_times(self, D: np.ndarray) -> np.ndarray:
        """``A^T @ D`` for ``D`` of shape (n, m), one pass over ``X``.

        ``D`` (on the driver) is cut into the row chunks of ``X``; each task gets its own
        piece.
        """
        D = np.asarray(D, dtype=np.float64)
        d, m = self.shape[1], D.shape[1]
        Dd = da.from_array(D, chunks=(self.X.chunks[0], (m,)), name=False)
        terms = da.blockwise(_t_times_task, "ijk", self.X, "ia", Dd, "ib", self.row_norm,
                             None, self.mean, None, new_axes={"j": d, "k": m},
                             adjust_chunks={"i": 1}, concatenate=True, dtype=_F64,
                             meta=np.empty((0, 0, 0), dtype=_F64))
        return terms.sum(axis=0).compute()

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """The rows ``idx`` of ``A`` (sorted indices), shape (len(idx), d).

        Only the chunks that hold one of the rows are read; each task clips its whole
        chunk (as the other passes do) and returns the rows asked for.
        """
        idx = np.asarray(idx)
        d = self.shape[1]
        if idx.size == 0:
            return np.empty((0, d))
        bounds = np.concatenate([[0], np.cumsum(self.X.chunks[0])])
        cuts = np.searchsorted(idx, bounds)
        pieces = []
        for j in range(self.n_blocks):
            a, b = int(cuts[j]), int(cuts[j + 1])
            if a == b:
                continue
            local = idx[a:b] - bounds[j]
            pieces.append(self.X.blocks[j].map_blocks(
                _rows_task, local, self.row_norm, self.mean, chunks=((b - a,), (d,)),
                dtype=_F64, meta=np.empty((0, 0), dtype=_F64)))
        return da.concatenate(pieces).compute()
