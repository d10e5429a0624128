"""A federated round on a GPU against one read of X on the device (issue 22).

The same measurement as ``benchmarks/fl_round.py``, with the linear head's kernel on the
torch backend (``FLConfig(backend="torch", device=...)``): one
:func:`dpprecond.fl.run_federated` run (full-batch mechanism, epsilon = 1, the default
method) of ``--rounds + 1`` rounds for every K and precision on Fashion-MNIST pixels
(60000 x 784). Recorded per run:

- seconds per round, from the run's history (rounds 2 onwards; the engine's round ends
  when the sums are back on the host, so the device work is inside it);
- one read of X **on the device** (``X @ v``, float64 and float32 copies, synchronized),
  timed after every round in the run's callback (interleaved), and the ratio of the round
  to it; the ratio to one read of X on the host (numpy, float64) as well;
- GPU memory: ``torch.cuda.max_memory_allocated`` over the run (the rows on the device,
  a float32 copy of them, and the kernel's blocks), and the size of X on the device.

The noise is drawn on the host by the library's noise source (``dpprecond.fl.backend``).

Without a CUDA device the script says so and exits with status 2 (nothing measured),
unless ``--device cpu`` asks for the same code path on the CPU (torch backend), which is
how its code is tested on machines without a GPU.

    # the measurement (a machine with a CUDA GPU)
    PYTHONPATH=src python benchmarks/fl_round_cuda.py --rounds 15 \
        --md docs/data/perf_fl_round_cuda.md
    # the code path on the CPU (smoke test; numbers meaningless)
    PYTHONPATH=src python benchmarks/fl_round_cuda.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check_load, environment, markdown_table, md_write, print_header, summary
from _common import write_json as _write_json

TARGET = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--precisions", nargs="+", default=["float32", "float64"],
                   choices=["float64", "float32"])
    p.add_argument("--algorithm", default=None, help="default: the library's default")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (after round 1)")
    p.add_argument("--rows", type=int, default=None, help="first N training rows only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3000 rows, K = 20, 3 rounds (numbers meaningless)")
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="fl_round_cuda", help="JSON name under benchmarks/out/")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.quick:
        args.rows = args.rows or 3000
        args.clients = [20]
        args.rounds = min(args.rounds, 3)
    return args


class DeviceTimer:
    """Wall time of a device computation (synchronizing CUDA before and after)."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.cuda = torch, device.type == "cuda"

    def __call__(self, fn: Any) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - t0


def run_case(data: tuple[Any, ...], K: int, algorithm: str, precision: str, rounds: int,
             device: str, seed: int) -> dict[str, Any]:
    import torch

    from dpprecond.fl import FLConfig, run_federated

    X, y, Xte, yte, n_classes = data
    dev = torch.device(device)
    timer = DeviceTimer(torch, dev)
    rng = np.random.default_rng(0)
    v = rng.standard_normal(X.shape[1])
    X64 = torch.from_numpy(X).to(dev)
    X32 = X64.to(torch.float32)
    v64 = torch.from_numpy(v).to(dev)
    v32 = v64.to(torch.float32)
    floors: dict[str, list[float]] = {"device read f64": [], "device read f32": [],
                                      "host read f64": []}

    def after_round(record: dict[str, float]) -> None:
        floors["device read f64"].append(timer(lambda: X64 @ v64))
        floors["device read f32"].append(timer(lambda: X32 @ v32))
        floors["host read f64"].append(timer(lambda: X @ v))

    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    cfg = FLConfig(n_rounds=rounds + 1, target_epsilon=1.0, precision=precision,
                   backend="torch", device=device)  # type: ignore[arg-type]
    res = run_federated(X, y, Xte, yte, n_classes, algorithm=algorithm, n_clients=K,
                        config=cfg, seed=seed, callback=after_round)
    peak = (torch.cuda.max_memory_allocated(dev) - base) if cuda else None
    round_s = summary([h["seconds"] for h in res.history[1:]])
    fl = {k: summary(t[1:] if len(t) > 1 else t) for k, t in floors.items()}
    own = "device read f64" if precision == "float64" else "device read f32"
    med = round_s["median"]
    return {"K": K, "algorithm": algorithm, "precision": precision, "device": str(dev),
            "round": round_s, "floors": fl, "gpu_peak_bytes": peak,
            "x_bytes_on_device": X.shape[0] * X.shape[1] * (8 if precision == "float64"
                                                            else 4),
            "ratios": {"to_device_read_f64": med / fl["device read f64"]["median"],
                       "to_device_read_own": med / fl[own]["median"],
                       "to_host_read_f64": med / fl["host read f64"]["median"]},
            "final_accuracy": res.final_accuracy, "epsilon": res.epsilon}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("# torch is not installed: pip install 'dpprecond[torch]'", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"# no CUDA device (torch {torch.__version__} sees none): nothing measured; "
              "run on a GPU machine, or --device cpu for the code path", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dpprecond.fl import DEFAULT_ALGORITHM
    from fl_round import load_data

    algorithm = args.algorithm or DEFAULT_ALGORITHM
    header = print_header("fl_round_cuda: a federated round on the torch backend against "
                          "one read of X on the device")
    gpu = (torch.cuda.get_device_name(torch.device(args.device))
           if args.device.startswith("cuda") else "none (CPU code path)")
    print(f"# torch {torch.__version__}, device {args.device}, GPU: {gpu}", flush=True)
    data = load_data(args.rows, 500 if args.quick else None)
    runs = []
    for K in args.clients:
        for precision in args.precisions:
            r = run_case(data, K, algorithm, precision, args.rounds, args.device, args.seed)
            runs.append(r)
            print(f"# K={K} {precision}: round {r['round']['median']:.4f} s, "
                  f"{r['ratios']['to_device_read_own']:.2f}x a device read", flush=True)
    load_after = check_load("after")
    rows = [[r["K"], r["algorithm"], r["precision"], 1e3 * r["round"]["median"],
             1e3 * r["floors"]["device read f64"]["median"],
             1e3 * r["floors"]["device read f32"]["median"],
             r["ratios"]["to_device_read_f64"], r["ratios"]["to_device_read_own"],
             r["ratios"]["to_host_read_f64"],
             "-" if r["gpu_peak_bytes"] is None else r["gpu_peak_bytes"] / 2**20,
             r["x_bytes_on_device"] / 2**20,
             f"<= {TARGET:g}x " + ("met" if r["ratios"]["to_device_read_f64"] <= TARGET
                                   else "MISSED")] for r in runs]
    table = markdown_table(["K", "algorithm", "precision", "round ms", "device read f64 ms",
                            "device read f32 ms", "/ device read f64", "/ device read own",
                            "/ host read f64", "GPU peak MiB", "X on device MiB", "target"],
                           rows)
    print(table)
    _write_json(args.name, {**header, "load_after": load_after, "command": " ".join(
        sys.argv), "device": args.device, "gpu": gpu, "torch": torch.__version__,
        "runs": runs, "quick": args.quick})
    if args.md:
        md_write(args.md, (
            "# A federated round on the torch backend against one read of X on the device\n\n"
            f"Command: `PYTHONPATH=src python benchmarks/fl_round_cuda.py "
            f"{' '.join(sys.argv[1:])}`\n\nEnvironment: {environment()}; torch "
            f"{torch.__version__}; device {args.device} ({gpu}); load before "
            f"{header['load_before'].get('load')}, after {load_after.get('load')}.\n\n"
            f"{table}\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
