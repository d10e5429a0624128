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


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if v == v and abs(v) != float("inf") else '"inf"'
    if v is None:
        return '"inf"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def tuned_config_text(cfg: ExperimentConfig, best: dict[str, dict[str, Any]]) -> str:
    """A complete experiment file whose method tables hold the tuned values."""
    raw = cfg.source
    lines = [f"# Tuned by `dpprecond experiment tune` from the experiment {cfg.name!r}.",
             f"# {NOT_CHARGED}"]
    for key in ("name", "output", "description"):
        if key in raw:
            lines.append(f"{key} = {_toml_value(raw[key])}")
    lines.append(f"tuned_from = {_toml_value(cfg.name)}")
    for table in ("data", "federation", "privacy", "protocol"):
        if table in raw:
            lines.append(f"\n[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in raw[table].items()]
    for m in cfg.methods:
        params = best.get(m.label, {}).get("params", m.params)
        lines.append(f"\n[methods.{m.label}]")
        lines.append(f"algorithm = {_toml_value(m.algorithm)}")
        lines += [f"{k} = {_toml_value(v)}" for k, v in params.items()]
        if m.label in best:
            lines.append(f"# validation accuracy {best[m.label]['validation_accuracy']:.4f} "
                         f"(mean of {best[m.label]['n_runs']} tuning runs)")
    return "\n".join(lines) + "\n"
