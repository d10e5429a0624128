"""Private PCA on real data: digits and Fashion-MNIST (spec pca.md, measurement 2).

For k in {5, 10} and eps in {0.25, 0.5, 1, 2, 4} (delta = 1e-6), every private method's
captured variance ratio and spectral sin-theta against the exact top-k subspace, median
over seeds. Rows are pixels in [0, 1]; the public row-norm bound is the domain's sqrt(d).

    .venv/bin/python benchmarks/pca_real.py --seeds 3 --md docs/pca_real_tables.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table
from dpprecond.cli.pca import PRIVATE_METHODS, load_pca_matrix, run_pca_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=["digits", "fashion-mnist"])
    p.add_argument("--k", type=int, nargs="+", default=[5, 10])
    p.add_argument("--eps", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--md", type=Path)
    args = p.parse_args()
    print(f"# {environment()}", flush=True)
    sections = []
    for data in args.data:
        X, row_norm, desc = load_pca_matrix(data)
        for k in args.k:
            t0 = time.perf_counter()
            runs = [run_pca_table(X, k, list(PRIVATE_METHODS), args.eps, args.delta, row_norm,
                                  seed) for seed in range(args.seeds)]
            rows = []
            for i, rec in enumerate(runs[0][1:], start=1):
                recs = [run[i] for run in runs]
                rows.append([rec["method"], rec["epsilon_target"],
                             statistics.median(r["epsilon"] for r in recs),
                             statistics.median(r["captured_variance"] for r in recs),
                             statistics.median(r["sin_theta"] for r in recs),
                             statistics.median(r["fit_seconds"] for r in recs)])
            rows.sort(key=lambda r: (r[1], PRIVATE_METHODS.index(r[0])))
            title = (f"### {desc}, k = {k}, delta = {args.delta:g}, row_norm = {row_norm:g}, "
                     f"median of {args.seeds} seeds ({time.perf_counter() - t0:.0f} s)")
            table = markdown_table(["method", "eps", "eps spent", "captured var.", "sin-theta",
                                    "fit s"], rows)
            print(title + "\n\n" + table + "\n", flush=True)
            sections.append(title + "\n\n" + table + "\n")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(f"Environment: {environment()}\n\n" + "\n".join(sections))


if __name__ == "__main__":
    main()
