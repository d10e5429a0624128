"""Client weighting with small clients: uniform vs size vs inverse noise variance.

DP-FedGD at its defaults (lr 0.1, C = 10, T = 70, delta 1e-5, PLD), eps in {1, 4}, seeds
0, 1, 2, on the cells of ``benchmarks/fl_defaults.py`` (digits K = 10 and 20 IID; the
synthetic multinomial-logistic problem, K = 100, Dirichlet(0.1)). Weightings:

- ``uniform``: ``1/K`` (``FLConfig(weighting="uniform")``);
- ``size``: ``|D_i| / n`` (``FLConfig(weighting="size")``);
- ``inverse-variance``: ``|D_i|^2 / sum_j |D_j|^2``, the inverse of the noise variance
  ``(2 z C / |D_i|)^2`` of client ``i``'s message. It is not a weighting of the package:
  this script measures it by replacing ``dpprecond.fl.engine.client_weights`` for its own
  runs (the weights are a public function of the sizes, so it costs no privacy).

Accuracy only. ``PYTHONPATH=src python benchmarks/fl_weighting.py``.
"""

from __future__ import annotations

import json
import statistics
import warnings
from typing import Any

import numpy as np

import dpprecond.fl.engine as engine
from dpprecond.fl import FLConfig, run_federated
from fl_defaults import CELLS, SEEDS, load

_package_weights = engine.client_weights


def _inverse_variance(sizes: Any, weighting: str = "uniform") -> np.ndarray:
    s = np.asarray(sizes, dtype=np.float64) ** 2
    return s / s.sum()


def measure(weighting: str, cell: str, eps: float, seed: int) -> float:
    """Final test accuracy of DP-FedGD with the given weighting."""
    data, K, partition = CELLS[cell]
    ds = load(data)
    engine.client_weights = (_inverse_variance if weighting == "inverse-variance"
                             else _package_weights)
    try:
        cfg = FLConfig(n_rounds=70, target_epsilon=eps,
                       weighting="uniform" if weighting == "uniform" else "size")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                                algorithm="fedgd", n_clients=K, partition=partition,  # type: ignore[arg-type]
                                alpha=0.1, config=cfg, seed=seed)
    finally:
        engine.client_weights = _package_weights
    return float(res.final_accuracy)


def main() -> None:
    print("| cell | eps | uniform | size | inverse-variance |")
    print("|---|---|---|---|---|")
    for cell in CELLS:
        for eps in (1.0, 4.0):
            row = []
            for w in ("uniform", "size", "inverse-variance"):
                accs = [measure(w, cell, eps, s) for s in SEEDS]
                row.append(f"{statistics.mean(accs):.3f} [{min(accs):.3f}, {max(accs):.3f}]")
                print(json.dumps({"cell": cell, "eps": eps, "weighting": w, "accuracy": accs}),
                      flush=True)
            print(f"| {cell} | {eps:g} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
