"""Tuning of the private-selection defaults on cells of the PCA regime map.

Compares configurations of ``method="select"`` (budget split, iteration grid, clip grid)
against Analyze Gauss on synthetic family 1 and on Fashion-MNIST; median sin-theta over
seeds. The defaults of ``fit_private_pca`` were chosen from this table (docs/pca.md).

    .venv/bin/python benchmarks/pca_tune.py --seeds 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table
from dpprecond.cli.pca import load_pca_matrix
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.metrics import sin_theta, top_right_singular_vectors


def narrow_grid(n: int, k: int) -> list[float]:
    """Powers of two around sqrt(k/n): the radii where the oracle's best R fell."""
    r = math.sqrt(k / n)
    return [r / 2, r, 2 * r, 4 * r]


CONFIGS = {
    "spec: 1/4, T<=64, mean 10": {"init_share": 0.25, "t_max": 64, "mean_trials": 10.0},
    "1/2, T<=8, mean 10": {"init_share": 0.5, "t_max": 8, "mean_trials": 10.0},
    "1/2, T<=8, mean 3": {"init_share": 0.5, "t_max": 8, "mean_trials": 3.0},
    "1/2, T<=4, mean 3, narrow R": {"init_share": 0.5, "t_max": 4, "mean_trials": 3.0,
                                    "clip_grid": "narrow"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--eps", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--cells", nargs="+", default=["20000x100", "20000x400", "100000x400",
                                                    "100000x1500", "fashion-mnist"])
    p.add_argument("--k", type=int, default=5)
    args = p.parse_args()
    print(f"# {environment()}", flush=True)
    rows = []
    for cell in args.cells:
        if cell == "fashion-mnist":
            X, row_norm, _ = load_pca_matrix(cell)
            A = X / row_norm
        else:
            n, d = (int(v) for v in cell.split("x"))
            A = spiked_covariance(n, d, args.k, 9.0, np.random.default_rng([n, d]))
            row_norm = 1.0
            X = A
        V = top_right_singular_vectors(A, args.k)
        n = X.shape[0]
        for eps in args.eps:
            res: dict[str, list[float]] = {"analyze_gauss": []}
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                ag = fit_private_pca(X, args.k, method="analyze_gauss", target_epsilon=eps,
                                     target_delta=1e-6, row_norm=row_norm, seed=seed)
                res["analyze_gauss"].append(sin_theta(ag.basis, V))
                for name, cfg in CONFIGS.items():
                    opts = dict(cfg)
                    if opts.get("clip_grid") == "narrow":
                        opts["clip_grid"] = narrow_grid(n, args.k)
                    r = fit_private_pca(X, args.k, method="select", target_epsilon=eps,
                                        target_delta=1e-6,
                                        row_norm=row_norm, seed=seed, **opts)
                    res.setdefault(name, []).append(sin_theta(r.basis, V))
                print(f"{cell} eps={eps:g} seed={seed}: "
                      + ", ".join(f"{m}={v[-1]:.3f}" for m, v in res.items())
                      + f" [{time.perf_counter() - t0:.0f}s]", flush=True)
            rows.append([cell, eps] + [statistics.median(v) for v in res.values()])
    print()
    print(markdown_table(["cell (n x d)", "eps", "analyze_gauss", *CONFIGS], rows))


if __name__ == "__main__":
    main()
