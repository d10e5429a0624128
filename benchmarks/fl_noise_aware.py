"""Noise-aware SOFIM against DP-FedGD, server Adam and the other SOFIM forms (issue 9).

Grid: data in {digits, fashion-mnist} (fixed pixel features), K = 20 clients, partition in
{IID, Dirichlet(0.5)}, epsilon in {0.5, 1, 2, 5, 10}, T = 70 rounds, C = 10, delta = 1e-5,
the paper's full-batch mechanism, noise calibrated with the PLD accountant, uniform weights,
3 evaluation seeds. Methods (server transforms of :mod:`dpprecond.fl.server`):

=====================  =====================================================================
``fedgd``              DP-FedGD, ``sgd(lr)``
``adam``               server Adam, ``adam(lr)`` (b1 0.9, b2 0.99, eps 1e-3)
``sofim``              the paper's form ``H(M_t) G_t`` (reference)
``sofim-momentum``     the authors' code form ``H(M_t) M_t`` (reference)
``sofim-lagged``       ``H(M_{t-1}) G_t``
``sofim-na-lagged``    noise-aware lagged form, ``noise_variance = s^2``
``sofim-na-momentum``  noise-aware momentum form, ``noise_variance = s^2``
``sofim-na``           noise-aware paper form, ``noise_variance = s^2``
=====================  =====================================================================

All SOFIM forms use beta 0.9, rho 0.5 and bias correction (the published settings).
``s^2 = aggregate_noise_variance(z, C, sizes)`` with ``z`` from
``dpprecond.fl.accounting.resolve_noise_multiplier(config)``; it is public (a function of z,
C and the client sizes), so the option costs no privacy.

Protocol. Seed ``s`` gives ``sim, part, val = SeedSequence(s).spawn(3)`` (as in
:mod:`dpprecond.experiments.runner`): ``part`` draws the partition, ``sim`` the model
initialisation and all noise, so every method sees the same partition and noise streams
(paired comparisons). **Tuning**: the learning rate of every method is chosen separately for
each (data, partition, epsilon) on a stratified 10 % validation split of the *training* data
(``validation_split`` with ``val``), training on the other 90 %, scored by the final
validation accuracy averaged over the tuning seeds (1000, 1001, ... : disjoint from the
evaluation seeds). The search starts from three points of the ladder
``{1e-4, 3e-4, 1e-3, ..., 1000}`` and extends by one ladder point whenever the best point is
at an edge (at most ``--max-extend`` times per side). The test set is never used for tuning.
**The tuning is not charged to the privacy budget.** **Evaluation**: the tuned rate, the
full training set, seeds 0, 1, 2, final test accuracy.

Every run is appended as one JSON line to ``--out`` (default
``benchmarks/out/fl_noise_aware.jsonl``) under a file lock; finished runs are skipped on
restart, so the script resumes. ``--summarize`` prints the markdown tables. Commands used
for docs/fl_noise_aware.md (two processes, one per partition, one BLAS thread each)::

    export PYTHONPATH=src OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    python benchmarks/fl_noise_aware.py --partitions iid &
    python benchmarks/fl_noise_aware.py --partitions dirichlet &
    wait
    python benchmarks/fl_noise_aware.py --summarize > benchmarks/out/fl_noise_aware.md
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond.data import load_dataset
from dpprecond.experiments.runner import validation_split
from dpprecond.features import featurize
from dpprecond.fl import server
from dpprecond.fl.accounting import resolve_noise_multiplier
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition
from dpprecond.fl.simulator import ClientData, FLConfig, simulate

OUT = Path(__file__).resolve().parent / "out" / "fl_noise_aware.jsonl"
EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
PARTITIONS = ("iid", "dirichlet")
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0,
          1000.0)
#: method -> (factory of the server optimizer from (lr, s2), first three ladder points)
METHODS: dict[str, tuple[Callable[[float, float], server.GradientTransformation],
                         tuple[float, ...]]] = {
    "fedgd": (lambda lr, s2: server.sgd(lr), (0.1, 0.3, 1.0)),
    "adam": (lambda lr, s2: server.adam(lr), (0.003, 0.01, 0.03)),
    "sofim": (lambda lr, s2: server.sofim(lr), (0.03, 0.1, 0.3)),
    "sofim-momentum": (lambda lr, s2: server.sofim(lr, precondition="momentum"),
                       (0.1, 0.3, 1.0)),
    "sofim-lagged": (lambda lr, s2: server.sofim(lr, lagged=True), (0.03, 0.1, 0.3)),
    "sofim-na-lagged": (lambda lr, s2: server.sofim(lr, lagged=True, noise_variance=s2),
                        (0.03, 0.1, 0.3)),
    "sofim-na-momentum": (lambda lr, s2: server.sofim(lr, precondition="momentum",
                                                      noise_variance=s2), (0.1, 0.3, 1.0)),
    "sofim-na": (lambda lr, s2: server.sofim(lr, noise_variance=s2), (0.03, 0.1, 0.3)),
}
NOISE_AWARE = ("sofim-na-lagged", "sofim-na-momentum", "sofim-na")
REFERENCES = ("fedgd", "adam", "sofim-lagged")


# ------------------------------------------------------------------------------ records


def record_key(rec: dict[str, Any]) -> tuple:
    return (rec["phase"], rec["data"], rec["partition"], rec["epsilon"], rec["method"],
            rec["lr"], rec["seed"])


def load_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_record(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps(rec) + "\n")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------- runs


class Problem:
    """One dataset's features, loaded once per process."""

    def __init__(self, name: str) -> None:
        ds = featurize(load_dataset(name), "pixels")
        self.name = name
        self.X_train, self.y_train = ds.X_train, ds.y_train
        self.X_test, self.y_test = ds.X_test, ds.y_test
        self.n_classes = ds.n_classes


def one_run(prob: Problem, phase: str, partition: str, eps: float, method: str, lr: float,
            seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one method with one learning rate; tuning runs score on the validation split."""
    sim, part, val = np.random.SeedSequence(seed).spawn(3)
    X, y = prob.X_train, prob.y_train
    if phase == "tune":
        tr, va = validation_split(y, 0.1, np.random.default_rng(val))
        X, y, X_eval, y_eval = X[tr], y[tr], X[va], y[va]
    else:
        X_eval, y_eval = prob.X_test, prob.y_test
    parts = make_partition(y, args.clients, partition, 0.5, np.random.default_rng(part))
    data = ClientData.from_partition(X, y, parts, prob.n_classes)
    config = FLConfig(n_rounds=args.rounds, clip_norm=args.clip_norm, target_epsilon=eps,
                      target_delta=args.delta, accountant="pld")
    z = resolve_noise_multiplier(config)
    s2 = server.aggregate_noise_variance(z, args.clip_norm, data.sizes)
    optimizer = METHODS[method][0](lr, s2)
    start = time.perf_counter()
    res = simulate(LinearSoftmax(X.shape[1], prob.n_classes), data, optimizer, config,
                   X_test=X_eval, y_test=y_eval, seed=sim)
    return {"phase": phase, "data": prob.name, "partition": partition, "epsilon": eps,
            "method": method, "lr": lr, "seed": seed, "clients": args.clients,
            "rounds": args.rounds, "clip_norm": args.clip_norm, "delta": args.delta,
            "noise_multiplier": z, "noise_variance": s2, "n_params": int(data.X.shape[1] + 1)
            * prob.n_classes, "epsilon_spent": res.epsilon,
            "final_accuracy": res.final_accuracy,
            "accuracy": [h["test_accuracy"] for h in res.history],
            "seconds": time.perf_counter() - start}


def tuning_scores(records: Iterable[dict[str, Any]], data: str, partition: str, eps: float,
                  method: str, seeds: list[int]) -> dict[float, float]:
    """Mean validation accuracy per learning rate, over the tuning seeds that finished."""
    acc: dict[float, list[float]] = defaultdict(list)
    for r in records:
        if (r["phase"], r["data"], r["partition"], r["epsilon"], r["method"]) == (
                "tune", data, partition, eps, method) and r["seed"] in seeds:
            acc[r["lr"]].append(r["final_accuracy"])
    return {lr: float(np.mean(v)) for lr, v in acc.items() if len(v) == len(seeds)}


def best_lr(scores: dict[float, float]) -> float:
    """Highest mean validation accuracy; ties go to the smaller rate."""
    return max(sorted(scores), key=lambda lr: scores[lr])


def next_points(scores: dict[float, float], start: tuple[float, ...],
                max_extend: int) -> list[float]:
    """Rates still to try: the start points, then one ladder step beyond a best edge."""
    missing = [lr for lr in start if lr not in scores]
    if missing:
        return missing
    tried = sorted(scores)
    best = best_lr(scores)
    i = LADDER.index(best)
    lo, hi = LADDER.index(start[0]), LADDER.index(start[-1])
    if best == tried[0] and i > 0 and lo - (i - 1) <= max_extend:
        return [LADDER[i - 1]]
    if best == tried[-1] and i < len(LADDER) - 1 and (i + 1) - hi <= max_extend:
        return [LADDER[i + 1]]
    return []


def run_grid(args: argparse.Namespace) -> None:
    out = Path(args.out)
    done = {record_key(r) for r in load_records(out)}
    for data in args.data:
        prob = Problem(data)
        methods = args.methods or tuple(METHODS)
        tune_seeds = list(range(1000, 1000 + (args.tune_seeds or (3 if data == "digits"
                                                                   else 1))))
        for eps, partition in itertools.product(args.epsilons, args.partitions):
            for method in methods:
                while True:  # adaptive learning-rate search on the validation split
                    scores = tuning_scores(load_records(out), data, partition, eps, method,
                                           tune_seeds)
                    todo = next_points(scores, METHODS[method][1], args.max_extend)
                    if not todo:
                        break
                    for lr, seed in itertools.product(todo, tune_seeds):
                        key = ("tune", data, partition, eps, method, lr, seed)
                        if key in done:
                            continue
                        rec = one_run(prob, "tune", partition, eps, method, lr, seed, args)
                        append_record(out, rec)
                        done.add(key)
                        print(f"tune  {data} {partition} eps={eps:g} {method} lr={lr:g} "
                              f"seed={seed}: val {rec['final_accuracy']:.4f} "
                              f"({rec['seconds']:.1f} s)", flush=True)
                lr = best_lr(tuning_scores(load_records(out), data, partition, eps, method,
                                           tune_seeds))
                for seed in args.seeds:
                    key = ("final", data, partition, eps, method, lr, seed)
                    if key in done:
                        continue
                    rec = one_run(prob, "final", partition, eps, method, lr, seed, args)
                    append_record(out, rec)
                    done.add(key)
                    print(f"final {data} {partition} eps={eps:g} {method} lr={lr:g} "
                          f"seed={seed}: test {rec['final_accuracy']:.4f} "
                          f"({rec['seconds']:.1f} s)", flush=True)


# ---------------------------------------------------------------------------- summary


def _fmt_eps(e: float) -> str:
    return f"{e:g}"


def _final_runs(recs: list[dict[str, Any]], tuned: dict[tuple, float]) -> dict[tuple, dict]:
    """``(data, partition, eps, method) -> {seed: record}`` of the tuned rate only."""
    out: dict[tuple, dict] = defaultdict(dict)
    for r in recs:
        cell = (r["data"], r["partition"], r["epsilon"], r["method"])
        if r["phase"] == "final" and tuned.get(cell) == r["lr"]:
            out[cell][r["seed"]] = r
    return out


def _tuned(recs: list[dict[str, Any]]) -> tuple[dict[tuple, float], dict[tuple, dict]]:
    scores: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in recs:
        if r["phase"] == "tune":
            scores[(r["data"], r["partition"], r["epsilon"], r["method"])][r["lr"]].append(
                r["final_accuracy"])
    tuned, info = {}, {}
    for cell, by_lr in scores.items():
        n = max(len(v) for v in by_lr.values())
        means = {lr: float(np.mean(v)) for lr, v in by_lr.items() if len(v) == n}
        lr = best_lr(means)
        tuned[cell] = lr
        tried = sorted(means)
        info[cell] = {"lr": lr, "val": means[lr], "tried": tried,
                      "edge": lr in (tried[0], tried[-1]) and len(tried) > 1}
    return tuned, info


def across_grid(cell_means: dict[tuple, dict[str, float]]) -> list[str]:
    """Best method per cell, and each method's standing over all cells and per data set.

    Only methods run in every cell take part (so that ranks compare like with like).
    Regret = the best mean of the cell minus the method's mean (points).
    """
    cells = [c for c, v in cell_means.items() if v]
    common = [m for m in METHODS if all(m in cell_means[c] for c in cells)]
    lines = ["\n### Best method per cell\n",
             f"Among the methods run in every cell ({', '.join(common)}).\n",
             "| data | partition | ε | best (mean) | runner-up | margin (points) |",
             "|---|---|---|---|---|---|"]
    for data, partition, e in cells:
        order = sorted(common, key=lambda m: -cell_means[(data, partition, e)][m])
        mean = cell_means[(data, partition, e)]
        lines.append(f"| {data} | {partition} | {_fmt_eps(e)} | {order[0]} | {order[1]} | "
                     f"{mean[order[0]] - mean[order[1]]:+.2f} |")
    scopes = [("all cells", cells)] + [
        (data, [c for c in cells if c[0] == data]) for data in dict.fromkeys(c[0] for c in cells)]
    for scope, chosen in scopes:
        lines += [f"\n### Across the grid: {scope} ({len(chosen)} cells)\n",
                  "Mean rank (1 = best mean accuracy in the cell), cells with the best mean, "
                  "mean accuracy (%), the difference to fedgd's mean (mean, min, max; points) "
                  "and the regret (best mean of the cell minus the method's; mean, max).\n",
                  "| method | mean rank | cells best | mean acc | - fedgd mean | min | max | "
                  "regret mean | regret max |", "|---|---|---|---|---|---|---|---|---|"]
        stats = {}
        for m in common:
            ranks, gaps, regrets, accs = [], [], [], []
            for c in chosen:
                mean = cell_means[c]
                order = sorted(common, key=lambda x, mean=mean: -mean[x])
                ranks.append(order.index(m) + 1)
                gaps.append(mean[m] - mean["fedgd"] if "fedgd" in mean else float("nan"))
                regrets.append(mean[order[0]] - mean[m])
                accs.append(mean[m])
            stats[m] = (float(np.mean(ranks)), sum(r == 1 for r in ranks), float(np.mean(accs)),
                        gaps, regrets)
        for m in sorted(common, key=lambda m: stats[m][0]):
            rank, wins, acc, gaps, regrets = stats[m]
            lines.append(f"| {m} | {rank:.2f} | {wins} | {acc:.2f} | {np.mean(gaps):+.2f} | "
                         f"{min(gaps):+.2f} | {max(gaps):+.2f} | {np.mean(regrets):.2f} | "
                         f"{max(regrets):.2f} |")
    return lines


def summarize(path: Path) -> str:
    recs = load_records(path)
    tuned, info = _tuned(recs)
    finals = _final_runs(recs, tuned)
    datas = list(dict.fromkeys(r["data"] for r in recs))
    lines: list[str] = []
    cell_means: dict[tuple, dict[str, float]] = {}
    for data in datas:
        methods = [m for m in METHODS if any(c[0] == data and c[3] == m for c in finals)]
        for partition in PARTITIONS:
            cells = {(e, m): finals.get((data, partition, e, m), {}) for e in EPSILONS
                     for m in methods}
            if not any(cells.values()):
                continue
            lines += [f"\n### {data}, K = 20, {partition}\n",
                      "Final test accuracy (%), mean ± std over seeds (n = seeds run); "
                      "best mean per column in bold.\n",
                      "| method | " + " | ".join(f"ε = {_fmt_eps(e)}" for e in EPSILONS) + " |",
                      "|---" * (1 + len(EPSILONS)) + "|"]
            means = {k: 100 * float(np.mean([r["final_accuracy"] for r in v.values()]))
                     for k, v in cells.items() if v}
            best = {e: max((m for m in methods if (e, m) in means),
                           key=lambda m, e=e: means[(e, m)], default=None) for e in EPSILONS}
            for m in methods:
                row = []
                for e in EPSILONS:
                    v = cells[(e, m)]
                    if not v:
                        row.append("not run")
                        continue
                    acc = 100 * np.array([r["final_accuracy"] for r in v.values()])
                    txt = f"{acc.mean():.2f} ± {acc.std():.2f}"
                    txt += "" if len(acc) == 3 else f" (n={len(acc)})"
                    row.append(f"**{txt}**" if best[e] == m else txt)
                lines.append(f"| {m} | " + " | ".join(row) + " |")
            # rounds to reach FedGD's final accuracy
            lines += ["\nRounds to reach DP-FedGD's final test accuracy (first round at which "
                      "the seed-mean curve reaches fedgd's seed-mean round-70 accuracy; "
                      "'never' = not within 70 rounds).\n",
                      "| method | " + " | ".join(f"ε = {_fmt_eps(e)}" for e in EPSILONS) + " |",
                      "|---" * (1 + len(EPSILONS)) + "|"]
            curves = {k: np.mean([r["accuracy"] for r in v.values()], axis=0)
                      for k, v in cells.items() if v}
            for m in methods:
                row = []
                for e in EPSILONS:
                    if (e, m) not in curves or (e, "fedgd") not in curves:
                        row.append("")
                        continue
                    hit = np.flatnonzero(curves[(e, m)] >= curves[(e, "fedgd")][-1] - 1e-12)
                    row.append(str(int(hit[0]) + 1) if len(hit) else "never")
                lines.append(f"| {m} | " + " | ".join(row) + " |")
            # paired differences of the noise-aware forms
            lines += ["\nPaired differences over seeds (accuracy points, same partition and "
                      "noise streams): mean ± std of (row - column), and in how many seeds "
                      "the row is ahead.\n",
                      "| method | against | " + " | ".join(f"ε = {_fmt_eps(e)}"
                                                          for e in EPSILONS) + " |",
                      "|---" * (2 + len(EPSILONS)) + "|"]
            for m in [m for m in NOISE_AWARE if m in methods]:
                for ref in [r for r in (*REFERENCES, "sofim-momentum", "sofim")
                            if r in methods and r != m]:
                    if m == "sofim-na-lagged" and ref in ("sofim-momentum", "sofim"):
                        continue
                    if m == "sofim-na-momentum" and ref == "sofim":
                        continue
                    if m == "sofim-na" and ref == "sofim-momentum":
                        continue
                    row = []
                    for e in EPSILONS:
                        a, b = cells[(e, m)], cells[(e, ref)]
                        common = sorted(set(a) & set(b))
                        if not common:
                            row.append("")
                            continue
                        d = 100 * np.array([a[s]["final_accuracy"] - b[s]["final_accuracy"]
                                            for s in common])
                        row.append(f"{d.mean():+.2f} ± {d.std():.2f} "
                                   f"({int((d > 0).sum())}/{len(d)})")
                    lines.append(f"| {m} | {ref} | " + " | ".join(row) + " |")
            for e in EPSILONS:
                cell_means[(data, partition, e)] = {m: means[(e, m)] for m in methods
                                                    if (e, m) in means}
    lines += across_grid(cell_means)
    # noise and tuning
    lines += ["\n### Noise and tuned learning rates\n",
              "Noise multiplier z (PLD, T = 70, delta = 1e-5) and the per-coordinate noise "
              "variance s^2 of the aggregate (mean over the evaluation seeds; Dirichlet sizes "
              "vary by seed), and p s^2, the noise energy of one aggregate.\n",
              "| data | partition | ε | z | s^2 | p s^2 |", "|---|---|---|---|---|---|"]
    noise: dict[tuple, list[tuple[float, float, int]]] = defaultdict(list)
    for r in recs:
        if r["phase"] == "final" and r["method"] == "fedgd":
            noise[(r["data"], r["partition"], r["epsilon"])].append(
                (r["noise_multiplier"], r["noise_variance"], r["n_params"]))
    for (data, partition, e), v in sorted(noise.items()):
        z, s2, p = v[0][0], float(np.mean([x[1] for x in v])), v[0][2]
        lines.append(f"| {data} | {partition} | {_fmt_eps(e)} | {z:.3f} | {s2:.3g} | "
                     f"{p * s2:.3g} |")
    lines += ["\nTuned learning rate per cell (validation split of the training data, "
              "never the test set; tuning not charged to the privacy budget): "
              "`lr (validation accuracy %)`, `*` = best at an edge of the tried range.\n",
              "| data | partition | method | " + " | ".join(f"ε = {_fmt_eps(e)}"
                                                     for e in EPSILONS) + " |",
              "|---" * (3 + len(EPSILONS)) + "|"]
    for data in datas:
        for partition in PARTITIONS:
            for m in METHODS:
                row = []
                for e in EPSILONS:
                    i = info.get((data, partition, e, m))
                    row.append("" if i is None else f"{i['lr']:g} ({100 * i['val']:.1f})"
                               + ("*" if i["edge"] else ""))
                if any(row):
                    lines.append(f"| {data} | {partition} | {m} | " + " | ".join(row) + " |")
    n_runs = len(recs)
    secs = sum(r["seconds"] for r in recs)
    lines.append(f"\n{n_runs} runs ({sum(r['phase'] == 'tune' for r in recs)} tuning), "
                 f"{secs / 3600:.2f} CPU-hours of training in total.")
    return "\n".join(lines)


def diagnose(args: argparse.Namespace) -> str:
    """Signal against noise inside SOFIM's momentum along one ``sofim-lagged`` run.

    Full training set, seed 0 of the grid's protocol, learning rate ``--diag-lr``. Per
    round: ``||g||^2`` of the noise-free aggregate of the clipped gradients at the current
    model (computed for this analysis only; the run itself uses the noisy ``G``), the
    squared norm of its bias-corrected EMA ``m`` (the signal in the momentum), that of the
    actual momentum ``M_hat``, its noise energy ``p v_t``, the debiased estimate
    ``||M_hat||^2 - p v_t``, the cosine of ``M_hat`` with ``m`` and the shrinkage ``kappa``.
    """
    from dpprecond.fl import client as client_mod

    data_name, partition, eps = args.diagnose[0], args.diagnose[1], float(args.diagnose[2])
    prob = Problem(data_name)
    sim, part, _ = np.random.SeedSequence(0).spawn(3)
    parts = make_partition(prob.y_train, args.clients, partition, 0.5,
                           np.random.default_rng(part))
    data = ClientData.from_partition(prob.X_train, prob.y_train, parts, prob.n_classes)
    config = FLConfig(n_rounds=args.rounds, clip_norm=args.clip_norm, target_epsilon=eps,
                      target_delta=args.delta, accountant="pld")
    z = resolve_noise_multiplier(config)
    s2 = server.aggregate_noise_variance(z, args.clip_norm, data.sizes)
    model = LinearSoftmax(data.X.shape[1], prob.n_classes)
    init_seq, noise_root = sim.spawn(2)  # the streams simulate() uses
    params = model.init_params(np.random.default_rng(init_seq))
    p, beta, K = params.size, 0.9, data.n_clients
    opt = server.sofim(args.diag_lr, lagged=True)
    state = opt.init(params)
    w = np.full(K, 1.0 / K)
    sq = np.einsum("ij,ij->i", data.X, data.X)
    sig = np.zeros(p)
    lines = [f"{data_name}, {partition}, eps = {eps:g}: z = {z:.4g}, s^2 = {s2:.3g}, "
             f"p = {p}, p s^2 = {p * s2:.3g}; sofim-lagged, lr = {args.diag_lr:g}\n",
             "| round | \\|g\\|^2 | \\|m\\|^2 | \\|M_hat\\|^2 | p v_t | "
             "\\|M_hat\\|^2 - p v_t | cos(M_hat, m) | kappa | test acc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in range(args.rounds):
        rngs = client_mod.round_generators(noise_root, t, K + 1)
        S = model.clipped_grad_sums(params, data.X, data.y, data.bounds, args.clip_norm,
                                    x_sq_norms=sq)
        g = w @ (S / data.sizes[:, None].astype(float))
        U = client_mod.full_batch_messages(model, params, data.X, data.y, data.bounds,
                                           args.clip_norm, z, rngs[:K], x_sq_norms=sq)
        upd, state = opt.update(w @ U, state, params)
        params = params + upd
        sig = beta * sig + (1 - beta) * g
        m = sig / (1 - beta ** (t + 1))
        M = state[0].momentum / (1 - beta ** (t + 1))
        pv = p * server.momentum_noise_variance(s2, beta, t + 1)
        if t + 1 in (1, 2, 5, 10, 20, 40, 70):
            n2 = float(M @ M)
            _, acc = model.evaluate(params, prob.X_test, prob.y_test)
            cos = float(M @ m) / math.sqrt(n2 * float(m @ m))
            lines.append(f"| {t + 1} | {g @ g:.3g} | {m @ m:.3g} | {n2:.3g} | {pv:.3g} | "
                         f"{n2 - pv:.3g} | {cos:.3f} | {max(0.0, 1 - pv / n2):.3f} | "
                         f"{100 * acc:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--data", nargs="+", default=["digits", "fashion-mnist"])
    p.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=PARTITIONS)
    p.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    p.add_argument("--methods", nargs="+", default=None, choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--tune-seeds", type=int, default=None,
                   help="tuning seeds per point (default: 3 on digits, 1 on fashion-mnist)")
    p.add_argument("--max-extend", type=int, default=4)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=70)
    p.add_argument("--clip-norm", type=float, default=10.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--diagnose", nargs=3, metavar=("DATA", "PARTITION", "EPSILON"),
                   help="print the signal and noise inside the momentum along one run")
    p.add_argument("--diag-lr", type=float, default=0.1)
    args = p.parse_args()
    if args.diagnose:
        print(diagnose(args))
    elif args.summarize:
        print(summarize(Path(args.out)))
    else:
        run_grid(args)


if __name__ == "__main__":
    main()
