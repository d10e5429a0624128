"""``dpprecond fl``: record-level DP federated learning (DP-FedSOFIM and baselines).

Example::

    dpprecond fl --data fashion-mnist --algorithm sofim --clients 20 --rounds 70 --epsilon 1

prints one line per round and a final summary, and writes ``<out>/history.json`` and
``<out>/accuracy.png``. ``run_demo()`` is the short comparison behind ``make demo``.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Any

__all__ = ["load_features", "plot_history", "register", "run", "run_demo"]

logger = logging.getLogger(__name__)

def load_features(data: str, data_path: str | None = None, features: str = "pixels",
                  checkpoint: str | None = None, cache_dir: str | None = None
                  ) -> tuple[Any, str]:
    """Load a dataset and featurize it; return ``(dataset, description of the features)``.

    Features come from :func:`dpprecond.features.featurize`: ``"pixels"`` is the fixed
    public rule ``(x - 0.5) / 0.5``; ``"resnet20"`` the frozen CIFAR-100 ResNet-20.
    """
    from dpprecond.data import load_dataset
    from dpprecond.features import featurize

    ds = load_dataset(data, data_path)
    desc = "pixels (x - 0.5) / 0.5" if features == "pixels" else f"{features} features"
    return featurize(ds, kind=features, checkpoint=checkpoint, cache_dir=cache_dir), desc


def _epsilon(text: str) -> float:
    if text.lower() in ("inf", "none", "nonprivate", "non-private"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--epsilon expects a number or 'inf' (non-private), got {text!r}") from None


def privacy_level(epsilon: float | None, noise_multiplier: float | None) -> dict[str, float]:
    """FLConfig's privacy arguments from the command line.

    ``--epsilon inf`` is the explicit non-private run (``noise_multiplier=0``); with neither
    option the target is epsilon 1; giving both is left to FLConfig to refuse.
    """
    if epsilon is None and noise_multiplier is None:
        return {"target_epsilon": 1.0}
    out: dict[str, float] = {}
    if epsilon is not None:
        if math.isinf(epsilon):
            out["noise_multiplier"] = 0.0
        else:
            out["target_epsilon"] = epsilon
    if noise_multiplier is not None:
        if "noise_multiplier" in out:
            raise ValueError("Give --epsilon or --noise-multiplier, not both.")
        out["noise_multiplier"] = noise_multiplier
    return out


def _level_text(level: dict[str, float]) -> str:
    if "target_epsilon" in level:
        return f"epsilon={level['target_epsilon']:g}"
    z = level["noise_multiplier"]
    return "non-private" if z == 0 else f"noise multiplier {z:g}"


def register(subparsers: Any) -> None:
    """Add the ``fl`` sub-command to the main parser's sub-parsers."""
    from dpprecond.fl.server import ALGORITHMS

    p = subparsers.add_parser(
        "fl", help="DP federated learning: DP-FedSOFIM vs DP-FedGD and baselines",
        description="Simulate record-level DP federated learning of a linear softmax head "
                    "(all clients in one process, vectorized).")
    g = p.add_argument_group("data")
    g.add_argument("--data", default="digits",
                   choices=["digits", "fashion-mnist", "cifar10", "pathmnist"])
    g.add_argument("--data-path", default=None, help="directory/file of the data set")
    g.add_argument("--features", default="pixels", choices=["pixels", "resnet20"])
    g.add_argument("--checkpoint", default=None, help="ResNet-20 checkpoint (resnet20)")
    g.add_argument("--cache-dir", default=None, help="feature cache directory")
    g = p.add_argument_group("federation")
    g.add_argument("--clients", type=int, default=20, help="number of clients K")
    g.add_argument("--partition", default="iid", choices=["iid", "dirichlet"])
    g.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    g.add_argument("--weighting", default="uniform", choices=["uniform", "size"])
    g.add_argument("--rounds", type=int, default=70, help="number of rounds T")
    g = p.add_argument_group("privacy")
    g.add_argument("--epsilon", type=_epsilon, default=None,
                   help="target epsilon of the whole run, or 'inf' for a non-private run "
                        "(default 1 unless --noise-multiplier is given)")
    g.add_argument("--delta", type=float, default=1e-5)
    g.add_argument("--noise-multiplier", type=float, default=None,
                   help="explicit noise multiplier z instead of --epsilon (not both)")
    g.add_argument("--clip-norm", type=float, default=10.0)
    g.add_argument("--mechanism", default="full-batch",
                   choices=["full-batch", "poisson", "client-level"])
    g.add_argument("--sampling-rate", type=float, default=1.0)
    g.add_argument("--local-steps", type=int, default=1)
    g.add_argument("--local-lr", type=float, default=0.1)
    g.add_argument("--accountant", default="pld", choices=["pld", "rdp"])
    g = p.add_argument_group("server optimizer")
    g.add_argument("--algorithm", default="sofim", choices=list(ALGORITHMS),
                   help="sofim = paper's gradient form, sofim-momentum = authors' code")
    g.add_argument("--lr", type=float, default=None, help="server learning rate")
    g.add_argument("--beta", type=float, default=0.9, help="SOFIM momentum")
    g.add_argument("--rho", type=float, default=0.5, help="SOFIM ridge")
    g.add_argument("--no-bias-correction", action="store_true")
    g.add_argument("--warmup-rounds", type=int, default=0)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g = p.add_argument_group("output")
    g.add_argument("--seed", type=int, default=None,
                   help="seed of all randomness, for reproducible research only (anyone who "
                        "knows it can regenerate the noise); default: fresh OS entropy")
    g.add_argument("--out", default="fl-out", help="output directory (JSON + PNG)")
    g.add_argument("--progress", action="store_true", help="tqdm bar instead of round lines")
    p.set_defaults(func=run)


def _optimizer_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if args.weight_decay:
        kw["weight_decay"] = args.weight_decay
    if args.algorithm.startswith("sofim"):
        kw.update(beta=args.beta, rho=args.rho, bias_correction=not args.no_bias_correction,
                  warmup_rounds=args.warmup_rounds)
    return kw


def plot_history(histories: dict[str, list[dict[str, float]]], path: Path,
                 title: str = "") -> None:
    """Test accuracy against round for one or several runs (matplotlib Agg, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, hist in histories.items():
        ax.plot([h["round"] for h in hist], [h["test_accuracy"] for h in hist], label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Execute ``dpprecond fl``."""
    from dpprecond.fl.simulator import FLConfig, run_federated

    ds, feat = load_features(args.data, args.data_path, args.features, args.checkpoint,
                             args.cache_dir)
    level = privacy_level(args.epsilon, args.noise_multiplier)
    config = FLConfig(n_rounds=args.rounds, clip_norm=args.clip_norm, **level,
                      target_delta=args.delta, mechanism=args.mechanism,
                      sampling_rate=args.sampling_rate, local_steps=args.local_steps,
                      local_lr=args.local_lr, weighting=args.weighting,
                      accountant=args.accountant).validated()
    seed = "fresh OS entropy" if args.seed is None else f"{args.seed} (reproducible research)"
    print(f"{ds!r}, features: {feat}; algorithm={args.algorithm}, K={args.clients} "
          f"({args.partition}), T={args.rounds}, {_level_text(level)}, delta={args.delta}, "
          f"seed={seed}")

    def line(rec: dict[str, float]) -> None:
        if not args.progress:
            print(f"round {rec['round']:3d}  acc {rec['test_accuracy']:.4f}  "
                  f"loss {rec['test_loss']:.4f}  eps {rec['epsilon']:.3f}  "
                  f"|update| {rec['update_norm']:.3g}  {rec['seconds'] * 1e3:.0f} ms",
                  flush=True)

    start = time.perf_counter()
    result = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                           algorithm=args.algorithm, n_clients=args.clients,
                           partition=args.partition, alpha=args.alpha, config=config,
                           learning_rate=args.lr, optimizer_kwargs=_optimizer_kwargs(args),
                           seed=args.seed, progress=args.progress, callback=line)
    result.config.update(data=args.data, features=feat)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.save_json(out / "history.json")
    plot_history({args.algorithm: result.history}, out / "accuracy.png",
                 f"{args.data}, K={args.clients}, {_level_text(level)}")
    eps = "inf (non-private)" if math.isinf(result.epsilon) else f"{result.epsilon:.4f}"
    noise = {"full-batch": "std 2zC added by each client",
             "poisson": "std zC per local step, add/remove-one unit",
             "client-level": "std 2zC added once to the sum, client-level unit"}[args.mechanism]
    print(f"final test accuracy {result.final_accuracy:.4f} after {args.rounds} rounds; "
          f"noise multiplier z={result.noise_multiplier:.4g} ({noise}); "
          f"epsilon spent {eps} at delta={args.delta:g}; {time.perf_counter() - start:.1f} s")
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0


def run_demo(seed: int = 0) -> None:
    """DP-FedSOFIM (paper, authors' and lagged forms) vs DP-FedGD on digits, 5 IID clients.

    Uses the RDP accountant to keep the demo short (slightly more noise than PLD).
    """
    from dpprecond.fl.simulator import FLConfig, run_federated

    ds, feat = load_features("digits")
    algorithms = ("fedgd", "sofim", "sofim-momentum", "sofim-lagged")
    print(f"DP federated learning on digits ({feat}): 5 IID clients, 40 rounds, C = 10, "
          "lr 0.1, beta 0.9, rho 0.5, delta 1e-5 (RDP accountant); final test accuracy")
    print(f"{'epsilon':>10} " + " ".join(f"{a:>15}" for a in algorithms))
    for eps in (2.0, 8.0, None):
        level = {"noise_multiplier": 0.0} if eps is None else {"target_epsilon": eps}
        config = FLConfig(n_rounds=40, accountant="rdp", **level)
        accs = [run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                              algorithm=a, n_clients=5, config=config,
                              seed=seed).final_accuracy
                for a in algorithms]
        label = "inf" if eps is None else f"{eps:g}"
        print(f"{label:>10} " + " ".join(f"{acc:>15.4f}" for acc in accs))
