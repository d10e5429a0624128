"""Wall time of one secure-aggregation round at Fashion-MNIST's shape (synthetic data).

Synthetic rows (``N x d`` standard normal, scaled to unit mean norm; labels uniform over 10
classes), K equal clients, ``fedgd`` with ``trust="secure-aggregation"``, size weighting,
a fixed noise multiplier (no calibration in the timing). Prints each round's ``seconds``
from the history (the clients' parts, roundings and shares, the decoding and the server
step; the evaluation on the test rows is outside), the load average and the core count.
Timings depend on the machine's load; say how loaded it was.

    PYTHONPATH=src python benchmarks/secagg_fl_round.py --rows 60000 --features 784 \
        --clients 20 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from dpprecond.fl import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import simulate
from dpprecond.fl.models import LinearSoftmax


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=60000)
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    n, d, k = args.rows, args.features, args.classes
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    y = rng.integers(0, k, n)
    Xt, yt = X[:1000], y[:1000]
    bounds = np.linspace(0, n, args.clients + 1).astype(np.int64)
    config = FLConfig(n_rounds=args.rounds, clip_norm=1.0, noise_multiplier=1.0,
                      weighting="size", trust="secure-aggregation")
    load = os.getloadavg()
    start = time.perf_counter()
    res = simulate(LinearSoftmax(d, k), ClientData(X, y, bounds, k), "fedgd", config,
                   X_test=Xt, y_test=yt, seed=0)
    total = time.perf_counter() - start
    secs = [r["seconds"] for r in res.history]
    print(f"N={n}, d={d}, classes={k}, K={args.clients}, T={args.rounds}, fedgd, "
          f"secure-aggregation; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"(start), {os.getloadavg()[0]:.2f} (end) on {os.cpu_count()} cores")
    print("seconds per round: " + ", ".join(f"{s:.2f}" for s in secs)
          + f"; median {statistics.median(secs):.2f}; whole run {total:.1f} s")
    print(f"modulus bits {res.config['modulus_bits']}, wrap probability "
          f"{res.config['wrap_probability']:.3g}, final accuracy "
          f"{res.history[-1]['test_accuracy']:.4f}")


if __name__ == "__main__":
    main()
