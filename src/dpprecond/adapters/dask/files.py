"""A ``.npy`` file as a dask array whose tasks read their own rows (one open per chunk).

``dask.array.from_array(np.load(path, mmap_mode="r"))`` works on threads, but it ships the
memory map itself: a ``dask.distributed`` worker in another process receives a pickled
``numpy.memmap``, which numpy pickles as a full in-memory copy of the data. And the pages
read stay mapped (counted in the resident memory) until the map is dropped.
:func:`from_npy` gives every task only the path: the task opens the file and reads its
rows into a new array, so a worker holds one chunk at a time and the file can live on
storage shared by all workers (NFS, a parallel file system). For data in
zarr, use ``dask.array.from_zarr`` instead (it reads chunk by chunk the same way).
"""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from dpprecond._validation import check_int
from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES, block_rows_for

__all__ = ["NpyRows", "from_npy"]


class NpyRows:
    """Read-on-demand rows of a 2-D ``.npy`` file (an array-like for ``da.from_array``).

    A full-width range of rows of a C-order file is read with one ``read`` into a new
    array (no memory map: about three times faster per chunk than mapping the file and
    copying the rows out, measured); any other selection copies out of a fresh memory map.
    Pickles as its path: a task in another process reopens the file (which must be at the
    same path there: shared storage).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        mm = np.load(self.path, mmap_mode="r")
        if mm.ndim != 2:
            raise ValueError(f"Expected a 2-D array in {self.path}, got shape {mm.shape}.")
        self.shape: tuple[int, int] = (int(mm.shape[0]), int(mm.shape[1]))
        self.dtype = mm.dtype
        self.ndim = 2
        self.offset = int(mm.offset)
        self.c_order = bool(mm.flags.c_contiguous)
        del mm

    def _row_range(self, key: Any) -> tuple[int, int] | None:
        """``(lo, hi)`` if ``key`` selects whole consecutive rows, else ``None``."""
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], slice)
                and isinstance(key[1], slice)):
            return None
        n, d = self.shape
        lo, hi, step = key[0].indices(n)
        if step != 1 or key[1].indices(d) != (0, d, 1) or not self.c_order:
            return None
        return lo, max(lo, hi)

    def __getitem__(self, key: Any) -> np.ndarray:
        rows = self._row_range(key)
        if rows is not None:
            lo, hi = rows
            d = self.shape[1]
            with open(self.path, "rb") as f:
                f.seek(self.offset + lo * d * self.dtype.itemsize)
                out = np.fromfile(f, dtype=self.dtype, count=(hi - lo) * d)
            if out.size != (hi - lo) * d:
                raise OSError(f"{self.path} is shorter than its header says (rows {lo}:{hi} "
                              "could not be read); was it truncated?")
            return out.reshape(hi - lo, d)
        mm = np.load(self.path, mmap_mode="r")
        try:
            return np.array(mm[key])  # a copy: the map is dropped on return
        finally:
            del mm


def from_npy(path: str | os.PathLike[str], *, block_rows: int | None = None) -> da.Array:
    """A 2-D ``.npy`` file as a dask array of row chunks (whole rows, one column chunk).

    Parameters
    ----------
    path : str or path-like
        The file (C order is read row block by row block; a Fortran-order file works but
        every chunk then reads across the whole file).
    block_rows : int, optional
        Rows per chunk; default: the in-memory block of
        :data:`dpprecond.pca.rows.DEFAULT_BLOCK_BYTES` (16 MiB of float64 per chunk).

    Returns
    -------
    dask.array.Array
        Chunks of ``(block_rows, d)``; its name depends on the path, the file's size and
        modification time and the chunking (a changed file is a new array).
    """
    src = NpyRows(path)
    d = src.shape[1]
    block_rows = (block_rows_for(d, DEFAULT_BLOCK_BYTES) if block_rows is None
                  else check_int("block_rows", block_rows, low=1))
    stat = os.stat(src.path)
    name = "npy-" + tokenize(os.path.abspath(src.path), stat.st_size, stat.st_mtime_ns,
                             block_rows)
    return da.from_array(src, chunks=(block_rows, d), name=name, asarray=True, fancy=False,
                         meta=np.empty((0, 0), dtype=src.dtype))
