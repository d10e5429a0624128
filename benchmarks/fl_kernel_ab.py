"""The linear head's round kernel against a reference tree's, interleaved in one process.

Times :func:`dpprecond.fl.kernels.clipped_sums` of this tree and of a reference source tree
(``--ref-src``, for instance main's ``src`` from ``git archive``) on Fashion-MNIST pixels
(60000 x 784, 10 classes), shared parameters, clip norm 1, K equal clients, alternating
reference, current and one read of X (``X @ v``, float64) call by call, so that both
kernels see the same load. Reports the medians, the ratio current / reference, the ratio
to the read, and the max abs difference of the two kernels' sums (float64: summation
order only). With ``--parts`` it also times, per K, the round's two other per-client costs:
the clients' noise streams (:func:`dpprecond.fl.client.round_generators`) and the noisy
releases (:func:`dpprecond.fl.client.add_client_noise`, K draws of ``(d + 1) k`` normals):
where a round at K = 100 costs more than at K = 20.

    git archive main src | tar -x -C /tmp/main-src
    PYTHONPATH=src python benchmarks/fl_kernel_ab.py --ref-src /tmp/main-src/src
    PYTHONPATH=src python benchmarks/fl_kernel_ab.py --ref-src /tmp/main-src/src --quick

The reference tree's ``fl/kernels.py`` and ``fl/backend.py`` are loaded as a separate
package (their ``dpprecond.fl.backend`` import pointed at the reference copy).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment
from dpprecond.fl import kernels as current
from dpprecond.fl.client import add_client_noise, round_generators


def load_reference(src: Path) -> Any:
    """The reference tree's kernels module, with its own backend module."""
    pkg = types.ModuleType("ref_fl")
    pkg.__path__ = []
    sys.modules["ref_fl"] = pkg
    mods = {}
    for name in ("backend", "kernels"):
        code = (src / "dpprecond" / "fl" / f"{name}.py").read_text()
        code = code.replace("from dpprecond.fl.backend import", "from ref_fl.backend import")
        mod = types.ModuleType(f"ref_fl.{name}")
        mod.__file__ = str(src / "dpprecond" / "fl" / f"{name}.py")
        sys.modules[mod.__name__] = mod
        exec(compile(code, mod.__file__, "exec"), mod.__dict__)
        mods[name] = mod
    return mods["kernels"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref-src", type=Path, required=True, help="the reference tree's src/")
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--repeats", type=int, default=9, help="timed calls of each (after one)")
    p.add_argument("--precision", choices=["float64", "float32"], default="float64")
    p.add_argument("--parts", action="store_true",
                   help="also time the noise streams and the noisy releases per K")
    p.add_argument("--quick", action="store_true", help="3000 rows, 3 repeats (smoke test)")
    args = p.parse_args()
    reference = load_reference(args.ref_src)
    from dpprecond.features import load_features

    ds, _ = load_features("fashion-mnist")
    X = np.ascontiguousarray(ds.X_train, dtype=np.float64)
    y = ds.y_train
    if args.quick:
        X, y, args.repeats = X[:3000], y[:3000], 3
    Xk = X if args.precision == "float64" else X.astype(np.float32)
    n, d = X.shape
    rng = np.random.default_rng(0)
    W = rng.standard_normal((d + 1, ds.n_classes)) * 0.01
    sq = np.einsum("ij,ij->i", Xk, Xk, dtype=np.float64)
    v = rng.standard_normal(d)
    root = np.random.SeedSequence(0)
    print(f"# {environment()}; load before {os.getloadavg()}", flush=True)
    for K in args.clients:
        bounds = np.linspace(0, n, K + 1).astype(np.int64)
        times: dict[str, list[float]] = {"reference": [], "current": [], "read": [],
                                         "streams": [], "noise": []}
        for r in range(args.repeats + 1):
            t0 = time.perf_counter()
            a, _ = reference.clipped_sums(Xk, y, W, bounds, 1.0, sq)
            t1 = time.perf_counter()
            b, _ = current.clipped_sums(Xk, y, W, bounds, 1.0, sq)
            t2 = time.perf_counter()
            X @ v
            t3 = time.perf_counter()
            if args.parts:
                rngs = round_generators(root, r, K)
                t4 = time.perf_counter()
                add_client_noise(b.reshape(K, -1).copy(), 0.5, rngs)
                t5 = time.perf_counter()
            if r:  # the first call warms the pools up
                times["reference"].append(t1 - t0)
                times["current"].append(t2 - t1)
                times["read"].append(t3 - t2)
                if args.parts:
                    times["streams"].append(t4 - t3)
                    times["noise"].append(t5 - t4)
        med = {key: 1e3 * float(np.median(t)) if t else 0.0 for key, t in times.items()}
        print(f"K={K} {args.precision}: reference {med['reference']:.1f} ms, current "
              f"{med['current']:.1f} ms (current / reference "
              f"{med['current'] / med['reference']:.2f}), read {med['read']:.1f} ms "
              f"(current / read {med['current'] / med['read']:.2f}); max abs difference of "
              f"the sums {float(np.max(np.abs(a - b))):.2e} (largest sum "
              f"{float(np.max(np.abs(a))):.2e}); 1-min load {os.getloadavg()[0]:.2f}",
              flush=True)
        if args.parts:
            print(f"K={K}: noise streams {med['streams']:.1f} ms, noisy releases "
                  f"{med['noise']:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
