"""Federated defaults that need no hand tuning: weighting, adaptive clipping, private tuning.

Cells: ``digits-K10`` and ``digits-K20`` (fixed pixel features in [-1, 1], IID split),
``fmnist-K20`` (Fashion-MNIST pixels in [-1, 1], 60,000 training records, IID over 20
clients), ``fmnist-pca64-K20`` (the same, through ``run_pipeline``: 64 private federated
PCA features, the epsilon the total of both stages; rows ``fedgd``, ``lagged`` and
``default`` only) and ``synthetic-K100``
(:func:`dpprecond.data.synthetic_fl.multinomial_logistic`, seed 0: 8,000 training and
2,000 test records, d = 20, 10 classes, Bayes accuracy 0.85; Dirichlet(0.1)
label split over 100 clients). T = 70 rounds, delta = 1e-5, the full-batch mechanism, PLD
accountant, seeds 0, 1, 2 (``run_federated(seed=s)``: the same partition and noise streams
for every configuration of a seed). Configurations:

====================  ==========================================================================
``fedgd``             DP-FedGD as the paper runs it (lr 0.1, C = 10, uniform weights)
``lagged``            sofim-lagged, uniform weights, the fixed clip 10 (the package default
                      until 2026-12-02; rows measured before were labelled ``default``)
``default``           the package defaults: ``DEFAULT_ALGORITHM`` with ``FLConfig()``'s
                      size weights and adaptive clipping (the same runs as
                      ``lagged-ac-size``)
``fedgd-size``        DP-FedGD, size weights
``fedgd-ac``          DP-FedGD, adaptive clipping (median, from C = 10), uniform weights
``fedgd-ac-size``     DP-FedGD, adaptive clipping, size weights
``lagged-ac-size``    sofim-lagged at its defaults, adaptive clipping, size weights
``adam-ac-size``      server Adam at its defaults, adaptive clipping, size weights
``tuned-private``     :func:`dpprecond.fl.tune_private` over its ``DEFAULT_SEARCH`` (size
                      weights, logarithmic number of trials, mean 3, scored on the
                      training records): the epsilon is the total
``best-free``         the best of ``FREE_GRID`` (27 candidates, size weights) by *test*
                      accuracy at each (cell, eps, seed): tuned for free, **not private**
``default-start1``    the defaults with adaptive clipping started at C = 1
                      (``AdaptiveClip(initial_clip=1.0)``), a candidate default
``default-start1-lr0.5``  the same with the clip's learning rate 0.5
====================  ==========================================================================

Every run is one JSON line in ``--out`` (default ``benchmarks/out/fl_defaults.jsonl``);
finished runs are skipped on restart (resumable). ``--summarize`` prints the markdown
tables of docs/fl_defaults.md. Accuracy only; the one wall time reported is that of a
private tuning run (``--time-tuning``), on a loaded machine.

    PYTHONPATH=src python benchmarks/fl_defaults.py --cells digits-K20 --eps 1 4
    PYTHONPATH=src python benchmarks/fl_defaults.py --summarize
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpprecond.data.base import Dataset
from dpprecond.fl import DEFAULT_ALGORITHM, AdaptiveClip, FLConfig, run_federated
from dpprecond.fl.tuning import search_space, tune_private

OUT = Path(__file__).resolve().parent / "out" / "fl_defaults.jsonl"
SEEDS = (0, 1, 2)
ROUNDS = 70
CONFIGS = ("fedgd", "lagged", "default", "fedgd-size", "fedgd-ac", "fedgd-ac-size",
           "lagged-ac-size", "adam-ac-size", "tuned-private", "best-free",
           "default-start1", "default-start1-lr0.5",
           "secure-fedgd", "secure-fixed", "secure-default")
#: The grid that ``best-free`` searches with the test set (not private): DP-FedGD,
#: sofim-lagged and server Adam at three server steps each, with fixed clips 1 and 10 and
#: adaptive clipping (median) from 1.
_STEPS = {"fedgd": (0.1, 0.3, 1.0), "sofim-lagged": (0.02, 0.05, 0.1),
          "adam": (0.003, 0.01, 0.03)}
FREE_GRID = (search_space(_STEPS, clip_norms=(1.0, 10.0))
             + search_space(_STEPS, clip_norms=(1.0,), adaptive=(AdaptiveClip(),)))
CELLS = {"digits-K10": ("digits", 10, "iid"), "digits-K20": ("digits", 20, "iid"),
         "synthetic-K100": ("synthetic", 100, "dirichlet"),
         "fmnist-K20": ("fashion-mnist", 20, "iid"),
         "fmnist-pca64-K20": ("fashion-mnist", 20, "iid")}
#: Cells run through :func:`dpprecond.pipeline.run_pipeline`: private federated PCA to 64
#: features (its default share of the budget, public row bound sqrt(784) = 28 for pixels
#: in [-1, 1]), then the training; the epsilon is the total of both stages. Only the
#: configurations of :data:`PIPELINE_CONFIGS` run there.
PIPELINE_CELLS = {"fmnist-pca64-K20": "pca:64"}
PIPELINE_ROW_NORM = 28.0
PIPELINE_CONFIGS = ("fedgd", "lagged", "default")


def load(name: str) -> Dataset:
    """The cell's data: digits or Fashion-MNIST pixels in [-1, 1], or the synthetic problem
    (seed 0)."""
    if name in ("digits", "fashion-mnist"):
        from dpprecond.features import load_features

        return load_features(name, None, "pixels", None, None)[0]
    from dpprecond.data.synthetic_fl import multinomial_logistic

    return multinomial_logistic(seed=0)


def _run(ds: Dataset, K: int, partition: str, eps: float, seed: int, algorithm: str,
         config: FLConfig, **kw: Any) -> float:
    res = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                        algorithm=algorithm, n_clients=K, partition=partition,  # type: ignore[arg-type]
                        alpha=0.1, config=config, seed=seed, **kw)
    return float(res.final_accuracy)


def measure_pipeline(ds: Dataset, K: int, partition: str, eps: float, seed: int,
                     name: str, features: str) -> dict[str, Any]:
    """One (configuration, eps, seed) of a pipeline cell: the same rows as
    :func:`measure` (``fedgd`` and ``lagged`` with the paper's uniform weights and fixed
    clip 10, ``default`` with ``run_pipeline``'s defaults), the PCA included."""
    from dpprecond.pipeline import run_pipeline

    paper = {"weighting": "uniform", "adaptive_clip": None}
    settings: dict[str, dict[str, Any]] = {
        "fedgd": {"algorithm": "fedgd", **paper},
        "lagged": {"algorithm": "sofim-lagged", **paper},
        "default": {"algorithm": DEFAULT_ALGORITHM}}
    res = run_pipeline(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                       features=features, target_epsilon=eps, row_norm=PIPELINE_ROW_NORM,
                       n_clients=K, partition=partition, n_rounds=ROUNDS, seed=seed,  # type: ignore[arg-type]
                       **settings[name])
    return {"accuracy": float(res.fl.final_accuracy), "epsilon": float(res.epsilon)}


def measure(ds: Dataset, K: int, partition: str, eps: float, seed: int,
            name: str) -> dict[str, Any]:
    """One (configuration, eps, seed) of a cell."""
    # the paper's protocol (uniform weights, the fixed clip 10), which the rows vary
    base = FLConfig(n_rounds=ROUNDS, target_epsilon=eps, weighting="uniform",
                    adaptive_clip=None)
    size = replace(base, weighting="size")
    ac = AdaptiveClip()
    out: dict[str, Any] = {}
    # the configurations that are one run: (algorithm, settings)
    single = {"fedgd": ("fedgd", base), "lagged": ("sofim-lagged", base),
              "default": (DEFAULT_ALGORITHM, FLConfig(n_rounds=ROUNDS, target_epsilon=eps)),
              "fedgd-size": ("fedgd", size),
              "fedgd-ac": ("fedgd", replace(base, adaptive_clip=ac)),
              "fedgd-ac-size": ("fedgd", replace(size, adaptive_clip=ac)),
              "lagged-ac-size": ("sofim-lagged", replace(size, adaptive_clip=ac)),
              "adam-ac-size": ("adam", replace(size, adaptive_clip=ac)),
              "default-start1": (DEFAULT_ALGORITHM, FLConfig(
                  n_rounds=ROUNDS, target_epsilon=eps,
                  adaptive_clip=AdaptiveClip(initial_clip=1.0))),
              "default-start1-lr0.5": (DEFAULT_ALGORITHM, FLConfig(
                  n_rounds=ROUNDS, target_epsilon=eps,
                  adaptive_clip=AdaptiveClip(initial_clip=1.0, learning_rate=0.5))),
              # secure aggregation (size weights, the only weighting its sums run):
              # DP-FedGD at its defaults, the default method with the fixed clip 10, and
              # the package default (adaptive clipping, its count in the secure sum)
              "secure-fedgd": ("fedgd", replace(size, trust="secure-aggregation")),
              "secure-fixed": (DEFAULT_ALGORITHM, FLConfig(
                  n_rounds=ROUNDS, target_epsilon=eps, trust="secure-aggregation",
                  adaptive_clip=None)),
              "secure-default": (DEFAULT_ALGORITHM, FLConfig(
                  n_rounds=ROUNDS, target_epsilon=eps, trust="secure-aggregation"))}
    if name in single:
        algorithm, config = single[name]
        out["accuracy"] = _run(ds, K, partition, eps, seed, algorithm, config)
    elif name == "tuned-private":
        res = tune_private(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                           config=size, mean_trials=3.0, trials="logarithmic", n_clients=K,
                           partition=partition, alpha=0.1, seed=seed)  # type: ignore[arg-type]
        out["accuracy"] = float(res.result.final_accuracy) if res.result else float("nan")
        out["epsilon"] = res.epsilon
        out["selected"] = None if res.candidate is None else res.candidate.describe()
    elif name == "best-free":
        best, arg = -1.0, None
        for cand in FREE_GRID:
            acc = _run(ds, K, partition, eps, seed, cand.algorithm, cand.config(size),
                       learning_rate=cand.learning_rate,
                       method_options=dict(cand.method_options))
            if acc > best:
                best, arg = acc, cand.describe()
        out["accuracy"], out["selected"] = best, arg
    else:
        raise ValueError(f"unknown configuration {name!r}")
    return out


def _done(path: Path) -> dict[tuple, dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[(r["cell"], r["eps"], r["seed"], r["config"])] = r
    return rows


def run_grid(cells: list[str], eps_list: list[float], configs: list[str], path: Path) -> None:
    """Measure every missing (cell, eps, seed, configuration); append as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _done(path)
    for cell in cells:
        data, K, partition = CELLS[cell]
        ds = load(data)
        for eps in eps_list:
            for seed in SEEDS:
                for name in configs:
                    features = PIPELINE_CELLS.get(cell)
                    if (cell, eps, seed, name) in done or \
                            (features is not None and name not in PIPELINE_CONFIGS):
                        continue
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got = (measure(ds, K, partition, eps, seed, name) if features is None
                               else measure_pipeline(ds, K, partition, eps, seed, name,
                                                     features))
                        row = {"cell": cell, "eps": eps, "seed": seed, "config": name,
                               **got}
                    with path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)


def summarize(path: Path) -> str:
    """Markdown: mean accuracy over the seeds (min-max) per cell, eps and configuration."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for (cell, eps, _seed, name), r in _done(path).items():
        groups[(cell, eps, name)].append(r["accuracy"])
    lines = []
    for cell in CELLS:
        eps_values = sorted({e for c, e, _ in groups if c == cell})
        if not eps_values:
            continue
        lines += [f"\n**{cell}** (mean of {len(SEEDS)} seeds, [min, max])\n",
                  "| configuration | " + " | ".join(f"eps {e:g}" for e in eps_values) + " |",
                  "|---|" + "---|" * len(eps_values)]
        for name in CONFIGS:
            cells = []
            for e in eps_values:
                v = groups.get((cell, e, name))
                cells.append("-" if not v else
                             f"{statistics.mean(v):.3f} [{min(v):.3f}, {max(v):.3f}]"
                             + ("" if len(v) == len(SEEDS) else f" ({len(v)} seeds)"))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_tuning(path: Path) -> None:
    """Wall time of one private tuning run (digits K = 20, eps 1), on a loaded machine."""
    ds = load("digits")
    start = time.perf_counter()
    res = tune_private(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                       config=FLConfig(n_rounds=ROUNDS, target_epsilon=1.0, weighting="size"),
                       mean_trials=3.0, trials="logarithmic", n_clients=20, seed=0)
    print(f"private tuning, digits K=20, eps 1, T={ROUNDS}: {time.perf_counter() - start:.1f} "
          f"s wall (loaded machine), epsilon {res.epsilon:.4f} total")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    p.add_argument("--eps", nargs="+", type=float, default=[1.0, 4.0])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--time-tuning", action="store_true")
    args = p.parse_args()
    if args.summarize:
        print(summarize(args.out))
    elif args.time_tuning:
        time_tuning(args.out)
    else:
        run_grid(args.cells, args.eps, args.configs, args.out)


if __name__ == "__main__":
    main()
