"""Adapters that run dpprecond's algorithms on external engines.

Adapters move arrays and configurations; they never contain the mathematics, which stays
in the engine-free modules (:mod:`dpprecond.fl`, :mod:`dpprecond.pca`). Each adapter is an
optional extra and is imported only on request:

- :mod:`dpprecond.adapters.flower`: DP federated learning on Flower (``dpprecond[flower]``).
- :mod:`dpprecond.adapters.dask`: private PCA of dask arrays, on threads or a
  ``dask.distributed`` cluster (``dpprecond[dask]``).
"""
