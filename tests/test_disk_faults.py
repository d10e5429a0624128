"""Corrupt checkpoints and a full disk during checkpoint and result writes.

A fault-injecting writer stands in for a full disk: every file that
:func:`dpprecond._files.atomic_write` opens accepts a budget of bytes, then raises
``OSError(ENOSPC)`` as a full file system does. Each test checks that nothing already on
disk is lost (the previous checkpoint or result file is intact and readable), that no
temporary file is left behind, that the error names the file and says the disk is full,
and that a run resumes once there is space again. Corrupt checkpoints (truncated, bytes
flipped, empty, a directory) are a ``ValueError`` naming the file, and ``simulate`` refuses
to resume from them without deleting them.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpprecond._files as files
from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.checkpoint import load_checkpoint
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition
from tests.fl.conftest import make_problem

ROUNDS = 6


class FullDisk:
    """``open`` for :mod:`dpprecond._files`: after ``budget`` bytes, writes fail (ENOSPC)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.opened: list[Path] = []

    def __call__(self, path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        handle = open(path, mode, *args, **kw)
        if "w" not in mode:
            return handle
        self.opened.append(Path(path))
        disk = self

        class Handle:
            def write(self, data: Any) -> int:
                size = len(memoryview(data).cast("B"))
                if size > disk.budget:
                    handle.write(bytes(memoryview(data).cast("B")[:disk.budget]))
                    disk.budget = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                disk.budget -= size
                return handle.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

            def __enter__(self) -> Handle:
                return self

            def __exit__(self, *exc: Any) -> None:
                handle.close()

        return Handle()


def _data() -> tuple[ClientData, np.ndarray, np.ndarray]:
    X, y, Xt, yt = make_problem(n=200)
    parts = make_partition(y, 4, "iid", 0.5, np.random.default_rng(1))
    return ClientData.from_partition(X, y, parts, 3), Xt, yt


def _run(ckpt: Path | None = None, callback: Any = None) -> Any:
    data, Xt, yt = _data()
    return simulate(LinearSoftmax(6, 3), data, make_method("sofim-lagged"),
                    FLConfig(n_rounds=ROUNDS, target_epsilon=2.0), X_test=Xt, y_test=yt,
                    seed=5, checkpoint=ckpt, checkpoint_every=1, callback=callback)


def _no_temps(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if ".tmp" in p.name], list(folder.iterdir())


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = _run()
    ckpt = tmp_path / "run.npz"
    disk = FullDisk(10**9)

    def fill(rec: dict) -> None:
        if rec["round"] == 3:  # the disk fills up while round 3's checkpoint is written
            disk.budget = 200

    monkeypatch.setattr(files, "open", disk, raising=False)
    with pytest.raises(OSError, match=rf"Could not write {ckpt}.*the disk is full") as err:
        _run(ckpt, callback=fill)
    assert err.value.errno == errno.ENOSPC
    _no_temps(tmp_path)
    assert load_checkpoint(ckpt)["round"] == 2  # nothing lost: round 2's checkpoint
    monkeypatch.undo()  # space again
    resumed = _run(ckpt)
    np.testing.assert_array_equal(resumed.params, reference.params)
    assert resumed.epsilon == reference.epsilon and not ckpt.exists()


@pytest.mark.parametrize("budget", [0, 10, 300, 2000])
def test_a_full_disk_during_a_result_write_keeps_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    result = _run()
    path = tmp_path / "history.json"
    result.save_json(path)
    before = path.read_bytes()
    monkeypatch.setattr(files, "open", FullDisk(budget), raising=False)
    with pytest.raises(OSError, match=rf"{path}.*the disk is full"):
        result.save_json(path)
    assert path.read_bytes() == before and json.loads(before)["epsilon"] == result.epsilon
    _no_temps(tmp_path)


def test_the_cli_reports_a_full_disk_in_one_line(tmp_path: Path, lab_file: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    from dpprecond.cli import main

    monkeypatch.setattr(files, "open", FullDisk(100), raising=False)
    out = tmp_path / "o"
    assert main(["fl", "--data", str(lab_file), "--rounds", "1", "--clients", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"Could not write {out / 'history.json'}" in err and "disk is full" in err
    assert "Traceback" not in err and not (out / "history.json").exists()
    _no_temps(out)
    table = tmp_path / "t.json"
    assert main(["pca", "-k", "2", "--method", "analyze_gauss", "--json", str(table)]) == 2
    assert f"Could not write {table}" in capsys.readouterr().err and not table.exists()


def test_a_full_disk_in_an_experiment_loses_no_finished_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpprecond.experiments.runner import DataCache, load_records, run_experiment
    from tests.experiments.test_experiments import blobs, tiny_config

    cfg = tiny_config(tmp_path)
    cache = DataCache(cfg, loader=blobs)
    assert run_experiment(cfg, progress=False, max_runs=3, cache=cache) == 3
    runs = cfg.output / "runs"
    done = {p.name: p.read_bytes() for p in runs.glob("*.json")}
    disk = FullDisk(0)
    monkeypatch.setattr(files, "open", disk, raising=False)
    with pytest.raises(OSError, match="the disk is full"):
        run_experiment(cfg, progress=False, cache=cache)
    assert {p.name: p.read_bytes() for p in runs.glob("*.json")} == done  # all intact
    _no_temps(runs)
    monkeypatch.undo()
    total = run_experiment(cfg, progress=False, cache=cache)
    assert len(load_records(cfg)) == 3 + total  # the sweep resumed and finished


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "directory", "garbage"])
def test_a_corrupt_checkpoint_is_named_and_kept(tmp_path: Path, damage: str) -> None:
    ckpt = tmp_path / "run.npz"

    def stop(rec: dict) -> None:
        if rec["round"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(ckpt, callback=stop)
    raw = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        ckpt.write_bytes(raw[:100] + bytes(b ^ 0xFF for b in raw[100:400]) + raw[400:])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    elif damage == "garbage":
        ckpt.write_bytes(np.random.default_rng(0).bytes(len(raw)))
    else:
        ckpt.unlink()
        ckpt.mkdir()
    with pytest.raises((ValueError, OSError), match=str(ckpt)):
        _run(ckpt)
    assert ckpt.exists()  # kept for the user to inspect or delete
