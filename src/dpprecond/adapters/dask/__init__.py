"""Private PCA on Dask: the passes over the rows run on the dask scheduler.

Needs the optional extra: ``pip install 'dpprecond[dask]'`` (``dask[array]`` and
``distributed``); importing this package without Dask raises an ``ImportError`` that says
so (``import dpprecond`` never imports Dask).

:func:`dpprecond.pca.fit_private_pca` and :class:`dpprecond.PrivatePCA` accept a dask array
directly: importing this package registers :class:`DaskRows` as the row source of dask
arrays with :func:`dpprecond.pca.rows.register_row_source` (and
:func:`~dpprecond.pca.rows.make_rows` imports it on the first dask array it is given, so
``pca`` never imports the adapter); :class:`DaskRows` is the row source they build, and
:func:`from_npy` reads a ``.npy`` file chunk by chunk on the
workers (for zarr, ``dask.array.from_zarr``). Every pass over the data is a sum of
per-row-chunk terms computed on the workers by the same pure block functions as the
in-memory path (:mod:`dpprecond.pca.rows`); every noise draw and every release happens on
the driver.
See docs/dask.md (cluster use, chunking, and what the workers must be trusted with).
"""

from dpprecond.adapters.dask._require import require_dask

require_dask()

from dpprecond._validation import is_dask_array  # noqa: E402
from dpprecond.adapters.dask.files import NpyRows, from_npy  # noqa: E402
from dpprecond.adapters.dask.rows import DaskRows, whole_rows  # noqa: E402
from dpprecond.pca.rows import register_row_source  # noqa: E402

register_row_source("dask", is_dask_array, DaskRows.from_data)

__all__ = ["DaskRows", "NpyRows", "from_npy", "whole_rows"]
