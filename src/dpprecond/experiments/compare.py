"""Several experiments side by side: each method against a reference, per epsilon.

The per-experiment report (:mod:`dpprecond.experiments.report`) answers "which method wins
in this setting"; :func:`comparison_report` answers "does the answer change with the
features": for every experiment (for example Fashion-MNIST pixels, 64 private-PCA features
and 64 random features) and every epsilon it gives, pooled over the (clients, partition)
settings and seeds,

- each method's mean final accuracy and its mean difference from the reference method in
  percentage points, with the exact McNemar tests of the method against the reference on
  the final test predictions of each pair of runs (same setting, seed and T): how many
  pairs the method wins or loses significantly (p < 0.05);
- the rounds each method needs to reach the reference's final accuracy (seed-mean curves,
  per setting; the median over settings, and how many settings never reach it);
- the best method by mean accuracy.

Only finished runs count; the header says how many of each experiment's runs finished.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond.experiments.config import ExperimentConfig, expand_runs
from dpprecond.experiments.report import (
    eps_label,
    held_out_labels,
    paired_tests,
    significance_cell,
)
from dpprecond.experiments.runner import DataCache, load_records
from dpprecond.experiments.stats import rounds_to_reach
from dpprecond.plots import line_figure

__all__ = ["comparison_figure", "comparison_report", "pooled_means"]


def _final(cfg: ExperimentConfig, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    T = cfg.rounds if cfg.protocol == "per-round" else max(cfg.rounds_list)
    return [r for r in recs if r["spec"]["rounds"] == T]


def _rounds_cell(recs: list[dict[str, Any]], method: str, ref: str,
                 eps: float | None) -> str:
    """Median over settings of the rounds ``method`` needs to reach ``ref``'s final
    accuracy (seed-mean curves), and the settings where it never does."""
    curves: dict[tuple[Any, ...], list[np.ndarray]] = defaultdict(list)
    for r in recs:
        s = r["spec"]
        if s["epsilon"] == eps and s["method"] in (method, ref):
            curves[(s["method"], s["clients"], s["partition"])].append(
                np.asarray(r["accuracy"]))
    hits, never = [], 0
    for (m, K, part), runs in curves.items():
        if m != method or (ref, K, part) not in curves:
            continue
        target = float(np.mean(curves[(ref, K, part)], axis=0)[-1])
        hit = rounds_to_reach(np.mean(runs, axis=0), target - 1e-12)
        if hit is None:
            never += 1
        else:
            hits.append(hit)
    if not hits and not never:
        return ""
    cell = f"{np.median(hits):g}" if hits else "never"
    return cell + (f" ({never} never)" if never and hits else "")


def pooled_means(cfg: ExperimentConfig, final: list[dict[str, Any]],
                 epsilons: Sequence[float | None]) -> dict[tuple[str, float | None], float]:
    """``(method, epsilon) -> mean final accuracy`` over every setting and seed."""
    means = {}
    for m in cfg.methods:
        for e in epsilons:
            v = [r["final_accuracy"] for r in final
                 if r["spec"]["method"] == m.label and r["spec"]["epsilon"] == e]
            if v:
                means[(m.label, e)] = float(np.mean(v))
    return means


def comparison_figure(cfgs: list[ExperimentConfig], path: str | Path, *,
                      labels: list[str] | None = None) -> Path:
    """One panel per experiment: each method's pooled mean final accuracy against the
    private epsilons (non-private runs as a dashed level would need another axis: they are
    in the table)."""
    labels = labels or [c.name for c in cfgs]
    panels: dict[str, dict[str, tuple[Any, ...]]] = {}
    for cfg, label in zip(cfgs, labels, strict=True):
        private = [e for e in cfg.epsilons if e is not None]
        means = pooled_means(cfg, _final(cfg, load_records(cfg)), private)
        series = {}
        for m in cfg.methods:
            pts = [(e, means[(m.label, e)]) for e in private if (m.label, e) in means]
            if pts:
                series[m.label] = ([x for x, _ in pts], [y for _, y in pts], None)
        if series:
            panels[label] = series
    n = max(1, len(panels))
    rows = -(-n // 3)  # at most 3 panels a row, rows filled evenly (4 panels: 2 x 2)
    return line_figure(panels, path, xlabel="epsilon", ylabel="final test accuracy",
                       logx=True, ncols=-(-n // rows),
                       suptitle="final test accuracy against epsilon, mean over the "
                                "settings (clients, partition) and seeds")


def comparison_report(cfgs: list[ExperimentConfig], *, reference: str = "fedgd",
                      labels: list[str] | None = None,
                      caches: list[DataCache] | None = None) -> str:
    """Markdown: the experiments side by side against ``reference`` (module docstring).

    Parameters
    ----------
    cfgs : list of ExperimentConfig
        The experiments, each with its finished runs on disk (``cfg.output``).
    reference : str, default "fedgd"
        The method label every other method is compared with; it must be in every
        experiment.
    labels : list of str, optional
        A name per experiment for the tables (default: each experiment's name).
    caches : list of DataCache, optional
        Where each experiment's test labels come from (default: its data set).
    """
    labels = labels or [c.name for c in cfgs]
    if len(labels) != len(cfgs):
        raise ValueError(f"labels: got {len(labels)} names for {len(cfgs)} experiments; "
                         "give one name per experiment.")
    for cfg in cfgs:
        if reference not in {m.label for m in cfg.methods}:
            raise ValueError(f"reference={reference!r} is not a method of experiment "
                             f"{cfg.name!r}; pick one of "
                             f"{sorted(m.label for m in cfg.methods)}.")
    epsilons: list[float | None] = []
    for cfg in cfgs:
        epsilons += [e for e in cfg.epsilons if e not in epsilons]
    head = "| features | method | " + " | ".join(f"ε = {eps_label(e)}" for e in epsilons)
    rule = "|---|---" + "|---" * len(epsilons) + "|"
    acc = [head + " |", rule]
    rounds = [head + " |", rule]
    best = ["| features | " + " | ".join(f"ε = {eps_label(e)}" for e in epsilons) + " |",
            "|---" + "|---" * len(epsilons) + "|"]
    status = []
    for i, (cfg, label) in enumerate(zip(cfgs, labels, strict=True)):
        recs = load_records(cfg, with_predictions=True)
        status.append(f"- {label} (`{cfg.name}`): {len(recs)} of {len(expand_runs(cfg))} "
                      "runs finished; " + ("tuned on a validation split (not charged)"
                                           if cfg.tuned_from else "step sizes as written "
                                           "in the file (not tuned)") + ".")
        final = _final(cfg, recs)
        if not final:
            continue
        y_test = held_out_labels(cfg, caches[i] if caches else None)
        means = pooled_means(cfg, final, epsilons)
        for m in cfg.methods:
            a_row, r_row = [], []
            for e in epsilons:
                if (m.label, e) not in means or (reference, e) not in means:
                    a_row.append("")
                    r_row.append("")
                    continue
                mean = 100 * means[(m.label, e)]
                if m.label == reference:
                    a_row.append(f"{mean:.1f}")
                    r_row.append(f"{cfg.rounds if cfg.protocol == 'per-round' else ''}")
                    continue
                diff = mean - 100 * means[(reference, e)]
                tests = paired_tests(final, y_test, m.label, reference, e)
                sig = significance_cell(tests, median_p=False)
                a_row.append(f"{mean:.1f} ({diff:+.1f}; {sig})")
                r_row.append(_rounds_cell(recs, m.label, reference, e)
                             if cfg.protocol == "per-round" else "")
            acc.append(f"| {label} | {m.label} | " + " | ".join(a_row) + " |")
            rounds.append(f"| {label} | {m.label} | " + " | ".join(r_row) + " |")
        cells = []
        for e in epsilons:
            cands = {m: v for (m, ee), v in means.items() if ee == e}
            if not cands:
                cells.append("")
                continue
            top = max(cands, key=cands.__getitem__)
            cells.append(f"{top} ({100 * cands[top]:.1f})")
        best.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([
        "Runs: pooled over the (clients, partition) settings and seeds of each experiment.",
        "", *status, "",
        f"Final test accuracy (%), mean over settings and seeds; in brackets the difference "
        f"from `{reference}` in points and the exact McNemar tests against `{reference}` "
        "on the final test predictions of each pair of runs (↑ = pairs the method wins "
        "significantly, p < 0.05; ↓ = pairs it loses significantly; /n = pairs).", "",
        *acc, "",
        f"Rounds to reach `{reference}`'s final accuracy (seed-mean curves; median over the "
        f"settings, '(k never)' = settings where it is not reached within T; the "
        f"`{reference}` row gives T).", "",
        *rounds, "",
        "Best method by mean final accuracy (%):", "", *best, ""])
