"""How cost grows: PCA fit time in n and d, a federated round in n and K, runner throughput.

Issue 13 ("How cost grows"): the cost curves a user needs to plan with, each against a
floor measured in the same run (interleaved with it: A, B, A, B, ...):

- ``pca-n``: default private PCA fit (:func:`dpprecond.pca.fit_private_pca`, k = 10,
  eps = 1, delta = 1e-6, uncentered and ``center="private"``) for n in {1e4, 1e5, 1e6},
  d = 784; floors: one Gram product ``X.T @ X`` and one read ``X @ v``;
- ``pca-d``: the same for d in {100, 400, 1000, 2000}, n = 1e5;
- ``fl``: one round of :func:`dpprecond.fl.run_federated` (default algorithm, full-batch,
  eps = 1, float64) for n in {6e4, 6e5} and K in {20, 100, 1000}; floor: one read of X
  (``X @ v``), timed after every round in the run's callback;
- ``runner``: ``dpprecond experiment run CONFIG --jobs 2`` on a small digits config
  written to a temporary directory, in runs per minute, interleaved with ``--jobs 1``.

PCA data are synthetic, low rank plus noise, generated block by block in place
(``x = G diag(s) V^T + e``, k = 10 spikes, G bounded, ``e ~ N(0, I_d)``; n = 1e6 x 784
float64 is 6.3 GB); the public row bound comes from the generator's parameters, not the
data (:func:`low_rank_plus_noise`), and no row reaches it. Federated data are
Fashion-MNIST pixels ``(x - 0.5) / 0.5``, replicated to n rows with a small perturbation
(``N(0, 0.05^2)``, clipped to [-1, 1]) for the copies after the first.

Each ``run`` writes its parts into ``benchmarks/out/<name>.json`` (existing parts are kept);
``report`` reads it and draws ``docs/figures/perf_*.png`` (matplotlib, Agg) and prints (or
writes with ``--md``) the tables.

    # smoke test (tiny sizes, seconds)
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/cost_growth.py run --quick
    PYTHONPATH=src python benchmarks/cost_growth.py report --quick   # figures: benchmarks/out
    # the measurement (quiet machine; about 20 GB free memory for n = 1e6 and n = 6e5)
    PYTHONPATH=src python benchmarks/cost_growth.py run --repeats 3
    PYTHONPATH=src python benchmarks/cost_growth.py report --md docs/perf_cost_growth.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    OUT_DIR,
    check_load,
    environment,
    interleaved,
    markdown_table,
    md_write,
    print_header,
    summary,
    was_disturbed,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
PARTS = ("pca-n", "pca-d", "fl", "runner")

FULL = {"pca_n": [10_000, 100_000, 1_000_000], "pca_n_d": 784,
        "pca_d": [100, 400, 1000, 2000], "pca_d_n": 100_000,
        "fl_n": [60_000, 600_000], "fl_k": [20, 100, 1000], "fl_rounds": 5,
        "runner": {"rounds": 70, "seeds": [0, 1, 2], "epsilons": [1, 2], "clients": [20, 100]}}
QUICK = {"pca_n": [2_000, 5_000], "pca_n_d": 100,
         "pca_d": [50, 100], "pca_d_n": 5_000,
         "fl_n": [3_000, 6_000], "fl_k": [20, 100], "fl_rounds": 2,
         "runner": {"rounds": 3, "seeds": [0], "epsilons": [1], "clients": [20]}}


# -- data ---------------------------------------------------------------------------------


def low_rank_plus_noise(n: int, d: int, k: int = 10, seed: int = 0,
                        block_rows: int = 65_536) -> tuple[np.ndarray, float]:
    """``x = G diag(s) V^T + e`` filled in place block by block; returns (X, row bound).

    ``s_j = sqrt(d) (k - j) / k`` (strong, decaying spikes), ``G`` uniform on
    ``[-sqrt(3), sqrt(3)]`` (unit variance, bounded), ``e`` standard normal. The row bound
    ``sqrt(3 sum s^2) + sqrt(d) + 6`` follows from these parameters (triangle inequality;
    ``||e||`` exceeds ``sqrt(d) + 6`` with probability below ``e^-18`` per row), so rows are
    essentially never clipped: the common case of data under a public bound.
    """
    rng = np.random.default_rng(seed)
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    s = math.sqrt(d) * np.arange(k, 0, -1) / k
    B = (s[:, None] * V.T)  # k x d
    X = np.empty((n, d))
    for lo in range(0, n, block_rows):
        hi = min(n, lo + block_rows)
        rng.standard_normal(out=X[lo:hi])
        X[lo:hi] += rng.uniform(-math.sqrt(3.0), math.sqrt(3.0), size=(hi - lo, k)) @ B
    return X, math.sqrt(3.0 * float(s @ s)) + math.sqrt(d) + 6.0


def replicated_pixels(n: int, test_rows: int | None) -> tuple[Any, ...]:
    """Fashion-MNIST pixels replicated (and perturbed after the first copy) to n rows."""
    from dpprecond.features import load_features

    ds, _ = load_features("fashion-mnist")
    X0, y0 = ds.X_train, ds.y_train
    n0 = X0.shape[0]
    X = np.empty((n, X0.shape[1]))
    y = np.empty(n, dtype=y0.dtype)
    rng = np.random.default_rng(0)
    for lo in range(0, n, n0):
        hi = min(n, lo + n0)
        X[lo:hi] = X0[:hi - lo]
        y[lo:hi] = y0[:hi - lo]
        if lo > 0:
            X[lo:hi] += rng.normal(0.0, 0.05, size=(hi - lo, X.shape[1]))
            np.clip(X[lo:hi], -1.0, 1.0, out=X[lo:hi])
    Xte, yte = ds.X_test, ds.y_test
    if test_rows is not None:
        Xte, yte = Xte[:test_rows], yte[:test_rows]
    return X, y, Xte, yte, ds.n_classes


# -- parts --------------------------------------------------------------------------------


def pca_point(n: int, d: int, repeats: int) -> dict[str, Any]:
    """Default fit (uncentered, centered) and the floors on one synthetic matrix."""
    from dpprecond.pca import fit_private_pca

    t0 = time.perf_counter()
    X, row_norm = low_rank_plus_noise(n, d)
    gen = time.perf_counter() - t0
    v = np.random.default_rng(1).standard_normal(d)
    seeds = iter(range(10_000))

    def fit(center: str | None) -> Callable[[], Any]:
        return lambda: fit_private_pca(X, 10, target_epsilon=1.0, target_delta=1e-6,
                                       row_norm=row_norm, center=center, seed=next(seeds))

    cases = {"fit": fit(None), "fit centered": fit("private"),
             "floor Gram X.T @ X": lambda: X.T @ X, "floor read X @ v": lambda: X @ v}
    times = interleaved(cases, repeats, warmup=1)
    stats = {name: summary(t) for name, t in times.items()}
    med = {name: s["median"] for name, s in stats.items()}
    out = {"n": n, "d": d, "bytes": X.nbytes, "generate_seconds": gen, "stats": stats,
           "ratios": {"fit/gram": med["fit"] / med["floor Gram X.T @ X"],
                      "fit centered/gram": med["fit centered"] / med["floor Gram X.T @ X"],
                      "fit/read": med["fit"] / med["floor read X @ v"]}}
    print(f"# pca n={n} d={d}: fit {med['fit']:.3f} s, centered {med['fit centered']:.3f} s, "
          f"Gram {med['floor Gram X.T @ X']:.3f} s, read {med['floor read X @ v']:.4f} s",
          flush=True)
    return out


def fl_point(data: tuple[Any, ...], K: int, rounds: int) -> dict[str, Any]:
    """One run of ``rounds + 1`` rounds; the read floor timed after every round."""
    from dpprecond.fl import DEFAULT_ALGORITHM, FLConfig, run_federated

    X, y, Xte, yte, n_classes = data
    v = np.random.default_rng(1).standard_normal(X.shape[1])
    reads: list[float] = []

    def after_round(record: dict[str, float]) -> None:
        t0 = time.perf_counter()
        X @ v
        reads.append(time.perf_counter() - t0)

    res = run_federated(X, y, Xte, yte, n_classes, n_clients=K, seed=0,
                        config=FLConfig(n_rounds=rounds + 1, target_epsilon=1.0),
                        callback=after_round)
    rnd = summary([h["seconds"] for h in res.history[1:]])
    read = summary(reads[1:])
    out = {"n": X.shape[0], "d": X.shape[1], "K": K, "algorithm": DEFAULT_ALGORITHM,
           "round": rnd, "read": read, "ratio": rnd["median"] / read["median"]}
    print(f"# fl n={X.shape[0]} K={K}: round {rnd['median']:.4f} s, read "
          f"{read['median']:.4f} s, {out['ratio']:.2f}x", flush=True)
    return out


RUNNER_TOML = """\
name = "perf-runner"
output = "{output}"
description = "runner throughput benchmark (benchmarks/cost_growth.py)"

[data]
name = "digits"
features = "pixels"

[federation]
clients = {clients}
partitions = ["iid"]

[privacy]
epsilons = {epsilons}
delta = 1e-5
clip_norm = 10.0

[protocol]
kind = "per-round"
rounds = {rounds}
seeds = {seeds}
reference = "fedgd"

[methods.fedgd]
algorithm = "fedgd"
learning_rate = 0.1

[methods.default]
algorithm = "{default}"
"""


def runner_point(settings: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Runs per minute of ``dpprecond experiment run --jobs 2`` (and ``--jobs 1``)."""
    from dpprecond.fl import DEFAULT_ALGORITHM

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    results: dict[str, list[dict[str, float]]] = {"jobs 2": [], "jobs 1": []}
    with tempfile.TemporaryDirectory(prefix="perf-runner-") as tmp:
        for rep in range(repeats):
            for label, jobs in (("jobs 2", 2), ("jobs 1", 1)):  # interleaved
                out_dir = Path(tmp) / f"out-{label.replace(' ', '')}-{rep}"
                cfg = Path(tmp) / f"runner-{label.replace(' ', '')}-{rep}.toml"
                cfg.write_text(RUNNER_TOML.format(
                    output=out_dir.as_posix(), default=DEFAULT_ALGORITHM,
                    **{k: json.dumps(v) for k, v in settings.items()}), encoding="utf-8")
                cmd = [sys.executable, "-m", "dpprecond.cli", "experiment", "run", str(cfg),
                       "--jobs", str(jobs), "--no-progress"]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      check=False)
                wall = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
                runs = sorted((out_dir / "runs").glob("*.json"))
                in_run = sum(json.loads(p.read_text())["seconds"] for p in runs)
                results[label].append({"wall": wall, "runs": len(runs),
                                       "runs_per_minute": 60.0 * len(runs) / wall,
                                       "sum_run_seconds": in_run})
    out: dict[str, Any] = {"settings": settings, "default_algorithm": DEFAULT_ALGORITHM,
                           "methods": ["fedgd", DEFAULT_ALGORITHM], "raw": results}
    for label, recs in results.items():
        out[label] = summary([r["runs_per_minute"] for r in recs])
    out["speedup_jobs2_over_jobs1"] = out["jobs 2"]["median"] / out["jobs 1"]["median"]
    print(f"# runner: {out['jobs 2']['median']:.1f} runs/min with --jobs 2, "
          f"{out['jobs 1']['median']:.1f} with --jobs 1", flush=True)
    return out


# -- run and report -----------------------------------------------------------------------


def json_path(name: str) -> Path:
    return OUT_DIR / f"{name}.json"


def run(args: argparse.Namespace) -> None:
    sizes = QUICK if args.quick else FULL
    header = print_header("cost_growth: how the cost grows (PCA in n and d, FL round in n "
                          "and K, runner)")
    path = json_path(args.name)
    payload = json.loads(path.read_text()) if path.exists() else {}
    payload.setdefault("meta", {})
    for part in args.parts:
        t0 = time.perf_counter()
        load_before = check_load(f"before {part}")
        if part == "pca-n":
            payload["pca_n"] = [pca_point(n, sizes["pca_n_d"], args.repeats)
                                for n in sizes["pca_n"]]
        elif part == "pca-d":
            payload["pca_d"] = [pca_point(sizes["pca_d_n"], d, args.repeats)
                                for d in sizes["pca_d"]]
        elif part == "fl":
            points = []
            for n in sizes["fl_n"]:
                data = replicated_pixels(n, 500 if args.quick else None)
                points += [fl_point(data, K, sizes["fl_rounds"]) for K in sizes["fl_k"]]
                del data
            payload["fl"] = points
        elif part == "runner":
            payload["runner"] = runner_point(sizes["runner"], args.repeats)
        payload["meta"][part] = {**header, "load_before": load_before,
                                 "load_after": check_load(f"after {part}"),
                                 "seconds": time.perf_counter() - t0,
                                 "command": " ".join(sys.argv), "quick": args.quick,
                                 "repeats": args.repeats}
    write_json(args.name, payload)


def _plot_pca(points: list[dict[str, Any]], key: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p[key] for p in points]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for case, style in (("fit", "o-"), ("fit centered", "s-"),
                        ("floor Gram X.T @ X", "k--"), ("floor read X @ v", "k:")):
        ax.plot(xs, [p["stats"][case]["median"] for p in points], style, label=case)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel("seconds (median)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    for r, style in (("fit/gram", "o-"), ("fit centered/gram", "s-")):
        ax2.plot(xs, [p["ratios"][r] for p in points], style, label=r)
    ax2.axhline(1.0, color="k", lw=0.5)
    ax2.set_xscale("log")
    ax2.set_xlabel(key)
    ax2.set_ylabel("fit time / Gram floor")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"# wrote {path}", flush=True)


def _plot_fl(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ns = sorted({p["n"] for p in points})
    for K in sorted({p["K"] for p in points}):
        pts = sorted((p for p in points if p["K"] == K), key=lambda p: p["n"])
        ax.plot([p["n"] for p in pts], [p["round"]["median"] for p in pts], "o-",
                label=f"round, K={K}")
        ax2.plot([p["n"] for p in pts], [p["ratio"] for p in pts], "o-", label=f"K={K}")
    reads = [min(p["read"]["median"] for p in points if p["n"] == n) for n in ns]
    ax.plot(ns, reads, "k:", label="floor: read X @ v")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel("seconds per round (median)")
    ax.set_title("Federated round (default algorithm, float64)")
    ax.legend(fontsize=8)
    ax2.axhline(2.0, color="r", lw=0.8, ls="--", label="target 2x")
    ax2.set_xscale("log")
    ax2.set_xlabel("n")
    ax2.set_ylabel("round / one read of X")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"# wrote {path}", flush=True)


def report(args: argparse.Namespace) -> None:
    path = json_path(args.name)
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `cost_growth.py run` first.")
    payload = json.loads(path.read_text())
    fig_dir = args.figures or (OUT_DIR / "figures" if args.quick else FIGURES)
    suffix = "_quick" if args.quick else ""
    parts = []
    for key, axis in (("pca_n", "n"), ("pca_d", "d")):
        pts = payload.get(key)
        if not pts:
            continue
        _plot_pca(pts, axis, fig_dir / f"perf_{key}{suffix}.png",
                  f"Default private PCA fit, k=10 ({'d' if axis == 'n' else 'n'} = "
                  f"{pts[0]['d' if axis == 'n' else 'n']})")
        parts.append(markdown_table(
            ["n", "d", "fit s", "fit centered s", "Gram X.T@X s", "read X@v s", "fit / Gram",
             "centered / Gram"],
            [[p["n"], p["d"], p["stats"]["fit"]["median"],
              p["stats"]["fit centered"]["median"], p["stats"]["floor Gram X.T @ X"]["median"],
              p["stats"]["floor read X @ v"]["median"], p["ratios"]["fit/gram"],
              p["ratios"]["fit centered/gram"]] for p in pts]))
    if payload.get("fl"):
        _plot_fl(payload["fl"], fig_dir / f"perf_fl_round{suffix}.png")
        parts.append(markdown_table(
            ["n", "K", "round s", "read X@v s", "round / read"],
            [[p["n"], p["K"], p["round"]["median"], p["read"]["median"], p["ratio"]]
             for p in payload["fl"]]))
    if payload.get("runner"):
        r = payload["runner"]
        parts.append(markdown_table(
            ["runner", "runs per minute (median)", "runs per sweep",
             "sum of in-run seconds / wall", "settings"],
            [[label, r[label]["median"], r["raw"][label][0]["runs"],
              float(np.median([x["sum_run_seconds"] / x["wall"] for x in r["raw"][label]])),
              json.dumps(r["settings"]) if label == "jobs 2" else "same"]
             for label in ("jobs 2", "jobs 1")]))
    envs = sorted({m["environment"]["line"] for m in payload.get("meta", {}).values()})
    def fmt(load: list[float] | None) -> str:
        return "unknown" if load is None else "/".join(f"{x:.2f}" for x in load)

    loads = "; ".join(f"{part}: {fmt(m['load_before'].get('load'))} -> "
                      f"{fmt(m['load_after'].get('load'))}"
                      + (" DISTURBED" if was_disturbed(m["load_before"], m["load_after"])
                         else "")
                      for part, m in payload.get("meta", {}).items())
    text = ("\n\n".join(parts) + f"\n\nEnvironment: {'; '.join(envs) or environment()}\n"
            f"Load (1/5/15 min) before and after each part: {loads}\n")
    print(text)
    if args.md:
        md_write(args.md, "# How cost grows\n\nCommands: `PYTHONPATH=src python "
                 f"benchmarks/cost_growth.py run`, then `... report`.\n\n{text}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure (writes benchmarks/out/<name>.json)")
    r.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    r.add_argument("--name", default=None, help="JSON name (default cost_growth[_quick])")
    s = sub.add_parser("report", help="plots (docs/figures/perf_*.png) and tables")
    s.add_argument("--quick", action="store_true", help="read the quick run's JSON; "
                   "figures go to benchmarks/out/figures with a _quick suffix")
    s.add_argument("--name", default=None)
    s.add_argument("--figures", type=Path, default=None,
                   help="figure folder (default docs/figures)")
    s.add_argument("--md", type=Path, help="also write the tables here")
    args = p.parse_args()
    if args.name is None:
        args.name = "cost_growth_quick" if args.quick else "cost_growth"
    if args.command == "run":
        if args.quick:
            args.repeats = min(args.repeats, 2)
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
