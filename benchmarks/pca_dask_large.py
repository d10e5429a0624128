"""Private PCA of an input larger than a quarter of RAM: the Dask path and the memmap path.

The input is a float32 ``.npy`` of ``n x d`` (default 20,000,000 x 100 = 8 GB, a third of
the 24 GiB machine) written in chunks under ``benchmarks/out/pca_dask_large/``. Each fit
runs in a fresh process and records the wall time of every pass over the data, the fit's
total, and the peak memory of the process: ``VmHWM`` (peak resident set, which counts the
pages of a memory-mapped file that the process has touched) and the peak of ``RssAnon``
(its own allocations, sampled every 20 ms). The two paths:

- ``dask``: ``fit_private_pca(from_npy(path, block_rows))``, the passes on the dask
  threaded scheduler (``--workers`` threads) or on a ``LocalCluster`` of 2 processes
  (``--cluster processes``; the workers' own peaks are reported too);
- ``memmap``: ``fit_private_pca(np.load(path, mmap_mode="r"))``, i.e. ClippedRows over the
  memory map, single-threaded, with its block size set to the same bytes.

``read`` times one plain read of the file (a float64 sum over the memory map, block by
block), after evicting the file from the page cache (``posix_fadvise(DONTNEED)``; cold)
and again right after (warm), and reports how much of the file ``fincore`` finds cached.

    python benchmarks/pca_dask_large.py generate
    python benchmarks/pca_dask_large.py read
    python benchmarks/pca_dask_large.py all          # the matrix of fits, fresh processes
    python benchmarks/pca_dask_large.py report --md benchmarks/out/pca_dask_large/report.md

``PCA_DASK_LARGE_DIR`` moves the data and results elsewhere (a small trial run). Run heavy
jobs with OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 (``all``
sets them for its children).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT_DIR, environment, markdown_table

OUT = Path(os.environ.get("PCA_DASK_LARGE_DIR", OUT_DIR / "pca_dask_large"))
DATA = OUT / "x.npy"
RESULTS = OUT / "results.jsonl"
ROW_NORM = 14.0  # public bound: 5.6% of the rows are above it (clipped; every block has some)
K = 5
SEED = 1
SINGLE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# -- data ----------------------------------------------------------------------------------


def generate(n: int, d: int, chunk: int = 500_000) -> None:
    """Rows ``N(0, diag(s^2))`` with ``s = 3`` on the first 5 coordinates and 1 elsewhere."""
    OUT.mkdir(parents=True, exist_ok=True)
    size = n * d * 4
    if DATA.exists():
        mm = np.load(DATA, mmap_mode="r")
        if mm.shape == (n, d) and mm.dtype == np.float32:
            print(f"{DATA} exists ({size / 1e9:.1f} GB); not rewritten")
            return
        del mm
        DATA.unlink()
    free = shutil.disk_usage(OUT).free
    print(f"free disk at {OUT}: {free / 1e9:.1f} GB; the file needs {size / 1e9:.1f} GB")
    if free < 1.2 * size:
        raise SystemExit("not enough free disk (need 1.2x the file); choose a smaller --n")
    scale = np.ones(d, dtype=np.float32)
    scale[:5] = 3.0
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(DATA, mode="w+", dtype=np.float32, shape=(n, d))
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        rng = np.random.default_rng([SEED, lo])
        block = rng.standard_normal((hi - lo, d), dtype=np.float32)
        block *= scale
        out[lo:hi] = block
    out.flush()
    del out
    print(f"wrote {DATA} ({n} x {d} float32, {size / 1e9:.1f} GB) in "
          f"{time.perf_counter() - t0:.0f} s")


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path: Path) -> float | None:
    """Fraction of the file in the page cache (``fincore``), or None if unavailable."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              str(path)], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[0]) / path.stat().st_size
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def read_once(block_rows: int = 200_000) -> dict[str, Any]:
    """One plain pass over the file, cold then warm: a float64 sum over the memory map
    (block by block), and ``readinto`` of 8 MB pieces (read() calls, no map)."""
    out: dict[str, Any] = {"kind": "read", "size_gb": DATA.stat().st_size / 1e9}
    for state in ("cold", "warm"):
        if state == "cold":
            _evict(DATA)
        out[f"cached_before_{state}"] = cached_fraction(DATA)
        mm = np.load(DATA, mmap_mode="r")
        t0 = time.perf_counter()
        total = 0.0
        for lo in range(0, mm.shape[0], block_rows):
            total += float(np.sum(mm[lo:lo + block_rows], dtype=np.float64))
        out[f"{state}_seconds"] = time.perf_counter() - t0
        del mm
    buf = bytearray(8 * 2**20)
    for state in ("cold", "warm"):
        if state == "cold":
            _evict(DATA)
        t0 = time.perf_counter()
        with open(DATA, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
        out[f"{state}_read_seconds"] = time.perf_counter() - t0
    out["load"] = os.getloadavg()[0]
    return out


# -- a fit in this process -----------------------------------------------------------------


class MemorySampler:
    """Peaks of VmRSS and RssAnon of this process, read from /proc every ``interval`` s."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def status() -> dict[str, int]:
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    fields[key] = int(rest.split()[0]) * 1024
        return fields

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, value in self.status().items():
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], value)
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _timed_passes(cls: type, log: list[tuple[str, float]]) -> None:
    """Record the wall time of every pass of a row class (patched on the class)."""
    def wrap(name: str, fn: Any) -> Any:
        def inner(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            log.append((name, time.perf_counter() - t0))
            return out
        return inner

    from_data = cls.from_data.__func__
    cls.from_data = classmethod(wrap("from_data", from_data))
    for name in ("gram", "column_sum", "centered", "times", "t_times", "rows"):
        setattr(cls, name, wrap(name, getattr(cls, name)))
    norms = cls.norms.fget

    def timed_norms(self: Any) -> np.ndarray:
        if self._norms is not None:
            return self._norms
        t0 = time.perf_counter()
        out = norms(self)
        log.append(("norms", time.perf_counter() - t0))
        return out

    cls.norms = property(timed_norms)


def fit(path: str, method: str, block_mib: float, n_iter: int, workers: int,
        cluster: str, cold: bool) -> dict[str, Any]:
    """One fit; returns the record (also saves the components for the cross-check)."""
    from dpprecond.pca import api, fit_private_pca
    from dpprecond.pca.rows import ClippedRows, block_rows_for, make_rows

    block_bytes = int(block_mib * 2**20)
    mm = np.load(DATA, mmap_mode="r")
    n, d = mm.shape
    block_rows = block_rows_for(d, block_bytes)
    if cold:
        _evict(DATA)
    cached = cached_fraction(DATA)
    log: list[tuple[str, float]] = []
    client = None
    if path == "dask":
        import dask

        from dpprecond.adapters.dask import DaskRows, from_npy

        _timed_passes(DaskRows, log)
        X: Any = from_npy(DATA, block_rows=block_rows)
        del mm
        if cluster == "processes":
            from distributed import Client, LocalCluster

            lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=None, memory_limit=0)
            client = Client(lc)
        else:
            dask.config.set(scheduler="threads", num_workers=workers)
    else:
        _timed_passes(ClippedRows, log)
        api.make_rows = partial(make_rows, block_bytes=block_bytes)  # the block size knob
        X = mm
    opts = {"n_iter": n_iter} if method == "fixed" else {}
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        res = fit_private_pca(X, K, method=method, target_epsilon=1.0, target_delta=1e-9,
                              row_norm=ROW_NORM, seed=SEED, diagnostics=False, **opts)
        total = time.perf_counter() - t0
    status = MemorySampler.status()
    workers_hwm = None
    if client is not None:
        workers_hwm = list(client.run(lambda: MemorySampler.status()["VmHWM"]).values())
        client.close()
    tag = f"{path}_{method}_{block_mib:g}_{cluster}_{workers}" + ("_cold" if cold else "")
    np.save(OUT / f"components_{tag}.npy", res.components)
    return {"kind": "fit", "path": path, "method": method, "block_mib": block_mib,
            "block_rows": block_rows, "n": int(n), "d": int(d), "k": K, "n_iter": n_iter,
            "workers": workers if path == "dask" else 1, "cluster": cluster,
            "cold_start": cold, "cached_before": cached, "fit_seconds": total,
            "passes": log, "vm_hwm": status["VmHWM"], "peak_rss_sampled": mem.peak["VmRSS"],
            "peak_anon": mem.peak["RssAnon"], "peak_file": mem.peak["RssFile"],
            "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "workers_vm_hwm": workers_hwm, "load": os.getloadavg()[0],
            "components": tag}


# -- the matrix ----------------------------------------------------------------------------

MATRIX = [
    # (path, method, block MiB, n_iter, workers, cluster, cold)
    ("memmap", "analyze_gauss", 4, 0, 1, "threads", False),
    ("memmap", "analyze_gauss", 16, 0, 1, "threads", False),
    ("memmap", "analyze_gauss", 64, 0, 1, "threads", False),
    ("dask", "analyze_gauss", 4, 0, 2, "threads", False),
    ("dask", "analyze_gauss", 16, 0, 2, "threads", False),
    ("dask", "analyze_gauss", 64, 0, 2, "threads", False),
    ("dask", "analyze_gauss", 16, 0, 1, "threads", False),
    ("dask", "analyze_gauss", 16, 0, 2, "threads", True),
    ("memmap", "analyze_gauss", 16, 0, 1, "threads", True),
    ("dask", "analyze_gauss", 16, 0, 2, "processes", False),
    ("memmap", "fixed", 16, 3, 1, "threads", False),
    ("dask", "fixed", 16, 3, 2, "threads", False),
]


def run_child(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, **SINGLE_THREAD}
    cmd = [sys.executable, __file__, *args]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    record = json.loads(out.stdout.strip().splitlines()[-1])
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(summary(record), flush=True)
    return record


def summary(r: dict[str, Any]) -> str:
    if r["kind"] == "read":
        return (f"read {r['size_gb']:.1f} GB: memory map cold {r['cold_seconds']:.1f} s, warm "
                f"{r['warm_seconds']:.1f} s; read() cold {r['cold_read_seconds']:.1f} s, warm "
                f"{r['warm_read_seconds']:.1f} s (cached before: {r['cached_before_cold']}, "
                f"{r['cached_before_warm']})")
    passes = ", ".join(f"{name} {sec:.1f}" for name, sec in r["passes"])
    return (f"{r['path']} {r['method']} block {r['block_mib']} MiB ({r['cluster']}, "
            f"{r['workers']} w): fit {r['fit_seconds']:.1f} s; passes [{passes}]; "
            f"VmHWM {r['vm_hwm'] / 2**30:.2f} GiB, peak anon {r['peak_anon'] / 2**30:.2f} GiB"
            f"; load {r['load']:.1f}")


def report(md: Path | None) -> None:
    records = [json.loads(line) for line in RESULTS.read_text().splitlines() if line]
    reads = [r for r in records if r["kind"] == "read"]
    fits = [r for r in records if r["kind"] == "fit"]
    lines = [f"Environment: {environment()}", ""]
    if reads:  # the median of each time over the repeated reads
        r = {**reads[-1], **{key: float(np.median([x[key] for x in reads])) for key in
                             ("cold_seconds", "warm_seconds", "cold_read_seconds",
                              "warm_read_seconds")}}
        gb = r["size_gb"]
        lines += [f"Read once, median of {len(reads)} ({gb:.1f} GB; last load {r['load']:.1f}; "
                  f"cached fraction before "
                  f"the cold reads: {r['cached_before_cold']}): float64 sum over the memory "
                  f"map cold {r['cold_seconds']:.1f} s ({gb / r['cold_seconds']:.2f} GB/s), "
                  f"warm {r['warm_seconds']:.1f} s ({gb / r['warm_seconds']:.2f} GB/s); "
                  f"read() of 8 MB pieces cold {r['cold_read_seconds']:.1f} s "
                  f"({gb / r['cold_read_seconds']:.2f} GB/s), warm "
                  f"{r['warm_read_seconds']:.1f} s ({gb / r['warm_read_seconds']:.2f} GB/s).",
                  ""]
    # Repeated runs of one configuration (``all`` run several times) give one row: the
    # median of each time and the largest memory peak, with the number of runs.
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in fits:
        key = (r["path"], r["method"], r["cluster"], r["workers"], r["block_mib"],
               r["block_rows"], r["cold_start"])
        by_config.setdefault(key, []).append(r)

    def first(r: dict[str, Any], name: str) -> float:
        return next(sec for n, sec in r["passes"] if n == name)

    def median_full_pass(r: dict[str, Any]) -> float:
        return float(np.median([sec for n, sec in r["passes"]
                                if n in ("gram", "times", "t_times", "norms")]))

    def median_over(rs: list[dict[str, Any]], f: Any) -> float:
        return float(np.median([f(r) for r in rs]))

    rows = []
    for (path, method, cluster, workers, mib, block_rows, cold), rs in by_config.items():
        med = partial(median_over, rs)
        workers_peak = [max(ws) for ws in zip(*(r["workers_vm_hwm"] for r in rs),
                                              strict=True)] if rs[0]["workers_vm_hwm"] else []
        rows.append([path, method, cluster, workers, mib, block_rows,
                     "cold" if cold else "warm", len(rs),
                     med(lambda r: first(r, "from_data")), med(lambda r: first(r, "gram")),
                     med(median_full_pass), len(rs[0]["passes"]),
                     med(lambda r: r["fit_seconds"]),
                     max(r["vm_hwm"] for r in rs) / 2**30,
                     max(r["peak_anon"] for r in rs) / 2**30,
                     " / ".join(f"{w / 2**30:.2f}" for w in workers_peak),
                     f"{min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f}"])
    lines.append(markdown_table(
        ["path", "method", "scheduler", "threads", "block MiB", "block rows", "cache", "runs",
         "first pass s", "gram s", "median pass s", "passes", "fit s", "VmHWM GiB",
         "peak anon GiB", "workers' VmHWM GiB", "load"], rows))
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in fits:
        groups.setdefault((r["method"], r["block_mib"]), []).append(r)
    lines.append("")
    for (method, mib), rs in groups.items():
        if len(rs) < 2:
            continue
        tags = sorted({r["components"] for r in rs})  # a repeated run overwrites its file
        cs = [np.load(OUT / f"components_{tag}.npy") for tag in tags]
        diff = max(float(np.abs(c - cs[0]).max()) for c in cs)
        lines.append(f"{method}, {mib:g} MiB blocks: largest entry difference between the "
                     f"components of its {len(cs)} saved runs (same seed; the noise is the same "
                     f"draw scaled by 1 + rounding_slack, which depends on the block size): "
                     f"{diff:.2e}")
    text = "\n".join(lines)
    print(text)
    if md is not None:
        md.write_text(text + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--n", type=int, default=20_000_000)
    g.add_argument("--d", type=int, default=100)
    sub.add_parser("read")
    f = sub.add_parser("fit")
    f.add_argument("--path", choices=["dask", "memmap"], required=True)
    f.add_argument("--method", choices=["analyze_gauss", "fixed"], required=True)
    f.add_argument("--block-mib", type=float, default=16)
    f.add_argument("--n-iter", type=int, default=3)
    f.add_argument("--workers", type=int, default=2)
    f.add_argument("--cluster", choices=["threads", "processes"], default="threads")
    f.add_argument("--cold", action="store_true")
    a = sub.add_parser("all")
    a.add_argument("--only", type=int, nargs="*", help="indices into the matrix")
    r = sub.add_parser("report")
    r.add_argument("--md", type=Path)
    args = p.parse_args()
    if args.cmd == "generate":
        generate(args.n, args.d)
    elif args.cmd == "read":
        print(json.dumps(read_once()))
    elif args.cmd == "fit":
        print(json.dumps(fit(args.path, args.method, args.block_mib, args.n_iter,
                             args.workers, args.cluster, args.cold)))
    elif args.cmd == "all":
        run_child(["read"])
        for i, (path, method, mib, n_iter, workers, cluster, cold) in enumerate(MATRIX):
            if args.only and i not in args.only:
                continue
            cmd = ["fit", "--path", path, "--method", method, "--block-mib", str(mib),
                   "--n-iter", str(n_iter), "--workers", str(workers), "--cluster", cluster]
            run_child([*cmd, "--cold"] if cold else cmd)
    else:
        report(args.md)


if __name__ == "__main__":
    main()
