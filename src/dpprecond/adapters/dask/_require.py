"""The one place that checks that Dask is installed (before anything imports it)."""

from __future__ import annotations


def require_dask() -> None:
    """Raise ``ImportError`` naming the ``dask`` extra if ``dask.array`` cannot be imported."""
    try:
        import dask.array  # noqa: F401
    except ImportError as exc:
        raise ImportError("dpprecond.adapters.dask needs Dask (dask.array; dask.distributed "
                          "for a cluster): pip install 'dpprecond[dask]'") from exc
