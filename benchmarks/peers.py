"""The peer table: private PCA libraries beside ours on Fashion-MNIST, one fresh process per fit.

Issue 13: one table that puts the peers beside us on the same data: scikit-learn (every
solver, non-private), diffprivlib 0.6.6 (``diffprivlib.models.PCA``) and OpenDP's PCA
(``opendp.prelude.sklearn.decomposition.PCA``), k = 10, epsilon = 1, on Fashion-MNIST train
(pixels in [0, 1], public row bound 28, public feature bounds [0, 1]). The peers run in a
separate venv (``/work/peers-venv``; their pins conflict with ours: see
``benchmarks/peers/README.md`` and ``python benchmarks/peers.py setup``), every fit in a
fresh process (diffprivlib slows down over repeated fits in one process) with a timeout
(default 300 s; a timeout is a result, reported as "> 300 s").

For each fit: the fit time (measured inside the worker around ``fit`` alone), the spectral
sin-theta distance to the exact top-10 subspace of the same problem, and the captured
variance ratio ``||A V||_F^2 / ||A V_k||_F^2``, where the problem is uncentered
(``A = X``, the second moment) or centered (``A = X - mean(X)``, the covariance), as each
row says. Repeats are interleaved (all specs, then all specs again); medians are reported.

    # create the peers' venv (once; pip from PyPI)
    python benchmarks/peers.py setup
    # smoke test (2000 rows, 16 of the 784 pixel columns, k = 3, 10 s timeout; seconds)
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/peers.py run --quick
    # the table (quiet machine; each diffprivlib / OpenDP fit may use the full timeout)
    PYTHONPATH=src python benchmarks/peers.py run --repeats 3 --md docs/data/perf_peers.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
    write_json,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "peers" / "worker.py"
REQUIREMENTS = HERE / "peers" / "requirements.txt"
DEFAULT_VENV = Path("/work/peers-venv")

OURS = ["dpprecond:auto:uncentered", "dpprecond:auto:centered",
        "dpprecond:analyze_gauss:uncentered", "dpprecond:analyze_gauss:centered"]
PEERS = ["diffprivlib:uncentered", "diffprivlib:centered", "opendp:centered"]
SKLEARN = ["sklearn:PCA:auto", "sklearn:PCA:full", "sklearn:PCA:covariance_eigh",
           "sklearn:PCA:arpack", "sklearn:PCA:randomized",
           "sklearn:TruncatedSVD:arpack", "sklearn:TruncatedSVD:randomized"]


def problem_of(spec: str) -> str:
    """``centered`` or ``uncentered``: the problem a spec solves."""
    if spec.startswith("sklearn:PCA") or spec.endswith(":centered"):
        return "centered"
    return "uncentered"


def setup(args: argparse.Namespace) -> None:
    """Create the peers' venv and install the pinned requirements (pip, PyPI)."""
    venv = args.venv
    if not (venv / "bin" / "python").exists():
        subprocess.run([args.base_python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-r", str(REQUIREMENTS)], check=True)
    out = subprocess.run([*pip, "list"], check=True, capture_output=True, text=True).stdout
    keep = ("diffprivlib", "opendp", "scikit-learn", "numpy", "scipy")
    print("\n".join(ln for ln in out.splitlines() if ln.split(" ")[0].lower() in keep))


def exact_bases(X: np.ndarray, k: int) -> dict[str, dict[str, Any]]:
    """The exact top-k bases of the uncentered and the centered problems."""
    out = {}
    mean = X.mean(axis=0)
    for name, A in (("uncentered", X), ("centered", X - mean)):
        w, V = np.linalg.eigh(A.T @ A)
        out[name] = {"A": A, "V": np.ascontiguousarray(V[:, ::-1][:, :k]),
                     "gap": float(w[::-1][k - 1] - w[::-1][k])}
    return out


def metrics(V: np.ndarray, exact: dict[str, Any]) -> dict[str, float]:
    """Spectral sin-theta and captured variance of the basis V (orthonormalized)."""
    from dpprecond.pca.metrics import captured_variance_ratio, sin_theta

    Q = np.linalg.qr(V)[0]
    return {"sin_theta": sin_theta(exact["V"], Q),
            "captured_variance": captured_variance_ratio(exact["A"], Q, exact["V"])}


def run_one(spec: str, python: str, data: Path, tmp: Path, args: argparse.Namespace,
            seed: int, row_norm: float) -> dict[str, Any]:
    """One fit in a fresh process; a timeout is a result."""
    out = tmp / f"basis-{spec.replace(':', '_')}-{seed}.npy"
    cmd = [python, str(WORKER), "--spec", spec, "--data", str(data), "--out", str(out),
           "--k", str(args.k), "--eps", str(args.eps), "--delta", str(args.delta),
           "--row-norm", repr(row_norm), "--seed", str(seed),
           "--opendp-epsilon", args.opendp_epsilon]
    env = os.environ.copy()
    if spec.startswith("dpprecond"):
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"spec": spec, "seed": seed, "timeout": True,
                "wall_seconds": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        return {"spec": spec, "seed": seed, "failed": True, "wall_seconds": wall,
                "stderr": proc.stderr[-2000:]}
    res = json.loads(line[len("RESULT "):])
    res.update(seed=seed, wall_seconds=wall, basis=str(out))
    return res


def peer_versions(python: str) -> dict[str, str]:
    """Installed versions of the peers' packages in their venv."""
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('diffprivlib', 'opendp', 'scikit-learn', 'numpy', 'scipy')}))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-500:]}


def peer_python(args: argparse.Namespace) -> str | None:
    py = args.venv / "bin" / "python"
    if py.exists():
        return str(py)
    print(f"# WARNING: no peers' venv at {args.venv} (run `python benchmarks/peers.py setup`);"
          " the diffprivlib and OpenDP rows are skipped.", file=sys.stderr, flush=True)
    return None


def run(args: argparse.Namespace) -> None:
    from dpprecond.data import load_dataset

    header = print_header("peers: private PCA libraries beside ours, one process per fit")
    X = load_dataset("fashion-mnist").X_train
    if args.rows is not None:
        X = X[:args.rows]
    if args.cols is not None:  # a fixed public rule: evenly spaced pixel columns
        X = X[:, np.linspace(0, X.shape[1] - 1, args.cols).round().astype(int)]
    X = np.ascontiguousarray(X, dtype=np.float64)
    n, d = X.shape
    row_norm = math.sqrt(d)  # public: pixels in [0, 1]
    print(f"# fashion-mnist train: {n} x {d}, k={args.k}, eps={args.eps}, delta (ours)="
          f"{args.delta}, row_norm={row_norm:g}, timeout {args.timeout:g} s", flush=True)
    exact = exact_bases(X, args.k)
    py_peers = peer_python(args)
    versions = peer_versions(py_peers) if py_peers else {}
    if versions:
        print(f"# peers' venv {args.venv}: " + ", ".join(f"{k} {v}"
                                                        for k, v in versions.items()), flush=True)
    specs = [s for s in args.specs if py_peers or not s.startswith(("diffprivlib", "opendp"))]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in specs}
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "X.npy"
        np.save(data, X)
        for rep in range(args.repeats):
            for spec in specs:  # interleaved
                python = py_peers if spec.startswith(("diffprivlib", "opendp")) \
                    else sys.executable
                assert python is not None
                r = run_one(spec, python, data, tmp, args, rep, row_norm)
                if not (r.get("timeout") or r.get("failed")):
                    r.update(metrics(np.load(r.pop("basis")), exact[problem_of(spec)]))
                results[spec].append(r)
                status = ("TIMEOUT" if r.get("timeout") else "FAILED" if r.get("failed")
                          else f"{r['fit_seconds']:.3f} s, sin-theta {r['sin_theta']:.3f}")
                print(f"# [{rep}] {spec}: {status}", flush=True)
                if r.get("failed"):
                    print(r["stderr"], file=sys.stderr, flush=True)
    load_after = check_load("after")
    rows = []
    for spec, recs in results.items():
        ok = [r for r in recs if not (r.get("timeout") or r.get("failed"))]
        n_to = sum(bool(r.get("timeout")) for r in recs)
        n_fail = sum(bool(r.get("failed")) for r in recs)
        first = ok[0] if ok else {}
        if ok:
            fit = f"{statistics.median(r['fit_seconds'] for r in ok):.3g}"
            sin = statistics.median(r["sin_theta"] for r in ok)
            cap = statistics.median(r["captured_variance"] for r in ok)
        else:
            fit = f"> {args.timeout:g} s" if n_to else "failed"
            sin = cap = math.nan
        lib = spec.split(":")[0]
        rows.append([spec, problem_of(spec), first.get("version", versions.get(lib, "-")),
                     first.get("privacy", "-"), first.get("epsilon", "-"), fit, sin, cap,
                     f"{len(ok)} ok, {n_to} timeout, {n_fail} failed"])
    table = markdown_table(["spec", "problem", "version", "privacy", "epsilon",
                            "fit s (median)", "sin-theta", "captured variance", "fits"],
                           rows)
    note = (f"Exact top-{args.k} subspaces from eigh of A^T A (uncentered: A = X; centered: "
            f"A = X - mean). Eigengap lambda_k - lambda_k+1: uncentered "
            f"{exact['uncentered']['gap']:.4g}, centered {exact['centered']['gap']:.4g}. "
            f"Ours: delta = {args.delta}; diffprivlib and OpenDP are pure epsilon-DP. "
            f"OpenDP epsilon mode: {args.opendp_epsilon}.")
    print(table)
    print(note)
    payload = {**header, "load_after": load_after, "command": " ".join(sys.argv),
               "n": n, "d": d, "k": args.k, "epsilon": args.eps, "delta": args.delta,
               "timeout": args.timeout, "repeats": args.repeats, "quick": args.quick,
               "peer_versions": versions, "results": results}
    write_json(args.name, payload)
    if args.md:
        md_write(args.md, (
            "# Private PCA libraries beside ours\n\n"
            f"Command: `PYTHONPATH=src python benchmarks/peers.py {' '.join(sys.argv[1:])}`"
            f"\n\nEnvironment (ours): {environment()}; load before "
            f"{header['load_before'].get('load')}, after {load_after.get('load')}.\n\n"
            f"Data: Fashion-MNIST train, {n} x {d}, k = {args.k}, epsilon = {args.eps}, "
            f"row_norm = {row_norm:g}; one fresh process per fit, timeout "
            f"{args.timeout:g} s, {args.repeats} interleaved repeats.\n\n{table}\n\n{note}\n"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="create the peers' venv (pip install -r "
                       "benchmarks/peers/requirements.txt)")
    s.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    s.add_argument("--base-python", default="python3")
    r = sub.add_parser("run", help="fit every spec, one fresh process per fit")
    r.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    r.add_argument("--specs", nargs="+", default=OURS + PEERS + SKLEARN)
    r.add_argument("--k", type=int, default=10)
    r.add_argument("--eps", type=float, default=1.0)
    r.add_argument("--delta", type=float, default=1e-6, help="ours (the peers are pure DP)")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per fit")
    r.add_argument("--rows", type=int, default=None, help="first N rows only")
    r.add_argument("--cols", type=int, default=None,
                   help="N evenly spaced pixel columns only (the peers' samplers slow down "
                        "sharply with d)")
    r.add_argument("--opendp-epsilon", choices=["replace-one", "constructor"],
                   default="replace-one", help="see benchmarks/peers/worker.py")
    r.add_argument("--quick", action="store_true",
                   help="smoke test: 2000 rows, 16 columns, k = 3, 1 repeat, 10 s timeout")
    r.add_argument("--md", type=Path, help="also write the markdown table here")
    r.add_argument("--name", default=None, help="JSON name (default peers[_quick])")
    args = p.parse_args()
    if args.command == "setup":
        setup(args)
        return
    if args.quick:
        args.rows = args.rows or 2000
        args.cols = args.cols or 16
        args.k = min(args.k, 3)
        args.repeats = 1
        args.timeout = min(args.timeout, 10.0)
    args.name = args.name or ("peers_quick" if args.quick else "peers")
    run(args)


if __name__ == "__main__":
    main()
