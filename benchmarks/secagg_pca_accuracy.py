"""Federated private PCA: local noise against secure sums with distributed Skellam noise.

For each K, epsilon and method the same rows, split into K equal clients, are fitted three
ways: central (one trusted curator, the Gaussian mechanism, the method's own accountant),
``trust="local"`` (every client adds the central noise to its part) and
``trust="secure-aggregation"`` (every release a secure sum of the clients' rounded parts
and Skellam shares, accounted in RDP). Prints a markdown table of the captured-variance
ratio ``||A X||_F^2 / ||A V||_F^2`` against the exact top-k ``V`` of the clipped rows
(mean over seeds), the secure fit's noise multiplier over the central one, and its
epsilon.

    PYTHONPATH=src python benchmarks/secagg_pca_accuracy.py --data digits --seeds 5
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dpprecond.data import load_dataset
from dpprecond.features import featurize
from dpprecond.pca import fit_private_pca
from dpprecond.pca.metrics import captured_variance_ratio, top_right_singular_vectors
from dpprecond.pca.rows import ClippedRows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="digits")
    p.add_argument("--components", type=int, default=8)
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--methods", nargs="+",
                   default=["auto", "analyze_gauss", "fixed", "power"])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--delta", type=float, default=1e-5)
    args = p.parse_args()
    ds = featurize(load_dataset(args.data), kind="pixels")
    X = np.asarray(ds.X_train, dtype=np.float64)
    n, d = X.shape
    row_norm = math.sqrt(d)  # pixels in [-1, 1]
    k = args.components
    A = ClippedRows.from_data(X, row_norm).materialize()
    V = top_right_singular_vectors(A, k)
    print(f"{args.data} pixels, n={n}, d={d}, k={k}, row_norm=sqrt(d), uncentered, "
          f"delta={args.delta:g}, {args.seeds} seeds, K equal clients")
    print("| method | K | epsilon | central | local | secagg | secagg z / central z "
          "| secagg epsilon (RDP) |")
    print("|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    for method in args.methods:
        for K in args.clients:
            bounds = np.linspace(0, n, K + 1).round().astype(np.int64)
            for eps in args.epsilons:
                cv: dict[str, list[float]] = {"central": [], "local": [], "secagg": []}
                ratio = spent = 0.0
                for seed in range(args.seeds):
                    kw = dict(method=method, target_epsilon=eps, target_delta=args.delta,
                              row_norm=row_norm, seed=seed)
                    c = fit_private_pca(X, k, **kw)  # type: ignore[arg-type]
                    loc = fit_private_pca(X, k, clients=bounds, **kw)  # type: ignore[arg-type]
                    sec = fit_private_pca(X, k, clients=bounds,  # type: ignore[arg-type]
                                          trust="secure-aggregation", **kw)
                    for key, res in (("central", c), ("local", loc), ("secagg", sec)):
                        cv[key].append(captured_variance_ratio(A, res.basis, V))
                    name = next(z for z in ("z_pca", "z0", "z_power")
                                if z in c.info["noise_multipliers"])
                    ratio = sec.info["noise_multipliers"][name] / c.info["noise_multipliers"][name]
                    spent = sec.epsilon
                print(f"| {method} | {K} | {eps:g} | {np.mean(cv['central']):.4f} | "
                      f"{np.mean(cv['local']):.4f} | {np.mean(cv['secagg']):.4f} | "
                      f"{ratio:.4f} | {spent:.4f} |", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
