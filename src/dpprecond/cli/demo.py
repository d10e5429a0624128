"""``dpprecond demo``: the defaults at work, in well under two minutes on 2 cores.

1. Private top-5 PCA: the default method (``auto``) beside Analyze Gauss and the exact
   answer, on digits and on a synthetic high-dimensional, low-coherence matrix (the regime
   where the preconditioned iteration beats Analyze Gauss; ``docs/pca_auto.md``).
2. DP federated learning on digits: the default method (``sofim-lagged``) beside DP-FedGD,
   both at their default settings.

Every number comes from a fixed seed so that the demo can be reproduced; real releases
default to fresh OS entropy.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from typing import Any

import numpy as np

__all__ = ["register", "run"]

PCA_EPSILONS = (0.5, 2.0, 8.0)
#: The synthetic case: n, d, k and the spike strength (family 1 of the spec's regime map).
SYNTHETIC_SHAPE = (20_000, 400, 5)
SYNTHETIC_THETA = 9.0
SYNTHETIC_EPSILONS = (1.0, 4.0)
FL_EPSILONS = (1.0, 4.0, None)

#: ``dpprecond demo --help``: the module's story in plain text (no reStructuredText).
DESCRIPTION = """\
The defaults at work, in well under two minutes on 2 cores:

1. Private top-5 PCA: the default method (auto) beside Analyze Gauss and the exact
   answer, on digits and on a synthetic high-dimensional, low-coherence matrix (the
   regime where the preconditioned iteration beats Analyze Gauss; docs/pca_auto.md).
2. DP federated learning on digits: the default method (sofim-lagged) beside DP-FedGD,
   both at their default settings.

Every number comes from a fixed seed so that the demo can be reproduced; real releases
default to fresh OS entropy."""


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    from dpprecond.cli.options import add

    p = subparsers.add_parser("demo", help="the default private PCA and federated method at "
                                           "work, beside their baselines",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add(p, "demo_seed")
    p.set_defaults(func=run)


def _pca_section(title: str, X: np.ndarray, row_norm: float, epsilons: tuple[float, ...],
                 seed: int) -> None:
    from dpprecond.cli.pca import format_table, run_pca_table
    from dpprecond.pca import DEFAULT_METHOD

    print(title)
    records = run_pca_table(X, 5, [DEFAULT_METHOD, "analyze_gauss"], list(epsilons), 1e-6,
                            row_norm, seed)
    print(format_table(records))
    print()


def _fl_section(seed: int) -> None:
    from dpprecond.features import load_features
    from dpprecond.fl import DEFAULT_ALGORITHM, FLConfig, run_federated
    from dpprecond.fl.divergence import CLIMB_RATIO, DivergenceWarning

    ds, feat = load_features("digits")
    # the package default (method, size weights, adaptive clipping from 10) against
    # DP-FedGD as the paper runs it (uniform weights, the fixed clip 10)
    runs: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("default", DEFAULT_ALGORITHM, {}),
        ("fedgd (paper)", "fedgd", {"weighting": "uniform", "adaptive_clip": None}))
    print(f"== DP federated learning on digits ({feat}): 10 IID clients, 70 rounds, "
          "delta 1e-5; final test accuracy ==")
    print(f"{'epsilon':>10} " + " ".join(f"{name:>15}" for name, _, _ in runs))
    quiet = logging.getLogger("dpprecond.fl.accounting")  # "inf" is non-private on purpose
    climbed: list[str] = []
    for eps in FL_EPSILONS:
        level: dict[str, Any] = ({"noise_multiplier": 0.0} if eps is None
                                 else {"target_epsilon": eps})
        quiet.setLevel(logging.ERROR if eps is None else logging.NOTSET)
        label = "inf" if eps is None else f"{eps:g}"
        accs = []
        for _, a, settings in runs:
            config = FLConfig(n_rounds=70, **level, **settings)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DivergenceWarning)
                accs.append(run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test,
                                          ds.n_classes, algorithm=a, n_clients=10,
                                          config=config, seed=seed).final_accuracy)
            for w in caught:  # one line in the table's note, not a warning per cell
                if issubclass(w.category, DivergenceWarning):
                    climbed.append(f"{a} at epsilon {label}")
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        print(f"{label:>10} " + " ".join(f"{acc:>15.4f}" for acc in accs))
    quiet.setLevel(logging.NOTSET)
    print(f"(inf: non-private. default: {DEFAULT_ALGORITHM} (DP-FedSOFIM with the "
          "preconditioner built from the\nprevious round's momentum), size weights and "
          "adaptive clipping from clip 10, charged inside the\nsame epsilon, no tuning: the "
          "measured best of docs/fl_defaults.md. fedgd (paper): DP-FedGD with\nuniform "
          "weights and the fixed clip 10. The paper's form 'sofim' climbs the loss under "
          "noise\nand warns.)")
    if climbed:
        print(f"The test loss climbed (to >= {CLIMB_RATIO:g} x its lowest; every run warns "
              f"of it) in: {', '.join(climbed)}: the noise dominates there, so the accuracy "
              "is low although above chance.")


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    from dpprecond.cli.pca import load_pca_matrix
    from dpprecond.data.synthetic import spiked_covariance

    X, bound, desc = load_pca_matrix("digits")
    row_norm = float(bound) if bound is not None else 8.0  # digits: sqrt(64)
    _pca_section(f"== Private top-5 PCA of {desc}: pixels in [0, 1], public row-norm bound "
                 f"sqrt(64) = {row_norm:g}, delta = 1e-6 ==", X, row_norm, PCA_EPSILONS,
                 args.seed)
    n, d, k = SYNTHETIC_SHAPE
    A = spiked_covariance(n, d, k, SYNTHETIC_THETA, seed=args.seed)
    _pca_section(f"== Private top-{k} PCA of a spiked covariance, n = {n}, d = {d} "
                 f"(low coherence; rows of norm <= 1 by construction), delta = 1e-6 ==",
                 A, 1.0, SYNTHETIC_EPSILONS, args.seed)
    from dpprecond.cli.pca import LEGEND

    print(LEGEND)
    print("auto spends the whole budget: a first release of A^T A and a private probe of the "
          "rows decide\nbetween completing Analyze Gauss and the preconditioned clipped "
          "iteration (docs/pca.md).\n")
    _fl_section(args.seed)
    return 0
