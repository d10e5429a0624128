"""``dpprecond fl``: record-level DP federated learning (DP-FedSOFIM and baselines).

Example::

    dpprecond fl --data fashion-mnist --algorithm sofim-lagged --clients 20 --epsilon 1
    dpprecond fl --data my_data.npz --algorithm scaffold --option local_steps=3
    dpprecond fl --data my_table.csv --label-column -1 --epsilon 2

prints one line per round and a final summary, and writes ``<out>/history.json`` and
``<out>/accuracy.png``. Every method of :mod:`dpprecond.fl.methods` runs here; its options
are ``--lr`` and ``--option NAME=VALUE``.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Any, Literal

__all__ = ["load_fl_data", "plot_history", "privacy_level", "register", "run"]

logger = logging.getLogger(__name__)

BUILT_IN = ("digits", "fashion-mnist", "cifar10", "pathmnist")


def load_fl_data(data: str, data_path: str | None = None, features: str = "pixels",
                 checkpoint: str | None = None, cache_dir: str | None = None,
                 label_column: int = -1, test_fraction: float = 0.2) -> tuple[Any, str]:
    """A built-in dataset with fixed features, or the user's labelled ``.npz``/``.csv``."""
    if data in BUILT_IN:
        from dpprecond.features import load_features

        return load_features(data, data_path, features, checkpoint, cache_dir)
    path = Path(data)
    if path.suffix.lower() in (".npz", ".csv", ".txt", ".tsv") or path.exists():
        from dpprecond.data.labelled import load_labelled

        if features != "pixels":
            raise ValueError("--features applies to the built-in image datasets only; a "
                             "file's columns are used as they are.")
        return (load_labelled(path, label_column=label_column, test_fraction=test_fraction),
                "the file's columns")
    raise ValueError(f"Unknown --data {data!r}: give one of {list(BUILT_IN)} or the path of "
                     "a labelled .npz/.csv file.")


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option expects NAME=VALUE, got {text!r}")
    low = value.lower()
    if low in ("true", "false"):
        return key, low == "true"
    if low in ("none", "null"):
        return key, None
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            continue
    return key, value


def _epsilon(text: str) -> float:
    if text.lower() in ("inf", "none", "nonprivate", "non-private"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--epsilon expects a number or 'inf' (non-private), got {text!r}") from None


def privacy_level(epsilon: float | None, noise_multiplier: float | None) -> dict[str, Any]:
    """FLConfig's privacy arguments from the command line.

    ``--epsilon inf`` is the explicit non-private run (``noise_multiplier=0``); with neither
    option the target is epsilon 1; giving both is left to FLConfig to refuse.
    """
    if epsilon is None and noise_multiplier is None:
        return {"target_epsilon": 1.0}
    out: dict[str, Any] = {}
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
    from dpprecond.fl.methods import METHODS
    from dpprecond.fl.simulator import DEFAULT_ALGORITHM

    p = subparsers.add_parser(
        "fl", help="DP federated learning: DP-FedSOFIM vs DP-FedGD and baselines",
        description="Simulate record-level DP federated learning of a linear softmax head "
                    "(all clients in one process, vectorized). Privacy unit: one record of "
                    "one client, replace-one; every client adds its own noise.")
    g = p.add_argument_group("data")
    g.add_argument("--data", default="digits", metavar="NAME|FILE",
                   help=f"one of {', '.join(BUILT_IN)}, or a labelled .npz (X_train, "
                        "y_train, X_test, y_test) or .csv file (default: digits)")
    g.add_argument("--data-path", default=None,
                   help="directory or file of a built-in dataset (default: its standard "
                        "location)")
    g.add_argument("--features", default="pixels", metavar="pixels|resnet20|pca:K|random:K",
                   help="pixels or resnet20 (fixed features of the built-in image data), "
                        "pca:K (private federated PCA to K dims, charged to the budget: "
                        "--pca-share) or random:K (a fixed random map, free); default pixels")
    g.add_argument("--pca-share", type=float, default=None,
                   help="share of the budget's Gaussian precision spent on pca:K features "
                        "(default: 0.2)")
    g.add_argument("--pca-method", default=None, choices=["auto", "analyze_gauss", "fixed"],
                   help="the federated PCA of pca:K features (default: auto)")
    g.add_argument("--trust", default=None, choices=["local", "secure-aggregation"],
                   help="who adds the pca:K noise: every client its own (local, default: "
                        "each client's message meets the target on its own; the aggregate "
                        "has sqrt(K) times the noise), or shares of std/sqrt(K) under an "
                        "assumed secure aggregation (only the sum meets the target, and only "
                        "if the protocol reveals nothing else; none runs here)")
    g.add_argument("--row-norm", type=float, default=None,
                   help="public bound on a row's l2 norm, for pca:K (default: sqrt(d) for the "
                        "built-in image data, whose features lie in [-1, 1]; required for "
                        "files)")
    g.add_argument("--checkpoint", default=None,
                   help="ResNet-20 weights file for --features resnet20 (default: the "
                        "standard location)")
    g.add_argument("--cache-dir", default=None,
                   help="feature cache directory (default: $DPPRECOND_DATA or "
                        "~/.cache/dpprecond)")
    g.add_argument("--label-column", type=int, default=-1,
                   help="label column of a .csv file (default: -1, the last)")
    g.add_argument("--test-fraction", type=float, default=0.2,
                   help="held-out share of a file without its own split (default: 0.2)")
    g = p.add_argument_group("federation")
    g.add_argument("--clients", type=int, default=20, help="number of clients K (default: 20)")
    g.add_argument("--partition", default="iid", choices=["iid", "dirichlet"],
                   help="how the data is split among clients (default: iid)")
    g.add_argument("--alpha", type=float, default=0.5,
                   help="Dirichlet concentration of --partition dirichlet (default: 0.5)")
    g.add_argument("--weighting", default="uniform", choices=["uniform", "size"],
                   help="aggregation weights (default: uniform, as the paper)")
    g.add_argument("--rounds", type=int, default=70, help="number of rounds T (default: 70)")
    g = p.add_argument_group("privacy")
    g.add_argument("--epsilon", type=_epsilon, default=None,
                   help="target epsilon of the whole run, or 'inf' for a non-private run "
                        "(default: 1 unless --noise-multiplier is given)")
    g.add_argument("--delta", type=float, default=1e-5, help="target delta (default: 1e-5)")
    g.add_argument("--noise-multiplier", type=float, default=None,
                   help="explicit noise multiplier z instead of --epsilon (not both)")
    g.add_argument("--clip-norm", type=float, default=10.0,
                   help="per-example gradient clipping norm C (default: 10)")
    g.add_argument("--adaptive-clip", action="store_true",
                   help="adaptive clipping from --clip-norm towards the median gradient norm "
                        "(private counts inside the same budget; full-batch mechanism)")
    g.add_argument("--mechanism", default="full-batch",
                   choices=["full-batch", "poisson", "client-level"],
                   help="client mechanism of the gradient methods (default: full-batch, the "
                        "paper's)")
    g.add_argument("--sampling-rate", type=float, default=1.0,
                   help="Poisson sampling rate of --mechanism poisson (default: 1)")
    g.add_argument("--local-steps", type=int, default=1,
                   help="local steps of --mechanism poisson/client-level (default: 1)")
    g.add_argument("--local-lr", type=float, default=0.1,
                   help="local learning rate of --mechanism poisson/client-level "
                        "(default: 0.1)")
    g.add_argument("--accountant", default="pld", choices=["pld", "rdp"],
                   help="dp_accounting accountant (default: pld)")
    g.add_argument("--tune", action="store_true",
                   help="select the method, server step and clip privately (repeat-and-"
                        "select, charged: --epsilon is the total, tuning included)")
    g.add_argument("--tune-trials", type=float, default=3.0,
                   help="mean number of trials of --tune (default: 3)")
    g.add_argument("--max-epsilon", type=float, default=None,
                   help="refuse to start a run whose whole plan (the pca:K features and "
                        "every round) would spend more than this (default: no cap)")
    g = p.add_argument_group("method")
    g.add_argument("--algorithm", default=DEFAULT_ALGORITHM, choices=list(METHODS),
                   help=f"the method (default: {DEFAULT_ALGORITHM}); sofim = the paper's "
                        "form, sofim-momentum = the authors' code, sofim-lagged = ours (see "
                        "docs/fl.md)")
    g.add_argument("--lr", type=float, default=None,
                   help="the method's (server) learning rate (default: the method's own)")
    g.add_argument("--option", type=_option, action="append", default=[],
                   metavar="NAME=VALUE",
                   help="another option of the method, e.g. beta=0.9, rho=0.5, "
                        "local_steps=5, gamma=1 (repeatable; see "
                        "dpprecond.fl.method_options)")
    g = p.add_argument_group("output")
    g.add_argument("--seed", type=int, default=None,
                   help="seed of all randomness, for reproducible research only (anyone who "
                        "knows it can regenerate the noise); default: fresh OS entropy")
    g.add_argument("--out", default="fl-out",
                   help="output directory for history.json and accuracy.png (default: "
                        "fl-out)")
    g.add_argument("--progress", action="store_true",
                   help="a tqdm bar instead of one line per round")
    g.add_argument("--secure", action="store_true",
                   help="secure mode for every stage (the pca:K features and the "
                        "training): noise from the OS CSPRNG, snapped releases; refuses "
                        "--seed (docs/privacy.md)")
    p.set_defaults(func=run)


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




def _prepare_out(path: str) -> Path:
    """Create the output directory before training, so a bad path fails at once."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {path} exists and is not a directory; give a directory.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {path} cannot be written ({exc.strerror}); give a writable "
                         "directory.") from None
    return out


def run(args: argparse.Namespace) -> int:
    """Execute ``dpprecond fl``."""
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.fl.methods import make_method

    if args.secure and args.seed is not None:
        raise ValueError(f"--secure refuses --seed (got --seed {args.seed}): a seeded run's "
                         "noise can be regenerated by whoever knows the seed; drop --seed.")
    from dpprecond._validation import check_target_delta

    check_target_delta(args.delta, "--delta")
    level = privacy_level(args.epsilon, args.noise_multiplier)
    from dpprecond.fl.adaptive_clip import AdaptiveClip

    config = FLConfig(n_rounds=args.rounds, clip_norm=args.clip_norm, **level,
                      adaptive_clip=AdaptiveClip() if args.adaptive_clip else None,
                      target_delta=args.delta, mechanism=args.mechanism,
                      sampling_rate=args.sampling_rate, local_steps=args.local_steps,
                      local_lr=args.local_lr, weighting=args.weighting,
                      accountant=args.accountant).validated()
    options = dict(args.option)
    make_method(args.algorithm, args.lr, **options)  # refuse bad options before loading
    ledger = None
    if args.max_epsilon is not None:
        ledger = PrivacyLedger(args.delta, max_epsilon=args.max_epsilon)
    out = _prepare_out(args.out)
    from dpprecond.pipeline import parse_features

    kind = args.features if args.features in ("pixels", "resnet20") else \
        parse_features(args.features)[0]
    pca_only = [flag for flag, value in (("--trust", args.trust), ("--pca-share", args.pca_share),
                                         ("--pca-method", args.pca_method)) if value is not None]
    if pca_only and kind != "pca":
        raise ValueError(f"{', '.join(pca_only)} apply to --features pca:K only (the private "
                         f"PCA features), not to --features {args.features}; drop them or use "
                         "pca:K.")
    base = args.features if kind in ("pixels", "resnet20") else "pixels"
    ds, feat = load_fl_data(args.data, args.data_path, base, args.checkpoint,
                            args.cache_dir, args.label_column, args.test_fraction)
    if args.tune:  # private selection (dpprecond.cli.fl_tune); pixel features or a file
        if kind in ("pca", "random"):
            raise ValueError("--tune runs on fixed features; drop --features pca:K/random:K.")
        from dpprecond.cli.fl_tune import run_tune

        return run_tune(args, ds, config, out, ledger)
    if kind in ("pca", "random"):
        if args.adaptive_clip:
            raise ValueError("--adaptive-clip runs on fixed features; drop it or drop "
                             "--features pca:K/random:K.")
        return _run_pipeline(args, ds, level, out, ledger)
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
                           learning_rate=args.lr, method_options=options, seed=args.seed,
                           ledger=ledger, progress=args.progress, callback=line,
                           secure=args.secure)
    result.config.update(data=args.data, features=feat)
    result.save_json(out / "history.json")
    plot_history({args.algorithm: result.history}, out / "accuracy.png",
                 f"{args.data}, K={args.clients}, {_level_text(level)}")
    eps = "inf (non-private)" if math.isinf(result.epsilon) else f"{result.epsilon:.4f}"
    noise = {"full-batch": "std 2zC added by each client",
             "poisson": "std zC per local step, add/remove-one unit",
             "client-level": "std 2zC added once to the sum, client-level unit"}[args.mechanism]
    print(f"final test accuracy {result.final_accuracy:.4f} after {args.rounds} rounds; "
          f"{result.n_releases} releases per client, noise multiplier "
          f"z={result.noise_multiplier:.4g} ({noise}); epsilon spent {eps} at "
          f"delta={args.delta:g}; {time.perf_counter() - start:.1f} s")
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0


def _run_pipeline(args: argparse.Namespace, ds: Any, level: dict[str, float],
                  out: Path, ledger: Any) -> int:
    """``--features pca:K | random:K``: private features, then training, one ledger."""
    from dpprecond.pipeline import run_pipeline

    if args.mechanism != "full-batch" or ("noise_multiplier" in level and level[
            "noise_multiplier"] != 0):
        raise ValueError("--features pca:K/random:K split a target epsilon between the PCA "
                         "and the training (Gaussian releases only): use --epsilon (or inf) "
                         "with --mechanism full-batch.")
    from dpprecond.pipeline import DEFAULT_PCA_METHOD

    pca_share = 0.2 if args.pca_share is None else args.pca_share
    pca_method = args.pca_method or DEFAULT_PCA_METHOD
    trust: Literal["local", "secure-aggregation"] = args.trust or "local"
    row_norm = args.row_norm
    if row_norm is None:
        if args.data not in BUILT_IN:
            raise ValueError("--row-norm is required with pca:K features on a file: give a "
                             "public bound on the l2 norm of its rows.")
        row_norm = math.sqrt(ds.X_train.shape[1])
    eps = level.get("target_epsilon")
    print(f"{ds!r}; features {args.features} (pca share {pca_share:g}, trust "
          f"{trust}, row_norm {row_norm:g}); algorithm={args.algorithm}, "
          f"K={args.clients}, T={args.rounds}, "
          f"{'non-private' if eps is None else f'epsilon={eps:g}'}, delta={args.delta}")
    start = time.perf_counter()
    res = run_pipeline(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                       features=args.features, target_epsilon=eps, target_delta=args.delta,
                       row_norm=row_norm, pca_share=pca_share, pca_method=pca_method,
                       trust=trust,
                       algorithm=args.algorithm, learning_rate=args.lr,
                       method_options=dict(args.option), n_clients=args.clients,
                       partition=args.partition, alpha=args.alpha, n_rounds=args.rounds,
                       clip_norm=args.clip_norm, weighting=args.weighting,
                       accountant=args.accountant, seed=args.seed, ledger=ledger,
                       secure=args.secure, progress=args.progress)
    res.fl.config.update(data=args.data, features=res.features)
    res.save_json(out / "history.json")
    plot_history({args.algorithm: res.fl.history}, out / "accuracy.png",
                 f"{args.data}, {args.features}, K={args.clients}")
    total = "inf (non-private)" if math.isinf(res.epsilon) else f"{res.epsilon:.4f}"
    pca = "" if res.pca_epsilon is None else f" (PCA {res.pca_epsilon:.4f}, training " \
        f"{res.fl.epsilon:.4f})"
    print(f"final test accuracy {res.final_accuracy:.4f}; features: {res.features}; total "
          f"epsilon per record {total}{pca} at delta={args.delta:g} from one ledger; "
          f"{time.perf_counter() - start:.1f} s")
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0

