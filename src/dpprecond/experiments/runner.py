"""Run the independent, resumable runs of an experiment.

Each run is one :class:`~dpprecond.experiments.config.RunSpec`; its result is written to
``<output>/runs/<run_id>.json`` (history, final accuracy, noise, epsilon, wall time) and
its final test predictions to ``<output>/runs/<run_id>.npy`` (for the paired McNemar
tests), atomically (a temporary file renamed into place). A run whose JSON exists is never
redone, so an interrupted sweep resumes where it stopped.

Seeding of a run with seed ``s`` (identical for every method, so methods are paired):
``sim, part, val = SeedSequence(s).spawn(3)``; ``part`` draws the client partition,
``val`` the validation split (tuning only), ``sim`` is the root of the method's own
randomness (initialization, noise per (round, client)); the first two match
:func:`dpprecond.fl.simulator.run_federated`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dpprecond._files import atomic_write, remove_stale_temps, write_json
from dpprecond._validation import check_int
from dpprecond.experiments.config import (
    ExperimentConfig,
    RunSpec,
    expand_runs,
    run_id,
)
from dpprecond.fl.config import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.divergence import CLIMB_RATIO, DivergenceWarning
from dpprecond.fl.engine import FLResult, simulate
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition

__all__ = ["DataCache", "execute_run", "load_records", "run_experiment", "validation_split"]

logger = logging.getLogger(__name__)


class DataCache:
    """Loads each (data, features) once per process: ``(X_train, y_train, X_test, y_test, k)``."""

    def __init__(self, cfg: ExperimentConfig | None = None,
                 loader: Callable[[str], tuple[np.ndarray, ...]] | None = None) -> None:
        self.cfg = cfg
        self.loader = loader
        self._store: dict[tuple[str, str], tuple[Any, ...]] = {}

    def get(self, data: str, features: str) -> tuple[Any, ...]:
        """The arrays of ``data`` with ``features`` (loaded on first use)."""
        key = (data, features)
        if key not in self._store:
            if self.loader is not None:
                self._store[key] = tuple(self.loader(data))
            else:
                from dpprecond.features import load_features

                cfg = self.cfg
                ds, _ = load_features(data, cfg.data_path if cfg else None, features,
                                      cfg.checkpoint if cfg else None,
                                      cfg.cache_dir if cfg else None)
                self._store[key] = (ds.X_train, ds.y_train, ds.X_test, ds.y_test,
                                    ds.n_classes)
        return self._store[key]


def validation_split(y: np.ndarray, fraction: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified ``(train_idx, val_idx)`` of the *training* data (``fraction`` per class)."""
    train, val = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = max(1, round(fraction * len(idx))) if len(idx) > 1 else 0
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def _run_method(spec: RunSpec, model: LinearSoftmax, data: ClientData, X_eval: np.ndarray,
                y_eval: np.ndarray, sim_seq: np.random.SeedSequence,
                progress: bool) -> FLResult:
    level = ({"noise_multiplier": 0.0} if spec["epsilon"] is None  # "inf": non-private
             else {"target_epsilon": spec["epsilon"]})
    config = FLConfig(n_rounds=int(spec["rounds"]), clip_norm=float(spec["clip_norm"]),
                      target_delta=float(spec["delta"]), accountant=spec["accountant"],
                      precision=spec.get("precision", "float64"),
                      backend=spec.get("backend", "numpy"),
                      # the grids' protocol (the DP-FedSOFIM paper's): uniform weights and a
                      # fixed clip, not the package defaults (docs/fl_defaults.md); size
                      # weights under secure aggregation, the only weighting it runs
                      weighting=spec.get("weighting", "size" if spec.get("trust") ==
                                         "secure-aggregation" else "uniform"),
                      trust=spec.get("trust", "local"), adaptive_clip=None, **level)
    method = make_method(spec["algorithm"], **spec["params"])
    return simulate(model, data, method, config, X_test=X_eval, y_test=y_eval, seed=sim_seq,
                    progress=progress)


def _pipeline_run(spec: RunSpec, X_tr: np.ndarray, y_tr: np.ndarray, X_eval: np.ndarray,
                  y_eval: np.ndarray, n_classes: int, sim_seq: np.random.SeedSequence,
                  progress: bool) -> tuple[FLResult, np.ndarray, float, int]:
    """``pca:K`` / ``random:K`` features: :func:`dpprecond.pipeline.run_pipeline`.

    Every method of a seed gets the same partition and the same private features (their
    randomness comes from the seed only), so methods stay paired.
    """
    from dpprecond.pipeline import DEFAULT_PCA_METHOD, run_pipeline

    pca = spec.get("pca", {})
    res = run_pipeline(X_tr, y_tr, X_eval, y_eval, n_classes, features=spec["features"],
                       target_epsilon=spec["epsilon"], target_delta=float(spec["delta"]),
                       row_norm=pca.get("row_norm", float(np.sqrt(X_tr.shape[1]))),
                       pca_share=pca.get("share", 0.2),
                       pca_method=pca.get("method", DEFAULT_PCA_METHOD),
                       trust=pca.get("trust", spec.get("trust", "local")),
                       algorithm=spec["algorithm"],
                       method_options=dict(spec["params"]), n_clients=int(spec["clients"]),
                       partition=spec["partition"], alpha=float(spec["alpha"]),
                       n_rounds=int(spec["rounds"]), clip_norm=float(spec["clip_norm"]),
                       accountant=spec["accountant"], seed=sim_seq, progress=progress,
                       # the grids' protocol, as in _fl_run (size under secure aggregation,
                       # the only weighting it runs)
                       weighting=spec.get("weighting", "size" if pca.get(
                           "trust", spec.get("trust")) == "secure-aggregation" else "uniform"),
                       adaptive_clip=None)
    releases = res.ledger.n_releases if res.ledger is not None else res.fl.n_releases
    if res.test_features is None:  # pragma: no cover - run_pipeline always sets them
        raise RuntimeError("run_pipeline returned no test features")
    return res.fl, res.test_features, res.epsilon, releases


def execute_run(spec: RunSpec, cache: DataCache, *,
                progress: bool = False) -> tuple[dict[str, Any], np.ndarray]:
    """Run one spec; return its record and the final predictions on its evaluation set."""
    pipeline = spec["features"].split(":")[0] in ("pca", "random")
    base = "pixels" if pipeline else spec["features"]
    X_tr, y_tr, X_te, y_te, n_classes = cache.get(spec["data"], base)
    sim_seq, part_seq, val_seq = np.random.SeedSequence(int(spec["seed"])).spawn(3)
    if spec.get("evaluation", "test") == "validation":
        tr, va = validation_split(y_tr, float(spec["validation_fraction"]),
                                  np.random.default_rng(val_seq))
        X_tr, y_tr, X_eval, y_eval = X_tr[tr], y_tr[tr], X_tr[va], y_tr[va]
    else:
        X_eval, y_eval = X_te, y_te
    start = time.perf_counter()
    if pipeline:
        result, X_eval, eps, releases = _pipeline_run(spec, X_tr, y_tr, X_eval, y_eval,
                                                      n_classes, sim_seq, progress)
    else:
        parts = make_partition(y_tr, int(spec["clients"]), spec["partition"],
                               float(spec["alpha"]), np.random.default_rng(part_seq))
        data = ClientData.from_partition(X_tr, y_tr, parts, n_classes)
        result = _run_method(spec, LinearSoftmax(X_tr.shape[1], n_classes), data, X_eval,
                             y_eval, sim_seq, progress)
        eps, releases = result.epsilon, result.n_releases
    seconds = time.perf_counter() - start
    model = LinearSoftmax(X_eval.shape[1], n_classes)
    pred = np.argmax(model.logits(result.params, X_eval), axis=1).astype(np.int16)
    record = {"id": run_id(spec), "spec": spec,
              "final_accuracy": result.final_accuracy,
              "accuracy": [h["test_accuracy"] for h in result.history],
              "noise_multiplier": result.noise_multiplier,
              "epsilon_spent": None if math.isinf(eps) else eps,
              "n_releases": releases,
              "seconds": seconds}
    return record, pred


def _save_run(runs_dir: Path, record: dict[str, Any], pred: np.ndarray) -> None:
    """Write the predictions, then the JSON (whose existence marks the run as finished).

    Both writes are atomic (:func:`dpprecond._files.atomic_write`): a killed sweep leaves
    finished runs or nothing, and a full disk is a clear error naming the file.
    """
    rid = record["id"]
    atomic_write(runs_dir / f"{rid}.npy", lambda fh: np.save(fh, pred))
    write_json(runs_dir / f"{rid}.json", record, indent=None)


_WORKER_CACHE: DataCache | None = None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a killed sweep's workers
    would otherwise keep running, or block on a queue nobody reads). No-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except OSError:  # pragma: no cover - no libc: the workers stay as before
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")


def _init_worker(cache: DataCache, parent: int) -> None:
    """Worker process set-up: die with the parent, the shared data cache, one BLAS thread."""
    global _WORKER_CACHE
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    _WORKER_CACHE = cache
    from threadpoolctl import threadpool_limits

    # the processes are the parallelism for BLAS; the linear head's kernel keeps its pool
    # of threads: with 2 workers on 2 cores one worker's serial parts (evaluation, noise,
    # server step) leave a core to the other's pool (issue 22: one kernel thread per
    # worker was 1.6x slower on a busy machine, within 5% on a quiet one; docs/performance.md)
    threadpool_limits(limits=1)


#: The logger of the per-run notice "noise_multiplier=0: a non-private run"; a sweep says
#: it once for all its non-private runs instead.
_NON_PRIVATE_LOGGER = "dpprecond.fl.accounting"


@contextlib.contextmanager
def _per_run_notices_off() -> Iterator[None]:
    """Silence the per-run non-private notice (the sweep has said it once)."""
    quiet = logging.getLogger(_NON_PRIVATE_LOGGER)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def _execute_counted(spec: RunSpec, cache: DataCache,
                     progress: bool) -> tuple[dict[str, Any], np.ndarray, bool]:
    """:func:`execute_run`, with the run's :class:`DivergenceWarning` counted (a sweep
    reports how many runs climbed once) instead of shown; other warnings pass."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DivergenceWarning)
        record, pred = execute_run(spec, cache, progress=progress)
    climbed = False
    for w in caught:
        if issubclass(w.category, DivergenceWarning):
            climbed = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return record, pred, climbed


def _execute_and_save(spec: RunSpec, runs_dir: Path) -> tuple[dict[str, Any], bool]:
    assert _WORKER_CACHE is not None
    with _per_run_notices_off():
        record, pred, climbed = _execute_counted(spec, _WORKER_CACHE, progress=False)
    _save_run(runs_dir, record, pred)
    return record, climbed


def _run_label(spec: RunSpec) -> str:
    eps = "inf" if spec["epsilon"] is None else f"{spec['epsilon']:g}"
    return (f"{spec['method']} K={spec['clients']} {spec['partition']} eps={eps} "
            f"seed={spec['seed']}")


def run_experiment(cfg: ExperimentConfig, *, tuning: bool = False, progress: bool = True,
                   max_runs: int | None = None, cache: DataCache | None = None,
                   on_record: Callable[[dict[str, Any]], None] | None = None,
                   where: dict[str, Any] | None = None, jobs: int = 1) -> int:
    """Run every missing run of ``cfg`` (or of its tuning grid); return how many ran.

    Finished runs (their JSON exists under ``<output>/runs``) are skipped; ``max_runs``
    stops after that many new runs; ``where`` (e.g. ``{"clients": 20, "seed": 0}``) runs
    only the matching part of the grid first (the run ids are those of the full grid, so
    the rest can follow later). ``jobs > 1`` runs that many runs at a time in worker
    processes with one BLAS thread each (the data is loaded once, before the workers
    start); a run's result is the one a single process with one BLAS thread gives
    (``OPENBLAS_NUM_THREADS=1``; a multi-threaded BLAS may sum in another order and differ
    in the last bits). Progress: one bar over the sweep,
    and with ``jobs == 1`` one over the rounds of the current run.
    """
    jobs = check_int("jobs", jobs, low=1)
    runs_dir = Path(cfg.output) / ("tuning" if tuning else "runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    stale = remove_stale_temps(runs_dir)
    if stale:
        logger.info("Removed %d temporary files left by an interrupted sweep.", stale)
    specs = [s for s in expand_runs(cfg, tuning=tuning)
             if all(s.get(k) == v for k, v in (where or {}).items())]
    todo = [s for s in specs if not (runs_dir / f"{run_id(s)}.json").exists()]
    logger.info("%s: %d runs, %d already done", cfg.name, len(specs), len(specs) - len(todo))
    # a bar on a terminal; elsewhere (a log file, a pipe) one plain line per run: tqdm's
    # redraws, and its cursor moves between nested bars, are junk in a file
    interactive = progress and sys.stderr.isatty()
    kind = "tuning" if tuning else "sweep"
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), disable=not interactive,
               desc=f"{cfg.name} {kind}", unit="run")
    if max_runs is not None:
        todo = todo[:max_runs]
    cache = cache or DataCache(cfg)
    non_private = sum(1 for s in todo if s["epsilon"] is None)
    if non_private:  # once for the sweep, not once per run
        logger.warning("%s: %d of the %d runs to do are non-private (epsilon inf, "
                       "noise_multiplier=0): reference runs with no privacy guarantee.",
                       cfg.name, non_private, len(todo))
    done = len(specs) - len(todo)
    climbed: list[str] = []

    def finished(record: dict[str, Any], climb: bool) -> None:
        nonlocal done
        done += 1
        if climb:
            climbed.append(_run_label(record["spec"]))
        if on_record is not None:
            on_record(record)
        bar.update(1)
        if progress and not interactive:
            print(f"{cfg.name} {kind}: run {done} of {len(specs)} done "
                  f"({_run_label(record['spec'])}): accuracy "
                  f"{record['final_accuracy']:.4f}, {record['seconds']:.1f} s",
                  file=sys.stderr, flush=True)

    with _per_run_notices_off():
        if jobs > 1 and len(todo) > 1:
            for key in dict.fromkeys((s["data"], s["features"]) for s in todo):
                feats = "pixels" if key[1].split(":")[0] in ("pca", "random") else key[1]
                cache.get(key[0], feats)  # load once in the parent; forked workers share it
            pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)),
                                       initializer=_init_worker,
                                       initargs=(cache, os.getpid()))
            try:
                futures = [pool.submit(_execute_and_save, spec, runs_dir) for spec in todo]
                for future in as_completed(futures):
                    finished(*future.result())
            finally:  # on an error or Ctrl-C: drop the queued runs, do not wait for them
                pool.shutdown(wait=True, cancel_futures=True)
        else:
            for spec in todo:
                bar.set_postfix_str(_run_label(spec))
                record, pred, climb = _execute_counted(spec, cache, progress=interactive)
                _save_run(runs_dir, record, pred)
                finished(record, climb)
    bar.close()
    if climbed:
        logger.warning("%s: the test loss climbed (to >= %g x its lowest) in %d of the %d "
                       "runs, e.g. %s: their noise or step size dominates; the report's "
                       "accuracy tables show what they reached.", cfg.name, CLIMB_RATIO,
                       len(climbed), len(todo), "; ".join(climbed[:3]))
    return len(todo)


def load_records(cfg: ExperimentConfig, *, tuning: bool = False,
                 with_predictions: bool = False) -> list[dict[str, Any]]:
    """The records of the finished runs of ``cfg`` (only runs of its current grid)."""
    runs_dir = Path(cfg.output) / ("tuning" if tuning else "runs")
    out = []
    for spec in expand_runs(cfg, tuning=tuning):
        path = runs_dir / f"{run_id(spec)}.json"
        if path.exists():
            rec = json.loads(path.read_text(encoding="utf-8"))
            if with_predictions:
                rec["predictions"] = np.load(path.with_suffix(".npy"))
            out.append(rec)
    return out
