"""The code of benchmarks/fl_round_cuda.py on the CPU (no GPU here): arguments, the exit
without CUDA, and one case through the torch backend's code path (issue 22)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("fl_round_cuda", BENCH / "fl_round_cuda.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def test_arguments(script) -> None:
    args = script.parse_args(["--quick"])
    assert (args.device, args.clients, args.rounds, args.rows) == ("cuda", [20], 3, 3000)
    assert script.parse_args(["--clients", "5", "--precisions", "float64"]).precisions == [
        "float64"]
    with pytest.raises(SystemExit):
        script.parse_args(["--rounds", "0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without CUDA")
def test_no_cuda_exits_cleanly_with_status_2(script, capsys) -> None:
    assert script.main(["--quick"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_one_case_on_the_cpu_code_path(script) -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (400, 10))
    y = rng.integers(0, 3, 400)
    data = (X, y, X[:50], y[:50], 3)
    r = script.run_case(data, 4, "fedgd", "float32", 2, "cpu", 0)
    assert r["round"]["n"] == 2 and r["gpu_peak_bytes"] is None
    assert r["x_bytes_on_device"] == 400 * 10 * 4
    assert all(v > 0 for v in r["ratios"].values())
