"""What ``dpprecond fl`` prints: the epsilon used against the cap, the stages, warnings."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dpprecond.cli import main


@pytest.fixture(scope="module")
def digits_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dpprecond.features import load_features

    ds = load_features("digits")[0]
    path = tmp_path_factory.mktemp("data") / "my_data.npz"
    np.savez(path, X_train=ds.X_train, y_train=ds.y_train, X_test=ds.X_test, y_test=ds.y_test)
    return path


def test_a_climbing_run_warns_and_the_cap_is_not_the_epsilon(
        digits_npz: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        shown_warnings: None) -> None:
    """The README's example: scaffold with 3 local steps under --max-epsilon 4 spends the
    default epsilon 1, and its test loss climbs (digits, 70 rounds)."""
    assert main(["fl", "--data", str(digits_npz), "--algorithm", "scaffold", "--option",
                 "local_steps=3", "--max-epsilon", "4", "--seed", "0",
                 "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert ("epsilon: the run spends 1 (the default --epsilon); --max-epsilon 4 is a cap "
            "that only checks the plan, not a target: give --epsilon 4 to spend it.") in out
    assert re.search(r"epsilon spent 1\.0000 at delta=1e-05 \(cap --max-epsilon 4\)", out)
    assert re.search(r"^dpprecond fl: warning: method 'scaffold': the test loss climbed "
                     r"from \S+ \(round \d+\) to \S+ \(round 70\)", err, re.M), err
    assert "DivergenceWarning" not in err and ".py:" not in err  # one plain line


def test_round_lines_use_one_precision(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fl", "--rounds", "3", "--clients", "5", "--seed", "0",
                 "--out", str(tmp_path)]) == 0
    rounds = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("round")]
    assert len(rounds) == 3
    for line in rounds:
        numbers = re.findall(r"(?:acc|loss|eps|\|update\|) (\S+)", line)
        assert len(numbers) == 4 and all(re.fullmatch(r"\d+\.\d{4}", n) for n in numbers), line


def test_pca_features_show_their_stage_and_the_composition(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fl", "--features", "pca:8", "--epsilon", "2", "--rounds", "3",
                 "--clients", "5", "--seed", "0", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("stage 1 of 2:"))
    done = next(i for i, ln in enumerate(lines) if ln.startswith("stage 1 of 2 done in"))
    round1 = next(i for i, ln in enumerate(lines) if ln.startswith("round   1"))
    assert first < done < round1
    total = next(ln for ln in lines if ln.startswith("total epsilon per record"))
    m = re.search(r"total epsilon per record (\S+) at delta=1e-05, from one ledger: PCA alone "
                  r"(\S+), training alone (\S+); composed \S+, not their sum (\S+): "
                  r"composition is not additive", total)
    assert m, total
    tot, pca, train, summed = map(float, m.groups())
    assert tot == pytest.approx(2.0, abs=1e-4)
    assert max(pca, train) < tot < pca + train == pytest.approx(summed, abs=2e-4)


def test_progress_off_a_terminal_prints_the_round_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fl", "--rounds", "3", "--clients", "5", "--progress", "--features", "pca:4",
                 "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in err and "\x1b[" not in err and "rounds:" not in err
    assert sum(ln.startswith("round ") for ln in out.splitlines()) == 3
