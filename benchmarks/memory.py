"""Peak memory of a federated run and of a default PCA fit against the size of the data.

Issue 13: the peak memory of a federated run and of a PCA fit should be at most the data
plus a few row blocks. Each case runs in a FRESH Python process (``--child CASE``) that

1. imports numpy and dpprecond (``rss_after_imports``),
2. loads Fashion-MNIST and keeps only what the case needs (``rss_after_load``; the size of
   the training matrix ``X`` in bytes is ``x_bytes``),
3. resets the kernel's peak-RSS counter to the current RSS (``/proc/self/clear_refs``,
   Linux; the baseline is then ``rss_after_load``),
4. runs the case, then reads the peak (``VmHWM`` of ``/proc/self/status``).

Reported: ``peak - baseline`` (the memory the run added on top of the loaded data) and its
ratio to ``x_bytes``, and the same in units of the library's row block. A thread samples
the RSS every few milliseconds and keeps the main thread's stack at the largest sample, so
the report also says where the peak happened (the sampled peak can miss a short spike that
``VmHWM`` catches). If the peak counter cannot be reset, ``ru_maxrss`` (the whole
process's peak, loading included) is reported instead and flagged.

Cases: ``fl`` (:func:`dpprecond.fl.run_federated`, K = 20, 5 rounds, default algorithm,
full-batch, epsilon = 1, pixels ``(x - 0.5) / 0.5``), ``fl-float32`` (the same with
``precision="float32"``), ``fl-simulate`` (the same run through
:func:`dpprecond.fl.simulate` on a :class:`~dpprecond.fl.ClientData` whose rows the caller
already holds in client order, so the run makes no copy of X), ``pca`` and
``pca-centered`` (:func:`dpprecond.pca.fit_private_pca`, default method, k = 10,
epsilon = 1, delta = 1e-6, row_norm = 28, ``center=None`` or ``"private"``; X in [0, 1]).

    # smoke test (5000 rows; seconds)
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/memory.py --quick
    # the measurement
    PYTHONPATH=src python benchmarks/memory.py --md docs/data/perf_memory.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    check_load,
    environment,
    markdown_table,
    md_write,
    print_header,
    proc_status_bytes,
    reset_peak_rss,
    write_json,
)

CASES = ("fl", "fl-float32", "fl-simulate", "pca", "pca-centered")
MIB = 2.0**20


class PeakSampler:
    """Samples ``VmRSS`` every ``interval`` s; keeps the main thread's stack at the maximum."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = 0
        self.stack: list[str] = []
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = proc_status_bytes("VmRSS") or 0
            if rss > self.peak:
                self.peak = rss
                frame = sys._current_frames().get(self._main)
                if frame is not None:
                    self.stack = [f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                  for f in traceback.extract_stack(frame)
                                  if "dpprecond" in f.filename or "numpy" in f.filename][-6:]
            time.sleep(self.interval)


def child(case: str, rows: int | None) -> dict[str, Any]:
    """Run one case in this (fresh) process and return its memory figures."""
    import numpy as np

    import dpprecond  # noqa: F401  (imports counted in the baseline)

    rss_imports = proc_status_bytes("VmRSS")
    if case.startswith("fl"):
        from dpprecond.features import load_features
        from dpprecond.fl import DEFAULT_ALGORITHM, FLConfig, run_federated
        from dpprecond.fl.kernels import DEFAULT_BLOCK_ROWS

        ds, _ = load_features("fashion-mnist")
        X, y, Xte, yte = ds.X_train, ds.y_train, ds.X_test, ds.y_test
        if rows is not None:
            X, y = np.ascontiguousarray(X[:rows]), y[:rows]
            Xte, yte = Xte[:1000], yte[:1000]
        n_classes = ds.n_classes
        del ds
        block_bytes = DEFAULT_BLOCK_ROWS * X.shape[1] * 8
        precision = "float32" if case == "fl-float32" else "float64"

        config = FLConfig(n_rounds=5, target_epsilon=1.0, precision=precision)
        if case == "fl-simulate":  # the caller's rows, already in client order: no copy
            from dpprecond.fl import ClientData, make_method, simulate
            from dpprecond.fl.models import LinearSoftmax

            bounds = np.linspace(0, X.shape[0], 21).astype(np.int64)
            data = ClientData(X, y, bounds, n_classes)

            def run() -> Any:
                return simulate(LinearSoftmax(X.shape[1], n_classes), data,
                                make_method(DEFAULT_ALGORITHM), config, X_test=Xte,
                                y_test=yte, seed=0)

            what = f"simulate({DEFAULT_ALGORITHM}, ClientData in client order, K=20, 5 rounds)"
        else:
            def run() -> Any:
                return run_federated(X, y, Xte, yte, n_classes, n_clients=20, seed=0,
                                     config=config)

            what = (f"run_federated({DEFAULT_ALGORITHM}, K=20, 5 rounds, full-batch, eps=1, "
                    f"{precision})")
    else:
        from dpprecond.data import load_dataset
        from dpprecond.pca import fit_private_pca
        from dpprecond.pca.api import DEFAULT_METHOD
        from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES

        X = np.ascontiguousarray(load_dataset("fashion-mnist").X_train, dtype=np.float64)
        if rows is not None:
            X = np.ascontiguousarray(X[:rows])
        block_bytes = DEFAULT_BLOCK_BYTES
        center = "private" if case == "pca-centered" else None

        def run() -> Any:
            return fit_private_pca(X, 10, target_epsilon=1.0, target_delta=1e-6,
                                   row_norm=28.0, center=center, seed=0)

        what = f"fit_private_pca({DEFAULT_METHOD}, k=10, eps=1, center={center!r})"
    gc.collect()
    rss_load = proc_status_bytes("VmRSS")
    reset_ok = reset_peak_rss()
    baseline = proc_status_bytes("VmRSS") if reset_ok else rss_load
    t0 = time.perf_counter()
    with PeakSampler() as sampler:
        run()
    seconds = time.perf_counter() - t0
    if reset_ok:
        peak = proc_status_bytes("VmHWM")
        source = "VmHWM after reset"
    else:  # ru_maxrss is in KiB on Linux: the process's lifetime peak, loading included
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        source = "ru_maxrss (lifetime peak: loading included, NOT reset)"
    extra = (peak or 0) - (baseline or 0)
    return {"case": case, "what": what, "n": X.shape[0], "d": X.shape[1],
            "x_bytes": X.nbytes, "x_dtype": str(X.dtype), "rss_after_imports": rss_imports,
            "rss_after_load": rss_load, "baseline": baseline, "peak": peak,
            "peak_source": source, "extra": extra, "extra_over_x": extra / X.nbytes,
            "block_bytes": block_bytes, "extra_in_blocks": extra / block_bytes,
            "sampled_peak": sampler.peak, "stack_at_sampled_peak": sampler.stack,
            "seconds": seconds, "pid": os.getpid()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--rows", type=int, default=None, help="first N training rows only")
    p.add_argument("--quick", action="store_true", help="smoke test: 5000 rows")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="memory", help="JSON name under benchmarks/out/")
    args = p.parse_args()
    if args.quick:
        args.rows = args.rows or 5000
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.rows)), flush=True)
        return

    header = print_header("memory: peak RSS of a federated run and a PCA fit against X")
    results = []
    for case in args.cases:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case]
        if args.rows is not None:
            cmd += ["--rows", str(args.rows)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=os.environ.copy(), check=False)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"# case {case} FAILED (exit {proc.returncode}):\n{proc.stderr[-2000:]}",
                  file=sys.stderr, flush=True)
            results.append({"case": case, "failed": True, "stderr": proc.stderr[-2000:]})
            continue
        r = json.loads(line[len("RESULT "):])
        results.append(r)
        print(f"# {case}: +{r['extra'] / MIB:.0f} MiB over the loaded data "
              f"({r['extra_over_x']:.2f}x X, {r['extra_in_blocks']:.1f} row blocks); peak at "
              f"{' > '.join(r['stack_at_sampled_peak'][-3:]) or '?'}", flush=True)
    load_after = check_load("after")
    rows = [[r["case"], r.get("what", "-"), f"{r['n']} x {r['d']} {r['x_dtype']}",
             r["x_bytes"] / MIB, r["rss_after_imports"] / MIB, r["baseline"] / MIB,
             r["peak"] / MIB, r["extra"] / MIB, r["extra_over_x"], r["extra_in_blocks"],
             (r["stack_at_sampled_peak"] or ["?"])[-1]]
            for r in results if not r.get("failed")]
    table = markdown_table(
        ["case", "run", "X", "X MiB", "RSS after imports MiB", "baseline (X loaded) MiB",
         "peak MiB", "peak - baseline MiB", "/ X bytes", "/ row block", "sampled peak at"],
        rows)
    note = ("Target (issue 13): peak - baseline at most a few row blocks, i.e. the data "
            "plus a few blocks. Row block: 16 MiB for PCA (`pca.rows.DEFAULT_BLOCK_BYTES`), "
            "2048 rows x d x 8 B for the federated kernel. Peak source: "
            + ", ".join(sorted({r["peak_source"] for r in results if not r.get("failed")})))
    print(table)
    print(note)
    write_json(args.name, {**header, "load_after": load_after, "command": " ".join(sys.argv),
                           "quick": args.quick, "results": results})
    if args.md:
        md_write(args.md, (
            "# Peak memory against the size of the data\n\n"
            f"Command: `PYTHONPATH=src python benchmarks/memory.py "
            f"{' '.join(sys.argv[1:])}`\n\nEnvironment: {environment()}.\n\n"
            f"Each case in a fresh process.\n\n{table}\n\n{note}\n"))


if __name__ == "__main__":
    main()
