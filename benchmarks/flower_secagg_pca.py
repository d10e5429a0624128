"""Seconds per release of federated private PCA on Flower's SecAgg+, in Ray simulation.

Runs ``fit_pca_on_flower(..., trust="secure-aggregation")`` (every release one SecAgg+
masked sum: four stages of K messages) and, for comparison, ``trust="local"`` (one
``query.pca`` round per release) on digits pixels (1,437 training rows, d = 64, pixels in
[-1, 1], row norm sqrt(d)) split over K equal clients, in Flower's Ray simulation with
seeded clients. Prints, per trust model, the number of releases, the median and the
range of the SecAgg+ rounds' seconds (the transport's own timing, registration and
Ray's start-up excluded) or of the local fit's whole wall time per release, the sums'
modulus bits, and whether the components equal the in-process fit with the same seed
(bit for bit under secure aggregation: integer sums; the in-process fit capped at
SecAgg+'s 2^30, ``max_modulus_bits=30``, which is the uncapped fit wherever its sums fit).
Timings depend on the machine's load; say how loaded it was.

``--data fashion-mnist`` (60,000 training rows, d = 784, row norm 28): its Gram sum needs
37 bits at the default rounding scale, so on SecAgg+ its sums are coarsened to 2^30 (the
printed ``accounted_inflation``). ``--accuracy-seeds S`` also fits, in process, the
capped and the uncapped secure fit for seeds 0..S-1 and prints their median sin-theta
and captured variance against the exact top-k subspace (the price of the coarsening).

    PYTHONPATH=src python benchmarks/flower_secagg_pca.py --clients 3 --method auto
    PYTHONPATH=src python benchmarks/flower_secagg_pca.py --data fashion-mnist --clients 3 \
        --components 10 --epsilon 1 --accuracy-seeds 3
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
from flwr.simulation import run_simulation

from dpprecond.adapters.flower.pca import SplitRows, make_pca_client_app, make_pca_server_app
from dpprecond.data import load_dataset
from dpprecond.features import featurize
from dpprecond.pca import fit_private_pca
from dpprecond.secagg.fl import FIT_BITS

RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}
SEED = 11


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--method", default="auto")
    p.add_argument("--components", type=int, default=8)
    p.add_argument("--epsilon", type=float, default=2.0)
    p.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"])
    p.add_argument("--accuracy-seeds", type=int, default=0)
    p.add_argument("--trust", nargs="*", default=["local", "secure-aggregation"],
                   choices=["local", "secure-aggregation"])
    args = p.parse_args()
    ds = featurize(load_dataset(args.data), kind="pixels")
    X = np.asarray(ds.X_train, dtype=np.float64)
    n, d = X.shape
    K = args.clients
    bounds = np.linspace(0, n, K + 1).round().astype(np.int64)
    fit = dict(target_epsilon=args.epsilon, target_delta=1e-5, row_norm=math.sqrt(d),
               method=args.method)
    print(f"{args.data} pixels n={n} d={d} K={K} method={args.method} k={args.components} "
          f"epsilon={args.epsilon} load average {os.getloadavg()[0]:.1f}")
    if args.accuracy_seeds:
        _accuracy(X, bounds, args.components, fit, args.accuracy_seeds)
    for trust in args.trust:
        seen: list = []
        server = make_pca_server_app(args.components, trust=trust, connect_timeout=900,
                                     timeout=900, **fit,
                                     on_result=lambda result, ctx, s=seen: s.append(result))
        start = time.perf_counter()
        run_simulation(server, make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED),
                       num_supernodes=K, backend_config=RAY)
        wall = time.perf_counter() - start
        cap = {"max_modulus_bits": FIT_BITS} if trust == "secure-aggregation" else {}
        ref = fit_private_pca(X, args.components, seed=SEED, clients=bounds, trust=trust,
                              **fit, **cap)
        got = seen[0]
        same = np.array_equal(got.components, ref.components)
        close = float(np.abs(got.components - ref.components).max())
        if trust == "secure-aggregation":
            sums = got.info["secure_aggregation"]
            sec = sums["seconds_per_release"]
            print(f"{trust}: {len(sec)} releases, SecAgg+ round median "
                  f"{statistics.median(sec):.2f} s (min {min(sec):.2f}, max {max(sec):.2f}); "
                  f"modulus bits {sums['modulus_bits']}, accounted inflation "
                  f"{sums['accounted_inflation']:g}, largest rounding inflation "
                  f"{sums['rounding_inflation']:.4g}; run {wall:.1f} s; components equal "
                  f"to the in-process secure fit: {same} (max diff {close:.2g}); epsilon "
                  f"{got.epsilon:.6g} (in process {ref.epsilon:.6g})")
        else:
            print(f"{trust}: run {wall:.1f} s (registration, start-up and every release); "
                  f"max diff to the in-process local fit {close:.2g}; epsilon "
                  f"{got.epsilon:.6g}")


def _accuracy(X: np.ndarray, bounds: np.ndarray, k: int, fit: dict, seeds: int) -> None:
    """Median sin-theta and captured variance of the in-process secure fit, uncapped and
    capped at SecAgg+'s 2^30, against the exact top-k subspace of ``X``."""
    from dpprecond.pca.metrics import captured_variance_ratio, sin_theta

    exact = fit_private_pca(X, k, target_epsilon=None, target_delta=1e-5,
                            row_norm=fit["row_norm"], method="exact").components
    for label, cap in (("uncapped (2^62)", {}), ("capped at 2^30", {"max_modulus_bits":
                                                                    FIT_BITS})):
        sins, caps, bits, infl = [], [], [], None
        for seed in range(seeds):
            r = fit_private_pca(X, k, seed=seed, clients=bounds, trust="secure-aggregation",
                                **fit, **cap)
            sins.append(sin_theta(r.components.T, exact.T))
            caps.append(captured_variance_ratio(X, r.components.T, exact.T))
            bits.append(max(r.info["secure_aggregation"]["modulus_bits"]))
            infl = r.info["secure_aggregation"]["rounding_inflation"]
        print(f"in process, {label}: sin-theta median {statistics.median(sins):.4f} "
              f"(seeds {[round(v, 4) for v in sins]}), captured variance median "
              f"{statistics.median(caps):.4f}, largest modulus 2^{max(bits)}, largest "
              f"rounding inflation {infl:.4g}")


if __name__ == "__main__":
    main()
