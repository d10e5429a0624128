"""Tables, figures and paired tests from the finished runs of an experiment.

:func:`write_report` writes into the experiment's report directory (``report`` in the
file, else its ``output``):

- ``manifest.json``: which experiment file the report is of; a report directory holding
  another file's report is refused (:class:`ReportDirectoryError`), except that the tuned
  file of an experiment replaces that experiment's report (``tune``'s documented default);

- ``results.csv`` (one row per run) and ``results.json`` (runs with their accuracy curves);
- ``report.md``: per (clients, partition) setting, the final test accuracy of every method
  at every epsilon (mean +- std over seeds, best per column in bold), the rounds each
  method needs to reach DP-FedGD's final accuracy (per-round protocol), and the exact
  McNemar test of the reference method (SOFIM) against every other method on the final
  test predictions, plus an account of the runs still missing;
- figures drawn by :func:`dpprecond.plots.line_figure`: accuracy against round (or against
  T for the per-T protocol) and accuracy against epsilon.
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond._files import write_json
from dpprecond.experiments.config import ExperimentConfig, expand_runs, run_id
from dpprecond.experiments.runner import DataCache, load_records
from dpprecond.experiments.stats import mcnemar_exact, rounds_to_reach
from dpprecond.experiments.tuning import NOT_CHARGED
from dpprecond.plots import line_figure

__all__ = ["MANIFEST", "ReportDirectoryError", "accuracy_table", "check_report_dir",
           "eps_label", "write_report"]

#: The file in a report directory that names the experiment file of its report.
MANIFEST = "manifest.json"


class ReportDirectoryError(ValueError):
    """A report directory holds the report of another experiment file."""


def _identity(cfg: ExperimentConfig, config_path: str | os.PathLike | None,
              out: Path) -> dict[str, Any]:
    config = None
    if config_path is not None:  # relative to the report directory: the clone can move
        config = Path(os.path.relpath(Path(config_path).resolve(), out.resolve())).as_posix()
    return {"config": config, "name": cfg.name, "tuned_from": cfg.tuned_from}


def check_report_dir(cfg: ExperimentConfig, out: Path,
                     config_path: str | os.PathLike | None = None, *,
                     force: bool = False) -> None:
    """Refuse (:class:`ReportDirectoryError`) to write ``cfg``'s report into ``out`` when
    ``out``'s manifest names another experiment file, unless ``force``.

    The same file (same path, or the same experiment name when a path is unknown) may
    rewrite its report; the tuned file of an experiment may replace that experiment's
    report (``dpprecond experiment tune`` without ``--report``), not the other way round.
    """
    path = out / MANIFEST
    if force or not path.exists():
        return
    old = json.loads(path.read_text(encoding="utf-8"))
    new = _identity(cfg, config_path, out)
    if old.get("config") and new["config"]:
        same = (out / old["config"]).resolve() == (out / new["config"]).resolve()
    else:
        same = old.get("name") == new["name"]  # no file to compare: the experiment's name
    replaces_its_source = (new["tuned_from"] is not None and old.get("tuned_from") is None
                           and old.get("name") == new["tuned_from"])
    if same or replaces_its_source:
        return

    def what(ident: dict[str, Any]) -> str:
        if ident.get("config"):
            return str(os.path.normpath(out / ident["config"]))
        tuned = f", tuned from {ident['tuned_from']!r}" if ident.get("tuned_from") else ""
        return f"the experiment {ident.get('name')!r}{tuned}"

    raise ReportDirectoryError(
        f"{out} holds the report of {what(old)} ({path}); this is {what(new)}. Refusing to "
        "overwrite it: give this report another directory (--output DIR, or report = "
        "\"DIR\" in the experiment file), or pass --force to replace it.")


def _write_manifest(cfg: ExperimentConfig, out: Path,
                    config_path: str | os.PathLike | None) -> None:
    write_json(out / MANIFEST, _identity(cfg, config_path, out), indent=2)

CSV_FIELDS = ("id", "method", "algorithm", "clients", "partition", "epsilon", "rounds", "seed",
              "final_accuracy", "noise_multiplier", "epsilon_spent", "n_releases", "seconds",
              "params")


def eps_label(eps: float | None) -> str:
    """``"non-private"`` for ``None``, else the number."""
    return "non-private" if eps is None else f"{eps:g}"


def _setting(spec: dict[str, Any]) -> tuple[int, str]:
    return int(spec["clients"]), str(spec["partition"])


def _setting_title(cfg: ExperimentConfig, setting: tuple[int, str]) -> str:
    K, part = setting
    part = f"Dirichlet({cfg.alpha:g})" if part == "dirichlet" else "IID"
    return f"{cfg.data}, K = {K}, {part}"


def _fmt(values: list[float], n_seeds: int) -> str:
    cell = f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"
    return cell if len(values) >= n_seeds else f"{cell} (n={len(values)})"


def accuracy_table(cfg: ExperimentConfig, recs: list[dict[str, Any]],
                   rounds: int | None = None) -> list[str]:
    """Markdown rows: methods x epsilons, final accuracy % (mean ± std), best bold."""
    cols = list(cfg.epsilons)
    cell: dict[tuple[str, Any], list[float]] = defaultdict(list)
    for r in recs:
        if rounds is None or r["spec"]["rounds"] == rounds:
            cell[(r["spec"]["method"], r["spec"]["epsilon"])].append(r["final_accuracy"])
    best = {e: max((np.mean(v) for (m, ee), v in cell.items() if ee == e), default=None)
            for e in cols}
    lines = ["| method | " + " | ".join(f"ε = {eps_label(e)}" for e in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for m in cfg.methods:
        row = []
        for e in cols:
            v = cell.get((m.label, e))
            if not v:
                row.append("not run")
                continue
            text = _fmt(v, len(cfg.seeds))
            top = best[e]
            row.append(f"**{text}**" if top is not None and np.isclose(np.mean(v), top)
                       else text)
        lines.append(f"| {m.label} | " + " | ".join(row) + " |")
    return lines


def _mean_curves(recs: list[dict[str, Any]]) -> dict[tuple[str, Any], tuple[Any, ...]]:
    curves: dict[tuple[str, Any], list[list[float]]] = defaultdict(list)
    for r in recs:
        curves[(r["spec"]["method"], r["spec"]["epsilon"])].append(r["accuracy"])
    return {k: (np.mean(v, axis=0), np.std(v, axis=0), len(v)) for k, v in curves.items()}


def _rounds_table(cfg: ExperimentConfig, recs: list[dict[str, Any]]) -> list[str]:
    curves = _mean_curves(recs)
    cols = list(cfg.epsilons)
    lines = ["| method | " + " | ".join(f"ε = {eps_label(e)}" for e in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for m in cfg.methods:
        row = []
        for e in cols:
            if ("fedgd", e) not in curves or (m.label, e) not in curves:
                row.append("")
                continue
            target = curves[("fedgd", e)][0][-1]
            hit = rounds_to_reach(curves[(m.label, e)][0], target - 1e-12)
            row.append("never" if hit is None else str(hit))
        lines.append(f"| {m.label} | " + " | ".join(row) + " |")
    return lines


def _tuning_note(cfg: ExperimentConfig) -> str:
    """Where the hyperparameters come from (tuned, and then not charged, or as written)."""
    if cfg.tuned_from is not None:
        return (f"The method values were tuned by `dpprecond experiment tune` from the "
                f"experiment {cfg.tuned_from!r}. {NOT_CHARGED}")
    return ("The method values are those written in the experiment file; they were not "
            "tuned on this data by `dpprecond experiment tune`.")


def paired_tests(recs: list[dict[str, Any]], y_test: np.ndarray, ref: str, other: str,
                 eps: float | None) -> list[Any]:
    """Exact McNemar tests of ``ref`` against ``other`` at ``eps``, one per pair of runs
    that differ only in the method (same setting, seed and T)."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        s = r["spec"]
        return s["clients"], s["partition"], s["seed"], s["rounds"]

    others = {key(r): r for r in recs
              if r["spec"]["method"] == other and r["spec"]["epsilon"] == eps}
    return [mcnemar_exact(r["predictions"], others[key(r)]["predictions"], y_test)
            for r in recs if r["spec"]["method"] == ref and r["spec"]["epsilon"] == eps
            and key(r) in others]


def significance_cell(tests: list[Any], *, median_p: bool = True) -> str:
    """``"b↑ w↓ /n"``: pairs where the first method is significantly better / worse."""
    better = sum(t.p_value < 0.05 and t.b > t.c for t in tests)
    worse = sum(t.p_value < 0.05 and t.b < t.c for t in tests)
    cell = f"{better}↑ {worse}↓ /{len(tests)}"
    if median_p:
        cell += f", p̃ = {float(np.median([t.p_value for t in tests])):.2g}"
    return cell


def _mcnemar_table(cfg: ExperimentConfig, recs: list[dict[str, Any]],
                   y_test: np.ndarray, ref: str) -> list[str]:
    cols = list(cfg.epsilons)
    lines = [f"| {ref} vs | " + " | ".join(f"ε = {eps_label(e)}" for e in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for m in cfg.methods:
        if m.label == ref:
            continue
        row = []
        for e in cols:
            tests = paired_tests(recs, y_test, ref, m.label, e)
            row.append(significance_cell(tests) if tests else "")
        lines.append(f"| {m.label} | " + " | ".join(row) + " |")
    return lines


def held_out_labels(cfg: ExperimentConfig, cache: DataCache | None = None) -> np.ndarray:
    """The test labels of an experiment's data (the McNemar tests pair predictions)."""
    base = "pixels" if cfg.features.split(":")[0] in ("pca", "random") else cfg.features
    return (cache or DataCache(cfg)).get(cfg.data, base)[3]


def _write_csv_json(out: Path, recs: list[dict[str, Any]]) -> None:
    with (out / "results.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for r in recs:
            s = r["spec"]
            w.writerow([r["id"], s["method"], s["algorithm"], s["clients"], s["partition"],
                        eps_label(s["epsilon"]), s["rounds"], s["seed"],
                        f"{r['final_accuracy']:.6f}", f"{r['noise_multiplier']:.6g}",
                        "" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.6f}",
                        r["n_releases"], f"{r['seconds']:.3f}",
                        json.dumps(s["params"], sort_keys=True)])
    clean = [{k: v for k, v in r.items() if k != "predictions"} for r in recs]
    write_json(out / "results.json", clean, indent=None)  # strict JSON (docs/outputs.md)


def _final_accuracy_series(cfg: ExperimentConfig, recs: list[dict[str, Any]],
                           points: list[tuple[float, Any, int]]) -> dict[str, tuple]:
    """Per method: (x, mean, std) of the final accuracy over seeds at each point.

    ``points`` lists ``(x, epsilon, rounds)``; points without finished runs are skipped.
    """
    series = {}
    for m in cfg.methods:
        xs, ys, ss = [], [], []
        for x, eps, rounds in points:
            v = [r["final_accuracy"] for r in recs if r["spec"]["method"] == m.label
                 and r["spec"]["epsilon"] == eps and r["spec"]["rounds"] == rounds]
            if v:
                xs.append(x)
                ys.append(float(np.mean(v)))
                ss.append(float(np.std(v)))
        if xs:
            series[m.label] = (xs, ys, ss)
    return series


def _figures(cfg: ExperimentConfig, settings: dict[tuple[int, str], list[dict[str, Any]]],
             out: Path) -> list[Path]:
    paths = []
    vs_eps: dict[str, dict[str, tuple[Any, ...]]] = {}
    private = [e for e in cfg.epsilons if e is not None]
    for setting, recs in sorted(settings.items()):
        title = _setting_title(cfg, setting)
        tag = f"K{setting[0]}_{setting[1]}"
        panels: dict[str, dict[str, Any]] = {}
        if cfg.protocol == "per-round":
            curves = _mean_curves(recs)
            for e in cfg.epsilons:
                series = {m.label: (np.arange(1, len(c[0]) + 1), c[0], c[1])
                          for m in cfg.methods if (c := curves.get((m.label, e)))}
                if series:
                    panels[f"ε = {eps_label(e)}"] = series
            if panels:
                paths.append(line_figure(panels, out / f"accuracy_vs_round_{tag}.png",
                                         xlabel="round", ylabel="test accuracy",
                                         suptitle=title))
        else:
            for e in cfg.epsilons:
                series = _final_accuracy_series(
                    cfg, recs, [(T, e, T) for T in cfg.rounds_list])
                if series:
                    panels[f"ε = {eps_label(e)}"] = series
            if panels:
                paths.append(line_figure(panels, out / f"accuracy_vs_T_{tag}.png",
                                         xlabel="T (separate run calibrated per T)",
                                         ylabel="final test accuracy", suptitle=title))
        T_final = cfg.rounds if cfg.protocol == "per-round" else max(cfg.rounds_list)
        series = _final_accuracy_series(cfg, recs, [(e, e, T_final) for e in private])
        if series:
            vs_eps[title] = series
    if vs_eps:
        paths.append(line_figure(vs_eps, out / "accuracy_vs_epsilon.png", xlabel="epsilon",
                                 ylabel="final test accuracy", logx=True,
                                 ncols=min(2, len(vs_eps)),
                                 suptitle=f"{cfg.data}: final accuracy vs epsilon "
                                          "(delta = " f"{cfg.delta:g})"))
    return paths


def write_report(cfg: ExperimentConfig, *, y_test: np.ndarray | None = None,
                 cache: DataCache | None = None,
                 config_path: str | os.PathLike | None = None,
                 force: bool = False) -> Path:
    """Write the CSV/JSON results, figures and ``report.md``; return the markdown path.

    ``y_test`` (the test labels, for the McNemar tests) is loaded from the data set when
    not given. ``config_path``: the experiment file, named in the directory's
    :data:`MANIFEST`; a directory holding another file's report raises
    :class:`ReportDirectoryError` before anything is written, unless ``force``
    (:func:`check_report_dir`).
    """
    out = Path(cfg.report_dir or cfg.output)
    check_report_dir(cfg, out, config_path, force=force)
    out.mkdir(parents=True, exist_ok=True)
    _write_manifest(cfg, out, config_path)
    recs = load_records(cfg, with_predictions=True)
    expected = expand_runs(cfg)
    _write_csv_json(out, recs)
    if y_test is None and recs:
        y_test = held_out_labels(cfg, cache)
    settings: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        settings[_setting(r["spec"])].append(r)
    figures = _figures(cfg, settings, out)
    compute = sum(r["seconds"] for r in recs)
    lines = [f"# Experiment `{cfg.name}`", "",
             f"Data: {cfg.data} ({cfg.features} features); clients {list(cfg.clients)}; "
             f"partitions {list(cfg.partitions)} (Dirichlet alpha = {cfg.alpha:g}); "
             f"delta = {cfg.delta:g}; clip norm C = {cfg.clip_norm:g}; accountant "
             f"{cfg.accountant}; protocol {cfg.protocol}, "
             + (f"T = {cfg.rounds}" if cfg.protocol == "per-round"
                else f"T in {list(cfg.rounds_list)}")
             + f"; seeds {list(cfg.seeds)}.", "",
             "Every method uses the same client mechanism (per-record clipping, each client "
             "adds its own Gaussian noise) and its noise is calibrated for its own release "
             "schedule, so a given ε is the same total privacy loss per client for every "
             "method. " + _tuning_note(cfg), "",
             f"Finished runs: {len(recs)} of {len(expected)}; compute time of the finished "
             f"runs {compute / 60:.1f} min (sum of run times).", ""]
    finished = {r["id"] for r in recs}
    missing = [s for s in expected if run_id(s) not in finished]
    if missing:
        groups: dict[str, int] = defaultdict(int)
        for s in missing:
            groups[f"K = {s['clients']}, {s['partition']}, seed {s['seed']}"] += 1
        lines += ["**Not run yet** (finish with `dpprecond experiment run <this file>`; "
                  "finished runs are kept):", ""]
        lines += [f"- {k}: {v} runs" for k, v in sorted(groups.items())] + [""]
    methods = ", ".join(f"`{m.label}` ({m.algorithm}: "
                        + ", ".join(f"{k}={v}" for k, v in m.params.items()) + ")"
                        for m in cfg.methods)
    lines += [f"Methods: {methods}.", ""]
    T_final = cfg.rounds if cfg.protocol == "per-round" else max(cfg.rounds_list)
    for setting, srecs in sorted(settings.items()):
        title = _setting_title(cfg, setting)
        lines += [f"## {title}", "",
                  f"Final test accuracy (%) after T = {T_final} rounds, mean ± std over "
                  "seeds; best per column in bold.", ""]
        lines += [*accuracy_table(cfg, srecs, T_final), ""]
        if cfg.protocol == "per-round" and any(m.label == "fedgd" for m in cfg.methods):
            lines += ["Rounds needed to reach DP-FedGD's final accuracy (seed-mean curves; "
                      "'never' = not within T):", ""]
            lines += [*_rounds_table(cfg, srecs), ""]
        refs = [cfg.reference] + [m.label for m in cfg.methods if m.label != cfg.reference
                                  and m.algorithm.startswith("sofim")]
        for ref in refs:
            if y_test is None:
                break
            lines += [f"Exact McNemar test of `{ref}` against each method on the "
                      f"final test predictions, per seed: ↑ = seeds where `{ref}` is "
                      "significantly better (p < 0.05), ↓ = significantly worse, "
                      "p̃ = median p-value over seeds.", ""]
            final = [r for r in srecs if r["spec"]["rounds"] == T_final]
            lines += [*_mcnemar_table(cfg, final, y_test, ref), ""]
    if figures:
        lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures] + [""]
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return md
