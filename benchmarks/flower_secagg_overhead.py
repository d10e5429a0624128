"""Per-round time of Flower's SecAgg+ with distributed noise against plain Flower.

Both run ``fedgd`` on digits (or ``--data fashion-mnist``) in Flower's Ray simulation with
the same K, rounds, clip norm, epsilon and size weighting: ``DPFedStrategy`` (local noise,
one message per client) and ``SecAggDPStrategy`` on ``SecAggPlusWorkflow`` (four SecAgg+
stages per round). Prints the median seconds per round over rounds 2..T (round 1 includes
the actors' start-up) and the final accuracy, the secure sum's modulus bits and rounding
inflation, and the largest difference between the SecAgg+ run's model and the simulator's
(``simulate_secure`` on the same partitions and seeds: 0 when the deployment releases the
simulator's sums). ``--num-shares 0 7`` also runs SecAgg+ with each client sharing with a
ring of 7 (0: every client, Flower's SecAgg), one run per value. Timings depend on the
machine's load; say how loaded it was.

    PYTHONPATH=src python benchmarks/flower_secagg_overhead.py --clients 5 --rounds 5
    PYTHONPATH=src python benchmarks/flower_secagg_overhead.py --data fashion-mnist \
        --clients 20 --rounds 3
    PYTHONPATH=src python benchmarks/flower_secagg_overhead.py --clients 20 --rounds 3 \
        --num-shares 0 5
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from flwr.simulation import run_simulation

from dpprecond.adapters.flower import (
    DPFedStrategy,
    PartitionedDataset,
    make_client_app,
    make_server_app,
)
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.data import featurized_dataset
from dpprecond.adapters.flower.protocol import simulator_seeds
from dpprecond.adapters.flower.secagg import (
    SecAggDPStrategy,
    make_secagg_client_app,
    make_secagg_server_app,
)
from dpprecond.fl import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import simulate_secure

RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epsilon", type=float, default=2.0)
    p.add_argument("--data", default="digits")
    p.add_argument("--num-shares", type=int, nargs="+", default=[0],
                   help="SecAgg+ neighbourhoods to run (0: every client)")
    args = p.parse_args()
    ds = featurized_dataset(args.data)
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    k, t = args.clients, args.rounds
    out = {}
    plans = {}
    runs = [("local", 0)] + [("secure-aggregation", s) for s in args.num_shares]
    for trust, shares in runs:
        config = FLConfig(n_rounds=t, clip_norm=1.0, target_epsilon=args.epsilon,
                          weighting="size", accountant="rdp", trust=trust)  # type: ignore[arg-type]
        strategy: DPFedStrategy | SecAggDPStrategy
        if trust == "local":
            strategy = DPFedStrategy(model, "fedgd", config, k, X_test=ds.X_test,
                                     y_test=ds.y_test, seed=0)
            server = make_server_app(lambda ctx, s=strategy: s)
            client = make_client_app(PartitionedDataset(args.data, seed=0), noise_seed=0)
        else:
            strategy = SecAggDPStrategy(model, "fedgd", config, k, ds.X_train.shape[0],
                                        X_test=ds.X_test, y_test=ds.y_test, seed=0,
                                        num_shares=shares or None)
            server = make_secagg_server_app(lambda ctx, s=strategy: s, timeout=600.0)
            client = make_secagg_client_app(PartitionedDataset(args.data, seed=0),
                                            noise_seed=0)
        name = trust if trust == "local" else f"SecAgg+ num_shares={shares or k}"
        run_simulation(server, client, num_supernodes=k, backend_config=RAY)
        if isinstance(strategy, SecAggDPStrategy):
            got = strategy.result()
            ref = simulate_secure(model, _client_data(args.data, k), "fedgd", config,
                                  X_test=ds.X_test, y_test=ds.y_test,
                                  seed=simulator_seeds(0).simulation)
            gap = float(abs(got.params - ref.params).max())
            plans[name] = (strategy.plan_.bits, strategy.plan_.inflation, gap)
        hist = strategy.history_
        per_round = statistics.median(r["seconds"] for r in hist[1:])
        out[name] = (per_round, hist[-1].get("test_accuracy"), hist[-1]["epsilon"],
                     os.getloadavg()[0])
    print(f"{args.data}, fedgd, K={k}, T={t}, epsilon={args.epsilon:g}, size weighting, "
          f"{os.cpu_count()} cores")
    for name, (sec, acc, eps, load) in out.items():
        print(f"  {name}: median {sec:.3f} s per round (rounds 2..{t}), final accuracy "
              f"{acc:.4f}, epsilon {eps:.4f}, load average after {load:.1f}")
    for name, (bits, inflation, gap) in plans.items():
        print(f"  {name}: modulus 2^{bits}, rounding inflation {inflation:.2e}; "
              f"max |params - simulate_secure's| = {gap:.3g}; "
              f"{out[name][0] / out['local'][0]:.1f}x plain per round")


def _client_data(name: str, k: int) -> ClientData:
    """The Flower partitions of ``name`` as the simulator's client data (same order)."""
    loader = PartitionedDataset(name, seed=0)
    parts = [loader(ClientInfo(i, k, {}, {})) for i in range(k)]
    X = np.concatenate([q.X for q in parts])
    y = np.concatenate([q.y for q in parts])
    bounds = np.cumsum([0] + [q.X.shape[0] for q in parts]).astype(np.int64)
    return ClientData(X, y, bounds, int(parts[0].model.n_classes))


if __name__ == "__main__":
    main()
