"""dpprecond: differentially private learning with cheap preconditioners.

Two systems share one accounting layer (:mod:`dpprecond.accounting`, on Google's
``dp_accounting``), one data layer (:mod:`dpprecond.data`) and one CLI:

- :mod:`dpprecond.pca`: coherence-adaptive private top-k PCA
  (:class:`dpprecond.PrivatePCA`) and its baselines;
- :mod:`dpprecond.fl`: record-level DP federated learning with the DP-FedSOFIM server-side
  rank-one Fisher preconditioner and its baselines.
"""

from dpprecond._validation import LargeDeltaWarning
from dpprecond.accounting import PrivacyBudgetExceededError

__version__ = "0.1.0"

__all__ = ["LargeDeltaWarning", "PrivacyBudgetExceededError", "PrivatePCA", "__version__"]


def __getattr__(name: str):  # lazy: importing the package stays cheap
    if name == "PrivatePCA":
        from dpprecond.pca.estimator import PrivatePCA

        return PrivatePCA
    raise AttributeError(f"module 'dpprecond' has no attribute {name!r}")
