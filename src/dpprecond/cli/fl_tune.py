"""``dpprecond fl --tune``: private selection of the federated configuration.

Runs :func:`dpprecond.fl.tuning.tune_private` over its default search space (method,
server step, clip norm, adaptive clipping) on whatever data ``dpprecond fl`` loaded, and
reports the total epsilon, tuning included.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

__all__ = ["run_tune"]


def run_tune(args: argparse.Namespace, ds: Any, config: Any, out: Path, ledger: Any) -> int:
    """Tune privately, write ``history.json`` (the selection) and ``accuracy.png``."""
    from dpprecond._files import write_json
    from dpprecond.cli.plots import plot_history
    from dpprecond.fl.tuning import tune_private

    given = [flag for flag, value in (("--lr", args.lr), ("--option", args.option or None),
                                      ("--adaptive-clip", args.adaptive_clip))
             if value is not None]
    if given:
        raise ValueError(f"--tune chooses the method and its options itself; drop "
                         f"{', '.join(given)} (or drop --tune to run one configuration).")
    level = "non-private" if config.noise_multiplier == 0 else \
        f"epsilon={config.target_epsilon:g}"
    print(f"{ds!r}; private tuning: mean {args.tune_trials:g} trials (logarithmic), "
          f"K={args.clients} ({args.partition}), T={args.rounds}, total {level} (tuning "
          f"included), delta={config.target_delta:g}", flush=True)
    # no wall time is printed: it grows with the number of trials, which stays hidden
    res = tune_private(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                       config=config, mean_trials=args.tune_trials, trials="logarithmic",
                       n_clients=args.clients, partition=args.partition, alpha=args.alpha,
                       seed=args.seed, ledger=ledger, progress=args.progress,
                       secure=args.secure)
    write_json(out / "history.json", {**res.to_dict(), "data": args.data})
    eps = "inf (non-private)" if math.isinf(res.epsilon) else f"{res.epsilon:.4f}"
    if res.result is None:
        print(f"no trial was drawn: nothing released; epsilon spent {eps}")
        return 0
    chosen = res.candidate.describe() if res.candidate is not None else {}
    plot_history({"selected": res.result.history}, out / "accuracy.png",
                 f"{args.data}, K={args.clients}, tuned privately")
    print(f"selected {chosen}; noisy validation accuracy {res.noisy_score:.4f} "
          f"(n_val={res.n_validation}); final test accuracy {res.result.final_accuracy:.4f}")
    print(f"total epsilon per record {eps} at delta={res.delta:g}, tuning included "
          f"(repeat-and-select over {res.n_candidates} candidates)")
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0
