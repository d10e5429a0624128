"""``flwr run examples/flower-app --stream`` end to end, as a Flower user runs it (smoke test).

Flower's CLI starts its managed local SuperLink (simulation runtime) on first use; the test
gives it its own home (``FLWR_HOME``), ports and Ray directory, so it neither sees nor
disturbs another Flower on the machine, and every process it starts carries a marker in its
command line. It checks that the app installs nothing from the package index, that the
federation size follows the SuperNodes, that server-side accuracy is reported as Flower's
ServerApp-side evaluate metrics, that a bad run config fails with the app's named error
and a suggestion before any round, that ``trust = "secure-aggregation"`` runs on
Flower's SecAgg+, that the pre-flight check exits non-zero, that the PCA app
(``examples/flower-pca-app``) fits on a 3-node federation, logs its epsilon, writes its
files and refuses a typo by name, and that
nothing is left running: after each run only the SuperLink Flower keeps on purpose (and
its SuperExec) remain, and once that is stopped, nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-app"
PCA_APP = APP.parent / "flower-pca-app"
BIN = Path(sys.executable).parent
TINY = "n-rounds=2 target-epsilon=2.0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalFlower:
    """A private FLWR_HOME, ports and Ray directory; the processes they mark."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.http, self.control = _free_port(), _free_port()
        self.env = {**os.environ, "FLWR_HOME": str(root / "home"),
                    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http),
                    "FLWR_LOCAL_CONTROL_API_PORT": str(self.control),
                    "RAY_TMPDIR": str(root / "ray"), "FLWR_DISABLE_UPDATE_CHECK": "1",
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def markers(self) -> tuple[str, ...]:
        return (str(self.root), f"127.0.0.1:{self.http}", f"127.0.0.1:{self.control}")

    def processes(self) -> dict[int, str]:
        """Live (not zombie) processes whose command line carries one of the markers."""
        out: dict[int, str] = {}
        for marker in self.markers():
            found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True)
            for line in found.stdout.splitlines():
                pid_text, _, cmd = line.partition(" ")
                pid = int(pid_text)
                if pid == os.getpid() or "pgrep" in cmd or not _alive(pid):
                    continue
                out[pid] = cmd
        return out

    def run(self, *args: str, timeout: float = 400.0,
            app: Path = APP) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "flwr"), "run", str(app), "--stream", *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=self.root)

    def settle(self, timeout: float = 60.0) -> dict[int, str]:
        """Wait until only the SuperLink and its SuperExec are left; return what is left."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.processes()
            rest = {p: c for p, c in left.items()
                    if "flower-superlink" not in c and "flower-superexec" not in c}
            if not rest or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def stop(self) -> None:
        for pid, cmd in self.processes().items():
            if "flower-superlink" in cmd:
                os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def flower() -> Iterator[LocalFlower]:
    root = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))  # short: Ray's socket paths
    local = LocalFlower(root)
    try:
        yield local
    finally:
        local.stop()
        deadline = time.monotonic() + 30
        while local.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in local.processes():  # pragma: no cover - only if the assertion failed
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def test_flwr_run_of_the_example_app_from_a_fresh_home(flower: LocalFlower) -> None:
    ok = flower.run("--run-config", TINY)
    log = ok.stdout + ok.stderr
    assert ok.returncode == 0, log
    assert "No non-`flwr` dependencies found" in log  # nothing installed from the index
    assert "(2 simulated SuperNodes)" in log
    assert "DPFedStrategy: sofim-lagged, K=2 clients" in log or "[ROUND 2/2]" in log
    served = log.split("ServerApp-side Evaluate Metrics", 1)
    assert len(served) == 2 and "test-accuracy" in served[1], log
    train = log.split("Aggregated ClientApp-side Train Metrics", 1)[1].split(
        "ServerApp-side Evaluate Metrics", 1)[0]
    assert "test-accuracy" not in train and "epsilon" in train
    left = flower.settle()
    assert all("flower-superlink" in c or "flower-superexec" in c for c in left.values()), left

    # a typo in a value: the app's named error with a suggestion, before any round
    bad = flower.run("--run-config", "algorithm='scafold'")
    log = bad.stdout + bad.stderr
    assert "RunConfigError" in log and "did you mean 'scaffold'" in log, log
    assert "[ROUND 1/" not in log
    left = flower.settle()
    assert all("flower-superlink" in c or "flower-superexec" in c for c in left.values()), left

    # secure aggregation: the same app on Flower's SecAgg+ with distributed noise
    sec = flower.run("--run-config", f"{TINY} trust='secure-aggregation' weighting='size'")
    log = sec.stdout + sec.stderr
    assert sec.returncode == 0, log
    assert log.count("Secure aggregation completed") == 2, log
    left = flower.settle()
    assert all("flower-superlink" in c or "flower-superexec" in c for c in left.values()), left

    # stopping Flower's SuperLink leaves nothing running
    flower.stop()
    deadline = time.monotonic() + 30
    while flower.processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert flower.processes() == {}


def _only_the_superlink_left(flower: LocalFlower) -> None:
    left = flower.settle()
    assert all("flower-superlink" in c or "flower-superexec" in c for c in left.values()), left


def test_flwr_run_of_the_pca_app_from_a_fresh_home(flower: LocalFlower) -> None:
    """``flwr run examples/flower-pca-app --stream``: the fit, its log line and its files."""
    out = flower.root / "out"
    ok = flower.run("--run-config", f"n-components=3 output-dir='{out}'",
                    "--federation-config", "num-supernodes=3", app=PCA_APP)
    log = ok.stdout + ok.stderr
    assert ok.returncode == 0, log
    assert "No non-`flwr` dependencies found" in log  # nothing installed from the index
    assert "(3 simulated SuperNodes)" in log  # n-clients = 0 follows the federation
    line = re.search(r"federated PCA \(auto, k=3, 3 clients, trust=local\): "
                     r"epsilon=([0-9.]+) at delta=1e-06", log)
    assert line is not None, log
    saved = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert 0.99 < saved["epsilon"] <= 1.0 and saved["trust"] == "local"  # target-epsilon 1
    assert float(line.group(1)) == pytest.approx(saved["epsilon"], rel=1e-5)
    assert np.load(out / "components.npy").shape == (3, 64)
    _only_the_superlink_left(flower)

    # secure aggregation: every release one SecAgg+ masked sum, on the same 3 SuperNodes
    sec_out = flower.root / "out-secure"
    sec = flower.run("--run-config", f"n-components=3 output-dir='{sec_out}' "
                     "trust='secure-aggregation'",
                     "--federation-config", "num-supernodes=3", app=PCA_APP)
    log = sec.stdout + sec.stderr
    assert sec.returncode == 0, log
    assert re.search(r"federated PCA \(auto, k=3, 3 clients, trust=secure-aggregation\): "
                     r"epsilon=[0-9.]+ at delta=1e-06", log), log
    saved = json.loads((sec_out / "result.json").read_text(encoding="utf-8"))
    assert saved["trust"] == "secure-aggregation" and 0.99 < saved["epsilon"] <= 1.0
    n_sums = saved["info"]["secure_aggregation"]["n_sums"]
    assert log.count("Secure aggregation completed") == n_sums >= 2, log  # M1, [probe], M2
    _only_the_superlink_left(flower)

    # a typo in a value: the app's named error with a suggestion, before any message
    bad = flower.run("--run-config", "method='analyse_gauss'", app=PCA_APP)
    log = bad.stdout + bad.stderr
    assert "RunConfigError" in log and "did you mean 'analyze_gauss'" in log, log
    assert "federated PCA (" not in log
    _only_the_superlink_left(flower)

    flower.stop()  # stopping Flower's SuperLink leaves nothing running
    deadline = time.monotonic() + 30
    while flower.processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert flower.processes() == {}


def test_the_preflight_check_exits_non_zero_on_a_bad_run_config() -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dpprecond.adapters.flower.app",
                               str(APP), *args], capture_output=True, text=True, timeout=120)

    good = check("--run-config", TINY)
    assert good.returncode == 0, good.stderr
    bad = check("--run-config", "algorithm='scafold'")
    assert bad.returncode == 2 and "did you mean 'scaffold'" in bad.stderr
    typo = check("--run-config", "max_epsilon=2.0")
    assert typo.returncode == 2 and "did you mean 'max-epsilon'" in typo.stderr
    value = check("--run-config", "clip-norm=-1.0")
    assert value.returncode == 2 and "clip" in value.stderr
    adaptive = check("--run-config", f"{TINY} adaptive-clip=true")
    assert adaptive.returncode == 0, adaptive.stderr
    flag = check("--run-config", "adaptive-clip='yes'")
    assert flag.returncode == 2 and "run config adaptive-clip" in flag.stderr
