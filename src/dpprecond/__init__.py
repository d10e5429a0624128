"""dpprecond: differentially private learning with cheap preconditioners.

Two systems share one accounting layer (:mod:`dpprecond.accounting`, on Google's
``dp_accounting``), one noise-and-release primitive (:mod:`dpprecond.noise`), one data
layer (:mod:`dpprecond.data`) and one CLI:

- :mod:`dpprecond.pca`: coherence-adaptive private top-k PCA (:class:`PrivatePCA`,
  :func:`fit_private_pca`) and its baselines;
- :mod:`dpprecond.fl`: record-level DP federated learning with the DP-FedSOFIM server-side
  rank-one Fisher preconditioner and its baselines (:func:`run_federated`,
  :func:`simulate`, :class:`FLConfig`);
- :mod:`dpprecond.pipeline`: private PCA features, then federated training, one ledger
  (:func:`run_pipeline`).

The top-level names (``from dpprecond import PrivatePCA, PrivacyLedger, ...``) are the
public API; each is loaded on first use, so ``import dpprecond`` stays cheap (no
scikit-learn, torch or Dask).
"""

from importlib import import_module
from typing import Any

from dpprecond._validation import LargeDeltaWarning
from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger

__version__ = "0.1.0"

#: Each lazily loaded public name and the module that defines it.
_LAZY: dict[str, str] = {
    "PrivatePCA": "dpprecond.pca.estimator",
    "PCAResult": "dpprecond.pca.api",
    "fit_private_pca": "dpprecond.pca.api",
    "FLConfig": "dpprecond.fl.config",
    "ClientData": "dpprecond.fl.data",
    "FLResult": "dpprecond.fl.engine",
    "simulate": "dpprecond.fl.engine",
    "run_federated": "dpprecond.fl.simulator",
    "PipelineResult": "dpprecond.pipeline",
    "run_pipeline": "dpprecond.pipeline",
}

__all__ = [
    "ClientData",
    "FLConfig",
    "FLResult",
    "LargeDeltaWarning",
    "PCAResult",
    "PipelineResult",
    "PrivacyBudgetExceededError",
    "PrivacyLedger",
    "PrivatePCA",
    "__version__",
    "fit_private_pca",
    "run_federated",
    "run_pipeline",
    "simulate",
]


def __getattr__(name: str) -> Any:  # lazy: importing the package stays cheap
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpprecond' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
