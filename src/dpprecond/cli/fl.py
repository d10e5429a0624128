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
import sys
import time
from pathlib import Path
from typing import Any, Literal

from dpprecond.cli.plots import plot_history

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


def privacy_level(epsilon: float | None, noise_multiplier: float | None) -> dict[str, Any]:
    """FLConfig's privacy arguments from the command line.

    ``--epsilon inf`` is the explicit non-private run (``noise_multiplier=0``); with neither
    option the target is epsilon 1; giving both is left to FLConfig to refuse.
    """
    if epsilon is None and noise_multiplier is None:
        return {"target_epsilon": 1.0}
    out: dict[str, Any] = {}
    if epsilon is not None:
        if not epsilon > 0:  # also nan
            raise ValueError(f"--epsilon must be > 0, got --epsilon {epsilon:g}: a smaller "
                             "epsilon is more private, and epsilon <= 0 is no target; for a "
                             "non-private run give --epsilon inf.")
        if math.isinf(epsilon):
            out["noise_multiplier"] = 0.0
        else:
            out["target_epsilon"] = epsilon
    if noise_multiplier is not None:
        if "noise_multiplier" in out:
            raise ValueError("Give --epsilon or --noise-multiplier, not both.")
        out["noise_multiplier"] = noise_multiplier
    return out


def method_learning_rates() -> str:
    """The default ``--lr`` of every method, e.g. ``fedgd, sofim 0.1; adam, yogi 0.01``.

    Read from the methods' own signatures (:func:`dpprecond.fl.method_options`); a method
    without a ``learning_rate`` (local-step methods) names its own step-size options.
    """
    from dpprecond.fl.methods import METHODS, method_options

    by_value: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    for name in METHODS:
        opts = method_options(name)
        if "learning_rate" in opts:
            by_value.setdefault(f"{opts['learning_rate'].default:g}", []).append(name)
        else:
            steps = " and ".join(f"--option {key}={opts[key].default:g}"
                                 for key in ("local_lr", "global_lr") if key in opts)
            others.setdefault(steps, []).append(name)
    parts = [f"{', '.join(names)} {value}" for value, names in by_value.items()]
    parts += [f"{', '.join(names)}: no --lr, their step sizes are {steps}"
              for steps, names in others.items()]
    return "the method's own: " + "; ".join(parts)


def _cap_text(args: argparse.Namespace, level: dict[str, Any]) -> str:
    """With ``--max-epsilon``: the epsilon the run uses against the cap, in one line."""
    if args.max_epsilon is None:
        return ""
    if "target_epsilon" in level:
        given = "--epsilon" if args.epsilon is not None else "the default --epsilon"
        text = (f"epsilon: the run spends {level['target_epsilon']:g} ({given}); "
                f"--max-epsilon {args.max_epsilon:g} is a cap that only checks the plan")
        if args.epsilon is None:
            text += f", not a target: give --epsilon {args.max_epsilon:g} to spend it"
        return text + "."
    return (f"epsilon: the run's noise is set by {_level_text(level)}; --max-epsilon "
            f"{args.max_epsilon:g} is a cap that only checks the plan.")


def _of_cap(args: argparse.Namespace) -> str:
    return "" if args.max_epsilon is None else f" (cap --max-epsilon {args.max_epsilon:g})"


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
                    "one client, replace-one; every client adds its own noise (--trust "
                    "secure-aggregation: the server sees only sums, each client adds a "
                    "share of distributed Skellam noise).")
    from dpprecond.cli.options import add

    g = p.add_argument_group("data")
    add(g, "fl_data")
    add(g, "data_path")
    add(g, "features")
    add(g, "pca_share")
    add(g, "fl_pca_method")
    add(g, "trust")
    add(g, "fl_row_norm")
    add(g, "checkpoint")
    add(g, "cache_dir")
    add(g, "label_column")
    add(g, "test_fraction")
    g = p.add_argument_group("federation")
    add(g, "clients")
    add(g, "partition")
    add(g, "alpha")
    add(g, "weighting")
    add(g, "rounds")
    g = p.add_argument_group("privacy")
    add(g, "fl_epsilon")
    add(g, "delta", default=1e-5)
    add(g, "noise_multiplier")
    add(g, "clip_norm")
    add(g, "adaptive_clip")
    add(g, "mechanism")
    add(g, "sampling_rate")
    add(g, "local_steps")
    add(g, "local_lr")
    add(g, "accountant")
    add(g, "tune")
    add(g, "tune_trials")
    add(g, "fl_max_epsilon")
    g = p.add_argument_group("method")
    add(g, "algorithm", default=DEFAULT_ALGORITHM, choices=tuple(METHODS))
    add(g, "lr", shown=method_learning_rates())
    add(g, "method_option")
    g = p.add_argument_group("output")
    add(g, "fl_seed")
    add(g, "out")
    add(g, "progress")
    add(g, "fl_secure")
    p.set_defaults(func=run)


def _check_method_flags(algorithm: str, lr: float | None, options: dict[str, Any], *,
                        local_steps: int = 1, local_lr: float = 0.1,
                        mechanism: str = "full-batch") -> None:
    """``--lr``, ``--local-steps``, ``--local-lr`` and ``--option NAME=VALUE`` against the
    method's own options, with the fix (another ``--mechanism`` of a local-step method is
    refused by the method, naming the mechanism)."""
    from dpprecond.fl.methods import method_options

    valid = method_options(algorithm)
    own = [(flag, name, value) for flag, name, value, default in (
        ("--local-steps", "local_steps", local_steps, 1),
        ("--local-lr", "local_lr", local_lr, 0.1)) if name in valid and value != default]
    if own and mechanism in ("full-batch", "client-level"):  # their own options
        flags = " and ".join(f"{flag} {value:g}" for flag, _, value in own)
        fix = " ".join(f"--option {name}={value:g}" for _, name, value in own)
        raise ValueError(f"--algorithm {algorithm} sets its own local steps and step size; "
                         f"got {flags}, which only the one-message gradient methods read. "
                         f"Drop them and pass {fix}.")
    if lr is not None and "learning_rate" not in valid:
        steps = " / ".join(f"--option {k}={valid[k].default:g}" for k in ("local_lr",
                           "global_lr") if k in valid)
        raise ValueError(f"--lr does not apply to --algorithm {algorithm} (it has no "
                         f"server learning rate); set its step sizes with {steps}.")
    unknown = sorted(set(options) - set(valid))
    if unknown:
        names = ", ".join(unknown)
        raise ValueError(f"--option {names}: not an option of --algorithm {algorithm}; its "
                         f"options are {', '.join(sorted(valid))} (--option NAME=VALUE).")


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
    if args.progress and not sys.stderr.isatty():  # a file or a pipe: lines, not redraws
        args.progress = False
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.fl.methods import make_method

    if args.secure and args.seed is not None:
        raise ValueError(f"--secure refuses --seed (got --seed {args.seed}): a seeded run's "
                         "noise can be regenerated by whoever knows the seed; drop --seed.")
    from dpprecond._validation import check_target_delta

    check_target_delta("--delta", args.delta)
    level = privacy_level(args.epsilon, args.noise_multiplier)
    trust: Literal["local", "secure-aggregation"] = args.trust or "local"
    options = dict(args.option)
    _check_method_flags(args.algorithm, args.lr, options, local_steps=args.local_steps,
                        local_lr=args.local_lr, mechanism=args.mechanism)
    if trust == "secure-aggregation":
        _check_secure_flags(args, level)
    weighting: Literal["uniform", "size"] | None = args.weighting  # None: FLConfig's default
    from dpprecond.fl.adaptive_clip import AdaptiveClip

    adaptive: AdaptiveClip | Literal["auto"] | None = (
        "auto" if args.adaptive_clip is None else AdaptiveClip() if args.adaptive_clip
        else None)
    config = FLConfig(n_rounds=args.rounds, clip_norm=args.clip_norm, **level,
                      adaptive_clip=adaptive,
                      target_delta=args.delta, mechanism=args.mechanism,
                      sampling_rate=args.sampling_rate, local_steps=args.local_steps,
                      local_lr=args.local_lr, weighting=weighting, trust=trust,
                      accountant=args.accountant).validated()
    make_method(args.algorithm, args.lr, **options)  # refuse bad options before loading
    from dpprecond.cli.options import check_row_norm

    check_row_norm(args.row_norm)
    ledger = None
    if args.max_epsilon is not None:
        ledger = PrivacyLedger(args.delta, max_epsilon=args.max_epsilon)
    out = _prepare_out(args.out)
    from dpprecond.pipeline import parse_features

    kind = args.features if args.features in ("pixels", "resnet20") else \
        parse_features(args.features)[0]
    pca_only = [flag for flag, value in (("--pca-share", args.pca_share),
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
        return _run_pipeline(args, ds, level, out, ledger, weighting, adaptive)
    seed = "fresh OS entropy" if args.seed is None else f"{args.seed} (reproducible research)"
    print(f"{ds!r}, features: {feat}; algorithm={args.algorithm}, K={args.clients} "
          f"({args.partition}), T={args.rounds}, {_level_text(level)}, delta={args.delta}, "
          f"seed={seed}")
    _print_trust(trust, args.weighting, args.mechanism)
    cap = _cap_text(args, level)
    if cap:
        print(cap)

    def line(rec: dict[str, float]) -> None:
        if not args.progress:
            print(_round_line(rec), flush=True)

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
    if trust == "secure-aggregation":
        noise = ("Skellam noise in shares, std z times the sum's L2 sensitivity on the "
                 "secure sum" + (", client-level unit" if args.mechanism == "client-level"
                                 else ""))
    print(f"final test accuracy {result.final_accuracy:.4f} after {args.rounds} rounds; "
          f"{result.n_releases} releases per client, noise multiplier "
          f"z={result.noise_multiplier:.4g} ({noise}); epsilon spent {eps} at "
          f"delta={args.delta:g}{_of_cap(args)}; {time.perf_counter() - start:.1f} s")
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0


def total_epsilon_text(total: float, pca: float | None, training: float,
                       delta: float, secure_aggregation: bool = False) -> str:
    """The pipeline's privacy line: the composed total and what each stage alone spends.

    The stages are Gaussian releases composed exactly (PLD), or under secure aggregation
    the PCA's Gaussian releases and the training's Skellam sums composed with the RDP
    accountant: their epsilons do not add up, the total is smaller than the sum, and the
    line says so.
    """
    if math.isinf(total):
        return f"total epsilon per record inf (non-private) at delta={delta:g}"
    if pca is None:
        return (f"total epsilon per record {total:.4f} at delta={delta:g} (the features "
                "are free; all of it is the training's)")
    return (f"total epsilon per record {total:.4f} at delta={delta:g}, from one ledger: PCA "
            f"alone {pca:.4f}, training alone {training:.4f}; composed {total:.4f}, not "
            f"their sum {pca + training:.4f}: composition is not additive ("
            + ("the PCA's Gaussian releases and the training's Skellam sums are composed "
               "with dp_accounting's RDP accountant)" if secure_aggregation else
               "the Gaussian releases of both stages are composed exactly)"))


class _Stages:
    """Says when the features stage starts and ends, then prints the rounds (the features
    stage has no rounds: without this a pca:K run is silent until training starts)."""

    def __init__(self, args: argparse.Namespace, start: float) -> None:
        self.args, self.start, self.started = args, start, False
        kind = args.features.split(":", 1)[0]
        what = ("private federated PCA of the clients' rows" if kind == "pca" else
                "random features (public, no budget)")
        self.bar = None
        if args.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=1, desc=f"features {args.features}", unit="stage")
        else:
            print(f"stage 1 of 2: {what} to {args.features.split(':', 1)[1]} dims ...",
                  flush=True)

    def round(self, rec: dict[str, float]) -> None:
        """The engine's per-round callback."""
        if not self.started:
            self.started = True
            took = time.perf_counter() - self.start - rec["seconds"]
            if self.bar is not None:
                self.bar.update(1)
                self.bar.close()
            else:
                print(f"stage 1 of 2 done in {took:.1f} s; stage 2 of 2: training, "
                      f"{self.args.rounds} rounds", flush=True)
        if not self.args.progress:
            print(_round_line(rec), flush=True)


def _round_line(rec: dict[str, float]) -> str:
    """One round of the history, every number with 4 decimals."""
    return (f"round {rec['round']:3d}  acc {rec['test_accuracy']:.4f}  "
            f"loss {rec['test_loss']:.4f}  eps {rec['epsilon']:.4f}  "
            f"|update| {rec['update_norm']:.4f}  {rec['seconds'] * 1e3:.0f} ms")


def _check_secure_flags(args: argparse.Namespace, level: dict[str, Any]) -> None:
    """``--trust secure-aggregation``: refuse, naming the flag, what its rounds cannot run
    (before any data is loaded)."""
    from dpprecond.fl.methods import (
        CovarianceMethod,
        GradientMethod,
        LocalStepsMethod,
        make_method,
    )

    why = "--trust secure-aggregation"
    client_level = args.mechanism == "client-level"
    if args.mechanism not in ("full-batch", "client-level"):
        raise ValueError(f"{why} runs the full-batch or the client-level mechanism; got "
                         f"--mechanism {args.mechanism}. Drop --mechanism or use --trust "
                         "local.")
    if client_level and args.weighting == "size":
        raise ValueError(f"{why} with --mechanism client-level weighs clients uniformly (a "
                         "size weight would reveal the replaced client's size); drop "
                         "--weighting.")
    if not client_level and args.weighting == "uniform":
        raise ValueError(f"{why} sums the records of all clients in one secure sum, i.e. "
                         "--weighting size; got --weighting uniform. Drop --weighting (size "
                         "is chosen for you) or use --trust local.")
    if args.tune:
        raise ValueError(f"--tune is not available with {why} (its trials run with local "
                         "noise); drop one of them.")
    if level.get("noise_multiplier") == 0:
        raise ValueError(f"{why} is a private mechanism; a non-private run (--epsilon inf "
                         "or --noise-multiplier 0) uses --trust local.")
    method = make_method(args.algorithm, args.lr, **dict(args.option))
    if isinstance(method, LocalStepsMethod) and client_level:
        if method.control_variates:
            raise ValueError(f"{why} with --mechanism client-level runs fedavg and fedprox; "
                             f"--algorithm {args.algorithm} has no client-level form (its "
                             "server control variate would drift by the sum of every "
                             "round's noise; docs/fl.md). Use --algorithm fedavg or fedprox.")
    elif not isinstance(method, (GradientMethod, CovarianceMethod)):
        raise ValueError(f"{why} runs the one-message gradient methods (fedgd, sofim*, adam, "
                         f"yogi), the covariance methods (fedfc, fednew) and, with "
                         f"--mechanism client-level, fedavg and fedprox; --algorithm "
                         f"{args.algorithm} --mechanism {args.mechanism} sends other releases "
                         "(record-level local steps, each on the client's own noisy gradient "
                         "before any sum). Choose one of them, use --trust local, or add "
                         "--mechanism client-level (fedavg, fedprox; not with --features "
                         "pca:K, whose private PCA is record-level).")
    if args.adaptive_clip and (client_level or not isinstance(method, GradientMethod)
                               or getattr(method, "noise_aware", None) is not None):
        raise ValueError(f"--adaptive-clip with {why} runs with the one-message gradient "
                         f"methods (fedgd, sofim*, adam, yogi; not noise-aware) and --mechanism "
                         f"full-batch, whose secure sums carry its count; got --algorithm "
                         f"{args.algorithm} --mechanism {args.mechanism}. Drop --adaptive-clip.")
    if client_level and isinstance(method, CovarianceMethod):
        raise ValueError(f"{why} with --mechanism client-level runs the one-message gradient "
                         f"methods; --algorithm {args.algorithm} releases a record-level "
                         "second moment first. Use --mechanism full-batch for it.")


def _print_trust(trust: str, weighting: str | None, mechanism: str = "full-batch") -> None:
    if trust == "secure-aggregation":
        if mechanism == "client-level":
            print("trust: secure-aggregation (the server sees only sums of clipped client "
                  "updates; distributed Skellam noise, client-level unit); weighting uniform")
            return
        chosen = " (chosen for it: one secure sum of all clients' records)" \
            if weighting is None else ""
        print(f"trust: secure-aggregation (the server sees only sums; distributed Skellam "
              f"noise in the training); weighting size{chosen}")


def _run_pipeline(args: argparse.Namespace, ds: Any, level: dict[str, float],
                  out: Path, ledger: Any, weighting: Literal["uniform", "size"] | None,
                  adaptive: Any) -> int:
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
    _print_trust(trust, args.weighting)
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
    cap = _cap_text(args, level)
    if cap:
        print(cap)
    start = time.perf_counter()
    stage = _Stages(args, start)
    res = run_pipeline(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                       features=args.features, target_epsilon=eps, target_delta=args.delta,
                       row_norm=row_norm, pca_share=pca_share, pca_method=pca_method,
                       trust=trust,
                       algorithm=args.algorithm, learning_rate=args.lr,
                       method_options=dict(args.option), n_clients=args.clients,
                       partition=args.partition, alpha=args.alpha, n_rounds=args.rounds,
                       clip_norm=args.clip_norm,
                       weighting=weighting, adaptive_clip=adaptive,
                       accountant=args.accountant, seed=args.seed, ledger=ledger,
                       secure=args.secure, progress=args.progress, callback=stage.round)
    res.fl.config.update(data=args.data, features=res.features)
    res.save_json(out / "history.json")
    plot_history({args.algorithm: res.fl.history}, out / "accuracy.png",
                 f"{args.data}, {args.features}, K={args.clients}")
    print(f"final test accuracy {res.final_accuracy:.4f}; features: {res.features}; "
          f"{time.perf_counter() - start:.1f} s")
    print(total_epsilon_text(res.epsilon, res.pca_epsilon, res.fl.epsilon, args.delta,
                             trust == "secure-aggregation") + _of_cap(args))
    print(f"wrote {out / 'history.json'} and {out / 'accuracy.png'}")
    return 0

