"""``dpprecond experiment``: declarative, resumable comparisons of the DP federated methods.

Examples::

    dpprecond experiment run experiments/digits.toml          # resumable sweep
    dpprecond experiment report experiments/digits.toml       # tables, figures, McNemar
    dpprecond experiment tune experiments/digits.toml         # validation-split tuning
    dpprecond experiment tune --private experiments/digits.toml   # charged selection

``run`` skips the runs already finished (results under the file's ``output`` directory);
``report`` writes ``results.csv``, ``results.json``, ``report.md`` and PNG figures there;
``tune`` writes ``<name>-tuned.toml`` next to the experiment file (``experiments/digits.toml``
gives ``experiments/digits-tuned.toml``), an experiment file with the tuned values; the
tuning is free (not charged). ``tune --private`` selects privately instead, each cell's
epsilon being the total budget with the tuning included
(:mod:`dpprecond.experiments.private_tuning`): it writes ``tuning-private.json`` and
``<name>-tuned-private.toml``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

__all__ = ["register", "report", "run", "tune"]


def register(subparsers: Any) -> None:
    """Add the ``experiment`` sub-command (``run``, ``report``, ``tune``)."""
    from dpprecond.cli.options import add

    p = subparsers.add_parser(
        "experiment", help="run and report the DP federated comparison from a TOML file",
        description="Declarative experiments: DP-FedSOFIM against the DP federated "
                    "baselines (same client mechanism, same total privacy loss per client).")
    sub = p.add_subparsers(dest="experiment_command", metavar="ACTION")
    r = sub.add_parser("run", help="run every missing run of an experiment file (resumable)")
    add(r, "config")
    add(r, "max_runs")
    add(r, "output")
    add(r, "no_progress")
    add(r, "jobs")
    add(r, "where")
    r.set_defaults(func=run)
    t = sub.add_parser("tune", help="tune on a validation split of the training data",
                       description="Tune every method's step size (and the options of "
                                   "[tuning.grid.<method>]) on a validation split of the "
                                   "training data, not charged to the privacy budget; "
                                   "writes <name>-tuned.toml next to the file and "
                                   "tuning.json in the report directory. With --private: "
                                   "a private selection per cell (repeat-and-select), the "
                                   "cell's epsilon the total with the tuning included; "
                                   "writes <name>-tuned-private.toml and "
                                   "tuning-private.json.")
    add(t, "config")
    add(t, "tune_output")
    add(t, "tune_report")
    add(t, "no_progress")
    add(t, "jobs")
    add(t, "private_tune")
    t.set_defaults(func=tune)
    s = sub.add_parser("report", help="tables, figures and McNemar tests of finished runs")
    add(s, "configs")
    add(s, "output")
    add(s, "force")
    s.set_defaults(func=report)
    c = sub.add_parser("compare", help="several experiments side by side against a "
                                       "reference method (accuracy, McNemar, rounds)")
    add(c, "compare_configs")
    add(c, "reference")
    add(c, "labels")
    add(c, "md")
    add(c, "figure")
    c.set_defaults(func=compare)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _load(path: str, output: str | None) -> Any:
    import dataclasses

    from dpprecond.experiments.config import load_config

    cfg = load_config(path)
    if not output:
        return cfg
    return dataclasses.replace(cfg, output=Path(output), report_dir=Path(output))


def _where(items: list[str]) -> dict[str, Any]:
    """``["clients=20", "epsilon=inf"]`` -> ``{"clients": 20, "epsilon": None}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--where expects KEY=VALUE, got {item!r}.")
        if key == "epsilon" and value.lower() in ("inf", "none", "non-private"):
            out[key] = None
            continue
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    """``experiment run``."""
    from dpprecond.experiments.config import expand_runs
    from dpprecond.experiments.runner import run_experiment

    cfg = _load(args.config, args.output)
    total = len(expand_runs(cfg))
    start = time.perf_counter()
    n = run_experiment(cfg, progress=not args.no_progress, max_runs=args.max_runs,
                       jobs=args.jobs,
                       where=_where(args.where))
    print(f"{cfg.name}: {n} new runs in {time.perf_counter() - start:.1f} s "
          f"({total} in the grid); results in {cfg.output}/runs")
    print(f"next: dpprecond experiment report {args.config}")
    return 0


def tune(args: argparse.Namespace) -> int:
    """``experiment tune`` (``--private``: the selection charged to each cell's epsilon)."""
    from dpprecond._files import write_json
    from dpprecond.experiments.runner import load_records, run_experiment
    from dpprecond.experiments.tuning import NOT_CHARGED, select_best, tuned_config_text

    cfg = _load(args.config, args.output)
    if not cfg.tune_grid:
        raise ValueError(f"{args.config} has no [tuning.grid.<method>] tables to tune.")
    if args.private:
        return _tune_private(args, cfg)
    if cfg.tune_clip_norms:
        raise ValueError(f"{args.config}: [tuning] clip_norms = {list(cfg.tune_clip_norms)} "
                         "is searched by `experiment tune --private` only (one [privacy] "
                         "clip_norm serves every method of the free tuning); add --private "
                         "or remove clip_norms.")
    print(NOT_CHARGED)
    run_experiment(cfg, tuning=True, progress=not args.no_progress, jobs=args.jobs)
    best = select_best(cfg, load_records(cfg, tuning=True))
    out = Path(cfg.report_dir or cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "tuning.json", best)  # strict JSON (docs/outputs.md)
    tuned = _write_tuned(args, tuned_config_text(cfg, best), "tuned")
    for method, b in best.items():
        print(f"{method:>16}: {b['params']}  validation accuracy {b['validation_accuracy']:.4f}")
    print(f"wrote {tuned} (tuned values as defaults) and {out / 'tuning.json'}")
    print(f"next: dpprecond experiment run {tuned}")
    return 0


def _tune_private(args: argparse.Namespace, cfg: Any) -> int:
    """``experiment tune --private``: :mod:`dpprecond.experiments.private_tuning`."""
    from dpprecond._files import write_json
    from dpprecond.experiments.private_tuning import (
        CHARGED,
        private_tuned_text,
        run_private_tuning,
        select_private,
    )

    if args.jobs != 1:
        raise ValueError(f"--jobs={args.jobs}: experiment tune --private runs its cells in "
                         "one process; drop --jobs.")
    print(CHARGED)
    best = select_private(cfg, run_private_tuning(cfg, progress=not args.no_progress))
    out = Path(cfg.report_dir or cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "tuning-private.json", {"private": True, "note": CHARGED,
                                             "methods": best})
    tuned = _write_tuned(args, private_tuned_text(cfg, best), "tuned-private")
    for method, b in best.items():
        for c in b["cells"]:
            eps = "inf (non-private)" if c["epsilon_total"] is None \
                else f"{c['epsilon_total']:.4f}"
            acc = "none" if c["test_accuracy"] is None else f"{c['test_accuracy']:.4f}"
            target = "inf" if c["epsilon_target"] is None else f"{c['epsilon_target']:g}"
            clip = "" if c["clip_norm"] is None else f", clip_norm {c['clip_norm']:g}"
            print(f"{method:>16} K={c['clients']} {c['partition']} seed={c['seed']} "
                  f"epsilon={target}: {c['params']}{clip}  test accuracy {acc}; total "
                  f"epsilon {eps} at delta={cfg.delta:g}, tuning included")
    print(f"wrote {out / 'tuning-private.json'} (the private selections) and {tuned} (the "
          "selected values as defaults; running it spends its epsilons again)")
    return 0


def _write_tuned(args: argparse.Namespace, text: str, suffix: str) -> Path:
    """Write ``<name>-<suffix>.toml`` next to the experiment file (``--output`` and
    ``--report`` rewritten into it); return its path."""
    source = Path(args.config)
    tuned = source.with_name(f"{source.stem}-{suffix}.toml")
    if args.output or args.report:
        import os
        import tomllib

        import tomli_w

        doc = tomllib.loads(text)
        if args.output:  # the tuned file must run into the same directory
            doc["output"] = str(Path(args.output).resolve())
        if args.report:
            doc["report"] = Path(os.path.relpath(Path(args.report).resolve(),
                                                 tuned.parent.resolve())).as_posix()
        text = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        text += "\n" + tomli_w.dumps(doc)
    tuned.write_text(text, encoding="utf-8")
    return tuned


def report(args: argparse.Namespace) -> int:
    """``experiment report``."""
    from dpprecond.experiments.report import write_report

    for path in args.config:
        cfg = _load(path, args.output)
        md = write_report(cfg, config_path=path, force=args.force)
        print(f"wrote {md}")
    return 0


def compare(args: argparse.Namespace) -> int:
    """``experiment compare``."""
    from dpprecond.experiments.compare import comparison_figure, comparison_report

    cfgs = [_load(p, None) for p in args.config]
    text = comparison_report(cfgs, reference=args.reference, labels=args.labels)
    print(text)
    if args.md:
        Path(args.md).write_text(text, encoding="utf-8")
        print(f"wrote {args.md}")
    if args.figure:
        print(f"wrote {comparison_figure(cfgs, args.figure, labels=args.labels)}")
    return 0
