"""Measurement 2 of issue 3: wall time of one simulated round against the matmul floor.

One round of the simulator (record-level full-batch mechanism at epsilon = 1, DP-FedSOFIM
server step) on Fashion-MNIST standardized pixels (60000 x 784, 10 classes), for K = 20 and
K = 100 clients, divided by the time of the two dense products any full-batch gradient of a
linear head needs: ``X @ W`` (60000 x 784 x 10) and ``X^T @ R`` (784 x 60000 x 10), timed
in the same process right before and after the rounds (median of repetitions).

    python benchmarks/fl_speed.py [--rounds 15] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from dpprecond.features import load_features
from dpprecond.fl import FLConfig, run_federated


def floor_seconds(X: np.ndarray, k: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    W = rng.standard_normal((X.shape[1], k))
    R = rng.standard_normal((X.shape[0], k))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        X @ W
        X.T @ R
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    args = p.parse_args()
    ds, feat = load_features("fashion-mnist")
    X = np.ascontiguousarray(ds.X_train)
    print(f"Fashion-MNIST {feat}: X {X.shape}, {ds.n_classes} classes; numpy "
          f"{np.__version__}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print("| K | round median (ms) | floor X@W + X^T R median (ms) | ratio |")
    print("|---|---|---|---|")
    for K in args.clients:
        before = floor_seconds(X, ds.n_classes, args.reps)
        res = run_federated(X, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                            algorithm="sofim", n_clients=K,
                            config=FLConfig(n_rounds=args.rounds, target_epsilon=1.0))
        after = floor_seconds(X, ds.n_classes, args.reps)
        rounds = float(np.median([h["seconds"] for h in res.history[1:]]))
        floor = min(before, after)
        print(f"| {K} | {1e3 * rounds:.1f} | {1e3 * floor:.1f} "
              f"(before {1e3 * before:.1f}, after {1e3 * after:.1f}) | {rounds / floor:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
