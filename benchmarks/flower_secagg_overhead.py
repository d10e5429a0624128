"""Per-round time of Flower's SecAgg+ with distributed noise against plain Flower.

Both run ``fedgd`` on digits in Flower's Ray simulation with the same K, rounds, clip norm,
epsilon and size weighting: ``DPFedStrategy`` (local noise, one message per client) and
``SecAggDPStrategy`` on ``SecAggPlusWorkflow`` (four SecAgg+ stages per round). Prints the
median seconds per round over rounds 2..T (round 1 includes the actors' start-up) and the
final accuracy. Timings depend on the machine's load; say how loaded it was.

    PYTHONPATH=src python benchmarks/flower_secagg_overhead.py --clients 5 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics

from flwr.simulation import run_simulation

from dpprecond.adapters.flower import (
    DPFedStrategy,
    PartitionedDataset,
    make_client_app,
    make_server_app,
)
from dpprecond.adapters.flower.data import featurized_dataset
from dpprecond.adapters.flower.secagg import (
    SecAggDPStrategy,
    make_secagg_client_app,
    make_secagg_server_app,
)
from dpprecond.fl import FLConfig
from dpprecond.fl.models import LinearSoftmax

RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epsilon", type=float, default=2.0)
    args = p.parse_args()
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    k, t = args.clients, args.rounds
    out = {}
    for trust in ("local", "secure-aggregation"):
        config = FLConfig(n_rounds=t, clip_norm=1.0, target_epsilon=args.epsilon,
                          weighting="size", accountant="rdp", trust=trust)  # type: ignore[arg-type]
        strategy: DPFedStrategy | SecAggDPStrategy
        if trust == "local":
            strategy = DPFedStrategy(model, "fedgd", config, k, X_test=ds.X_test,
                                     y_test=ds.y_test, seed=0)
            server = make_server_app(lambda ctx, s=strategy: s)
            client = make_client_app(PartitionedDataset("digits", seed=0), noise_seed=0)
        else:
            strategy = SecAggDPStrategy(model, "fedgd", config, k, ds.X_train.shape[0],
                                        X_test=ds.X_test, y_test=ds.y_test, seed=0)
            server = make_secagg_server_app(lambda ctx, s=strategy: s, timeout=600.0)
            client = make_secagg_client_app(PartitionedDataset("digits", seed=0),
                                            noise_seed=0)
        run_simulation(server, client, num_supernodes=k, backend_config=RAY)
        hist = strategy.history_
        per_round = statistics.median(r["seconds"] for r in hist[1:])
        out[trust] = (per_round, hist[-1].get("test_accuracy"), hist[-1]["epsilon"])
    print(f"digits, fedgd, K={k}, T={t}, epsilon={args.epsilon:g}, size weighting, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for trust, (sec, acc, eps) in out.items():
        print(f"  {trust}: median {sec:.3f} s per round (rounds 2..{t}), final accuracy "
              f"{acc:.4f}, epsilon {eps:.4f}")
    print(f"  SecAgg+ / plain: {out['secure-aggregation'][0] / out['local'][0]:.1f}x per round")


if __name__ == "__main__":
    main()
