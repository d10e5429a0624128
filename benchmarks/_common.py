"""Shared helpers of the benchmark scripts: timing, environment line, markdown tables.

Benchmarks are scripts, never tests. Each prints ratios against a reference measured in the
same run, since the machines are shared and noisy; quote medians and ratios.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

OUT_DIR = Path(__file__).resolve().parent / "out"


def median_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def environment() -> str:
    """One line describing the machine and every BLAS loaded (numpy's, scipy's), with threads."""
    libs = blas_libraries()
    blas = "; ".join(f"{b['owner']} {b['api']} {b['version']} ({b['threads']} threads)"
                     for b in libs) or "unknown BLAS"
    return (f"python {sys.version.split()[0]}, numpy {np.__version__}, BLAS: {blas}, "
            f"{os.cpu_count()} cores, {platform.machine()}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats get 3 significant digits."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# -- helpers of the speed benchmarks of issue 13 (pca_speed, fl_round, memory, cost_growth,
# -- peers): thread and load reporting, interleaved timing, JSON output, RSS --------------

#: Environment variables that set the number of BLAS/OpenMP threads.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_libraries() -> list[dict[str, Any]]:
    """Every BLAS loaded in the process (threadpoolctl), with the package that ships it.

    numpy and scipy wheels each ship their own OpenBLAS (numpy's runs ``X @ Y``, scipy's
    runs ``scipy.linalg``, e.g. ``eigh``), possibly of different versions.
    """
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    out = []
    for i in threadpool_info():
        if i.get("user_api") != "blas":
            continue
        path = str(i.get("filepath") or "")
        owner = next((pkg for pkg in ("numpy", "scipy", "torch") if f"{pkg}." in path
                      or f"/{pkg}/" in path), "other")
        out.append({"owner": owner, "api": i.get("internal_api"), "version": i.get("version"),
                    "threads": i.get("num_threads"), "library": path})
    return out


def environment_info() -> dict[str, Any]:
    """The environment as a dict (for the JSON outputs): versions, BLAS, threads, cores."""
    return {"line": environment(), "python": sys.version.split()[0],
            "numpy": np.__version__, "blas": blas_libraries(), "cores": os.cpu_count(),
            "machine": platform.machine(),
            "thread_env": {v: os.environ.get(v) for v in THREAD_VARS}}


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """(machine busy CPU-seconds, this process's and its children's CPU-seconds, wall)."""
    try:
        with open("/proc/stat") as fh:
            vals = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system, time.perf_counter()


_START = _cpu_snapshot()

#: Other processes may use at most this many cores on average during a run.
MAX_OTHER_CORES = 0.25


def others_cores(start: tuple[float, float, float] | None = None) -> float | None:
    """Cores used on average by *other* processes since ``start`` (default: import time).

    The machine's busy CPU time (``/proc/stat``) minus this process's and its children's,
    over the wall time. Unlike the load average, this does not count the benchmark itself.
    """
    start = start or _START
    end = _cpu_snapshot()
    if start is None or end is None or end[2] <= start[2]:
        return None
    return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2]))


def check_load(label: str = "before") -> dict[str, Any]:
    """Print the load average and warn loudly when the machine is busy.

    Before a run: a 1-minute load above half the number of cores means other processes
    compete for the cores. After a run (``label`` starting with "after"): the load average
    then counts the benchmark's own threads, so the verdict is the CPU that *other*
    processes used during the run (:func:`others_cores`), above
    :data:`MAX_OTHER_CORES` cores on average. The result goes into the JSON so that a
    reader can discard such a run.
    """
    cores = os.cpu_count() or 1
    try:
        load1, load5, load15 = os.getloadavg()
    except OSError:  # not available on this platform
        print(f"# load {label}: unknown (os.getloadavg unavailable)", flush=True)
        return {"label": label, "load": None, "cores": cores, "disturbed": None}
    others = others_cores() if label.startswith("after") else None
    if others is not None:
        print(f"# other processes used {others:.2f} cores on average during the run", flush=True)
        disturbed = others > MAX_OTHER_CORES
    else:
        disturbed = load1 > 0.5 * cores
    print(f"# load {label}: {load1:.2f} {load5:.2f} {load15:.2f} (1/5/15 min) on {cores} cores",
          flush=True)
    if disturbed:
        bar = "!" * 78
        why = (f"other processes used {others:.2f} cores" if others is not None
               else f"1-min load {load1:.2f} > 0.5 x {cores} cores")
        print(f"{bar}\n!! WARNING: {why}: the machine is busy,\n!! this run is DISTURBED; do "
              f"not quote its times (rerun on a quiet machine).\n{bar}", file=sys.stderr,
              flush=True)
    return {"label": label, "load": [load1, load5, load15], "cores": cores,
            "others_cores": others, "disturbed": disturbed}


def was_disturbed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """The verdict of a run: the CPU other processes used during it when known (the load
    average before a later part of a run counts the benchmark's own earlier parts), else the
    load averages before and after."""
    if after.get("others_cores") is not None:
        return bool(after["disturbed"])
    return bool(before.get("disturbed") or after.get("disturbed"))


def print_header(title: str) -> dict[str, Any]:
    """Print the title, the environment line and the load; return them for the JSON."""
    print(f"# {title}", flush=True)
    print(f"# {environment()}", flush=True)
    print("# thread variables: " + ", ".join(f"{v}={os.environ.get(v, 'unset')}"
                                             for v in THREAD_VARS), flush=True)
    return {"title": title, "environment": environment_info(), "load_before": check_load()}


def interleaved(cases: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                after: Callable[[str, Any], None] | None = None) -> dict[str, list[float]]:
    """Wall times of every case, interleaved: A, B, C, A, B, C, ... (``repeats`` rounds).

    Each case runs ``warmup`` times first (imports, page faults, BLAS thread start-up).
    Interleaving makes a drift of a shared machine hit every case alike, so ratios of
    medians stay meaningful when absolute times move. ``after(name, result)`` is called
    after each timed call (outside the timing) to collect what the call returned.
    """
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            res = fn()
            times[name].append(time.perf_counter() - t0)
            if after is not None:
                after(name, res)
    return times


def summary(times: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the raw times of one case (seconds)."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "n": len(times), "times": list(times)}


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``benchmarks/out/<name>.json`` (ignored by git); return the path."""
    import json

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n",
                    encoding="utf-8")
    print(f"# wrote {path}", flush=True)
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the peak RSS (``VmHWM``) to the current RSS; False where Linux refuses it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def md_write(path: Path, text: str) -> None:
    """Write a markdown report (creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"# wrote {path}", flush=True)
