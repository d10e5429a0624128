"""Measurement 1 of issue 3: final test accuracy of DP-FedGD and both DP-FedSOFIM forms.

Grid: datasets x partitions (IID, Dirichlet 0.5) x epsilon in {0.5, 1, 2, 5, 10, inf} x
algorithms (fedgd, sofim = paper's gradient form, sofim-momentum = authors' code form) x
seeds, K = 20 clients, T = 70 rounds, the published v2 settings (lr 0.1, beta 0.9, rho 0.5,
C = 10, bias correction, delta 1e-5, PLD accountant), features = fixed standardized pixels.

Every finished run is appended as one JSON line to ``--out`` (so a partial grid is usable);
runs already in the file are skipped on restart. ``--summarize`` prints the markdown tables.
The grid was run as two single-threaded processes (one per partition) on 2 cores:

    export OPENBLAS_NUM_THREADS=1
    python benchmarks/fl_accuracy.py --out fl_accuracy.jsonl --partitions iid &
    python benchmarks/fl_accuracy.py --out fl_accuracy.jsonl --partitions dirichlet &
    python benchmarks/fl_accuracy.py --out fl_accuracy.jsonl --summarize
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np

from dpprecond.features import load_features
from dpprecond.fl import FLConfig, run_federated

EPSILONS: tuple[float | None, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, None)
ALGORITHMS = ("fedgd", "sofim", "sofim-momentum")
#: Extra column, run separately with ``--algorithms sofim-lagged`` (our option, not the paper).
ALL_ALGORITHMS = (*ALGORITHMS, "sofim-lagged")
PARTITIONS = ("iid", "dirichlet")


def key(rec: dict) -> tuple:
    return (rec["data"], rec["partition"], rec["epsilon"], rec["algorithm"], rec["seed"])


def run_grid(args: argparse.Namespace) -> None:
    out = Path(args.out)
    done = set()
    if out.exists():
        done = {key(json.loads(line)) for line in out.read_text().splitlines() if line}
    for data in args.data:
        ds, feat = load_features(data)
        grid = itertools.product(args.partitions, EPSILONS, range(args.seeds), args.algorithms)
        for partition, eps, seed, algorithm in grid:
            rec = {"data": data, "partition": partition, "epsilon": eps,
                   "algorithm": algorithm, "seed": seed}
            if key(rec) in done:
                continue
            start = time.perf_counter()
            res = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                                algorithm=algorithm, n_clients=args.clients,
                                partition=partition, alpha=0.5, seed=seed,
                                config=FLConfig(n_rounds=args.rounds,
                                                **({"noise_multiplier": 0.0} if eps is None
                                                   else {"target_epsilon": eps})))
            rec.update(features=feat, clients=args.clients, rounds=args.rounds,
                       noise_multiplier=res.noise_multiplier,
                       epsilon_spent=None if math.isinf(res.epsilon) else res.epsilon,
                       final_accuracy=res.final_accuracy,
                       accuracy=[h["test_accuracy"] for h in res.history],
                       seconds=time.perf_counter() - start)
            with out.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(f"{data} {partition} eps={eps} {algorithm} seed={seed}: "
                  f"{res.final_accuracy:.4f} ({rec['seconds']:.1f} s)", flush=True)


def summarize(path: Path) -> str:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line]
    algos = [a for a in ALL_ALGORITHMS if any(r["algorithm"] == a for r in recs)]
    lines = []
    for data, partition in itertools.product(dict.fromkeys(r["data"] for r in recs),
                                             PARTITIONS):
        sub = [r for r in recs if r["data"] == data and r["partition"] == partition]
        if not sub:
            continue
        lines += [f"\n**{data}, {partition}** (final test accuracy %, mean ± std over seeds; "
                  "n = runs)\n",
                  "| epsilon | " + " | ".join(algos) + " | "
                  + " | ".join(f"{a} - fedgd" for a in algos[1:]) + " |",
                  "|---" * (2 * len(algos)) + "|"]
        for eps in EPSILONS:
            cells, means = [], {}
            for a in algos:
                acc = [100 * r["final_accuracy"] for r in sub
                       if r["epsilon"] == eps and r["algorithm"] == a]
                if acc:
                    means[a] = float(np.mean(acc))
                    cells.append(f"{np.mean(acc):.2f} ± {np.std(acc):.2f} (n={len(acc)})")
                else:
                    cells.append("not run")
            diffs = [f"{means[a] - means['fedgd']:+.2f}" if a in means and "fedgd" in means
                     else "" for a in algos[1:]]
            label = "inf" if eps is None else f"{eps:g}"
            lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    lines += ["\n**Rounds to reach DP-FedGD's final accuracy** (first round where the seed-mean "
              "accuracy curve reaches the seed-mean final accuracy of fedgd; '-' = never)\n",
              "| data | partition | epsilon | " + " | ".join(algos) + " |",
              "|---" * (3 + len(algos)) + "|"]
    for data, partition in itertools.product(dict.fromkeys(r["data"] for r in recs),
                                             PARTITIONS):
        for eps in EPSILONS:
            curves = {}
            for a in algos:
                acc = [r["accuracy"] for r in recs if r["data"] == data
                       and r["partition"] == partition and r["epsilon"] == eps
                       and r["algorithm"] == a]
                if acc:
                    curves[a] = np.mean(acc, axis=0)
            if "fedgd" not in curves:
                continue
            target = curves["fedgd"][-1]
            cells = []
            for a in algos:
                if a not in curves:
                    cells.append("")
                    continue
                hit = np.flatnonzero(curves[a] >= target - 1e-12)
                cells.append(str(int(hit[0]) + 1) if len(hit) else "-")
            label = "inf" if eps is None else f"{eps:g}"
            lines.append(f"| {data} | {partition} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="fl_accuracy.jsonl")
    p.add_argument("--data", nargs="+", default=["digits", "fashion-mnist"])
    p.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=PARTITIONS)
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALL_ALGORITHMS)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=70)
    p.add_argument("--summarize", action="store_true")
    args = p.parse_args()
    if args.summarize:
        if not Path(args.out).exists():  # raw runs are not tracked: the grid makes them
            p.exit(1, f"{args.out} does not exist: run the grid first (this script without "
                      "--summarize writes it; docs/fl_results.md has the commands)\n")
        print(summarize(Path(args.out)))
    else:
        run_grid(args)


if __name__ == "__main__":
    main()
