"""``dpprecond fl --tune``: private selection from the command line, on any loaded data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpprecond.cli import main
from tests.fl.conftest import make_problem


def test_tune_on_digits_reports_the_total_epsilon(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["fl", "--tune", "--rounds", "3", "--clients", "4", "--epsilon", "2",
                 "--seed", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tuning included" in text and "total epsilon per record 2.0000" in text
    saved = json.loads((out / "history.json").read_text())
    assert saved["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert "n_trials" not in saved
    assert saved["candidate"]["algorithm"] in ("fedgd", "adam")


def test_tune_on_a_users_npz_file(tmp_path, capsys) -> None:
    X, y, Xt, yt = make_problem(n=200)
    path = tmp_path / "mine.npz"
    np.savez(path, X_train=X, y_train=y, X_test=Xt, y_test=yt)
    assert main(["fl", "--tune", "--data", str(path), "--rounds", "2", "--clients", "4",
                 "--epsilon", "4", "--seed", "0", "--out", str(tmp_path / "o")]) == 0
    assert "tuning included" in capsys.readouterr().out


def test_tune_checks_the_cap_before_any_run(tmp_path, capsys) -> None:
    assert main(["fl", "--tune", "--rounds", "2", "--clients", "4", "--epsilon", "2",
                 "--max-epsilon", "1", "--out", str(tmp_path / "o")]) == 2
    assert "--max-epsilon" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--lr", "0.1"], ["--option", "beta=0.5"],
                                   ["--features", "random:8"], ["--adaptive-clip"]])
def test_tune_refuses_what_it_would_ignore(tmp_path, capsys, extra: list[str]) -> None:
    assert main(["fl", "--tune", "--rounds", "2", "--out", str(tmp_path / "o"), *extra]) == 2
    assert "--tune" in capsys.readouterr().err


def test_adaptive_clip_from_the_command_line(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["fl", "--adaptive-clip", "--algorithm", "fedgd", "--rounds", "3",
                 "--clients", "4", "--epsilon", "2", "--seed", "0", "--out", str(out)]) == 0
    saved = json.loads((out / "history.json").read_text())
    assert len(saved["config"]["clip_norms"]) == 3 and saved["config"]["clip_norms"][0] == 10
    assert saved["config"]["adaptive_clip"]["target_quantile"] == 0.5
    assert saved["history"][-1]["epsilon"] <= 2.0 + 1e-9


@pytest.mark.parametrize("extra", [["--mechanism", "poisson", "--sampling-rate", "0.5"]])
def test_adaptive_clip_refuses_what_it_cannot_run(tmp_path, capsys, extra: list[str]) -> None:
    assert main(["fl", "--adaptive-clip", "--rounds", "2", "--out", str(tmp_path / "o"),
                 *extra]) == 2
    err = capsys.readouterr().err
    assert "adaptive" in err
