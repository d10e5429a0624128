"""The budget split of the private-features pipeline (issue 11): what the PCA stage costs.

``dpprecond fl --features pca:64`` spends a share ``pca_share`` of the budget's Gaussian
precision on federated private PCA and the rest on training (:mod:`dpprecond.pipeline`).
This measures, on a validation split of the Fashion-MNIST *training* data (10% per class,
never the test set), the final accuracy for each share against two references on the same
split, seeds and clients:

- ``exact``: the features from the exact (non-private) top-64 subspace with the *whole*
  budget spent on training, i.e. what a free, perfect PCA would give (a bound on what the
  PCA stage can reach, not a private method);
- ``random``: the data-independent random features (``random:64``, free).

The gap ``exact - share`` is the PCA stage's cost at that split. Runs are saved as JSON
lines (resumable: a finished cell is skipped) and summarised as a markdown table of medians
over seeds.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/pipeline_share.py run
    PYTHONPATH=src python benchmarks/pipeline_share.py report --md docs/data/pipeline_share.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT_DIR, environment
from dpprecond.data import load_dataset
from dpprecond.experiments.runner import validation_split
from dpprecond.pipeline import run_pipeline

OUT = OUT_DIR / "pipeline_share.jsonl"
DIM = 64
ROW_NORM = 28.0  # pixels in [0, 1], 784 of them: a public bound on a row's norm


def _cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    cells = []
    for algorithm in args.algorithms:
        for partition in args.partitions:
            for eps in args.eps:
                for seed in args.seeds:
                    base = dict(algorithm=algorithm, clients=args.clients, partition=partition,
                                epsilon=eps, seed=seed, rounds=args.rounds,
                                learning_rate=args.learning_rate.get(algorithm))
                    for share in args.shares:
                        cell = {**base, "features": "pca", "share": share}
                        if args.trust != "local":  # (cells without the key are "local")
                            cell["trust"] = args.trust
                        cells.append(cell)
                    if not args.no_references:
                        cells.append({**base, "features": "exact", "share": 0.0})
                        cells.append({**base, "features": "random", "share": 0.0})
    return cells


def _key(cell: dict[str, Any]) -> str:
    return json.dumps(cell, sort_keys=True)


def run(args: argparse.Namespace) -> None:
    ds = load_dataset("fashion-mnist")
    X = np.asarray(ds.X_train, dtype=np.float64)
    y = np.asarray(ds.y_train)
    tr, va = validation_split(y, 0.1, np.random.default_rng(20261201))
    X_tr, y_tr, X_va, y_va = X[tr], y[tr], X[va], y[va]
    # the exact top-64 subspace of the training rows (for the "exact" reference only)
    _, V = np.linalg.eigh(X_tr.T @ X_tr)
    V_exact = V[:, ::-1][:, :DIM]
    done = set()
    if OUT.exists():
        done = {_key(json.loads(line)["cell"]) for line in OUT.read_text().splitlines() if line}
    todo = [c for c in _cells(args) if _key(c) not in done]
    print(f"# {environment()}; {len(todo)} runs to do, {len(done)} done", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    for cell in todo:
        t0 = time.perf_counter()
        opts = {} if cell["learning_rate"] is None else {"learning_rate": cell["learning_rate"]}
        common = dict(target_delta=1e-5, algorithm=cell["algorithm"], method_options=opts,
                      n_clients=cell["clients"], partition=cell["partition"],
                      n_rounds=cell["rounds"], seed=cell["seed"], row_norm=ROW_NORM)
        eps = None if math.isinf(cell["epsilon"]) else cell["epsilon"]
        if cell["features"] == "exact":
            scale = math.sqrt(DIM) / ROW_NORM
            res = run_pipeline(X_tr @ V_exact * scale, y_tr, X_va @ V_exact * scale, y_va,
                               ds.n_classes, features="pixels", target_epsilon=eps,
                               **{**common, "row_norm": math.sqrt(DIM)})
        elif cell["features"] == "random":
            res = run_pipeline(X_tr, y_tr, X_va, y_va, ds.n_classes, features=f"random:{DIM}",
                               target_epsilon=eps, **common)
        else:
            res = run_pipeline(X_tr, y_tr, X_va, y_va, ds.n_classes, features=f"pca:{DIM}",
                               target_epsilon=eps, pca_share=cell["share"],
                               trust=cell.get("trust", "local"), **common)
        rec = {"cell": cell, "accuracy": res.final_accuracy, "epsilon": res.epsilon,
               "pca_epsilon": res.pca_epsilon, "seconds": time.perf_counter() - t0}
        with OUT.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(f"{cell['algorithm']} {cell['partition']} eps={cell['epsilon']} "
              f"{cell['features']} share={cell['share']} seed={cell['seed']}: "
              f"{rec['accuracy']:.4f} (eps spent {rec['epsilon']:.4f}, "
              f"{rec['seconds']:.1f} s)", flush=True)


def report(args: argparse.Namespace) -> None:
    recs = [json.loads(line) for line in OUT.read_text().splitlines() if line]
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in recs:
        c = r["cell"]
        g = groups.setdefault((c["algorithm"], c["partition"], c["epsilon"]), {})
        col = c["features"] if c["features"] != "pca" else f"pca {c['share']:g}"
        if c.get("trust", "local") != "local":
            col += " (secure agg.)"
        g.setdefault(col, []).append(r["accuracy"])
    cols = sorted({k for g in groups.values() for k in g if k.startswith("pca")},
                  key=lambda s: ("secure" in s, float(s.split()[1])))
    header = ["method", "partition", "eps", *cols, "exact PCA (free)", "random (free)",
              "best local share"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (alg, part, eps), g in sorted(groups.items(), key=lambda t: (t[0][0], t[0][1], t[0][2])):
        med = {k: statistics.median(v) for k, v in g.items()}
        local = [c for c in cols if "secure" not in c]
        best = max(local, key=lambda c: med.get(c, -1.0)) if local else "-"
        row = [alg, part, f"{eps:g}", *[f"{med[c]:.4f}" if c in med else "-" for c in cols],
               f"{med.get('exact', math.nan):.4f}", f"{med.get('random', math.nan):.4f}",
               best.split()[1] if local else "-"]
        lines.append("| " + " | ".join(row) + " |")
    n_seeds = max(len(v) for g in groups.values() for v in g.values())
    text = (f"Median validation accuracy over {n_seeds} seeds (Fashion-MNIST, 64 features, "
            f"K = {recs[0]['cell']['clients']}, T = {recs[0]['cell']['rounds']}; "
            "validation split of the training data).\n\n" + "\n".join(lines) + "\n")
    print(text)
    if args.md:
        Path(args.md).write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.5])
    r.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0, 5.0])
    r.add_argument("--algorithms", nargs="+", default=["fedgd"])
    r.add_argument("--partitions", nargs="+", default=["iid", "dirichlet"])
    r.add_argument("--clients", type=int, default=20)
    r.add_argument("--rounds", type=int, default=70)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--trust", default="local", choices=["local", "secure-aggregation"])
    r.add_argument("--no-references", action="store_true",
                   help="skip the exact-PCA and random-feature references")
    r.add_argument("--learning-rate", type=json.loads, default={},
                   help='per-algorithm learning rates as JSON, e.g. \'{"fedgd": 1.0}\'')
    rep = sub.add_parser("report")
    rep.add_argument("--md")
    args = p.parse_args()
    run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    main()
