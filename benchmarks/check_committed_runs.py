"""Rerun committed result cells with the current code and compare them.

The committed results (``docs/results/<name>/results.json``) hold every run's spec and its
per-round test accuracies. This script reruns a sample of them through the experiment
runner (:func:`dpprecond.experiments.runner.execute_run`, one process, one BLAS thread as in
a sweep's workers) and reports how many reproduce their accuracy trajectory exactly, their
final accuracy exactly, and the largest difference of any round's accuracy.

Changes of the noise's rounding cover since the cells were run (the bound on the clipped
sums' rounding, about ``2e-9`` relatively; the covariance release's, about ``1e-9``) and
the pipeline's single calibration (its multipliers within ``1e-4`` relatively of the
earlier two-step calibration) move a rerun only through those factors in the noise std;
``--pipeline`` reruns the ``pca:K`` cells to measure the latter. The linear head's
classes-major kernel changed the clipped sums' summation order only (relative differences
near 1e-16).

    PYTHONPATH=src python benchmarks/check_committed_runs.py digits --limit 60
    PYTHONPATH=src python benchmarks/check_committed_runs.py digits --methods fedfc fednew
    PYTHONPATH=src python benchmarks/check_committed_runs.py fashion-mnist --limit 6
    PYTHONPATH=src python benchmarks/check_committed_runs.py fashion-mnist-pca64 --pipeline \\
        --limit 6
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name", help="a folder of docs/results (digits, fashion-mnist, ...)")
    p.add_argument("--limit", type=int, default=20, help="runs to rerun (an even sample)")
    p.add_argument("--methods", nargs="+", default=None,
                   help="rerun only these methods (default: all)")
    p.add_argument("--pipeline", action="store_true",
                   help="rerun the pca:K / random:K cells instead of the others (they run "
                        "the whole pipeline: minutes per Fashion-MNIST cell)")
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    from dpprecond.experiments.runner import DataCache, execute_run
    from dpprecond.fl.kernels import set_kernel_threads

    records = json.loads((ROOT / "docs" / "results" / args.name / "results.json").read_text())
    records = [r for r in records if (r["spec"]["features"].split(":")[0] in ("pca", "random"))
               == args.pipeline and (args.methods is None or r["spec"]["method"] in args.methods)]
    step = max(1, len(records) // args.limit)
    sample = records[::step][:args.limit]
    threadpool_limits(1)
    set_kernel_threads(1)
    cache = DataCache()
    same_traj = same_final = 0
    worst = 0.0
    for r in sample:
        new, _ = execute_run(r["spec"], cache)
        diff = float(np.max(np.abs(np.subtract(new["accuracy"], r["accuracy"]))))
        worst = max(worst, diff)
        same_traj += new["accuracy"] == r["accuracy"]
        same_final += new["final_accuracy"] == r["final_accuracy"]
        print(f"# {r['id']} {r['spec']['method']} K={r['spec']['clients']} "
              f"eps={r['spec']['epsilon']}: final {r['final_accuracy']:.4f} -> "
              f"{new['final_accuracy']:.4f}, max round difference {diff:.4f}", flush=True)
    print(f"{args.name}: {len(sample)} runs rerun; identical trajectories {same_traj}, "
          f"identical final accuracy {same_final}; largest difference of a round's "
          f"accuracy {worst:.4g}")
    sys.exit(0)


if __name__ == "__main__":
    main()
