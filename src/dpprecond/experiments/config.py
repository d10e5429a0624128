"""Declarative experiment files (TOML) and their expansion into independent runs.

An experiment file names the data, the federation, the privacy grid, the protocol and the
methods with their hyperparameters (see ``experiments/*.toml``)::

    name = "digits"
    output = "../results/digits"       # raw runs (ignored by git), relative to this file
    report = "../docs/results/digits"  # tables, figures, CSV/JSON (default: output)
    # tuned_from = "digits"    # written by `dpprecond experiment tune` into its output file

    [data]
    name = "digits"            # digits | fashion-mnist | cifar10 | pathmnist
    features = "pixels"        # pixels | resnet20
    # path = "...", checkpoint = "...", cache_dir = "..."

    [federation]
    clients = [20, 100]
    partitions = ["iid", "dirichlet"]
    alpha = 0.5

    [privacy]
    epsilons = [0.5, 1, 2, 5, 10, "inf"]   # "inf" = non-private
    delta = 1e-5
    clip_norm = 10.0
    accountant = "pld"

    [protocol]
    kind = "per-round"         # or "per-T" with rounds_list = [1, 2, 5, ...]
    rounds = 70
    seeds = [0, 1, 2]
    reference = "sofim"        # the method tested against every other (McNemar)
    precision = "float64"      # the kernel: "float32" is faster, with 0.6% more noise
    backend = "numpy"          # or "torch" (CPU, or CUDA when present)

    [methods.sofim]
    algorithm = "sofim"
    learning_rate = 0.1

    [tuning]                   # optional: `dpprecond experiment tune`
    validation_fraction = 0.1
    epsilons = [1.0]
    seeds = [0]
    # mean_trials = 3.0, trials = "logarithmic"   # the private selection (tune --private)
    # clip_norms = [1.0, 10.0]                     # searched by tune --private only
    [tuning.grid.sofim]
    learning_rate = [0.05, 0.1, 0.5]

Each run is a :class:`RunSpec`, a plain dictionary of everything that determines its result,
identified by a hash of that dictionary (so an interrupted sweep resumes, and a changed
hyperparameter is a new run).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dpprecond.accounting import DEFAULT_ACCOUNTANT
from dpprecond.experiments.schema import (
    ExperimentFile,
    TuningTable,
    check_method_params,
    format_errors,
)
from dpprecond.fl.methods import METHODS

__all__ = [
    "ALGORITHMS",
    "ExperimentConfig",
    "MethodSpec",
    "RunSpec",
    "expand_runs",
    "load_config",
    "parse_config",
    "run_id",
]

#: Every method of :mod:`dpprecond.fl.methods`.
ALGORITHMS = tuple(METHODS)

RunSpec = dict[str, Any]


@dataclass(frozen=True)
class MethodSpec:
    """A method of the comparison: its label, algorithm and hyperparameters."""

    label: str
    algorithm: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExperimentConfig:
    """A parsed experiment file (see the module docstring for the format)."""

    name: str
    output: Path
    data: str
    report_dir: Path | None = None
    features: str = "pixels"
    pca: dict[str, Any] = field(default_factory=dict)
    trust: str = "local"
    data_path: str | None = None
    checkpoint: str | None = None
    cache_dir: str | None = None
    clients: tuple[int, ...] = (20,)
    partitions: tuple[str, ...] = ("iid",)
    alpha: float = 0.5
    epsilons: tuple[float | None, ...] = (1.0,)
    delta: float = 1e-5
    clip_norm: float = 10.0
    accountant: str = DEFAULT_ACCOUNTANT
    protocol: str = "per-round"
    rounds: int = 70
    rounds_list: tuple[int, ...] = ()
    seeds: tuple[int, ...] = (0,)
    reference: str = "sofim"
    precision: str = "float64"
    backend: str = "numpy"
    methods: tuple[MethodSpec, ...] = ()
    validation_fraction: float = 0.1
    tune_epsilons: tuple[float | None, ...] = (1.0,)
    tune_seeds: tuple[int, ...] = (0,)
    tune_grid: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    tune_mean_trials: float = 3.0
    tune_trials: str | float = "logarithmic"
    tune_clip_norms: tuple[float, ...] = ()
    tuned_from: str | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def method(self, label: str) -> MethodSpec:
        """The method with this label (``KeyError`` naming the known labels)."""
        for m in self.methods:
            if m.label == label:
                return m
        raise KeyError(f"No method {label!r}; known: {[m.label for m in self.methods]}")


def _pca_settings(data: Any) -> dict[str, Any]:
    """The PCA stage's settings of ``pca:K`` features (empty for other features)."""
    if not data.features.startswith("pca:"):
        return {}
    out = {"share": float(data.pca_share), "method": data.pca_method, "trust": data.trust}
    if data.row_norm is not None:
        out["row_norm"] = float(data.row_norm)
    return out


def _check_secure_sweep(source: str, methods: list[MethodSpec],
                        epsilons: list[Any]) -> None:
    """``[data] trust = "secure-aggregation"`` (the training of every run, and both stages of
    ``pca:K`` runs): refuse at load time, naming the key, what the training's Skellam
    rounds cannot run."""
    from dpprecond.fl.methods import CovarianceMethod, GradientMethod, make_method

    why = f"{source}: [data] trust = 'secure-aggregation' runs the training's Skellam rounds"
    for m in methods:
        if not isinstance(make_method(m.algorithm, **m.params),
                          (GradientMethod, CovarianceMethod)):
            raise ValueError(f"{why}, which take the one-message gradient methods (fedgd, "
                             f"sofim*, adam, yogi) and the covariance methods (fedfc, "
                             f"fednew); methods.{m.label}.algorithm = {m.algorithm!r} sends "
                             "other releases (local steps). Remove it or use trust = 'local'.")
    if "inf" in epsilons:
        raise ValueError(f"{why}, a private mechanism; privacy.epsilons holds 'inf' (a "
                         "non-private run uses trust = 'local').")


def _eps(value: float | int | str) -> float | None:
    return None if isinstance(value, str) else float(value)


def parse_config(raw: dict[str, Any], base_dir: str | os.PathLike = ".",
                 source: str = "experiment file") -> ExperimentConfig:
    """Validate a TOML document (as a dict) and build an :class:`ExperimentConfig`.

    Validation is strict (:mod:`dpprecond.experiments.schema`): unknown keys, wrong types,
    empty grids and unknown method parameters raise ``ValueError`` naming the table and the
    key (with the closest valid key for a typo). ``output`` is resolved relative to
    ``base_dir`` (the folder of the file, for :func:`load_config`) unless absolute.
    """
    try:
        doc = ExperimentFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(format_errors(exc, source)) from None
    methods = []
    for label, table in doc.methods.items():
        table = dict(table)
        algorithm = table.pop("algorithm", label)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{source}: methods.{label}.algorithm = {algorithm!r} is not a "
                             f"known algorithm; expected one of {list(ALGORITHMS)}.")
        check_method_params(f"{source}: methods.{label}", algorithm, table)
        methods.append(MethodSpec(label, algorithm, table))
    labels = [m.label for m in methods]
    by_label = {m.label: m for m in methods}
    tuning = doc.tuning or TuningTable()
    for label, grid in tuning.grid.items():
        if label not in by_label:
            raise ValueError(f"{source}: tuning.grid.{label} names no method; methods: "
                             f"{labels}.")
        for key, values in grid.items():
            if not values:
                raise ValueError(f"{source}: tuning.grid.{label}.{key} is empty.")
            for value in values:
                m = by_label[label]
                check_method_params(f"{source}: tuning.grid.{label}", m.algorithm,
                                    {**m.params, key: value})
    proto = doc.protocol
    if proto.reference is None:
        reference = "sofim" if "sofim" in labels else labels[0]
    elif proto.reference in labels:
        reference = proto.reference
    else:
        raise ValueError(f"{source}: protocol.reference = {proto.reference!r} names no method; "
                         f"expected one of {labels}.")
    kernel = (doc.protocol.precision, doc.protocol.backend)
    if doc.data.features.split(":")[0] in ("pca", "random") and kernel != ("float64", "numpy"):
        raise ValueError(f"[protocol] precision={kernel[0]!r}, backend={kernel[1]!r}: runs "
                         f"on {doc.data.features!r} features go through the private-features "
                         "pipeline, which runs the float64 numpy kernel; remove them.")
    if doc.data.trust == "secure-aggregation":  # every run's training (and pca:K's PCA)
        _check_secure_sweep(source, methods, doc.privacy.epsilons)
    output = Path(doc.output if doc.output is not None else f"results/{doc.name}")
    if not output.is_absolute():
        output = Path(base_dir) / output
    report_dir = output if doc.report is None else Path(doc.report)
    if not report_dir.is_absolute():
        report_dir = Path(base_dir) / report_dir
    data, fed, priv = doc.data, doc.federation, doc.privacy
    return ExperimentConfig(
        name=doc.name, output=output, report_dir=report_dir, data=data.name,
        features=data.features, pca=_pca_settings(data), trust=data.trust,
        data_path=data.path, checkpoint=data.checkpoint, cache_dir=data.cache_dir,
        clients=tuple(fed.clients), partitions=tuple(fed.partitions), alpha=float(fed.alpha),
        epsilons=tuple(_eps(e) for e in priv.epsilons), delta=float(priv.delta),
        clip_norm=float(priv.clip_norm), accountant=priv.accountant,
        protocol=proto.kind, rounds=proto.rounds, rounds_list=tuple(proto.rounds_list),
        seeds=tuple(proto.seeds), reference=reference, precision=proto.precision,
        backend=proto.backend, methods=tuple(methods),
        validation_fraction=float(tuning.validation_fraction),
        tune_epsilons=tuple(_eps(e) for e in tuning.epsilons),
        tune_seeds=tuple(tuning.seeds),
        tune_grid={k: {p: list(v) for p, v in g.items()} for k, g in tuning.grid.items()},
        tune_mean_trials=float(tuning.mean_trials),
        tune_trials=tuning.trials if isinstance(tuning.trials, str) else float(tuning.trials),
        tune_clip_norms=tuple(float(c) for c in tuning.clip_norms or ()),
        tuned_from=doc.tuned_from, source=raw)


def load_config(path: str | os.PathLike) -> ExperimentConfig:
    """Read and validate an experiment TOML file; ``output`` is relative to its folder."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No experiment file at {path}.")
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc}).") from None
    except UnicodeDecodeError as exc:  # a binary file (an .npy, a zip...)
        raise ValueError(f"{path} is not a TOML experiment file: it is not UTF-8 text "
                         f"({exc.reason} at byte {exc.start}); give an experiment .toml "
                         "(see experiments/).") from None
    return parse_config(raw, base_dir=path.parent, source=str(path))


def run_id(spec: RunSpec) -> str:
    """A stable 16-hex-digit hash of everything that determines a run's result."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _base(cfg: ExperimentConfig) -> RunSpec:
    base = {"data": cfg.data, "features": cfg.features, "alpha": cfg.alpha,
            "delta": cfg.delta, "clip_norm": cfg.clip_norm, "accountant": cfg.accountant}
    if cfg.pca:  # private PCA features: their settings determine the run
        base["pca"] = dict(cfg.pca)
    elif cfg.trust != "local":  # fixed features: the training's trust model (pca:K: in pca)
        base["trust"] = cfg.trust
    # the kernel's settings, only when not the default (the ids of earlier runs stay)
    if cfg.precision != "float64":
        base["precision"] = cfg.precision
    if cfg.backend != "numpy":
        base["backend"] = cfg.backend
    return base


def expand_runs(cfg: ExperimentConfig, *, tuning: bool = False) -> list[RunSpec]:
    """All runs of the sweep (or of the tuning grid), seed-major.

    Seed-major order means that an interrupted sweep has covered the whole grid with the
    first seeds before it starts the later ones. Tuning runs evaluate on a validation split
    carved from the training data (``evaluation = "validation"``), never on the test set.
    """
    runs: list[RunSpec] = []
    if tuning:
        rounds = [cfg.rounds if cfg.protocol == "per-round" else max(cfg.rounds_list)]
        for seed, K, part, eps, m in itertools.product(cfg.tune_seeds, cfg.clients,
                                                       cfg.partitions, cfg.tune_epsilons,
                                                       cfg.methods):
            grid = cfg.tune_grid.get(m.label, {})
            names = sorted(grid)
            for values in itertools.product(*(grid[n] for n in names)):
                params = {**m.params, **dict(zip(names, values, strict=True))}
                runs.append({**_base(cfg), "clients": K, "partition": part, "epsilon": eps,
                             "rounds": rounds[0], "method": m.label,
                             "algorithm": m.algorithm, "params": params, "seed": seed,
                             "evaluation": "validation",
                             "validation_fraction": cfg.validation_fraction})
        return runs
    rounds_all = [cfg.rounds] if cfg.protocol == "per-round" else list(cfg.rounds_list)
    for seed, K, part, eps, T, m in itertools.product(cfg.seeds, cfg.clients, cfg.partitions,
                                                      cfg.epsilons, rounds_all, cfg.methods):
        runs.append({**_base(cfg), "clients": K, "partition": part, "epsilon": eps,
                     "rounds": T, "method": m.label, "algorithm": m.algorithm,
                     "params": dict(m.params), "seed": seed, "evaluation": "test"})
    return runs
