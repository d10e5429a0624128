"""The same DP federated run in Flower's Ray simulation and in the in-process engine.

Digits or Fashion-MNIST (pixels), 20 clients (IID), 20 rounds, epsilon = 1 at
delta = 1e-5, clip norm 1, the method's published/default settings (``--method``, any name
of :mod:`dpprecond.fl.methods`; default DP-FedSOFIM). The Flower run uses
``run_simulation`` (Ray backend, 2 actors of one CPU each) with the seeded noise streams,
so both runs must end at the same model; the script reports the wall time of each
(Flower: the whole ``run_simulation`` call including Ray's start-up and shut-down, and
the rounds alone), the ratio, the largest absolute difference between the two final
parameter vectors, and the machine's load average (the machine is shared: the timings are
indicative).

Usage::

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src \\
        python benchmarks/flower_vs_simulator.py [--method sofim] [--data digits]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import numpy as np

from _common import environment, median_time

SEED = 0


def main() -> None:
    from dpprecond.fl import METHODS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--method", default="sofim", choices=sorted(METHODS))
    parser.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"])
    args = parser.parse_args()
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)

    from dpprecond.adapters.flower import (
        DPFedStrategy,
        PartitionedDataset,
        make_client_app,
        make_server_app,
    )
    from dpprecond.adapters.flower.data import featurized_dataset
    from dpprecond.fl import FLConfig, LinearSoftmax, make_method, run_federated

    load_before = os.getloadavg()
    ds = featurized_dataset(args.data)
    config = FLConfig(n_rounds=args.rounds, clip_norm=1.0, target_epsilon=1.0)

    def simulator():
        return run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                             algorithm=args.method, n_clients=args.clients, config=config,
                             seed=SEED)

    t_sim = median_time(simulator, repeats=3, warmup=1)
    ref = simulator()  # warm: its per-round times are comparable

    strategy = DPFedStrategy(LinearSoftmax(ds.n_features, ds.n_classes),
                             make_method(args.method), config, args.clients,
                             X_test=ds.X_test, y_test=ds.y_test, seed=SEED)
    t0 = time.perf_counter()
    run_simulation(make_server_app(lambda ctx: strategy, round_timeout=600),
                   make_client_app(PartitionedDataset(args.data, seed=SEED), noise_seed=SEED),
                   num_supernodes=args.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "logging_level": "error"}})
    t_flower = time.perf_counter() - t0
    res = strategy.result_
    t_rounds = sum(r["seconds"] for r in res.history[1:])  # round 1 includes actor start-up
    t_sim_rounds = sum(r["seconds"] for r in ref.history[1:])
    diff = float(np.abs(res.params - ref.params).max())
    load_after = os.getloadavg()

    print(environment())
    print("load average (1, 5, 15 min) before: " + ", ".join(f"{x:.2f}" for x in load_before)
          + "; after: " + ", ".join(f"{x:.2f}" for x in load_after))
    print(f"{args.data}, K={args.clients}, T={args.rounds}, method={args.method}, "
          f"epsilon=1, delta=1e-5, C=1, z={ref.noise_multiplier:.4f}")
    print("| engine | wall time (s) | rounds 2..T (s) | final test accuracy | epsilon |")
    print("|---|---|---|---|---|")
    print(f"| in-process engine (median of 3) | {t_sim:.3f} | {t_sim_rounds:.3f} | "
          f"{ref.final_accuracy:.4f} | {ref.epsilon:.4f} |")
    print(f"| Flower run_simulation (Ray) | {t_flower:.1f} | {t_rounds:.2f} | "
          f"{res.final_accuracy:.4f} | {res.epsilon:.4f} |")
    print(f"ratio Flower / engine: {t_flower / t_sim:.0f}x wall, "
          f"{t_rounds / max(t_sim_rounds, 1e-12):.0f}x per round (rounds 2..T)")
    print(f"max |theta_flower - theta_engine| = {diff:.3g} "
          f"(max |theta| = {np.abs(ref.params).max():.3g}); same releases: "
          f"{res.events == ref.events}")


if __name__ == "__main__":
    main()
