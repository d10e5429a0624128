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

No per-row vector is stored: a block's scale factors are recomputed from the block each
time it is read. The block math (the two steps, the scan of the first pass, a block's Gram
matrix, the rounding bound) is a set of pure module-level functions of one raw block and
public values: :class:`ClippedRows` calls them on consecutive slices of ``X``, and the Dask
adapter (:mod:`dpprecond.adapters.dask`) calls the same functions on the workers, one dask
chunk at a time. :func:`make_rows` picks the one that fits the input.

The input is never converted or copied whole (a float32 or memory-mapped ``X`` is read one
float64 block at a time), and the first pass (:meth:`ClippedRows.from_data`) is also the
check for NaN and infinity. :func:`make_rows` defers that pass to the first pass a method
makes: a Gram pass scans each block just before its product (the block is then read from
memory once), any other pass runs the scan over all of ``X`` first; either way no value is
released before every row was checked.

Passes over the data (each one read of ``X``):

- :meth:`ClippedRows.gram`: ``A^T A`` as a sum of block Gram matrices. A block whose rows
  are all below the bound (no centering, ``1e-100 <= row_norm <= 1e100``) is multiplied as
  raw ``X_b^T X_b`` and scaled by the constant ``(SHRINK / row_norm)^2`` afterwards: the
  same sum up to rounding (the terms are bounded, no cancellation);
- :meth:`ClippedRows.column_sum`: ``sum_i u_i`` for the private mean;
- :meth:`ClippedRows.times`, :meth:`ClippedRows.t_times` and :meth:`ClippedRows.rows`: the
  products and row subsets of the power iteration.

Floating point: a release computed as a float64 sum of ``n`` terms of Frobenius norm at
most ``c`` differs from the exact sum by at most ``gamma_m n c`` (Higham, in any order of
summation; ``m`` the longest chain of roundings of one entry: ``block_rows + n_blocks + 2``
for a pass that adds its blocks' terms one by one, and for the Gram pass, whose BLAS call
adds the terms of up to :func:`gram_group` consecutive blocks (at most
:data:`GRAM_GROUP_ROWS` rows) into one accumulator in an order of its own, the group's rows
plus one addition per group). Two neighbouring
inputs can therefore give computed releases that differ by at most
``sensitivity + 2 gamma_m n c``; :meth:`ClippedRows.rounding_slack` returns that relative
excess, and the callers inflate their noise by it (for ``d = 784``: ``1.4e-6`` at
``n = 10^5`` and ``1.5e-4`` at ``n = 10^7``, set by the Gram pass's groups of ``2^16``
rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
from scipy.linalg import blas as _blas

from dpprecond._validation import is_dask_array
from dpprecond.clipping import (
    SHRINK,
    check_width,
    clip_to_radius,
    gamma,
    row_sq_norms,
    safe_row_norms,
    unit_scale,
)

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "GRAM_GROUP_ROWS",
    "BlockScan",
    "ClippedRows",
    "DataRows",
    "DenseRows",
    "GramSum",
    "RowAdapter",
    "RowSource",
    "add_block_gram",
    "block_gram",
    "block_rows_for",
    "clip_rows",
    "clip_unit_rows",
    "count_recentered_clipped",
    "finish_gram",
    "gram_group",
    "gram_upper",
    "make_rows",
    "mean_sensitivity",
    "noise_inflation",
    "nonfinite_error",
    "norms_of",
    "raw_gram_allowed",
    "recenter_rows",
    "register_row_source",
    "rounding_slack_bound",
    "rows_t_times",
    "rows_times",
    "scale_rows",
    "scan_rows",
    "scan_rows_sq",
]

#: Target size of one materialized block of rows (bytes).
DEFAULT_BLOCK_BYTES = 16 * 2**20
#: Rows whose Gram terms one BLAS accumulator may sum (``dsyrk`` with ``beta = 1``, over
#: :func:`gram_group` consecutive blocks) before that sum is added to the total: one
#: ``d x d`` addition per group instead of one per block (on Fashion-MNIST, with the first
#: pass fused: 0.600 s against 0.660 s for the scan and the Gram pass before, 1.04x numpy's
#: ``X.T @ X``; docs/performance.md), for a longer rounding chain
#: (:func:`rounding_slack_bound`: the noise is inflated by at most ``1 + 2 gamma_m n`` with
#: ``m`` about ``2^16 + n / 2^16``, ``1.5e-4`` at ``n = 10^7``).
GRAM_GROUP_ROWS = 2**16
_RAW_RANGE = (1e-100, 1e100)


def gram_group(block_rows: int) -> int:
    """Blocks of ``block_rows`` rows per Gram accumulator (at least one)."""
    return max(1, GRAM_GROUP_ROWS // max(block_rows, 1))


def mean_sensitivity(n_samples: int) -> float:
    """Replace-one l2 sensitivity of the mean of ``n_samples`` rows of norm <= 1: ``2/n``."""
    return 2.0 / n_samples


class RowSource(Protocol):
    """What the power iteration needs from the rows of ``A`` (each of norm <= 1)."""

    @property
    def norms(self) -> np.ndarray: ...

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

    def block_sum(self, func: Callable[..., np.ndarray], *args: Any,
                  shape: tuple[int, ...], row_scaled: bool = False, row_sq: bool = False,
                  block_rows: int = 8192) -> np.ndarray:
        """``sum_b func(A_b, *args)`` over the row blocks ``A_b`` of ``A`` (one pass).

        ``func`` maps a block of rows (each of norm <= 1) and public ``args`` to an array of
        ``shape``; it must be a module-level function (a cluster pickles it by reference).
        A release built on it has the sensitivity of one row's term. ``row_scaled`` and
        ``row_sq`` (see :meth:`ClippedRows.block_sum`) are accepted and not used: the rows
        are already in memory.
        """
        out = np.zeros(shape)
        for lo in range(0, self.shape[0], block_rows):
            out += func(self.A[lo:lo + block_rows], *args)
        return out


# -- the block math: pure functions of one raw block and public values --------------------


def block_rows_for(d: int, block_bytes: int) -> int:
    """Rows of ``d`` float64 entries in a block of about ``block_bytes`` (at least 64)."""
    return max(64, block_bytes // (8 * max(d, 1)))


class BlockScan(NamedTuple):
    """What the first pass learns from one raw block (:func:`scan_rows`).

    ``n_clipped``: rows scaled down in step 1; ``unclipped``: no row clipped and no row
    prescaled (the block may take the raw Gram path of :func:`block_gram`); ``first_bad``:
    ``(row, column)`` of the first NaN or infinity in the block (block coordinates), or
    ``None``.
    """

    n_clipped: int
    unclipped: bool
    first_bad: tuple[int, int] | None


def nonfinite_error(row: int, col: int) -> ValueError:
    """The error for a NaN or an infinity at ``X[row, col]`` (global coordinates)."""
    return ValueError(f"X contains NaN or infinite entries (first at index {(row, col)}); "
                      "remove or impute them first.")


def scan_rows(raw: Any, row_norm: float) -> BlockScan:
    """The first pass over one raw block: NaN/infinity check and step-1 clipping count."""
    return scan_rows_sq(raw, row_norm)[0]


def scan_rows_sq(raw: Any, row_norm: float) -> tuple[BlockScan, np.ndarray]:
    """:func:`scan_rows`, and the block's squared row norms it computed on the way
    (:func:`dpprecond.clipping.row_sq_norms` of the block read as float64), which the later
    passes may take instead of reading the block for them again."""
    block = np.asarray(raw, dtype=np.float64)
    sq = row_sq_norms(block)
    nu, p = safe_row_norms(block, sq)
    if not np.all(np.isfinite(nu)):  # a NaN or an infinity (this is the read of X)
        bad = np.argwhere(~np.isfinite(block))
        return BlockScan(0, False, (int(bad[0][0]), int(bad[0][1]))), sq
    _, clipped = unit_scale(nu, p, row_norm)
    count = int(np.count_nonzero(clipped))
    return BlockScan(count, count == 0 and bool(np.all(p == 1.0)), None), sq


def scale_rows(raw: Any, row_norm: float, sq: np.ndarray | None = None) -> np.ndarray:
    """Step 1 on one raw block: ``u_i = clip_1(x_i / row_norm)`` (a new float64 array).

    ``sq``: the block's squared row norms if a pass kept them (:func:`scan_rows_sq`; the
    same numbers, so the same rows).
    """
    U = np.array(raw, dtype=np.float64)  # a copy of the block
    nu, pre = safe_row_norms(U, sq)
    post, _ = unit_scale(nu, pre, row_norm)
    if not np.all(pre == 1.0):
        U *= pre[:, None]
    with np.errstate(under="ignore"):
        U *= post[:, None]
    return U


def recenter_rows(U: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Step 2 in place on step-1 rows: ``a_i = clip_1(u_i - mean)``; returns ``U``."""
    return recenter_rows_counted(U, mean)[0]


def clip_unit_rows(U: np.ndarray) -> tuple[np.ndarray, int]:
    """Scale the rows of ``U`` above norm 1 down to norm 1, in place (as computed, every row
    ends with norm <= 1, :mod:`dpprecond.clipping`); returns ``U`` and how many it scaled."""
    nu, pre = safe_row_norms(U)
    post = clip_to_radius(nu, pre, 1.0)
    if not np.all(pre == 1.0):
        U *= pre[:, None]
    with np.errstate(under="ignore"):
        U *= post[:, None]
    return U, int(np.count_nonzero(nu > pre))


def recenter_rows_counted(U: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`recenter_rows`, and the number of rows it scaled down (a diagnostic)."""
    U -= mean
    return clip_unit_rows(U)


def clip_rows(raw: Any, row_norm: float, mean: np.ndarray | None,
              sq: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``A`` for one raw block: step 1, then step 2 if ``mean`` is given
    (``sq`` as in :func:`scale_rows`)."""
    U = scale_rows(raw, row_norm, sq)
    return U if mean is None else recenter_rows(U, mean)


def count_recentered_clipped(raw: Any, row_norm: float, mean: np.ndarray,
                             sq: np.ndarray | None = None) -> int:
    """Rows of one raw block scaled down again by step 2 (a diagnostic)."""
    nu, p = safe_row_norms(scale_rows(raw, row_norm, sq) - mean)
    return int(np.count_nonzero(nu > p))  # true norm nu / p above 1


def rows_times(B: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``B @ M`` for a block of rows ``B`` (b, d) and a skinny ``M`` (d, m).

    Computed as ``(M^T B^T)^T``, the layout in which OpenBLAS runs products with few
    columns fastest here (a 60,000 x 784 float64 matrix, Fashion-MNIST's shape, in blocks
    of 2,674 rows, 11 columns: 27 ms against 45 ms for ``B @ M``, medians of 9; the FL
    kernel holds its blocks the same way, ``dpprecond.fl.kernels``). Every entry is the
    same dot product of ``d`` terms in another order, so the rounding bounds are those of
    ``B @ M``. Returns a Fortran-ordered view.
    """
    return (M.T @ B.T).T


def rows_t_times(B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``B^T @ C`` for a block of rows ``B`` (b, d) and ``C`` (b, m), as ``(C^T B)^T``.

    The same reason and bounds as :func:`rows_times` (33 ms against 66 ms on the same
    blocks with 11 columns); each entry is a sum of the block's ``b`` terms.
    """
    return (C.T @ B).T


def norms_of(B: np.ndarray) -> np.ndarray:
    """l2 norms of the rows of a block of ``A``."""
    return np.sqrt(np.einsum("ij,ij->i", B, B))


def raw_gram_allowed(row_norm: float, mean: np.ndarray | None) -> bool:
    """Whether unclipped blocks may be multiplied raw and scaled once (:func:`block_gram`)."""
    return mean is None and _RAW_RANGE[0] <= row_norm <= _RAW_RANGE[1]


def gram_upper(B: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The upper triangle (diagonal included) of ``B^T B``, the rest zero, shape (d, d).

    For a C-ordered float64 block, one BLAS ``dsyrk`` that writes that triangle only (the
    numbers numpy's ``B.T @ B`` computes there: it calls the same routine, then copies the
    triangle to the other half); ``out``, a Fortran-ordered (d, d) float64 array whose
    strictly lower triangle is zero, is reused as the result's storage (no allocation per
    block). Another layout takes ``numpy.triu(B.T @ B)`` (numpy's numbers again; only for
    a float64 view strided in both directions, which numpy multiplies without BLAS and
    symmetric only to rounding, did the pass before average the two triangles instead).
    The result is C-ordered.
    """
    d = B.shape[1]
    if B.dtype != np.float64 or not B.flags.c_contiguous:
        return np.triu(B.T @ B)
    if out is None:
        out = np.zeros((d, d), order="F")
    # B.T is B^T in Fortran order: C = B^T B in its lower triangle (Fortran), which is the
    # upper triangle of the C-ordered transpose returned.
    out = _blas.dsyrk(1.0, B.T, beta=0.0, c=out, trans=0, lower=1, overwrite_c=1)
    return out.T


class GramSum:
    """The upper triangle of a sum of block Gram matrices ``sum_b B_b^T B_b``.

    The terms of up to ``group`` consecutive blocks go into one Fortran-ordered
    accumulator through BLAS ``dsyrk`` with ``beta = 1`` (its lower triangle, which is the
    upper triangle of the C-ordered transpose); each full group is then added to the
    total. The rounding chain this makes is the one :func:`rounding_slack_bound` counts
    with the same ``group`` (:func:`gram_group` of the block size).
    """

    def __init__(self, d: int, group: int) -> None:
        self._group = max(1, int(group))
        self._total = np.zeros((d, d), order="F")
        self._acc = np.zeros((d, d), order="F")
        self._in_group = 0
        self._total_empty = True
        self._closed = False

    def add(self, B: np.ndarray) -> None:
        """Add ``B^T B`` for a block ``B`` of shape (rows, d) (read as float64)."""
        if self._closed:
            raise RuntimeError("GramSum.add after upper(): the sum was handed out; start a "
                               "new GramSum.")
        B = np.ascontiguousarray(B, dtype=np.float64)
        self._acc = _blas.dsyrk(1.0, B.T, beta=1.0, c=self._acc, trans=0, lower=1,
                                overwrite_c=1)
        self._in_group += 1
        if self._in_group == self._group:
            self._flush()

    def _flush(self) -> None:
        if not self._in_group:
            return
        if self._total_empty:  # the first group's sum is the total: no addition
            self._total, self._acc = self._acc, self._total  # (the zero one accumulates)
            self._total_empty = False
        else:
            self._total += self._acc
            self._acc[...] = 0.0
        self._in_group = 0

    def upper(self) -> np.ndarray:
        """The sum: its upper triangle (diagonal included), the rest zero, C-ordered.

        A view of the accumulator's storage (no copy of the ``d x d`` matrix), so the sum
        is closed: a later :meth:`add` raises.
        """
        self._flush()
        self._closed = True
        return self._total.T


def block_gram(raw: Any, row_norm: float, mean: np.ndarray | None,
               use_raw: bool, sq: np.ndarray | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
    """One block's term of ``A^T A``: its upper triangle (the rest zero), shape (d, d).

    ``use_raw`` (only for a block that :func:`scan_rows` found unclipped, and only when
    :func:`raw_gram_allowed`): ``X_b^T X_b`` of the raw rows, summed apart from the others
    and scaled once by the constant ``(SHRINK / row_norm)^2`` in :func:`finish_gram`;
    otherwise ``A_b^T A_b`` of the clipped rows (``sq`` as in :func:`scale_rows`). ``out``
    as in :func:`gram_upper`.
    """
    return gram_upper(_gram_rows(raw, row_norm, mean, use_raw, sq), out)


def _gram_rows(raw: Any, row_norm: float, mean: np.ndarray | None, use_raw: bool,
               sq: np.ndarray | None) -> np.ndarray:
    """The block a Gram term multiplies: the raw rows (``use_raw``, see :func:`block_gram`)
    or the clipped ones."""
    return np.asarray(raw, dtype=np.float64) if use_raw else clip_rows(raw, row_norm, mean, sq)


def add_block_gram(sums: tuple[GramSum, GramSum], raw: Any, row_norm: float, use_raw: bool,
                   sq: np.ndarray | None = None) -> None:
    """Add one uncentered block's Gram term to ``sums = (clipped, raw)``: the term
    :func:`block_gram` computes, into the accumulator of its kind."""
    sums[1 if use_raw else 0].add(_gram_rows(raw, row_norm, None, use_raw, sq))


def finish_gram(S: np.ndarray, raw: np.ndarray, row_norm: float, raw_ok: bool) -> np.ndarray:
    """``A^T A`` from the summed upper triangles of the clipped-block terms ``S`` and of the
    raw-block terms ``raw`` (:func:`block_gram`): the triangle, mirrored (exactly
    symmetric)."""
    if raw_ok:
        c = SHRINK / row_norm
        with np.errstate(under="ignore"):
            S = S + raw * c * c
    return S + np.triu(S, 1).T


def rounding_slack_bound(n: int, d: int, block_rows: int, n_blocks: int,
                         group: int = 1) -> float:
    """``2 gamma_m n`` with ``m = chain + d + 4`` (see the module docstring).

    ``block_rows`` bounds the rows of a block and ``n_blocks`` the longest chain of
    additions over blocks (a sequential loop, or a reduction tree): ``chain = block_rows +
    n_blocks``. ``group > 1``: a pass also sums the terms of up to ``group`` consecutive
    blocks in one accumulator, in an unknown order, and adds the groups one by one (the
    Gram pass, :func:`gram_group`): ``chain`` is the larger of the two, the group's being
    ``min(n_blocks, group) * block_rows + ceil(n_blocks / group)``.
    """
    chain = block_rows + n_blocks
    if group > 1:
        chain = max(chain, min(n_blocks, group) * block_rows + -(-n_blocks // group))
    return 2.0 * gamma(chain + d + 4) * n


def noise_inflation(rows: Any) -> float:
    """The factor every PCA noise std is multiplied by: ``1 + rows.rounding_slack()``.

    The one place the rounding of the block sums enters the noise (the events keep the
    plan's multipliers; the noise covers the computed sums' excess sensitivity, module
    docstring). Rows that do not bound their rounding (a bare :class:`RowSource`, such as
    a test's exact stand-in) get ``1``.
    """
    slack = getattr(rows, "rounding_slack", None)
    return 1.0 if slack is None else 1.0 + float(slack())


class DataRows(RowSource, Protocol):
    """What :func:`dpprecond.pca.fit_private_pca` needs beyond :class:`RowSource`.

    Implemented by :class:`ClippedRows` (numpy and memory-mapped input) and by
    :class:`dpprecond.adapters.dask.DaskRows` (dask arrays).
    """

    @property
    def n_clipped(self) -> int: ...

    @property
    def n_clipped_centered(self) -> int: ...

    def centered(self, mean: np.ndarray) -> DataRows: ...

    def column_sum(self) -> np.ndarray: ...

    def gram(self) -> np.ndarray: ...

    def rounding_slack(self, n_terms: int | None = None) -> float: ...


# --------------------------------------------------------------------------------------
# Row-source adapters: inputs other than in-memory arrays register themselves here
# --------------------------------------------------------------------------------------


class RowAdapter(NamedTuple):
    """A row source for one kind of input, registered by the adapter that implements it.

    ``accepts(X)`` says whether ``X`` is that kind of input (without importing the engine);
    ``build(X, row_norm, block_bytes=...)`` is step 1 and the first pass for it.
    """

    name: str
    accepts: Callable[[Any], bool]
    build: Callable[..., DataRows]


class _Provider(NamedTuple):
    """Where the adapter of a known kind of input lives, imported when one first arrives."""

    accepts: Callable[[Any], bool]
    module: str
    install: str


#: Registered adapters (by name); filled by the adapters' packages when they are imported.
_ROW_ADAPTERS: dict[str, RowAdapter] = {}

#: The adapters this package knows of without importing them: a dask array imports
#: ``dpprecond.adapters.dask`` (which registers itself) the first time one arrives.
_PROVIDERS: dict[str, _Provider] = {
    "dask": _Provider(is_dask_array, "dpprecond.adapters.dask",
                      "pip install 'dpprecond[dask]'"),
}


def register_row_source(name: str, accepts: Callable[[Any], bool],
                        build: Callable[..., DataRows]) -> None:
    """Register the row source of an external engine (called by its adapter on import).

    Registering a name again replaces it (re-importing an adapter is harmless).
    """
    _ROW_ADAPTERS[name] = RowAdapter(name, accepts, build)


def _adapter_for(X: Any) -> RowAdapter | None:
    """The registered adapter accepting ``X``, importing a known provider on first use."""
    for adapter in _ROW_ADAPTERS.values():
        if adapter.accepts(X):
            return adapter
    for name, provider in _PROVIDERS.items():
        if name not in _ROW_ADAPTERS and provider.accepts(X):
            import importlib

            try:
                importlib.import_module(provider.module)  # registers the adapter
            except ImportError as exc:
                raise ImportError(
                    f"X is a {name} array, which needs the {name} row source "
                    f"({provider.module}): {provider.install}, then pass X again "
                    f"({exc}).") from exc
            if name not in _ROW_ADAPTERS:
                raise ImportError(f"Importing {provider.module} did not register the {name} "
                                  "row source (register_row_source).")
            return _ROW_ADAPTERS[name]
    return None


def make_rows(X: Any, row_norm: float, *, block_bytes: int = DEFAULT_BLOCK_BYTES) -> DataRows:
    """Step 1 and the first pass for ``X``: :class:`ClippedRows`, or a registered adapter's.

    An input that a registered row-source adapter accepts gets that adapter's rows (a dask
    array: ``dpprecond.adapters.dask.DaskRows``, whose passes run on the dask scheduler, a
    ``dask.distributed`` cluster included; the adapter is imported on the first dask
    array); anything else (a numpy or memory-mapped array) gets :class:`ClippedRows`. ``X``
    is validated lazily by the caller (:func:`dpprecond._validation.check_matrix_lazy`).
    """
    adapter = _adapter_for(X)
    if adapter is not None:
        return adapter.build(X, row_norm, block_bytes=block_bytes)
    # the first pass is deferred: a Gram pass (the first release of most methods) scans
    # each block on its way, any other pass scans all of X first
    return ClippedRows.from_data(X, row_norm, block_bytes=block_bytes, defer_scan=True)


@dataclass
class ClippedRows:
    """The rows of ``A`` as a view of the raw data ``X`` (see the module docstring).

    Build with :meth:`from_data`; center with :meth:`centered`. ``X`` is never copied or
    modified. With ``from_data(..., defer_scan=True)`` the first pass is made by the first
    pass a caller asks for (:meth:`gram` scans each block just before its product; every
    other pass, property and :meth:`centered` runs the scan over all of ``X`` first), so
    nothing is computed from the rows before all of them were checked.

    The scale factors of a block are recomputed whenever it is read (an exact,
    deterministic function of the row) from the squared norms of its raw rows, which the
    first pass keeps (one float per row) when they take at most one default block's memory
    (16 MiB: ``n`` up to two million rows), so that later passes need not read the rows for
    them again; otherwise each pass recomputes them. Memory beyond ``X`` is one block of
    rows and those norms (plus ``norms`` when a method asks for them).

    Attributes
    ----------
    X : array of shape (n, d)
        The raw data, of any real dtype (any array that supports row slicing, such as a
        memory-mapped ``.npy``); every block is read as float64, and NaN or infinity is
        refused by the first pass (:meth:`from_data`).
    row_norm : float
        The public bound on the raw row norms.
    block_rows : int
        Rows per materialized block.
    n_clipped : int
        Rows scaled down in step 1 (a diagnostic for the data owner, not a release; a
        property, known after the first pass).
    mean : ndarray of shape (d,) or None
        The mean subtracted in step 2, in the units of ``u`` (``None``: uncentered).
    n_clipped_centered : int
        Rows scaled down again after centering (a property, counted lazily).
    """

    X: np.ndarray
    row_norm: float
    block_rows: int
    #: rows scaled down in step 1, or None before the (deferred) first pass
    _n_clipped: int | None
    mean: np.ndarray | None = None
    _n_clipped_centered: int | None = 0
    _unclipped_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _norms: np.ndarray | None = None
    #: squared norms of the raw rows as the first pass computed them, or None (not kept)
    _sq: np.ndarray | None = None
    #: whether the first pass keeps those norms (:meth:`from_data`'s ``norms_bytes``)
    _keep_norms: bool = True

    @property
    def n_clipped(self) -> int:
        """Rows scaled down in step 1 (a diagnostic, not a release)."""
        self._require_scan()
        assert self._n_clipped is not None
        return self._n_clipped

    def _require_scan(self) -> None:
        """Make the first pass now if it was deferred (:meth:`from_data`)."""
        if self._n_clipped is None:
            self._scan_blocks()

    def _scan_blocks(self, gram: tuple[GramSum, GramSum] | None = None) -> None:
        """The first pass: check every block, count the rows step 1 scales down, note the
        blocks that need no clipping and keep the squared norms (see :meth:`from_data`).

        ``gram = (clipped, raw)`` given (the deferred pass made by :meth:`gram`,
        uncentered rows): each checked block's Gram term is added while the block is in
        cache (:func:`add_block_gram`). A NaN or an infinity raises before :meth:`gram`
        reads the sums, so nothing computed from them leaves.
        """
        n = self.shape[0]
        sq_all = np.empty(n) if self._keep_norms else None
        raw_ok = raw_gram_allowed(self.row_norm, self.mean)
        unclipped = []
        n_clipped = 0
        for lo, hi in self._ranges():
            raw = self.X[lo:hi]
            scan, block_sq = scan_rows_sq(raw, self.row_norm)
            if scan.first_bad is not None:
                raise nonfinite_error(scan.first_bad[0] + lo, scan.first_bad[1])
            n_clipped += scan.n_clipped
            unclipped.append(scan.unclipped)
            if sq_all is not None:
                sq_all[lo:hi] = block_sq
            if gram is not None:  # the scan's norms only where they are kept, as eagerly
                add_block_gram(gram, raw, self.row_norm, raw_ok and scan.unclipped,
                               block_sq if sq_all is not None else None)
        self._n_clipped = n_clipped
        self._unclipped_blocks = np.array(unclipped, dtype=bool)
        self._sq = sq_all

    @property
    def n_clipped_centered(self) -> int:
        """Rows scaled down again after centering (a diagnostic, not a release).

        Counted by the first pass over the centered rows that needs them (the Gram
        matrix), or by a pass of its own when asked for first.
        """
        self._require_scan()
        if self._n_clipped_centered is None:
            assert self.mean is not None
            self._n_clipped_centered = sum(
                count_recentered_clipped(self.X[lo:hi], self.row_norm, self.mean,
                                         self._sq_of(lo, hi))
                for lo, hi in self._ranges())
        return self._n_clipped_centered

    def _sq_of(self, lo: int, hi: int) -> np.ndarray | None:
        """The kept squared norms of the raw rows ``lo:hi`` (None when not kept)."""
        return None if self._sq is None else self._sq[lo:hi]

    def _ranges(self) -> Iterator[tuple[int, int]]:
        n = self.shape[0]
        for lo in range(0, n, self.block_rows):
            yield lo, min(n, lo + self.block_rows)

    @classmethod
    def from_data(cls, X: np.ndarray, row_norm: float, *,
                  block_bytes: int = DEFAULT_BLOCK_BYTES,
                  norms_bytes: int = DEFAULT_BLOCK_BYTES,
                  defer_scan: bool = False) -> ClippedRows:
        """Step 1 for a real 2-D array ``X`` and a public ``row_norm > 0``.

        The first pass also checks the values: ``ValueError`` at the first NaN or
        infinity, naming its position. It keeps the squared norms of the raw rows when
        they take at most ``norms_bytes`` (see the class docstring; 0 keeps none).
        ``defer_scan=True`` makes no pass here: the first pass is made by the first pass
        asked for (the class docstring), with the same checks before anything is computed
        from the rows.
        """
        n, d = X.shape
        check_width("X", d)
        rows = cls(X, float(row_norm), block_rows_for(d, block_bytes), None,
                   _keep_norms=0 < 8 * n <= norms_bytes)
        if not defer_scan:
            rows._scan_blocks()
        return rows

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``."""
        return self.X.shape

    def block(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of ``A`` (a new array)."""
        self._require_scan()
        return clip_rows(self.X[lo:hi], self.row_norm, self.mean, self._sq_of(lo, hi))

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(lo, hi, A[lo:hi])`` for consecutive blocks of rows."""
        n = self.shape[0]
        for lo in range(0, n, self.block_rows):
            hi = min(n, lo + self.block_rows)
            yield lo, hi, self.block(lo, hi)

    @property
    def norms(self) -> np.ndarray:
        """l2 norms of the rows of ``A`` as computed, shape (n,) (one pass, then cached)."""
        if self._norms is None:
            out = np.empty(self.shape[0])
            for lo, hi, B in self.blocks():
                out[lo:hi] = norms_of(B)
            self._norms = out
        return self._norms

    def column_sum(self) -> np.ndarray:
        """``sum_i u_i`` (step 1 rows, before centering), shape (d,).

        A block that needs no prescaling is summed as ``post @ X_b`` (its step-1 factors
        times the raw rows, no copy of a float64 block); other blocks through
        :func:`scale_rows`.
        """
        self._require_scan()
        out = np.zeros(self.shape[1])
        for lo, hi in self._ranges():
            raw = np.asarray(self.X[lo:hi], dtype=np.float64)  # float32 widens exactly
            sq = self._sq_of(lo, hi)
            nu, pre = safe_row_norms(raw, sq)
            if np.all(pre == 1.0):
                post, _ = unit_scale(nu, pre, self.row_norm)
                out += post @ raw
            else:
                out += scale_rows(raw, self.row_norm, sq).sum(axis=0)
        return out

    def centered(self, mean: np.ndarray) -> ClippedRows:
        """The same rows centered at ``mean`` (units of ``u``) and re-clipped to norm 1.

        ``mean`` must be public or already released, and finite. No pass is made here: the
        rows clipped again (a diagnostic) are counted by the next Gram pass.
        """
        self._require_scan()
        mean = np.asarray(mean, dtype=np.float64)
        return ClippedRows(self.X, self.row_norm, self.block_rows, self._n_clipped, mean,
                           None, _unclipped_blocks=np.zeros_like(self._unclipped_blocks),
                           _sq=self._sq, _keep_norms=self._keep_norms)

    def rounding_slack(self, n_terms: int | None = None) -> float:
        """Relative excess of a computed block-sum release over its exact sensitivity.

        ``2 gamma_m n`` with ``m = chain + d + 4`` chained roundings per entry (block
        product and accumulation over blocks, or over the Gram pass's groups of blocks:
        :func:`rounding_slack_bound` with ``group=gram_group(block_rows)``; one product
        with an orthonormal matrix; scaling), for releases whose per-row terms are bounded
        by the sensitivity's own scale (see the module docstring). Noise standard
        deviations are multiplied by ``1 + rounding_slack()``.
        """
        n, d = self.shape
        n = n if n_terms is None else n_terms
        return rounding_slack_bound(n, d, self.block_rows, n // self.block_rows + 1,
                                    gram_group(self.block_rows))

    # -- passes ---------------------------------------------------------------------------

    def gram(self) -> np.ndarray:
        """``A^T A`` (symmetric, shape (d, d)), one pass over ``X``.

        The blocks' Gram terms are summed by :class:`GramSum` (BLAS ``dsyrk`` into one
        accumulator per group of blocks, one triangle); a block that needs no clipping is
        multiplied raw and summed apart (:func:`block_gram`); the sum is mirrored at the
        end. If the first pass was deferred, this pass is it: each block is scanned just
        before its product.
        """
        d = self.shape[1]
        group = gram_group(self.block_rows)
        S, raw = GramSum(d, group), GramSum(d, group)
        raw_ok = raw_gram_allowed(self.row_norm, self.mean)
        if self._n_clipped is None:  # the deferred first pass, fused (uncentered rows)
            assert self.mean is None  # centered() makes the first pass
            self._scan_blocks((S, raw))
            return finish_gram(S.upper(), raw.upper(), self.row_norm, raw_ok)
        if self.mean is not None:  # centered rows: count the re-clipped ones on the way
            n_over = 0
            for lo, hi in self._ranges():
                B, count = recenter_rows_counted(
                    scale_rows(self.X[lo:hi], self.row_norm, self._sq_of(lo, hi)), self.mean)
                S.add(B)
                n_over += count
            self._n_clipped_centered = n_over
            return finish_gram(S.upper(), raw.upper(), self.row_norm, False)
        for j, (lo, hi) in enumerate(self._ranges()):  # raw: no clipped or prescaled row
            add_block_gram((S, raw), self.X[lo:hi], self.row_norm,
                           raw_ok and bool(self._unclipped_blocks[j]), self._sq_of(lo, hi))
        return finish_gram(S.upper(), raw.upper(), self.row_norm, raw_ok)

    def times(self, M: np.ndarray) -> np.ndarray:
        """``A @ M``, shape (n, m), one pass over ``X``.

        An uncentered block that needs no prescaling is computed as ``s * (X_b @ M)`` with
        its step-1 factors ``s`` (no copy of the block); the result is not a release by
        itself (the callers clip its rows before anything is summed and noised).
        """
        self._require_scan()
        n = self.shape[0]
        out = np.empty((n, M.shape[1]))
        for lo, hi in self._ranges():
            raw = self.X[lo:hi]
            sq = self._sq_of(lo, hi)
            if self.mean is None:
                raw = np.asarray(raw, dtype=np.float64)  # float32 widens exactly
                nu, pre = safe_row_norms(raw, sq)
                if np.all(pre == 1.0):
                    post, _ = unit_scale(nu, pre, self.row_norm)
                    out[lo:hi] = rows_times(raw, M)
                    out[lo:hi] *= post[:, None]
                    continue
            out[lo:hi] = rows_times(clip_rows(raw, self.row_norm, self.mean, sq), M)
        return out

    def t_times(self, D: np.ndarray) -> np.ndarray:
        """``A^T @ D`` for ``D`` of shape (n, m), one pass over ``X``."""
        out = np.zeros((self.shape[1], D.shape[1]))
        for lo, hi, B in self.blocks():
            out += rows_t_times(B, D[lo:hi])
        return out

    def block_sum(self, func: Callable[..., np.ndarray], *args: Any,
                  shape: tuple[int, ...], row_scaled: bool = False,
                  row_sq: bool = False) -> np.ndarray:
        """``sum_b func(A_b, *args)`` over the row blocks ``A_b`` of ``A`` (one pass).

        ``func`` maps a block of rows (each of norm <= 1) and public ``args`` to an array of
        ``shape``; it must be a module-level function (a cluster pickles it by reference).
        A release built on it has the sensitivity of one row's term.

        ``row_scaled=True`` declares that ``func`` also accepts ``func(R, *args,
        scale=s)`` meaning the rows ``s_i r_i``: then a block of uncentered rows that needs
        no prescaling is passed raw (widened to float64) with its step-1 factors ``s``
        (exactly the ``post`` that :func:`scale_rows` multiplies by), which spares the copy
        of a float64 block. Other blocks are materialized as usual. ``row_sq=True`` (with
        ``row_scaled``) declares that it also accepts ``sq=q`` there, the squared norms
        :func:`dpprecond.clipping.row_sq_norms` of the raw rows ``R`` (the numbers it would
        compute from ``R``; kept by the first pass, so the block is not read for them).
        """
        self._require_scan()
        out = np.zeros(shape)
        n = self.shape[0]
        fast = row_scaled and self.mean is None
        for lo in range(0, n, self.block_rows):
            hi = min(n, lo + self.block_rows)
            raw = self.X[lo:hi]
            sq = self._sq_of(lo, hi)
            if fast:
                raw = np.asarray(raw, dtype=np.float64)  # float32 widens exactly
                if sq is None and row_sq:
                    sq = row_sq_norms(raw)
                nu, pre = safe_row_norms(raw, sq)
                if np.all(pre == 1.0):
                    post, _ = unit_scale(nu, pre, self.row_norm)
                    out += (func(raw, *args, scale=post, sq=sq) if row_sq
                            else func(raw, *args, scale=post))
                    continue
            out += func(clip_rows(raw, self.row_norm, self.mean, sq), *args)
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
