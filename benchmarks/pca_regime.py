"""Regime map of private top-k PCA (spec: pca.md, "What must be measured", item 1).

For the synthetic families 1 (i.i.d. spiked covariance) and 2 (spike carried by a fraction
f of the rows), over n, d, epsilon and seeds, measures the spectral sin-theta to the exact
top-k subspace of:

- ``analyze_gauss``: Analyze Gauss;
- ``power``: the DP power method (row model, random start, T = 10);
- ``fixed``: Algorithms 1-2 at the default fixed (R, T) of ``fit_private_pca``;
- ``oracle``: Algorithms 1-2 at the best (R, T) of the grid, chosen with the *true* error
  (non-private; shows what private selection could reach);
- ``select``: the full private method with private selection;
- ``auto``: the library's default (``docs/pca_auto.md``).

``--fill`` adds the methods missing from records already in ``--out`` (the same matrices,
regenerated from their seeds), e.g. ``auto`` to a map measured before it existed.

Results are appended as JSON lines to ``--out`` (one line per cell, seed and epsilon); a
rerun skips what is already there, so an interrupted run resumes. ``pca_regime_report.py``
turns the file into the tables and figures of ``docs/pca_regime.md``.

Examples
--------
Quick look (minutes)::

    .venv/bin/python benchmarks/pca_regime.py --n 20000 --d 100 400 --seeds 2

The spec's grid (long; run in the background)::

    .venv/bin/python benchmarks/pca_regime.py --n 20000 100000 --d 100 400 1500 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT_DIR, environment
from dpprecond.data.synthetic import coherent_spiked
from dpprecond.pca import fit_private_pca
from dpprecond.pca.budget import plan_fixed
from dpprecond.pca.core import (
    TrialSpec,
    clip_grid,
    private_init,
    run_trials,
)
from dpprecond.pca.metrics import describe, sin_theta
from dpprecond.pca.rows import DenseRows

ORACLE_ITERS = (1, 2, 4, 8, 16, 32)
#: Appended, never reordered: a method's seed is derived from its index.
METHODS = ("analyze_gauss", "power", "fixed", "select", "auto")


def oracle(A: np.ndarray, S: np.ndarray, V: np.ndarray, k: int, eps: float, delta: float,
           rng: np.random.Generator) -> tuple[float, float, int]:
    """Best sin-theta over the (R, T) grid (T = 0 is Analyze Gauss), chosen non-privately."""
    n = A.shape[0]
    rows = DenseRows(A)
    # The private grid extended by two smaller radii, to see whether its lower end binds.
    grid = clip_grid(n, k)
    radii = np.concatenate([grid[0] / np.array([4.0, 2.0]), grid])
    best = (math.inf, math.nan, 0)
    streams = rng.spawn(len(ORACLE_ITERS))
    for T, stream in zip(ORACLE_ITERS, streams, strict=True):
        z = plan_fixed(eps, delta, n_iter=T, accountant="rdp").noise_multipliers
        init_rng, *trial_rngs = stream.spawn(1 + len(radii))
        init = private_init(S, k, z["z0"], init_rng)
        specs = [TrialSpec(float(R), T, z["zH"], z["zZ"], r)
                 for R, r in zip(radii, trial_rngs, strict=True)]
        Xs, _ = run_trials(rows, S, init.X0, specs)
        for X, spec in zip(Xs, specs, strict=True):
            err = sin_theta(X, V)
            if err < best[0]:
                best = (err, spec.clip_radius, T)
    return best


def fit_method(A: np.ndarray, V: np.ndarray, k: int, eps: float, delta: float, seed: int,
               method: str, rec: dict) -> None:
    """Fit one method on the cell's matrix and store its sin-theta, epsilon and time."""
    t1 = time.perf_counter()
    res = fit_private_pca(A, k, method=method, target_epsilon=eps, target_delta=delta,
                          row_norm=1.0,
                          seed=np.random.SeedSequence([seed, int(eps * 1000),
                                                       METHODS.index(method)]))
    rec["seconds"][method] = time.perf_counter() - t1
    rec["sin_theta"][method] = sin_theta(res.basis, V)
    rec["epsilon_spent"][method] = res.epsilon
    if method == "select":
        rec["select_R"] = res.info.get("clip_radius")
        rec["select_T"] = res.info.get("n_iter")
        rec["select_early_exit"] = res.info.get("early_exit")
    if method == "auto":
        rec["auto_branch"] = res.info.get("branch")


def fill(out_path: Path) -> None:
    """Add the methods of :data:`METHODS` missing from the records of ``out_path``."""
    records = [json.loads(line) for line in out_path.read_text().splitlines() if line]
    by_matrix: dict[tuple, list[dict]] = {}
    for r in records:
        key = (r["family"], r["n"], r["d"], r["k"], r["theta"], r["fraction"], r["seed"])
        by_matrix.setdefault(key, []).append(r)
    for (family, n, d, k, theta, fraction, seed), recs in by_matrix.items():
        missing = [m for m in METHODS if any(m not in r["sin_theta"] for r in recs)]
        if not missing:
            continue
        rng = np.random.default_rng([family, n, d, k, seed, int(1e6 * fraction)])
        A = coherent_spiked(n, d, k, theta / fraction, fraction, rng)
        _w, U = np.linalg.eigh(A.T @ A)
        V = U[:, ::-1][:, :k]
        for r in recs:
            for m in missing:
                if m not in r["sin_theta"]:
                    fit_method(A, V, k, r["epsilon"], r["delta"], seed, m, r)
            print(f"f{family} n={n} d={d} frac={fraction:g} eps={r['epsilon']:g} seed={seed}: "
                  + " ".join(f"{m}={r['sin_theta'][m]:.3f}" for m in missing), flush=True)
        out_path.write_text("".join(json.dumps(x) + "\n" for x in records))


def run_cell(family: int, n: int, d: int, k: int, theta: float, fraction: float,
             epsilons: list[float], delta: float, seed: int, done: set[str],
             out_path: Path) -> None:
    keys = {eps: f"{family}|{n}|{d}|{k}|{theta}|{fraction}|{eps}|{seed}" for eps in epsilons}
    todo = [eps for eps in epsilons if keys[eps] not in done]
    if not todo:
        return
    rng = np.random.default_rng([family, n, d, k, seed, int(1e6 * fraction)])
    # Family 2 keeps the total spike energy of family 1: the f n spiked rows get theta / f,
    # so coherence rises as f falls while the eigengap stays comparable.
    A = coherent_spiked(n, d, k, theta / fraction, fraction, rng)
    desc = describe(A, k)
    S = A.T @ A
    _w, U = np.linalg.eigh(S)
    V = U[:, ::-1][:, :k]
    for eps in todo:
        t0 = time.perf_counter()
        rec = {"key": keys[eps], "family": family, "n": n, "d": d, "k": k, "theta": theta,
               "fraction": fraction, "epsilon": eps, "delta": delta, "seed": seed, **desc,
               "sin_theta": {}, "epsilon_spent": {}, "seconds": {}}
        for method in METHODS:
            fit_method(A, V, k, eps, delta, seed, method, rec)
        t1 = time.perf_counter()
        err, R, T = oracle(A, S, V, k, eps, delta,
                           np.random.default_rng([seed, int(eps * 1000), 99]))
        rec["seconds"]["oracle"] = time.perf_counter() - t1
        rec["sin_theta"]["oracle"] = err
        rec["oracle_R"], rec["oracle_T"] = R, T
        rec["total_seconds"] = time.perf_counter() - t0
        with open(out_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        st = rec["sin_theta"]
        print(f"f{family} n={n} d={d} frac={fraction:g} eps={eps:g} seed={seed}: "
              + " ".join(f"{m}={st[m]:.3f}" for m in (*METHODS, "oracle"))
              + f" (R*={R:.3g}, T*={T}; select R={rec['select_R']}, T={rec['select_T']}) "
              f"[{rec['total_seconds']:.1f}s]", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[20000, 100000])
    p.add_argument("--d", type=int, nargs="+", default=[100, 400, 1500])
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--theta", type=float, default=9.0)
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.01],
                   help="f: 1 is family 1; f < 1 is family 2 (spike theta / f on f n rows)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", type=Path, default=OUT_DIR / "pca_regime.jsonl")
    p.add_argument("--fill", action="store_true",
                   help="add the methods missing from the records already in --out")
    args = p.parse_args()
    if args.fill:
        fill(args.out)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.exists():
        done = {json.loads(line)["key"] for line in args.out.read_text().splitlines() if line}
    print(f"# {environment()}", flush=True)
    t0 = time.perf_counter()
    for n in sorted(args.n):
        for d in sorted(args.d):
            for fraction in args.fractions:
                family = 1 if fraction >= 1 else 2
                for seed in range(args.seeds):
                    run_cell(family, n, d, args.k, args.theta, fraction, args.eps, args.delta,
                             seed, done, args.out)
    print(f"# total {time.perf_counter() - t0:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
