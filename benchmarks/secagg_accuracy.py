"""Accuracy of local noise against secure aggregation with distributed Skellam noise.

For each K and epsilon, the same method, data split, rounds, fixed clip norm and size
weighting run twice:
``trust="local"`` (each client adds its full Gaussian noise) and
``trust="secure-aggregation"`` (the sum carries the noise once). Prints a markdown table
of the final test accuracy (mean over seeds) and each run's noise multiplier, plus the
measured std of the decoded aggregate's noise against the plan's claim.

    PYTHONPATH=src python benchmarks/secagg_accuracy.py --data digits --seeds 3
    # private PCA features first (run_pipeline: the PCA's releases are secure sums too
    # under secure aggregation; the epsilon is the total of both stages)
    PYTHONPATH=src python benchmarks/secagg_accuracy.py --data fashion-mnist --features pca:64
    # client-level DP-FedAvg (uniform weights): the trusted aggregator's Gaussian against
    # the secure sum of clipped updates
    PYTHONPATH=src python benchmarks/secagg_accuracy.py --mechanism client-level \
        --algorithm fedgd --local-steps 3 --clients 100 1000 --data fashion-mnist
    # client-level DP-FedAvg / DP-FedProx as methods (their own local steps and options)
    PYTHONPATH=src python benchmarks/secagg_accuracy.py --mechanism client-level \
        --algorithm fedprox --method-options '{"local_steps": 3, "local_lr": 0.2, \
        "mu": 0.1}' --clients 100
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from dpprecond.data import load_dataset
from dpprecond.features import featurize
from dpprecond.fl import FLConfig, run_federated
from dpprecond.pipeline import run_pipeline
from dpprecond.secagg import plan_sum, secure_sum


def measured_noise_std(k: int, dim: int, reps: int = 200) -> tuple[float, float]:
    """The decoded sum's noise std (zero parts, ``z = 2``, sensitivity ``2C = 2``) and the
    plan's claim, both in gradient-sum units."""
    plan = plan_sum(dim, 2.0, 2.0, n_rows=10_000, n_clients=k, min_clients=k)
    rng = np.random.default_rng(0)
    noise = np.concatenate([secure_sum(np.zeros((k, dim)), plan, rng.spawn(k))
                            for _ in range(reps)])
    return float(noise.std()), plan.noise_std()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="digits")
    p.add_argument("--features", default="pixels")
    p.add_argument("--algorithm", default="sofim-lagged")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--mechanism", choices=("full-batch", "client-level"), default="full-batch")
    p.add_argument("--local-steps", type=int, default=1)
    p.add_argument("--local-lr", type=float, default=0.1)
    p.add_argument("--method-options", type=json.loads, default=None,
                   help="the method's options as a JSON object, e.g. fedavg's "
                        '\'{"local_steps": 3, "local_lr": 0.2}\'')
    args = p.parse_args()
    client_level = args.mechanism == "client-level"
    if client_level and args.features.startswith("pca:"):
        p.error("--mechanism client-level runs on fixed features (the pipeline's PCA is "
                "record-level)")
    if args.method_options and args.features.startswith("pca:"):
        p.error("--method-options runs on fixed features (the pipeline takes its own "
                "learning options)")
    weighting = "uniform" if client_level else "size"
    pipeline = args.features.startswith("pca:")
    ds = featurize(load_dataset(args.data), kind="pixels" if pipeline else args.features)
    row_norm = math.sqrt(ds.X_train.shape[1])  # pixels in [-1, 1]: the public row bound
    print(f"{args.data} ({args.features}), {args.algorithm}, T={args.rounds}, C={args.clip}, "
          f"mechanism={args.mechanism} (local steps {args.local_steps}, local lr "
          f"{args.local_lr:g}), options {args.method_options}, weighting={weighting}, "
          f"delta=1e-5, {args.seeds} seeds, IID")
    print("| K | epsilon | local acc | secagg acc | local z | secagg z | secagg eps "
          "| bits | inflation |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in args.clients:
        for eps in args.epsilons:
            row = {}
            for trust in ("local", "secure-aggregation"):
                accs, z, spent, plan = [], 0.0, 0.0, (0, 0.0)
                for seed in range(args.seeds):
                    # the fixed clip for both (adaptive clipping's count is a release
                    # secure aggregation does not make)
                    cfg = FLConfig(n_rounds=args.rounds, clip_norm=args.clip,
                                   target_epsilon=eps, weighting=weighting,  # type: ignore[arg-type]
                                   accountant="rdp", trust=trust,  # type: ignore[arg-type]
                                   adaptive_clip=None, mechanism=args.mechanism,
                                   local_steps=args.local_steps, local_lr=args.local_lr)
                    if pipeline:  # private federated PCA, then the rounds, one ledger
                        out = run_pipeline(
                            ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                            features=args.features, target_epsilon=eps, row_norm=row_norm,
                            trust=trust, algorithm=args.algorithm, n_clients=k,  # type: ignore[arg-type]
                            n_rounds=args.rounds, clip_norm=args.clip, weighting="size",
                            adaptive_clip=None, accountant="rdp", seed=seed)
                        res, total = out.fl, out.epsilon
                    else:
                        res = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test,
                                            ds.n_classes, algorithm=args.algorithm,
                                            n_clients=k, seed=seed, config=cfg,
                                            method_options=args.method_options)
                        total = res.epsilon
                    accs.append(res.history[-1]["test_accuracy"])
                    z, spent = res.noise_multiplier, total
                    plan = (res.config.get("modulus_bits", 0),
                            res.config.get("rounding_inflation", 0.0))
                row[trust] = (float(np.mean(accs)), z, spent, plan)
            lo, sa = row["local"], row["secure-aggregation"]
            print(f"| {k} | {eps:g} | {lo[0]:.4f} | {sa[0]:.4f} | {lo[1]:.3f} | {sa[1]:.3f} "
                  f"| {sa[2]:.4f} | {sa[3][0]} | {sa[3][1]:.2e} |")
    for k in args.clients:
        got, claim = measured_noise_std(k, 650)
        print(f"aggregate noise std, K={k}, d=650, 200 sums: measured {got:.6g}, claimed "
              f"{claim:.6g} (ratio {got / claim:.4f}, 5-sigma band "
              f"+-{5 / math.sqrt(2 * 200 * 650):.4f})")


if __name__ == "__main__":
    main()
