"""A sweep killed with SIGKILL leaves no workers behind and no temporary files that stay."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpprecond._files import atomic_write, remove_stale_temps

CONFIG = """
name = "kill"
output = "out"
[data]
name = "digits"
[federation]
clients = [4]
[privacy]
epsilons = [0.5, 1, 2, 5, 10, "inf"]
[protocol]
rounds = 200
seeds = [0, 1, 2, 3]
reference = "fedgd"
[methods.fedgd]
algorithm = "fedgd"
[methods.sofim]
algorithm = "sofim-lagged"
"""


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie has exited


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_killed_sweep_takes_its_workers_with_it(tmp_path: Path) -> None:
    cfg = tmp_path / "kill.toml"
    cfg.write_text(CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "dpprecond.cli", "experiment", "run",
                             str(cfg), "--jobs", "2", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        workers: list[int] = []
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = [p for p in _children(proc.pid) if _alive(p)]
        assert len(workers) >= 2, "the sweep did not start its workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stale_temporary_files_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f"abc.json.tmp{dead}"
    stale.write_text("{")
    mine = tmp_path / f"def.json.tmp{os.getpid()}"
    mine.write_text("{")
    assert remove_stale_temps(tmp_path) == 1
    assert not stale.exists() and mine.exists()


def test_full_disk_is_a_clear_error(tmp_path: Path) -> None:
    def write(fh) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "x.json"
    with pytest.raises(OSError, match=r"x.json.*disk is full"):
        atomic_write(target, write)
    assert list(tmp_path.iterdir()) == []  # no partial file left
