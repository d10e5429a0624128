"""Seconds per federated round against the memory floor (one read of X), and "result unchanged".

Issue 13: a round of the simulator should cost at most 2x one read of the training data
(float64), on Fashion-MNIST pixels (60000 x 784, 10 classes, ``(x - 0.5) / 0.5``), for
K = 20 and K = 100, with the same seeds giving the same model up to summation order.

Timing. For each K in ``--clients``, each algorithm (the default,
``dpprecond.fl.DEFAULT_ALGORITHM``, and ``fedgd``) and each precision (``float64``,
``float32``), one :func:`dpprecond.fl.run_federated` run (record-level full-batch mechanism,
epsilon = 1) of ``--rounds + 1`` rounds; its per-round seconds come from the run's history
(the engine times the round: clients' messages and the server step, not the test-set
evaluation). After every round, inside the run's callback, the floors are timed once each,
so that rounds and floors interleave (round, floors, round, floors, ...):

- ``read``: one read of X, ``X @ v`` with v of length d (float64, and float32 for the
  float32 rows);
- ``X @ W`` (W d x 10), the same product as ``(W.T @ X.T).T`` (another layout, the one
  the kernel's logits use), and ``X.T @ R`` (R n x 10) with its other layout ``R.T @ X``
  (the kernel's sums), in the row's precision; with ``--torch`` also ``X @ W`` in torch.

Round 1 (warm-up: thread pools, first touch of the float32 copy) is left out of the medians.

Result unchanged. With ``--check-rounds`` > 0 the same seeded run is repeated with the
reference path: a :class:`~dpprecond.fl.models.LinearSoftmax` whose ``clipped_grad_sums`` is
:meth:`~dpprecond.fl.models.LinearSoftmax.clipped_grad_sums_safe` (one ``X W`` and
per-client ``X_i^T R_i`` products, no fused kernel), and the max abs difference of the final
parameters is reported (float64: summation order only). The float32 run is compared with the
float64 run as information (that difference is the rounding of the records, not the order).

    # smoke test (3000 rows, K = 20, 3 rounds; seconds)
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fl_round.py --quick
    # the measurement (quiet machine)
    PYTHONPATH=src python benchmarks/fl_round.py --rounds 15 --md docs/data/perf_fl_round.md
    # with the torch backend on the CPU too (FLConfig(backend="torch", device="cpu"))
    PYTHONPATH=src python benchmarks/fl_round.py --rounds 15 --backends numpy torch

The target verdict is given for every row: a row meets it when its round is at most 2x one
read of X as the user gives it (float64), whatever precision or backend the round used.
GPU: ``benchmarks/fl_round_cuda.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    check_load,
    environment,
    markdown_table,
    md_write,
    print_header,
    summary,
    was_disturbed,
    write_json,
)
from dpprecond.features import load_features
from dpprecond.fl import DEFAULT_ALGORITHM, FLConfig, LinearSoftmax, run_federated

TARGET = 2.0  # round <= 2x one read of X (float64)


class ReferenceSoftmax(LinearSoftmax):
    """The linear head with the unfused reference path for the clipped sums."""

    def clipped_grad_sums(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                          bounds: np.ndarray, clip_norm: float, *,
                          x_sq_norms: np.ndarray | None = None) -> np.ndarray:
        return self.clipped_grad_sums_safe(params, X, y, bounds, clip_norm,
                                           x_sq_norms=x_sq_norms)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def floor_functions(X: np.ndarray, n_classes: int, precision: str,
                    torch_floors: bool) -> dict[str, Callable[[], Any]]:
    """The floor products, in float64 and in the row's precision."""
    rng = np.random.default_rng(0)
    n, d = X.shape
    v = rng.standard_normal(d)
    fns: dict[str, Callable[[], Any]] = {"read f64 (X @ v)": lambda: X @ v}
    Xp = X if precision == "float64" else X.astype(np.float32)
    dt = Xp.dtype
    W = rng.standard_normal((d, n_classes)).astype(dt)
    R = rng.standard_normal((n, n_classes)).astype(dt)
    if precision != "float64":
        vp = v.astype(dt)
        fns[f"read {precision} (X @ v)"] = lambda: Xp @ vp
    fns[f"X @ W {precision}"] = lambda: Xp @ W
    fns[f"(W.T @ X.T).T {precision}"] = lambda: (W.T @ Xp.T).T
    fns[f"X.T @ R {precision}"] = lambda: Xp.T @ R
    fns[f"R.T @ X {precision}"] = lambda: R.T @ Xp  # the layout of the kernel's sums
    if torch_floors:
        import torch

        Xt, Wt = torch.from_numpy(Xp), torch.from_numpy(W)
        fns[f"torch X @ W {precision}"] = lambda: Xt @ Wt
    return fns


def timed_run(data: tuple[Any, ...], K: int, algorithm: str, precision: str, rounds: int,
              torch_floors: bool, seed: int, backend: str = "numpy",
              device: str | None = None, fixed_clip: bool = False) -> dict[str, Any]:
    """One run of ``rounds + 1`` rounds with the floors timed after every round."""
    X, y, Xte, yte, n_classes = data
    fns = floor_functions(X, n_classes, precision, torch_floors)
    floors: dict[str, list[float]] = {name: [] for name in fns}

    def after_round(record: dict[str, float]) -> None:
        for name, fn in fns.items():
            floors[name].append(_timed(fn))

    cfg = FLConfig(n_rounds=rounds + 1, target_epsilon=1.0, precision=precision,
                   backend=backend, device=device)  # type: ignore[arg-type]
    if fixed_clip:  # the paper's fixed clip: no adaptive clipping's count pass
        cfg = replace(cfg, adaptive_clip=None)
    res = run_federated(X, y, Xte, yte, n_classes, algorithm=algorithm, n_clients=K,
                        config=cfg, seed=seed, callback=after_round)
    round_s = [h["seconds"] for h in res.history[1:]]  # round 1 is the warm-up
    out: dict[str, Any] = {"K": K, "algorithm": algorithm, "precision": precision,
                           "backend": backend if device is None else f"{backend}:{device}",
                           "round": summary(round_s), "round_1_seconds":
                           res.history[0]["seconds"],
                           "floors": {name: summary(t[1:]) for name, t in floors.items()},
                           "final_accuracy": res.history[-1]["test_accuracy"],
                           "epsilon": res.epsilon}
    med = out["round"]["median"]
    fl = {name: s["median"] for name, s in out["floors"].items()}
    products = fl[f"X @ W {precision}"] + fl[f"X.T @ R {precision}"]
    own_read = fl.get(f"read {precision} (X @ v)", fl["read f64 (X @ v)"])
    out["ratios"] = {"to_read_f64": med / fl["read f64 (X @ v)"],
                     "to_read_own_precision": med / own_read,
                     "to_products_XW_plus_XtR": med / products}
    return out


def unchanged_check(data: tuple[Any, ...], K: int, algorithm: str, rounds: int,
                    seed: int) -> dict[str, Any]:
    """Final parameters of the fused kernel against the reference path, same seed."""
    X, y, Xte, yte, n_classes = data
    finals = {}
    for label, model, precision in (("fused f64", LinearSoftmax, "float64"),
                                    ("reference f64", ReferenceSoftmax, "float64"),
                                    ("fused f32", LinearSoftmax, "float32")):
        cfg = FLConfig(n_rounds=rounds, target_epsilon=1.0, precision=precision)
        res = run_federated(X, y, Xte, yte, n_classes, algorithm=algorithm, n_clients=K,
                            config=cfg, seed=seed, model=model(X.shape[1], n_classes))
        finals[label] = res.params
    scale = float(np.max(np.abs(finals["reference f64"])))
    d_ref = float(np.max(np.abs(finals["fused f64"] - finals["reference f64"])))
    d_32 = float(np.max(np.abs(finals["fused f32"] - finals["fused f64"])))
    return {"K": K, "algorithm": algorithm, "rounds": rounds, "seed": seed,
            "max_abs_param": scale, "fused_vs_reference_f64": d_ref,
            "fused_vs_reference_f64_relative": d_ref / scale if scale else d_ref,
            "float32_vs_float64": d_32,
            "float32_vs_float64_relative": d_32 / scale if scale else d_32}


def load_data(rows: int | None, test_rows: int | None) -> tuple[Any, ...]:
    ds, feat = load_features("fashion-mnist")
    X, y = ds.X_train, ds.y_train
    Xte, yte = ds.X_test, ds.y_test
    if rows is not None:
        X, y = X[:rows], y[:rows]
    if test_rows is not None:
        Xte, yte = Xte[:test_rows], yte[:test_rows]
    X = np.ascontiguousarray(X, dtype=np.float64)
    print(f"# Fashion-MNIST {feat}: X {X.shape} float64 ({X.nbytes / 2**20:.0f} MiB), "
          f"{ds.n_classes} classes, test {Xte.shape[0]} rows", flush=True)
    return X, y, Xte, yte, ds.n_classes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--algorithms", nargs="+", default=None,
                   help=f"default: the default ({DEFAULT_ALGORITHM}) and fedgd")
    p.add_argument("--precisions", nargs="+", default=["float64", "float32"],
                   choices=["float64", "float32"])
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (after round 1)")
    p.add_argument("--check-rounds", type=int, default=3,
                   help="rounds of the result-unchanged check (0: skip it)")
    p.add_argument("--rows", type=int, default=None, help="first N training rows only")
    p.add_argument("--torch", action="store_true", help="also time X @ W in torch")
    p.add_argument("--backends", nargs="+", default=["numpy"], choices=["numpy", "torch"],
                   help="array backends of the kernel (FLConfig.backend); torch on the CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed-clip", action="store_true",
                   help="time the fixed clip (adaptive_clip=None) instead of the defaults "
                        "(adaptive clipping's count makes one more forward product a round)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3000 rows, K = 20, 3 rounds (numbers meaningless)")
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="fl_round", help="JSON name under benchmarks/out/")
    args = p.parse_args()
    test_rows = None
    if args.quick:
        args.rows = args.rows or 3000
        args.clients = args.clients if args.clients != [20, 100] else [20]
        args.rounds = min(args.rounds, 3)
        args.check_rounds = min(args.check_rounds, 2)
        test_rows = 500
    algorithms = args.algorithms or list(dict.fromkeys([DEFAULT_ALGORITHM, "fedgd"]))

    header = print_header("fl_round: seconds per federated round against one read of X")
    data = load_data(args.rows, test_rows)
    if args.torch:
        import torch

        print(f"# torch {torch.__version__}, {torch.get_num_threads()} intra-op threads",
              flush=True)
    runs = []
    for K in args.clients:
        for algorithm in algorithms:
            for precision in args.precisions:
                for backend in args.backends:
                    r = timed_run(data, K, algorithm, precision, args.rounds, args.torch,
                                  args.seed, backend, "cpu" if backend == "torch" else None,
                                  args.fixed_clip)
                    runs.append(r)
                    print(f"# K={K} {algorithm} {precision} {r['backend']}: round "
                          f"{r['round']['median']:.4f} s, "
                          f"{r['ratios']['to_read_f64']:.2f}x read f64", flush=True)
    checks = []
    if args.check_rounds > 0:
        for K in args.clients:
            for algorithm in algorithms:
                checks.append(unchanged_check(data, K, algorithm, args.check_rounds,
                                              args.seed))
    load_after = check_load("after")

    rows = []
    for r in runs:
        fl = {name: s["median"] for name, s in r["floors"].items()}
        prec = r["precision"]
        rt = r["ratios"]["to_read_f64"]
        verdict = f"<= {TARGET:g}x " + ("met" if rt <= TARGET else "MISSED")
        rows.append([r["K"], r["algorithm"], prec, r["backend"], 1e3 * r["round"]["median"],
                     1e3 * fl["read f64 (X @ v)"],
                     1e3 * fl.get(f"read {prec} (X @ v)", fl["read f64 (X @ v)"]),
                     1e3 * fl[f"X @ W {prec}"], 1e3 * fl[f"(W.T @ X.T).T {prec}"],
                     1e3 * fl[f"X.T @ R {prec}"], 1e3 * fl[f"R.T @ X {prec}"], rt,
                     r["ratios"]["to_read_own_precision"],
                     r["ratios"]["to_products_XW_plus_XtR"], verdict]
                    + ([1e3 * fl[f"torch X @ W {prec}"]] if args.torch else []))
    table = markdown_table(
        ["K", "algorithm", "precision", "backend", "round ms", "read f64 ms", "read own ms",
         "X@W ms", "(W.T@X.T).T ms", "X.T@R ms", "R.T@X ms", "/ read f64", "/ read own",
         "/ (X@W + X.T@R)", "target"] + (["torch X@W ms"] if args.torch else []), rows)
    check_table = markdown_table(
        ["K", "algorithm", "rounds", "max abs param", "fused - reference (f64)",
         "relative", "float32 - float64", "relative"],
        [[c["K"], c["algorithm"], c["rounds"], c["max_abs_param"],
          c["fused_vs_reference_f64"], c["fused_vs_reference_f64_relative"],
          c["float32_vs_float64"], c["float32_vs_float64_relative"]] for c in checks])
    ref = ("Reference: the floors are numpy products in the same process (BLAS and threads: "
           f"{environment()}), timed once after every round (interleaved); medians over "
           f"rounds 2..{args.rounds + 1}.")
    print(table)
    print(ref)
    if checks:
        print(check_table)
    payload = {**header, "load_after": load_after, "command": " ".join(sys.argv),
               "rows": data[0].shape[0], "rounds": args.rounds, "quick": args.quick,
               "target_round_over_read_f64": TARGET, "runs": runs, "unchanged": checks}
    write_json(args.name, payload)
    if args.md:
        md_write(args.md, (
            "# Seconds per federated round against one read of X\n\n"
            f"Command: `PYTHONPATH=src python benchmarks/fl_round.py "
            f"{' '.join(sys.argv[1:])}`\n\nEnvironment: {environment()}; load before "
            f"{header['load_before'].get('load')}, after {load_after.get('load')}; other "
            f"processes used {load_after.get('others_cores')} cores on average (disturbed: "
            f"{was_disturbed(header['load_before'], load_after)}).\n\n"
            f"{ref}\n\n{table}\n\nResult unchanged (final parameters after "
            f"{args.check_rounds} rounds, same seed):\n\n{check_table}\n"))


if __name__ == "__main__":
    main()
