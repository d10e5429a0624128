"""``dpprecond demo``: the main jobs on the embedded default data (scikit-learn's digits).

1. Private top-k PCA at a few epsilons beside the non-private answer.
2. A short DP-FedSOFIM vs DP-FedGD comparison (when the federated-learning module is built).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

__all__ = ["register", "run"]

DEMO_EPSILONS = [0.5, 2.0, 8.0]


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser("demo", help="private PCA and DP-FedSOFIM on digits",
                              description=__doc__)
    p.add_argument("--seed", type=int, default=0,
                   help="the demo runs on public data and is seeded so that its numbers can "
                        "be reproduced (default 0); real releases default to fresh entropy")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    from dpprecond.cli.pca import PRIVATE_METHODS, format_table, load_pca_matrix, run_pca_table

    X, bound, desc = load_pca_matrix("digits")
    row_norm = float(bound) if bound is not None else 8.0  # digits: sqrt(64)
    print(f"== Private top-5 PCA of {desc}: rows of pixels in [0, 1], public row-norm bound "
          f"sqrt(64) = {row_norm:g}, delta = 1e-6 ==")
    records = run_pca_table(X, 5, list(PRIVATE_METHODS), DEMO_EPSILONS, 1e-6, row_norm,
                            args.seed)
    print(format_table(records))
    print("sin-theta: spectral sin of the largest principal angle to the exact top-5 subspace "
          "(0 is exact, 1 is orthogonal);\ncapt. var: variance captured relative to the exact "
          "top-5 subspace; eps spent comes from dp_accounting (below the target when the "
          "selection's gap test fails\nand only the init and one more Gram release are "
          "made, see docs/pca.md).")
    if importlib.util.find_spec("dpprecond.cli.fl") is not None:
        from dpprecond.cli.fl import run_demo

        print()
        run_demo(args.seed)
    return 0
