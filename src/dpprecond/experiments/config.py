"""Declarative experiment files (TOML) and their expansion into independent runs.

An experiment file names the data, the federation, the privacy grid, the protocol and the
methods with their hyperparameters (see ``experiments/*.toml``)::

    name = "digits"
    output = "results/digits"
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

    [methods.sofim]
    algorithm = "sofim"
    learning_rate = 0.1

    [tuning]                   # optional: `dpprecond experiment tune`
    validation_fraction = 0.1
    epsilons = [1.0]
    seeds = [0]
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
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpprecond._validation import check_choice, check_delta, check_fraction, check_positive

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

#: Server-optimizer methods of :mod:`dpprecond.fl.server` and the baselines with local state.
SERVER_ALGORITHMS = ("fedgd", "sofim", "sofim-momentum", "sofim-lagged", "adam", "yogi")
BASELINE_ALGORITHMS = ("scaffold", "fedavg", "fedfc", "fednew")
ALGORITHMS = SERVER_ALGORITHMS + BASELINE_ALGORITHMS
PROTOCOLS = ("per-round", "per-T")

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
    features: str = "pixels"
    data_path: str | None = None
    checkpoint: str | None = None
    cache_dir: str | None = None
    clients: tuple[int, ...] = (20,)
    partitions: tuple[str, ...] = ("iid",)
    alpha: float = 0.5
    epsilons: tuple[float | None, ...] = (1.0,)
    delta: float = 1e-5
    clip_norm: float = 10.0
    accountant: str = "pld"
    protocol: str = "per-round"
    rounds: int = 70
    rounds_list: tuple[int, ...] = ()
    seeds: tuple[int, ...] = (0,)
    reference: str = "sofim"
    methods: tuple[MethodSpec, ...] = ()
    validation_fraction: float = 0.1
    tune_epsilons: tuple[float | None, ...] = (1.0,)
    tune_seeds: tuple[int, ...] = (0,)
    tune_grid: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    tuned_from: str | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def method(self, label: str) -> MethodSpec:
        """The method with this label (``KeyError`` naming the known labels)."""
        for m in self.methods:
            if m.label == label:
                return m
        raise KeyError(f"No method {label!r}; known: {[m.label for m in self.methods]}")


def _epsilon(value: Any) -> float | None:
    if isinstance(value, str):
        if value.lower() in ("inf", "none", "non-private", "nonprivate"):
            return None
        raise ValueError(f"Expected an epsilon number or 'inf' (non-private), got {value!r}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected an epsilon number or 'inf', got {value!r}.")
    if math.isinf(value):
        return None
    return check_positive("epsilon", float(value))


def _ints(name: str, value: Any) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                            for v in items):
        raise ValueError(f"Expected {name} to be a non-empty list of non-negative integers, "
                         f"got {value!r}.")
    return tuple(items)


def parse_config(raw: dict[str, Any], base_dir: str | os.PathLike = ".") -> ExperimentConfig:
    """Validate a TOML document (as a dict) and build an :class:`ExperimentConfig`.

    ``output`` is resolved relative to ``base_dir`` unless absolute. Unknown top-level
    tables or method algorithms raise ``ValueError`` naming them.
    """
    known = {"name", "output", "data", "federation", "privacy", "protocol", "methods",
             "tuning", "description", "tuned_from"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"Unknown keys in the experiment file: {sorted(unknown)}; "
                         f"expected some of {sorted(known)}.")
    name = str(raw.get("name", "experiment"))
    data = raw.get("data", {})
    if "name" not in data:
        raise ValueError("The experiment file needs [data] name = 'digits' (or "
                         "'fashion-mnist', 'cifar10', 'pathmnist').")
    fed = raw.get("federation", {})
    priv = raw.get("privacy", {})
    proto = raw.get("protocol", {})
    methods_raw = raw.get("methods", {})
    if not methods_raw:
        raise ValueError("The experiment file lists no [methods.<label>] tables.")
    methods = []
    for label, table in methods_raw.items():
        table = dict(table)
        algorithm = check_choice(f"methods.{label}.algorithm", table.pop("algorithm", label),
                                 ALGORITHMS)
        methods.append(MethodSpec(label, algorithm, table))
    partitions = tuple(fed.get("partitions", ["iid"]))
    for p in partitions:
        check_choice("federation.partitions", p, ("iid", "dirichlet"))
    protocol = check_choice("protocol.kind", proto.get("kind", "per-round"), PROTOCOLS)
    rounds_list = _ints("protocol.rounds_list", proto["rounds_list"]) \
        if "rounds_list" in proto else ()
    if protocol == "per-T" and not rounds_list:
        raise ValueError("protocol.kind = 'per-T' needs protocol.rounds_list = [1, 2, ...].")
    tuning = raw.get("tuning", {})
    grid = {k: {p: list(v) for p, v in g.items()} for k, g in tuning.get("grid", {}).items()}
    labels = {m.label for m in methods}
    for k in grid:
        if k not in labels:
            raise ValueError(f"tuning.grid.{k} names no method; methods: {sorted(labels)}.")
    reference = str(proto.get("reference", "sofim"))
    if reference not in labels:
        reference = methods[0].label
    output = Path(raw.get("output", f"results/{name}"))
    if not output.is_absolute():
        output = Path(base_dir) / output
    return ExperimentConfig(
        name=name, output=output, data=str(data["name"]),
        features=str(data.get("features", "pixels")), data_path=data.get("path"),
        checkpoint=data.get("checkpoint"), cache_dir=data.get("cache_dir"),
        clients=_ints("federation.clients", fed.get("clients", [20])), partitions=partitions,
        alpha=check_positive("federation.alpha", float(fed.get("alpha", 0.5))),
        epsilons=tuple(_epsilon(e) for e in priv.get("epsilons", [1.0])),
        delta=check_delta(float(priv.get("delta", 1e-5)), "privacy.delta"),
        clip_norm=check_positive("privacy.clip_norm", float(priv.get("clip_norm", 10.0))),
        accountant=check_choice("privacy.accountant", priv.get("accountant", "pld"),
                                ("pld", "rdp")),
        protocol=protocol, rounds=_ints("protocol.rounds", proto.get("rounds", 70))[0],
        rounds_list=rounds_list, seeds=_ints("protocol.seeds", proto.get("seeds", [0])),
        reference=reference, methods=tuple(methods),
        validation_fraction=check_fraction("tuning.validation_fraction",
                                           float(tuning.get("validation_fraction", 0.1)),
                                           low_open=True),
        tune_epsilons=tuple(_epsilon(e) for e in tuning.get("epsilons", [1.0])),
        tune_seeds=_ints("tuning.seeds", tuning.get("seeds", [0])),
        tune_grid=grid,
        tuned_from=str(raw["tuned_from"]) if "tuned_from" in raw else None, source=raw)


def load_config(path: str | os.PathLike) -> ExperimentConfig:
    """Read and validate an experiment TOML file (``output`` relative to the current dir)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No experiment file at {path}.")
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    return parse_config(raw)


def run_id(spec: RunSpec) -> str:
    """A stable 16-hex-digit hash of everything that determines a run's result."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _base(cfg: ExperimentConfig) -> RunSpec:
    return {"data": cfg.data, "features": cfg.features, "alpha": cfg.alpha,
            "delta": cfg.delta, "clip_norm": cfg.clip_norm, "accountant": cfg.accountant}


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
