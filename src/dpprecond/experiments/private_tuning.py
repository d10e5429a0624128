"""``experiment tune --private``: private selection charged to each cell's budget.

Every cell that tuning covers (tuning seeds x clients x partitions x tuning epsilons) and
every method with a ``[tuning.grid.<method>]`` table gets one run of
:func:`dpprecond.fl.tune_private`: repeat-and-select over the method's grid points (its
server step ``learning_rate`` and its options), the cell's epsilon being the **total**
budget, tuning included. The selected trial's model is the cell's private result: its test
accuracy is that of a method tuned privately, not tuned for free.

The selection of each method is its own release at the cell's epsilon (as every method of
a sweep spends the cell's epsilon on its own run); the methods are alternatives, not a
composition. Each result is written to ``<output>/tuning-private/<id>.json``, so an
interrupted tuning resumes.

Refused before any run (named errors): ``pca:K`` / ``random:K`` features (their private
PCA stage is outside the selection's accounting) and any grid point whose training run is
not a composition of unsampled Gaussian releases (:func:`check_private_tuning`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import sys
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dpprecond._files import write_json
from dpprecond.accounting import gaussian_precision
from dpprecond.experiments.config import ExperimentConfig, run_id
from dpprecond.fl.config import FLConfig
from dpprecond.fl.divergence import DivergenceWarning
from dpprecond.fl.engine import plan_event
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.tuning import Candidate, tune_private

__all__ = ["CHARGED", "candidates_of", "check_private_tuning", "private_cells",
           "private_tuned_text", "run_private_tuning", "select_private"]

logger = logging.getLogger(__name__)

#: What every output of a private tuning says.
CHARGED = ("Hyperparameters were selected privately (repeat-and-select with a random number "
           "of trials, accounted by dp_accounting): each cell's epsilon is the TOTAL budget "
           "of its selection, tuning included; the selection was not free.")


def candidates_of(cfg: ExperimentConfig, label: str) -> list[Candidate]:
    """The grid points of method ``label`` as candidates, times ``[tuning] clip_norms``
    when given (``clip_norm=None``: the file's ``[privacy] clip_norm``)."""
    m = cfg.method(label)
    grid = cfg.tune_grid.get(label, {})
    names = sorted(grid)
    clips: tuple[float | None, ...] = cfg.tune_clip_norms or (None,)
    out: list[Candidate] = []
    for values in itertools.product(*(grid[n] for n in names)):
        params = {**m.params, **dict(zip(names, values, strict=True))}
        lr = params.pop("learning_rate", None)
        out.extend(Candidate(m.algorithm, None if lr is None else float(lr), clip, params)
                   for clip in clips)
    return out


def private_cells(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The cells of the private tuning, seed-major, each with one method."""
    return [{"seed": seed, "clients": K, "partition": part, "epsilon": eps,
             "rounds": _rounds(cfg), "method": label}
            for seed, K, part, eps, label in itertools.product(
                cfg.tune_seeds, cfg.clients, cfg.partitions, cfg.tune_epsilons,
                [m.label for m in cfg.methods if m.label in cfg.tune_grid])]


def _rounds(cfg: ExperimentConfig) -> int:
    return cfg.rounds if cfg.protocol == "per-round" else max(cfg.rounds_list)


def _config(cfg: ExperimentConfig, epsilon: float | None) -> FLConfig:
    """The base settings of a cell: ``epsilon`` the total (``None``: non-private)."""
    settings: dict[str, Any] = {
        "n_rounds": _rounds(cfg), "clip_norm": cfg.clip_norm, "target_delta": cfg.delta,
        "accountant": cfg.accountant, "precision": cfg.precision, "backend": cfg.backend}
    if epsilon is None:
        settings["noise_multiplier"] = 0.0
    else:
        settings["target_epsilon"] = float(epsilon)
    return FLConfig(**settings)


def _check_settings(cfg: ExperimentConfig) -> None:
    """The checks that need no data (run before it is loaded)."""
    if not cfg.tune_grid:
        raise ValueError(f"{cfg.name}: no [tuning.grid.<method>] tables to tune.")
    if cfg.features.split(":")[0] in ("pca", "random"):
        trust = f" (trust = {cfg.pca['trust']!r})" if "trust" in cfg.pca else ""
        raise ValueError(
            f"experiment tune --private runs on fixed features only: [data] features = "
            f"{cfg.features!r}{trust} go through the "
            "private-features pipeline, whose private PCA stage the selection does not "
            "account; use pixels or resnet20 features, or drop --private.")
    if cfg.trust != "local":
        raise ValueError(f"experiment tune --private runs its trials with local noise "
                         f"(dpprecond.fl.tune_private); [data] trust = {cfg.trust!r} would not "
                         "be the trust model of the selection. Use trust = 'local' or drop "
                         "--private.")


def check_private_tuning(cfg: ExperimentConfig, n_features: int, n_classes: int) -> None:
    """Refuse, before any run, what :func:`~dpprecond.fl.tune_private` cannot account.

    Raises ``ValueError`` naming the setting: no tuning grid; ``pca:K`` / ``random:K``
    features (with their ``trust``); a grid point whose training run is not one Gaussian
    mechanism (an unsampled composition).
    """
    _check_settings(cfg)
    model = LinearSoftmax(n_features, n_classes)
    base = replace(_config(cfg, 1.0), target_epsilon=None, noise_multiplier=1.0)
    for label in cfg.tune_grid:
        for cand in candidates_of(cfg, label):
            method = make_method(cand.algorithm, cand.learning_rate,
                                 **dict(cand.method_options))
            precision = gaussian_precision(plan_event(model, method, cand.config(base)))
            if precision is None or not precision > 0:
                raise ValueError(
                    f"tuning.grid.{label}: the grid point {cand.describe()} is not a "
                    "composition of unsampled Gaussian releases, so experiment tune "
                    "--private cannot account its selection; remove it or drop --private.")


def _cell_spec(cfg: ExperimentConfig, cell: dict[str, Any]) -> dict[str, Any]:
    """Everything that determines a cell's selection (its id is the hash of this)."""
    return {**cell, "kind": "private-tuning", "data": cfg.data, "features": cfg.features,
            "alpha": cfg.alpha, "delta": cfg.delta, "clip_norm": cfg.clip_norm,
            "accountant": cfg.accountant, "precision": cfg.precision, "backend": cfg.backend,
            "candidates": [c.describe() for c in candidates_of(cfg, cell["method"])],
            "mean_trials": cfg.tune_mean_trials, "trials": cfg.tune_trials,
            "validation_fraction": cfg.validation_fraction}


def _eps_text(eps: float | None) -> str:
    return "inf" if eps is None else f"{eps:g}"


def _label(cell: dict[str, Any]) -> str:
    eps = _eps_text(cell["epsilon"])
    return (f"{cell['method']} K={cell['clients']} {cell['partition']} eps={eps} "
            f"seed={cell['seed']}")


def run_private_tuning(cfg: ExperimentConfig, *, progress: bool = True,
                       cache: Any = None) -> list[dict[str, Any]]:
    """Run (or resume) every cell's private selection; return the cells' records.

    A record holds the cell, the released selection (:meth:`TuningResult.to_dict` without
    the selected run's per-round history) and the selected run's final test accuracy.
    Progress: one bar over the cells (never the hidden number of trials); no record
    holds a cell's wall time, which grows with its number of trials.
    """
    from dpprecond.experiments.runner import DataCache, _per_run_notices_off

    _check_settings(cfg)  # before the data is loaded
    cache = cache or DataCache(cfg)
    X_tr, y_tr, X_te, y_te, n_classes = cache.get(cfg.data, cfg.features)
    check_private_tuning(cfg, X_tr.shape[1], n_classes)
    cells = private_cells(cfg)
    runs_dir = Path(cfg.output) / "tuning-private"
    runs_dir.mkdir(parents=True, exist_ok=True)
    interactive = progress and sys.stderr.isatty()
    bar = tqdm(total=len(cells), disable=not interactive, desc=f"{cfg.name} private tuning",
               unit="cell")
    non_private = sum(1 for c in cells if c["epsilon"] is None)
    if non_private:  # once, not once per trial
        logger.warning("%s: %d of the %d private-tuning cells are non-private (epsilon "
                       "inf): a search with no privacy guarantee.", cfg.name, non_private,
                       len(cells))
    records = []
    for i, cell in enumerate(cells, 1):
        spec = _cell_spec(cfg, cell)
        path = runs_dir / f"{run_id(spec)}.json"
        if path.exists():
            records.append(json.loads(path.read_text(encoding="utf-8")))
            bar.update(1)
            continue
        bar.set_postfix_str(_label(cell))
        # a trial's notices are not shown one by one: their count would reveal the number
        # of trials. Divergence concerns runs that are not released (dropped); any other
        # warning (a delta above 1/n) is shown once per cell
        with _per_run_notices_off(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = tune_private(X_tr, y_tr, X_te, y_te, n_classes,
                               config=_config(cfg, cell["epsilon"]),
                               candidates=candidates_of(cfg, cell["method"]),
                               mean_trials=cfg.tune_mean_trials,
                               trials=cfg.tune_trials,  # type: ignore[arg-type]
                               validation_fraction=cfg.validation_fraction,
                               n_clients=int(cell["clients"]), partition=cell["partition"],
                               alpha=cfg.alpha, seed=int(cell["seed"]))
        _warn_once([w for w in caught if not issubclass(w.category, DivergenceWarning)])
        selection = res.to_dict()
        selection.pop("selected_run", None)
        if math.isnan(selection["noisy_validation_accuracy"]):  # no trial drawn
            selection["noisy_validation_accuracy"] = None
        record = {"id": run_id(spec), "spec": spec, "private": True,
                  "epsilon_total": None if math.isinf(res.epsilon) else res.epsilon,
                  "selection": selection,
                  "test_accuracy": None if res.result is None
                  else res.result.final_accuracy}  # no wall time: it reveals the trials
        write_json(path, record, indent=None)
        records.append(record)
        bar.update(1)
        if progress and not interactive:
            acc = record["test_accuracy"]
            print(f"{cfg.name} private tuning: cell {i} of {len(cells)} done ({_label(cell)})"
                  f": test accuracy {'none' if acc is None else f'{acc:.4f}'}",
                  file=sys.stderr, flush=True)
    bar.close()
    return records


def _warn_once(caught: list[warnings.WarningMessage]) -> None:
    """Show each distinct warning of a cell once."""
    seen = set()
    for w in caught:
        key = (w.category, str(w.message))
        if key not in seen:
            seen.add(key)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def select_private(cfg: ExperimentConfig,
                   records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: the grid point selected in most cells (ties: the higher mean noisy
    score), and every cell's selection. Post-processing of the private selections only."""
    out: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(r["spec"]["method"] for r in records):
        rows = [r for r in records if r["spec"]["method"] == label]
        chosen = [r for r in rows if r["selection"]["candidate"] is not None]
        votes: Counter[str] = Counter()
        scores: dict[str, list[float]] = {}
        for r in chosen:
            cand = r["selection"]["candidate"]
            key = json.dumps([_params(cand), _clip(cfg, cand)], sort_keys=True)
            votes[key] += 1
            scores.setdefault(key, []).append(r["selection"]["noisy_validation_accuracy"])
        best = max(votes, key=lambda k: (votes[k], sum(scores[k]) / len(scores[k]), k)) \
            if votes else None
        params, clip = json.loads(best) if best is not None else (
            dict(cfg.method(label).params), cfg.clip_norm)
        out[label] = {
            "params": params, "clip_norm": clip,
            "selected_in": votes[best] if best is not None else 0,
            "n_cells": len(rows),
            "cells": [{"clients": r["spec"]["clients"], "partition": r["spec"]["partition"],
                       "seed": r["spec"]["seed"], "epsilon_target": r["spec"]["epsilon"],
                       "epsilon_total": r["epsilon_total"],
                       "params": None if r["selection"]["candidate"] is None
                       else _params(r["selection"]["candidate"]),
                       "clip_norm": None if r["selection"]["candidate"] is None
                       else _clip(cfg, r["selection"]["candidate"]),
                       "noisy_validation_accuracy": r["selection"]["noisy_validation_accuracy"],
                       "test_accuracy": r["test_accuracy"],
                       "selection": r["selection"]} for r in rows]}
    return out


def _clip(cfg: ExperimentConfig, candidate: dict[str, Any]) -> float:
    """A candidate's clip norm (the file's when it sets none)."""
    clip = candidate["clip_norm"]
    return cfg.clip_norm if clip is None else float(clip)


def _params(candidate: dict[str, Any]) -> dict[str, Any]:
    """A candidate's settings as a method table (``learning_rate`` and the options)."""
    params = dict(candidate["method_options"])
    if candidate["learning_rate"] is not None:
        params["learning_rate"] = candidate["learning_rate"]
    return params


def private_tuned_text(cfg: ExperimentConfig, best: dict[str, dict[str, Any]]) -> str:
    """A complete experiment file with the privately selected values as the defaults.

    The method tables hold each method's values selected in most cells; ``[privacy]
    clip_norm`` is the selected clip when every method selected the same one (one file
    has one clip for all its methods), else the source's, and the header says so.
    """
    import tomllib

    import tomli_w

    from dpprecond.experiments.tuning import tuned_config_text

    lines = [f"# Tuned privately by `dpprecond experiment tune --private` from the experiment "
             f"{cfg.name!r}.", f"# {CHARGED}",
             "# Running this file spends its epsilons again on the same data: a run's total "
             "privacy loss is its epsilon plus the selection's (composition). The selected "
             "runs themselves, at the total epsilon, are in tuning-private.json."]
    for label, b in best.items():
        lines.append(f"# {label}: {b['params']}, clip_norm {b['clip_norm']:g}, selected in "
                     f"{b['selected_in']} of {b['n_cells']} cells")
        for c in b["cells"]:
            eps = "inf (non-private)" if c["epsilon_total"] is None \
                else f"{c['epsilon_total']:.4g}"
            acc = "none" if c["test_accuracy"] is None else f"{c['test_accuracy']:.4f}"
            clip = "none" if c["clip_norm"] is None else f"{c['clip_norm']:g}"
            lines.append(f"#   K={c['clients']} {c['partition']} seed={c['seed']} "
                         f"epsilon={_eps_text(c['epsilon_target'])}: {c['params']}, clip_norm "
                         f"{clip}, test accuracy {acc}, total epsilon {eps} (tuning "
                         "included)")
    doc = tomllib.loads(tuned_config_text(cfg, best, []))
    clips = {b["clip_norm"] for b in best.values()}
    if len(clips) == 1:
        doc.setdefault("privacy", {})["clip_norm"] = clips.pop()
    else:
        lines.append(f"# The methods selected different clip norms; [privacy] clip_norm "
                     f"keeps the source's ({cfg.clip_norm:g}).")
    return "\n".join(lines) + "\n" + tomli_w.dumps(doc)
