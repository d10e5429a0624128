"""Rerun committed result cells with the current code and compare them (issue 22).

The committed results (``docs/results/<name>/results.json``) hold every run's spec and its
per-round test accuracies. This script reruns a sample of them through the experiment
runner (:func:`dpprecond.experiments.runner.execute_run`, one process, one BLAS thread as in
a sweep's workers) and reports how many reproduce their accuracy trajectory exactly, their
final accuracy exactly, and the largest difference of any round's accuracy.

Issue 22 changed the bound on the rounding of the clipped sums (both neighbours' rounding,
any blocking: the noise std of a float64 run is about ``2e-9`` relatively larger than
before); the sums themselves are bit for bit the same, so a rerun differs from the
committed run only through that factor in the noise.

    PYTHONPATH=src python benchmarks/check_committed_runs.py digits --limit 60
    PYTHONPATH=src python benchmarks/check_committed_runs.py fashion-mnist --limit 6
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
    args = p.parse_args()
    from threadpoolctl import threadpool_limits

    from dpprecond.experiments.runner import DataCache, execute_run
    from dpprecond.fl.kernels import set_kernel_threads

    records = json.loads((ROOT / "docs" / "results" / args.name / "results.json").read_text())
    records = [r for r in records if r["spec"]["features"].split(":")[0] not in ("pca",
                                                                                  "random")]
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
