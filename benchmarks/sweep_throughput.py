"""Sweep throughput: runs per minute of ``dpprecond experiment run --jobs 2`` (issue 22).

On a committed grid subset (``benchmarks/configs/sweep-fashion-mnist.toml``: 8 Fashion-MNIST
runs of 70 rounds, K in {20, 100}), each variant is one ``experiment run CONFIG --jobs 2
--no-progress`` in a fresh process and a fresh output folder (nothing resumed), and the
variants are interleaved (A, B, C, A, B, C, ...) ``--repeats`` times:

- ``reference``: the same command with another checkout's code (``--ref-src``, e.g. a
  ``git archive`` of main's ``src``), the "today" of the target;
- ``float64``: this checkout, the default configuration (the committed result cells' runs,
  up to the noise inflation of the corrected rounding bound and the summation order);
- ``float32``: this checkout with ``[protocol] precision = "float32"``;
- ``torch`` (with ``--torch``): this checkout with ``[protocol] backend = "torch"``.

Runs per minute are ``runs / wall seconds * 60`` of the whole command (process start,
data loading and the workers included), medians over the repeats; the ratio is to the
reference's median. The load and the disturbance verdict are printed (``_common``).

    # smoke test (2 runs of 3 rounds on digits; numbers meaningless)
    PYTHONPATH=src python benchmarks/sweep_throughput.py --quick
    # the measurement (quiet machine)
    git archive main src | tar -x -C /tmp/main-src
    PYTHONPATH=src python benchmarks/sweep_throughput.py --ref-src /tmp/main-src/src \\
        --repeats 3 --md docs/data/perf_sweep.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    check_load,
    environment,
    markdown_table,
    md_write,
    print_header,
    was_disturbed,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = Path(__file__).resolve().parent / "configs" / "sweep-fashion-mnist.toml"


def _toml_value(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def write_variant(raw: dict[str, Any], path: Path, output: Path,
                  protocol: dict[str, Any]) -> None:
    """The config with its own output folder and extra ``[protocol]`` keys (TOML)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)
             and k != "output"]
    lines.append(f"output = {json.dumps(output.as_posix())}")
    for table, body in raw.items():
        if not isinstance(body, dict):
            continue
        if table == "methods":
            for name, opts in body.items():
                lines.append(f"\n[methods.{name}]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in opts.items()]
            continue
        lines.append(f"\n[{table}]")
        extra = protocol if table == "protocol" else {}
        lines += [f"{k} = {_toml_value(v)}" for k, v in {**body, **extra}.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def quick_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """The smoke-test grid: digits, K = 20, one epsilon, 3 rounds."""
    raw = json.loads(json.dumps(raw))
    raw["data"] = {"name": "digits", "features": "pixels"}
    raw["federation"]["clients"] = [20]
    raw["privacy"]["epsilons"] = [1]
    raw["protocol"]["rounds"] = 3
    return raw


def one_sweep(cfg: Path, out: Path, src: Path, jobs: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "dpprecond.cli", "experiment", "run", str(cfg),
           "--jobs", str(jobs), "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (PYTHONPATH={src}) failed:\n"
                           f"{proc.stderr[-3000:]}")
    runs = sorted((out / "runs").glob("*.json"))
    return {"wall": wall, "runs": len(runs), "runs_per_minute": 60.0 * len(runs) / wall,
            "sum_run_seconds": sum(json.loads(p.read_text())["seconds"] for p in runs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--ref-src", type=Path, default=None,
                   help="the reference checkout's src folder (e.g. main's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--torch", action="store_true", help="also the torch backend (CPU)")
    p.add_argument("--quick", action="store_true", help="smoke test (digits, 3 rounds)")
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="sweep_throughput", help="JSON name in benchmarks/out")
    args = p.parse_args()
    with args.config.open("rb") as fh:
        raw = tomllib.load(fh)
    if args.quick:
        raw = quick_raw(raw)
        args.repeats = min(args.repeats, 1)
    ours = ROOT / "src"
    variants: dict[str, tuple[Path, dict[str, Any]]] = {}
    if args.ref_src is not None:
        variants["reference"] = (args.ref_src.resolve(), {})
    variants["float64"] = (ours, {})
    variants["float32"] = (ours, {"precision": "float32"})
    if args.torch:
        variants["torch"] = (ours, {"backend": "torch"})

    header = print_header("sweep_throughput: runs per minute of experiment run --jobs "
                          f"{args.jobs}")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="perf-sweep-") as tmp:
        for rep in range(args.repeats):
            for label, (src, protocol) in variants.items():  # interleaved
                out = Path(tmp) / f"{label}-{rep}"
                cfg = Path(tmp) / f"{label}-{rep}.toml"
                write_variant(raw, cfg, out, protocol)
                r = one_sweep(cfg, out, src, args.jobs)
                results[label].append(r)
                print(f"# {label} #{rep}: {r['runs']} runs in {r['wall']:.1f} s, "
                      f"{r['runs_per_minute']:.2f} runs/min", flush=True)
    load_after = check_load("after")
    med = {k: statistics.median(r["runs_per_minute"] for r in v) for k, v in results.items()}
    ref = med.get("reference")
    rows = [[k, results[k][0]["runs"], med[k],
             statistics.median(r["wall"] for r in results[k]),
             "-" if ref is None else med[k] / ref] for k in variants]
    table = markdown_table(["variant", "runs", "runs / min (median)", "wall s (median)",
                            "/ reference"], rows)
    disturbed = was_disturbed(header["load_before"], load_after)
    print(table)
    print(f"# disturbed: {disturbed}")
    write_json(args.name, {**header, "load_after": load_after, "command": " ".join(sys.argv),
                           "config": str(args.config), "jobs": args.jobs, "raw": results,
                           "median_runs_per_minute": med, "disturbed": disturbed,
                           "quick": args.quick})
    if args.md:
        md_write(args.md, (
            "# Sweep throughput: runs per minute of `experiment run --jobs "
            f"{args.jobs}`\n\nCommand: `PYTHONPATH=src python benchmarks/sweep_throughput.py "
            f"{' '.join(sys.argv[1:])}`\n\nGrid: `{args.config.relative_to(ROOT)}`. "
            f"Environment: {environment()}; load before "
            f"{header['load_before'].get('load')}, after {load_after.get('load')}; "
            f"disturbed: {disturbed}.\n\nMedians of {args.repeats} interleaved repeats.\n\n"
            f"{table}\n"))


if __name__ == "__main__":
    main()
