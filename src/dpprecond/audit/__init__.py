"""Empirical privacy audits: the audit itself, the library's audit cases, broken references.

- :mod:`dpprecond.audit.core`: a lower bound on epsilon from a distinguishing test on two
  neighbouring datasets (:func:`audit`, :func:`threshold_audit`, Clopper-Pearson bounds,
  the power of an audit); its names are re-exported here;
- :mod:`dpprecond.audit.cases`: the worst-case audits of the library's own mechanisms
  (every PCA method's releases, the FL client message and run, federated PCA, the
  pipeline end to end), run by ``tests/test_audit.py`` and ``benchmarks/privacy_audit.py``;
- :mod:`dpprecond.audit.broken`: mechanisms with known privacy bugs, reimplemented, that an
  audit must catch (evidence that the audits have power).

See docs/privacy.md (Audits).
"""

from dpprecond.audit.core import (
    AuditResult,
    audit,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gaussian_audit_ceiling,
    heldout_for_power,
    largest_certifiable_bound,
    sample_statistics,
    threshold_audit,
)

__all__ = [
    "AuditResult",
    "audit",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "gaussian_audit_ceiling",
    "heldout_for_power",
    "largest_certifiable_bound",
    "sample_statistics",
    "threshold_audit",
]
