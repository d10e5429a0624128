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
    """One line describing the machine and the BLAS that numpy runs."""
    blas = "unknown BLAS"
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            i = info[0]
            blas = f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
    except ImportError:
        pass
    return (f"python {sys.version.split()[0]}, numpy {np.__version__}, {blas}, "
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
