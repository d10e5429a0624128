"""The options of the ``dpprecond`` command, each described once: flags, type, default, unit.

Every sub-command adds its options from :data:`OPTIONS` with :func:`add`, so an option
shared by several sub-commands (``--epsilon``, ``--delta``, ``--seed``, ``--secure``,
``--max-epsilon``, ``--row-norm``, ``--output`` ...) has one help text, one type and one
unit everywhere; a sub-command may only change its default (``--delta`` is ``1e-6`` for
PCA and ``1e-5`` for federated learning). The help of every option ends with its default
and, for numbers, its unit: ``(default: 1e-06; unit: probability)``.

:func:`flag_names` maps the library's parameter names (``target_epsilon``) to the flags a
user typed (``--epsilon``), so that the command line's errors speak the user's language.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dpprecond.accounting import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from dpprecond.fl.config import MECHANISMS
from dpprecond.pca.federated import TRUST_MODELS
from dpprecond.pipeline import PCA_METHODS

__all__ = ["OPTIONS", "Option", "add", "check_row_norm", "epsilon_or_inf", "flag_names",
           "option_pair"]


def check_row_norm(value: float | None) -> float | None:
    """``--row-norm``: ``None`` (the domain's bound) or a finite number > 0, else a
    ``ValueError`` naming the flag, the value and the fix."""
    if value is None or (math.isfinite(value) and value > 0):
        return value
    raise ValueError(f"--row-norm must be a finite public bound > 0 on the l2 norm of a row, "
                     f"got --row-norm {value:g}; give the largest norm the data's domain "
                     "allows (e.g. sqrt(d) for d features in [0, 1]), never one read from "
                     "the data, or leave it out for a built-in dataset.")


def epsilon_or_inf(text: str) -> float:
    """``--epsilon`` of ``fl``: a number, or ``inf`` (also ``none``, ``non-private``)."""
    if text.lower() in ("inf", "none", "nonprivate", "non-private"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--epsilon expects a number or 'inf' (non-private), got {text!r}") from None


def option_pair(text: str) -> tuple[str, Any]:
    """``--option NAME=VALUE``: the value read as bool, None, int, float or text."""
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


_NUMERIC = (int, float, epsilon_or_inf)


@dataclass(frozen=True)
class Option:
    """One command-line option.

    ``flags``: its flags (or the name of a positional argument); ``help``: what it does,
    without its default; ``default``: the value argparse stores when it is not given;
    ``shown``: how the default reads when the stored value does not say it (``None`` for
    "the method's own", "fresh OS entropy" ...); ``unit``: the unit of a number (required
    for numeric options); ``param``: the library parameter it sets, for error messages.
    The other fields are passed to ``argparse`` as they are.
    """

    flags: tuple[str, ...]
    help: str
    default: Any = None
    shown: str | None = None
    unit: str | None = None
    param: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None
    metavar: str | None = None
    nargs: str | None = None
    dest: str | None = None

    def __post_init__(self) -> None:
        if self.type in _NUMERIC and not self.unit:
            raise ValueError(f"option {self.flags[0]} is a number and needs a unit")

    @property
    def positional(self) -> bool:
        """A positional argument (no leading dash)."""
        return not self.flags[0].startswith("-")

    def default_text(self) -> str:
        """How the default reads in the help."""
        if self.shown is not None:
            return self.shown
        if self.action == "store_true":
            return "off"
        if self.default is None:
            return "none"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        if isinstance(self.default, list | tuple):
            return "none" if not self.default else ", ".join(map(str, self.default))
        return str(self.default)

    def help_text(self) -> str:
        """The help with its default and unit: ``... (default: 1e-06; unit: probability)``."""
        tail = "required" if self.positional and self.nargs != "?" else \
            f"default: {self.default_text()}"
        if self.unit:
            tail += f"; unit: {self.unit}"
        return f"{self.help} ({tail})".replace("%", "%%")

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``add_argument``."""
        out: dict[str, Any] = {"help": self.help_text()}
        for name in ("type", "action", "metavar", "nargs", "dest"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if not self.positional:
            out["default"] = list(self.default) if isinstance(self.default, list) else \
                self.default
        return out


def _opt(*flags: str, help: str, **kw: Any) -> Option:
    return Option(tuple(flags), help, **kw)


#: Every option of every sub-command, keyed by a short name. Options shared by several
#: sub-commands come first.
OPTIONS: dict[str, Option] = {
    # -- shared ----------------------------------------------------------------------
    "verbose": _opt("-v", "--verbose", action="count", default=0, shown="0, warnings only",
                    help="log more (-v info and the traceback of an error, -vv debug)"),
    "data_path": _opt("--data-path", default=None, shown="the dataset's standard location",
                      help="directory or file of a built-in dataset"),
    "epsilon": _opt("--epsilon", type=float, default=None, shown="1", unit="epsilon",
                    param="target_epsilon", help="target epsilon of the whole release"),
    "delta": _opt("--delta", type=float, default=1e-6, unit="probability",
                  param="target_delta", help="target delta"),
    "row_norm": _opt("--row-norm", type=float, default=None, unit="l2 norm of a row",
                     param="row_norm",
                     shown="sqrt(d) for the built-in image data; required for files",
                     help="public bound on the l2 norm of a row (never derived from the "
                          "data)"),
    "seed": _opt("--seed", type=int, default=None, shown="fresh OS entropy",
                 unit="integer seed", param="seed",
                 help="seed of the noise, for reproducible research only (anyone who "
                      "knows it can regenerate the noise)"),
    "secure": _opt("--secure", action="store_true", param="secure",
                   help="secure mode: noise from the OS CSPRNG, snapped releases; refuses "
                        "--seed (docs/privacy.md)"),
    "max_epsilon": _opt("--max-epsilon", type=float, default=None, shown="no cap",
                        unit="epsilon", param="max_epsilon",
                        help="a cap: refuse to start unless the whole plan spends at most "
                             "this (the run still uses --epsilon; the cap only checks it)"),
    "config": _opt("config", metavar="CONFIG", help="experiment TOML file (see experiments/)"),
    "configs": _opt("config", nargs="+", metavar="CONFIG",
                    help="experiment TOML file(s) (see experiments/)"),
    "output": _opt("--output", default=None, metavar="DIR",
                   shown="the file's output (runs) and report directories",
                   help="directory of the runs and the report, instead of the file's"),
    "no_progress": _opt("--no-progress", action="store_true",
                        help="no progress bars (plain output)"),
    "jobs": _opt("--jobs", type=int, default=1, metavar="N", unit="processes",
                 param="jobs",
                 help="runs at a time, each in its own process with one BLAS thread"),
    # -- pca -------------------------------------------------------------------------
    "pca_data": _opt("--data", default="digits", metavar="NAME|FILE",
                     help="digits | fashion-mnist | path to a .npy/.csv matrix"),
    "pca_data_path": _opt("--data-path", default=None,
                          shown="/usr/share/datasets/fashion-mnist",
                          help="directory of the dataset files (fashion-mnist: the four IDX "
                               "files)"),
    "n_components": _opt("-k", "--n-components", type=int, default=5, unit="components",
                         param="n_components", help="k, the number of components"),
    "pca_method": _opt("--method", action="append", default=None, shown="auto",
                       help="method (repeatable; auto is the best measured, docs/pca_auto.md; "
                            "'all' runs every private method)"),
    "pca_epsilon": _opt("--epsilon", type=float, action="append", default=None, shown="1",
                        unit="epsilon", param="target_epsilon",
                        help="target epsilon of each fit (repeatable: one row per value)"),
    "center": _opt("--center", choices=("none", "private"), default="none",
                   param="center",
                   help="none: uncentered PCA; private: a private mean charged to the "
                        "budget"),
    "clip_radius": _opt("--clip-radius", type=float, default=None, shown="sqrt(k/n)",
                        unit="l2 norm of a preconditioned row, rows in units of --row-norm",
                        param="clip_radius",
                        help="clip radius R of the preconditioned rows, for --method fixed "
                             "(auto and select choose theirs privately)"),
    "n_iter": _opt("--n-iter", type=int, default=None, shown="the method's own",
                   unit="iterations", param="n_iter",
                   help="number of power iterations T, for --method fixed / power"),
    "mean_trials": _opt("--mean-trials", type=float, default=None, shown="the method's own",
                        unit="trials (the mean of a random count)", param="mean_trials",
                        help="mean number of repeat-and-select trials, for --method select"),
    "pca_json": _opt("--json", dest="json_path", default=None, metavar="PATH",
                     shown="no file",
                     help="write all results, with every fit's released components, to this "
                          "strict JSON file (docs/outputs.md)"),
    "pca_max_epsilon": _opt("--max-epsilon", type=float, default=None, shown="no cap",
                            unit="epsilon", param="max_epsilon",
                            help="refuse to start unless the whole table (every fit is a "
                                 "release on the same rows: their composition) spends at "
                                 "most this; prints the total"),
    "pca_clients": _opt("--clients", type=int, default=0, unit="clients", param="clients",
                        shown="0, one data holder (central PCA)",
                        help="split the rows over K clients (contiguous blocks in row order) "
                             "and fit federated PCA: every pass a sum over the clients, the "
                             "noise added as --trust says; methods auto, analyze_gauss, "
                             "fixed, power"),
    "pca_trust": _opt("--trust", default=None, shown="local (with --clients)",
                      choices=tuple(TRUST_MODELS), param="trust",
                      help="who adds the noise of federated PCA. local: every client adds "
                           "the full noise to its own part (each message meets the target; "
                           "sqrt(K) times the central noise in the sum). "
                           "secure-aggregation: every release a secure sum, each client "
                           "adding a Skellam share, so only the sum meets the target "
                           "(honest-but-curious server; docs/secure_aggregation.md)"),
    # -- fl --------------------------------------------------------------------------
    "fl_data": _opt("--data", default="digits", metavar="NAME|FILE",
                    help="one of digits, fashion-mnist, cifar10, pathmnist, or a labelled "
                         ".npz (X_train, y_train, X_test, y_test) or .csv file"),
    "fl_epsilon": _opt("--epsilon", type=epsilon_or_inf, default=None,
                       shown="1 unless --noise-multiplier is given", unit="epsilon",
                       param="target_epsilon",
                       help="target epsilon of the whole run, or 'inf' for a non-private "
                            "run"),
    "features": _opt("--features", default="pixels",
                     metavar="pixels|resnet20|pca:K|random:K",
                     help="pixels or resnet20 (fixed features of the built-in image data), "
                          "pca:K (private federated PCA to K dims, charged to the budget: "
                          "--pca-share) or random:K (a fixed random map, free)"),
    "pca_share": _opt("--pca-share", type=float, default=None, shown="0.2",
                      unit="share of the Gaussian precision", param="pca_share",
                      help="share of the budget's Gaussian precision spent on pca:K "
                           "features"),
    "fl_pca_method": _opt("--pca-method", default=None, shown="auto",
                          choices=tuple(PCA_METHODS), param="pca_method",
                          help="the federated PCA of pca:K features"),
    "trust": _opt("--trust", default=None, shown="local",
                  choices=tuple(TRUST_MODELS), param="trust",
                  help="the trust model of the whole run. local: every client adds its own "
                       "noise to every message (each message meets the target on its own). "
                       "secure-aggregation: the server sees only sums; the training runs "
                       "the distributed Skellam rounds (fedgd, sofim*, adam, yogi; "
                       "full-batch; --weighting size, chosen by default), and pca:K "
                       "features are secure sums too, each client adding a Skellam share "
                       "of std/sqrt(K), so only the sum meets the target"),
    "fl_row_norm": _opt("--row-norm", type=float, default=None, unit="l2 norm of a row",
                        param="row_norm",
                        shown="sqrt(d) for the built-in image data, whose features lie in "
                              "[-1, 1]; required for files",
                        help="public bound on a row's l2 norm, for pca:K"),
    "checkpoint": _opt("--checkpoint", default=None, shown="the standard location",
                       help="ResNet-20 weights file for --features resnet20"),
    "cache_dir": _opt("--cache-dir", default=None, shown="$DPPRECOND_DATA or ~/.cache/dpprecond",
                      help="feature cache directory"),
    "label_column": _opt("--label-column", type=int, default=-1, shown="-1, the last",
                         unit="column index", param="label_column",
                         help="label column of a .csv file"),
    "test_fraction": _opt("--test-fraction", type=float, default=0.2,
                          unit="share of the rows", param="test_fraction",
                          help="held-out share of a file without its own split"),
    "clients": _opt("--clients", type=int, default=20, unit="clients", param="n_clients",
                    help="number of clients K"),
    "partition": _opt("--partition", default="iid", choices=("iid", "dirichlet"),
                      param="partition", help="how the data is split among clients"),
    "alpha": _opt("--alpha", type=float, default=0.5, unit="Dirichlet concentration",
                  param="alpha", help="concentration of --partition dirichlet"),
    "weighting": _opt("--weighting", default=None, choices=("uniform", "size"),
                      shown="size; uniform for --mechanism client-level",
                      param="weighting",
                      help="aggregation weights (size: |D_i| / n, the measured best; "
                           "uniform: 1/K, as the paper)"),
    "rounds": _opt("--rounds", type=int, default=70, unit="rounds", param="n_rounds",
                   help="number of rounds T"),
    "noise_multiplier": _opt("--noise-multiplier", type=float, default=None,
                             shown="calibrated to --epsilon",
                             unit="noise std / sensitivity", param="noise_multiplier",
                             help="explicit noise multiplier z instead of --epsilon (not "
                                  "both)"),
    "clip_norm": _opt("--clip-norm", type=float, default=10.0,
                      unit="l2 norm of a per-example gradient", param="clip_norm",
                      help="per-example gradient clipping norm C"),
    "mechanism": _opt("--mechanism", default="full-batch",
                      choices=tuple(MECHANISMS), param="mechanism",
                      help="client mechanism of the gradient methods (full-batch is the "
                           "paper's)"),
    "sampling_rate": _opt("--sampling-rate", type=float, default=1.0,
                          unit="probability per record", param="sampling_rate",
                          help="Poisson sampling rate of --mechanism poisson"),
    "local_steps": _opt("--local-steps", type=int, default=1, unit="steps per round",
                        param="local_steps",
                        help="local steps of --mechanism poisson/client-level"),
    "local_lr": _opt("--local-lr", type=float, default=0.1, unit="step size",
                     param="local_lr",
                     help="local learning rate of --mechanism poisson/client-level"),
    "accountant": _opt("--accountant", default=DEFAULT_ACCOUNTANT, choices=tuple(ACCOUNTANTS),
                       param="accountant", help="dp_accounting accountant"),
    "adaptive_clip": _opt("--adaptive-clip", action=argparse.BooleanOptionalAction,
                          default=None, param="adaptive_clip",
                          shown="on where it runs (a private full-batch run, --trust local, "
                                "not noise-aware); --no-adaptive-clip keeps --clip-norm",
                          help="adaptive clipping from --clip-norm towards the median "
                               "per-example gradient norm (private counts inside the same "
                               "budget; the measured best, docs/fl_defaults.md)"),
    "tune": _opt("--tune", action="store_true", param="tune",
                 help="select the method, server step and clip privately (repeat-and-"
                      "select, charged: --epsilon is the total, tuning included)"),
    "tune_trials": _opt("--tune-trials", type=float, default=3.0, unit="trials (mean)",
                        param="mean_trials", help="mean number of trials of --tune"),
    "fl_max_epsilon": _opt("--max-epsilon", type=float, default=None, shown="no cap",
                           unit="epsilon", param="max_epsilon",
                           help="a cap, not a target: refuse to start a run whose whole "
                                "plan (the pca:K features and every round) would spend "
                                "more than this; the run spends --epsilon"),
    "algorithm": _opt("--algorithm",
                      help="the method; sofim = the paper's form, sofim-momentum = the "
                           "authors' code, sofim-lagged = ours (see docs/fl.md)"),
    "lr": _opt("--lr", type=float, default=None, unit="step size", param="learning_rate",
               help="the method's (server) learning rate"),
    "method_option": _opt("--option", type=option_pair, action="append", default=[],
                          metavar="NAME=VALUE",
                          help="another option of the method, e.g. beta=0.9, rho=0.5, "
                               "local_steps=5, gamma=1 (repeatable; see "
                               "dpprecond.fl.method_options)"),
    "out": _opt("--out", default="fl-out", metavar="DIR",
                help="output directory for history.json and accuracy.png"),
    "progress": _opt("--progress", action="store_true",
                     help="progress bars instead of one line per round"),
    "fl_secure": _opt("--secure", action="store_true", param="secure",
                      help="secure mode for every stage (the pca:K features and the "
                           "training): noise from the OS CSPRNG, snapped releases; refuses "
                           "--seed (docs/privacy.md)"),
    "fl_seed": _opt("--seed", type=int, default=None, shown="fresh OS entropy",
                    unit="integer seed", param="seed",
                    help="seed of all randomness, for reproducible research only (anyone "
                         "who knows it can regenerate the noise)"),
    # -- demo ------------------------------------------------------------------------
    "demo_seed": _opt("--seed", type=int, default=0, unit="integer seed", param="seed",
                      help="the demo runs on public data and is seeded so that its numbers "
                           "can be reproduced; real releases default to fresh entropy"),
    # -- experiment ------------------------------------------------------------------
    "max_runs": _opt("--max-runs", type=int, default=None, shown="every missing run",
                     unit="runs", help="stop after N new runs"),
    "where": _opt("--where", action="append", default=[], metavar="KEY=VALUE",
                  shown="the whole grid",
                  help="run only this part of the grid first, e.g. --where clients=20 "
                       "--where partition=iid --where seed=0 (repeatable)"),
    "tune_output": _opt("--output", default=None, metavar="DIR",
                        shown="the file's output directory",
                        help="directory of the tuning runs (and of tuning.json unless "
                             "--report); the tuned file runs into it too"),
    "private_tune": _opt("--private", action="store_true",
                         help="select privately, charged: repeat-and-select per cell, the "
                              "cell's epsilon the total with the tuning included (fixed "
                              "features; [tuning] mean_trials, trials, clip_norms)"),
    "tune_report": _opt("--report", default=None, metavar="DIR",
                        shown="the source file's report directory, so the tuned report "
                              "replaces the untuned one",
                        help="report directory of the tuned file; written relative to the "
                             "tuned file"),
    "force": _opt("--force", action="store_true",
                  help="overwrite a report directory written for another experiment file"),
    "compare_configs": _opt("config", nargs="+", metavar="CONFIG",
                            help="experiment TOML files (finished runs on disk)"),
    "reference": _opt("--reference", default="fedgd",
                      help="the method every other is compared with"),
    "labels": _opt("--labels", nargs="+", default=None, metavar="NAME",
                   shown="the experiments' names", help="a name per experiment for the tables"),
    "md": _opt("--md", default=None, metavar="PATH", shown="print only",
               help="also write the markdown here"),
    "figure": _opt("--figure", default=None, metavar="PNG", shown="no figure",
                   help="also draw accuracy against epsilon, a panel per experiment"),
}


def add(parser: Any, name: str, **changes: Any) -> argparse.Action:
    """Add option ``name`` of :data:`OPTIONS` to ``parser`` (a parser or an argument group).

    ``changes`` replace fields of the option for this sub-command (its ``default``,
    ``shown`` text or ``choices``; never its meaning).
    """
    opt = OPTIONS[name]
    if changes:
        opt = dataclasses.replace(opt, **changes)
    action = parser.add_argument(*opt.flags, **opt.kwargs())
    action.option = opt  # the table entry, for flag_names and the tests
    return action


def flag_names(parser: argparse.ArgumentParser) -> dict[str, tuple[str, ...]]:
    """``{library parameter: its flags}`` of the options of ``parser`` that set one."""
    out: dict[str, tuple[str, ...]] = {}
    for action in parser._actions:
        opt = getattr(action, "option", None)
        if opt is not None and opt.param and not opt.positional:
            out.setdefault(opt.param, opt.flags)
    return out


def option_actions(parser: argparse.ArgumentParser) -> Iterable[argparse.Action]:
    """The actions of ``parser`` that are options (not help, version or sub-commands)."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction
                      | argparse._SubParsersAction):
            continue
        yield action
