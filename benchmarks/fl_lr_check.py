"""Is the collapse of the paper's SOFIM form a step-size problem? A learning-rate check.

Digits pixels, 5 IID clients, T = 40, eps = 8 (RDP accountant), seed 0: final test
accuracy of each server optimizer for several server learning rates.

    python benchmarks/fl_lr_check.py
"""

from __future__ import annotations

from dpprecond.features import load_features
from dpprecond.fl import FLConfig, run_federated

LEARNING_RATES = (0.2, 0.1, 0.05, 0.02, 0.01)
ALGORITHMS = ("fedgd", "sofim", "sofim-momentum", "sofim-lagged")


def main() -> None:
    ds, _ = load_features("digits")
    config = FLConfig(n_rounds=40, target_epsilon=8.0, accountant="rdp")
    print("| lr | " + " | ".join(ALGORITHMS) + " |")
    print("|---" * (len(ALGORITHMS) + 1) + "|")
    for lr in LEARNING_RATES:
        accs = [run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                              algorithm=a, n_clients=5, learning_rate=lr, config=config,
                              seed=0).final_accuracy for a in ALGORITHMS]
        print(f"| {lr:g} | " + " | ".join(f"{100 * a:.1f}" for a in accs) + " |", flush=True)


if __name__ == "__main__":
    main()
