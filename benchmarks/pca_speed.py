"""Fit time of the private PCA methods against every scikit-learn solver and the BLAS floors.

Issue 13 (speed at the memory floor) and issue 9 (the default within 1.0x scikit-learn's
default ``PCA``). On Fashion-MNIST train (60000 x 784, pixels in [0, 1], public row bound
``row_norm = 28 = sqrt(784)``), k = 10, epsilon = 1, delta = 1e-6, one process:

- ours: :func:`dpprecond.pca.fit_private_pca` with the default method (``auto``),
  ``analyze_gauss`` and ``fixed``, each uncentered and centered (``center="private"``);
- references: scikit-learn ``PCA(10)`` with every ``svd_solver`` (``auto``, ``full``,
  ``covariance_eigh``, ``arpack``, ``randomized``) and ``TruncatedSVD(10)`` (``arpack``,
  ``randomized``), the uncentered analogue;
- floors: one Gram product ``X.T @ X`` (BLAS, the same threads) and one read ``X @ v``;
- the library's passes alone (``dpprecond.pca.rows.ClippedRows``): the first (checking)
  pass, the Gram pass uncentered and centered, and one iteration pass ``A @ M`` with k
  columns, against ``X @ v``, ``X.T @ X`` and ``X @ M``.

Every case runs once to warm up, then the cases are timed interleaved (A, B, C, ..., A, B,
C, ...) for ``--repeats`` rounds; the table gives medians and the ratio of each of ours to
scikit-learn's default (``svd_solver="auto"``, and which solver it picks on this shape) and
to the fastest scikit-learn solver. The load average is printed first: a busy machine
disturbs the run (a warning says so). Results: ``benchmarks/out/pca_speed.json``.

    # smoke test (a 3000-row subsample, seconds)
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/pca_speed.py --quick
    # the measurement (quiet machine)
    PYTHONPATH=src python benchmarks/pca_speed.py --repeats 7 --md docs/data/perf_pca_speed.md
    # what separates the default from the Gram floor: a cProfile of one default fit
    PYTHONPATH=src python benchmarks/pca_speed.py --profile          # or --profile centered
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from sklearn.decomposition import PCA, TruncatedSVD

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
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
from dpprecond.data import load_dataset
from dpprecond.pca import fit_private_pca
from dpprecond.pca.api import DEFAULT_METHOD
from dpprecond.pca.auto import _block_clipped_step
from dpprecond.pca.rows import ClippedRows, make_rows

OURS = (DEFAULT_METHOD, "analyze_gauss", "fixed")
PCA_SOLVERS = ("auto", "full", "covariance_eigh", "arpack", "randomized")
TSVD_ALGORITHMS = ("arpack", "randomized")


def load_matrix(name: str, rows: int | None) -> np.ndarray:
    """The training matrix, float64 C-contiguous, optionally its first ``rows`` rows."""
    X = load_dataset(name).X_train
    if rows is not None:
        X = X[:rows]
    return np.ascontiguousarray(X, dtype=np.float64)


def ours_cases(X: np.ndarray, args: argparse.Namespace, row_norm: float,
               seeds: dict[str, int]) -> dict[str, Callable[[], Any]]:
    """One fit per (method, centering); a fresh seed per call (the noise differs)."""
    cases: dict[str, Callable[[], Any]] = {}
    for method in OURS:
        for center in (None, "private"):
            name = f"ours {method}" + (" centered" if center else "")

            def fit(method: str = method, center: str | None = center,
                    name: str = name) -> Any:
                seeds[name] = seeds.get(name, 0) + 1
                return fit_private_pca(X, args.k, method=method, target_epsilon=args.eps,
                                       target_delta=args.delta, row_norm=row_norm,
                                       center=center, seed=seeds[name])

            cases[name] = fit
    return cases


def sklearn_cases(X: np.ndarray, k: int, solvers: list[str],
                  tsvd: list[str]) -> dict[str, Callable[[], Any]]:
    """scikit-learn ``PCA`` (centered) per solver and ``TruncatedSVD`` (uncentered)."""
    cases: dict[str, Callable[[], Any]] = {}
    for s in solvers:
        cases[f"sklearn PCA {s}"] = (
            lambda s=s: PCA(n_components=k, svd_solver=s, random_state=0).fit(X))
    for a in tsvd:
        cases[f"sklearn TruncatedSVD {a}"] = (
            lambda a=a: TruncatedSVD(n_components=k, algorithm=a, random_state=0).fit(X))
    return cases


def floor_cases(X: np.ndarray, k: int, row_norm: float) -> dict[str, Callable[[], Any]]:
    """BLAS floors and the library's single passes (see the module docstring)."""
    rng = np.random.default_rng(0)
    v = rng.standard_normal(X.shape[1])
    M = np.linalg.qr(rng.standard_normal((X.shape[1], k)))[0]
    rows = make_rows(X, row_norm)
    mu = X.mean(axis=0) / row_norm  # a stand-in for the released mean (speed only)
    centered = rows.centered(mu)
    return {
        "floor read X @ v": lambda: X @ v,
        "floor Gram X.T @ X": lambda: X.T @ X,
        "floor X @ M (k columns)": lambda: X @ M,
        "pass first (ClippedRows.from_data: scan, NaN check)": lambda: ClippedRows.from_data(
            X, row_norm),
        "pass Gram (ClippedRows.gram, rows already scanned)": rows.gram,
        "pass Gram with the first pass fused (make_rows(X).gram(), the default fit's)":
            lambda: make_rows(X, row_norm).gram(),
        "pass Gram centered (ClippedRows.centered(mu).gram)": centered.gram,
        "pass iteration (ClippedRows.times, k columns)": lambda: rows.times(M),
        "floor X.T @ (X @ M) (two products)": lambda: X.T @ (X @ M),
        "pass auto iteration (clipped step A^T clip(A M))": lambda: rows.block_sum(
            _block_clipped_step, M, 1.0, shape=M.shape, row_scaled=True),
    }


def auto_solver(X: np.ndarray, k: int) -> str:
    """The solver scikit-learn's ``svd_solver="auto"`` picks for this shape."""
    pca = PCA(n_components=k).fit(X)
    # scikit-learn records its choice in this attribute (1.5+); read-only use.
    return str(getattr(pca, "_fit_svd_solver", "unknown"))


def profile_fit(X: np.ndarray, args: argparse.Namespace, row_norm: float,
                center: str | None) -> str:
    """cProfile of one default fit, top functions by own time (tottime)."""
    fit_private_pca(X, args.k, target_epsilon=args.eps, target_delta=args.delta,
                    row_norm=row_norm, center=center, seed=0)  # warm-up
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    res = fit_private_pca(X, args.k, target_epsilon=args.eps, target_delta=args.delta,
                          row_norm=row_norm, center=center, seed=1)
    prof.disable()
    wall = time.perf_counter() - t0
    v = np.random.default_rng(0).standard_normal(X.shape[1])
    gram = statistics.median(_time(lambda: X.T @ X) for _ in range(3))
    read = statistics.median(_time(lambda: X @ v) for _ in range(3))
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile_top)
    head = (f"# profile of one default fit ({res.method}, "
            f"{'centered' if center else 'uncentered'}, branch {res.info.get('branch')}): "
            f"{wall:.3f} s under cProfile; floors measured after it: Gram X.T @ X "
            f"{gram:.3f} s, read X @ v {read:.4f} s\n")
    return head + out.getvalue()


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ratio_rows(stats: dict[str, dict[str, Any]], sk_auto: str,
               auto_pick: str) -> tuple[list[list[Any]], dict[str, Any]]:
    """Table rows and the ratios of every case to the references and floors."""
    med = {name: s["median"] for name, s in stats.items()}
    pca_names = [n for n in med if n.startswith("sklearn PCA")]
    tsvd_names = [n for n in med if n.startswith("sklearn TruncatedSVD")]
    fastest_pca = min(pca_names, key=med.__getitem__) if pca_names else None
    fastest_tsvd = min(tsvd_names, key=med.__getitem__) if tsvd_names else None
    gram = med.get("floor Gram X.T @ X")
    read = med.get("floor read X @ v")
    xm = med.get("floor X @ M (k columns)")
    two = med.get("floor X.T @ (X @ M) (two products)")
    ratios: dict[str, Any] = {"fastest_sklearn_pca": fastest_pca,
                              "fastest_truncated_svd": fastest_tsvd, "cases": {}}
    rows = []
    for name, m in med.items():
        r: dict[str, float | None] = {}
        if sk_auto in med:
            r["to_sklearn_auto"] = m / med[sk_auto]
        if fastest_pca:
            r["to_fastest_sklearn_pca"] = m / med[fastest_pca]
        if fastest_tsvd:
            r["to_fastest_truncated_svd"] = m / med[fastest_tsvd]
        if gram:
            r["to_gram_floor"] = m / gram
        if read:
            r["to_read_floor"] = m / read
        floor = _own_floor(name, gram, read, xm, two)
        if floor is not None:
            r["to_own_floor"] = m / floor[1]
            r["own_floor"] = floor[0]
        ratios["cases"][name] = r
        label = name + (f" (picks {auto_pick})" if name == sk_auto else "")
        own = f"{r['to_own_floor']:.2f}x {floor[0]}" if floor else "-"
        rows.append([label, m, stats[name]["min"], r.get("to_sklearn_auto", math.nan),
                     r.get("to_fastest_sklearn_pca", math.nan),
                     r.get("to_gram_floor", math.nan), own])
    return rows, ratios


def _own_floor(name: str, gram: float | None, read: float | None,
               xm: float | None, two: float | None) -> tuple[str, float] | None:
    """The floor a library pass should be held against (issue 13: within 1.5x)."""
    if name.startswith("pass Gram") and gram:
        return "X.T @ X", gram
    if name.startswith("pass first") and read:
        return "X @ v", read
    if name.startswith("pass iteration") and xm:
        return "X @ M", xm
    if name.startswith("pass auto iteration") and two:
        return "X.T @ (X @ M)", two
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--eps", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--rows", type=int, default=None, help="use the first N rows only")
    p.add_argument("--solvers", nargs="*", default=list(PCA_SOLVERS), choices=PCA_SOLVERS,
                   help="scikit-learn PCA solvers to time (default: all)")
    p.add_argument("--tsvd", nargs="*", default=list(TSVD_ALGORITHMS),
                   choices=TSVD_ALGORITHMS, help="TruncatedSVD algorithms (default: both)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3000 rows, 2 repeats (numbers meaningless)")
    p.add_argument("--profile", nargs="?", const="uncentered",
                   choices=["uncentered", "centered"],
                   help="print a cProfile of one default fit instead of the timing table")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="pca_speed", help="JSON name under benchmarks/out/")
    args = p.parse_args()
    if args.quick:
        args.rows = args.rows or 3000
        args.repeats = min(args.repeats, 2)

    header = print_header("pca_speed: private PCA fit time against scikit-learn and floors")
    X = load_matrix(args.data, args.rows)
    n, d = X.shape
    row_norm = math.sqrt(d)  # public: pixels in [0, 1]
    print(f"# {args.data}: {n} x {d} float64 ({X.nbytes / 2**20:.0f} MiB), k={args.k}, "
          f"eps={args.eps}, delta={args.delta}, row_norm={row_norm:g}; scikit-learn "
          f"{sklearn.__version__}", flush=True)

    if args.profile:
        print(profile_fit(X, args, row_norm, "private" if args.profile == "centered"
                          else None))
        return

    pick = auto_solver(X, args.k)
    print(f"# scikit-learn PCA(svd_solver='auto') picks '{pick}' on {n} x {d}, "
          f"n_components={args.k}", flush=True)
    seeds: dict[str, int] = {}
    cases = {**sklearn_cases(X, args.k, args.solvers, args.tsvd),
             **ours_cases(X, args, row_norm, seeds),
             **floor_cases(X, args.k, row_norm)}
    info: dict[str, list[str]] = {}

    def record(name: str, res: Any) -> None:
        if name.startswith("ours"):
            i = res.info
            info.setdefault(name, []).append(
                f"branch={i.get('branch', '-')}, R={i.get('clip_radius', '-')}, "
                f"T={i.get('n_iter', '-')}, eps={res.epsilon:.4g}")

    times = interleaved(cases, args.repeats, warmup=1, after=record)
    load_after = check_load("after")
    stats = {name: summary(t) for name, t in times.items()}
    sk_auto = "sklearn PCA auto"
    rows, ratios = ratio_rows(stats, sk_auto, pick)
    table = markdown_table(
        ["case", "median s", "min s", "/ sklearn auto", "/ fastest sklearn PCA",
         "/ Gram floor", "/ own floor"], rows)
    fastest = ratios["fastest_sklearn_pca"]
    ref = (f"References: scikit-learn {sklearn.__version__} PCA(n_components={args.k}) per "
           f"svd_solver, random_state=0 (auto picks '{pick}' here); fastest PCA solver: "
           f"{fastest}; TruncatedSVD({args.k}) is uncentered; BLAS and threads: "
           f"{environment()}.")
    print(table)
    print(ref)
    for name, runs in info.items():
        print(f"# {name}: " + "; ".join(sorted(set(runs))))
    payload = {**header, "load_after": load_after, "command": " ".join(sys.argv),
               "data": {"name": args.data, "n": n, "d": d, "row_norm": row_norm},
               "k": args.k, "epsilon": args.eps, "delta": args.delta,
               "repeats": args.repeats, "quick": args.quick,
               "sklearn": {"version": sklearn.__version__, "auto_picks": pick},
               "stats": stats, "ratios": ratios, "ours_info": info}
    write_json(args.name, payload)
    if args.md:
        disturbed = " DISTURBED (other processes used the cores)" if was_disturbed(
            header["load_before"], load_after) else ""
        md_write(args.md, (
            "# Private PCA fit time against scikit-learn and the BLAS floors\n\n"
            f"Command: `PYTHONPATH=src python benchmarks/pca_speed.py "
            f"{' '.join(sys.argv[1:])}`\n\nEnvironment: {environment()}; load before "
            f"{header['load_before'].get('load')}, after {load_after.get('load')}"
            f"{disturbed}.\n\nData: {args.data} train, {n} x {d}, k = {args.k}, "
            f"epsilon = {args.eps}, delta = {args.delta}, row_norm = {row_norm:g}. Medians "
            f"of {args.repeats} interleaved rounds after one warm-up per case.\n\n{ref}\n\n"
            f"{table}\n"))


if __name__ == "__main__":
    main()
