"""Hyperparameter tuning on a validation split carved from the training data.

The tuning runs of :func:`dpprecond.experiments.config.expand_runs` (``tuning=True``) train
on the training data minus a stratified validation split and are scored on that split:
the test set is never looked at. Tuning itself is **not charged to the privacy budget**
(as in the paper): the selected hyperparameters depend on the private training data, so a
fully private pipeline would have to account for the search as well. Every output of this
module says so.

:func:`select_best` picks, for every method, the grid point with the highest validation
accuracy averaged over the tuning settings (clients x partitions x epsilons x seeds);
:func:`tuned_config_text` writes a complete experiment file with those values as the
method defaults.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from dpprecond.experiments.config import ExperimentConfig

__all__ = ["NOT_CHARGED", "select_best", "tuned_config_text"]

NOT_CHARGED = ("Hyperparameters were tuned on a validation split carved from the training "
               "data (never the test set); as in the paper, the tuning itself is NOT charged "
               "to the privacy budget.")


def select_best(cfg: ExperimentConfig,
                records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{method: {"params": ..., "validation_accuracy": ..., "n_runs": ...}}``."""
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    params_of: dict[str, dict[str, Any]] = {}
    for rec in records:
        spec = rec["spec"]
        key = json.dumps(spec["params"], sort_keys=True)
        scores[spec["method"]][key].append(rec["final_accuracy"])
        params_of[key] = spec["params"]
    best = {}
    for method, by_params in scores.items():
        key = max(by_params, key=lambda k: (float(np.mean(by_params[k])), k))
        best[method] = {"params": params_of[key],
                        "validation_accuracy": float(np.mean(by_params[key])),
                        "n_runs": len(by_params[key]),
                        "all": {k: float(np.mean(v)) for k, v in by_params.items()}}
    return best


def tuned_config_text(cfg: ExperimentConfig, best: dict[str, dict[str, Any]],
                      header: list[str] | None = None) -> str:
    """A complete experiment file whose method tables hold the tuned values (TOML, tomli-w).

    The data, federation, privacy and protocol tables are copied from the source file; the
    ``[tuning]`` table is left out (the output is an experiment to run, not to tune again),
    and ``tuned_from`` names the source experiment. ``header`` replaces the comment lines
    of the free tuning (which say it is not charged).
    """
    import tomli_w

    raw = cfg.source
    doc: dict[str, Any] = {key: raw[key] for key in ("name", "output", "report",
                                                     "description") if key in raw}
    doc["tuned_from"] = cfg.name
    for table in ("data", "federation", "privacy", "protocol"):
        if table in raw:
            doc[table] = dict(raw[table])
    doc.setdefault("protocol", {})["reference"] = cfg.reference
    doc["methods"] = {m.label: {"algorithm": m.algorithm,
                                **best.get(m.label, {}).get("params", m.params)}
                      for m in cfg.methods}
    if header is None:
        header = [f"# Tuned by `dpprecond experiment tune` from the experiment {cfg.name!r}.",
                  f"# {NOT_CHARGED}"]
        for m in cfg.methods:
            if m.label in best:
                b = best[m.label]
                header.append(f"# {m.label}: validation accuracy "
                              f"{b['validation_accuracy']:.4f} (mean of {b['n_runs']} "
                              "tuning runs)")
    return "\n".join(header) + "\n" + tomli_w.dumps(doc)
