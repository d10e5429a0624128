"""Mistakes on the command line: the closest flag, the user's flag names, the fix."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from dpprecond.cli import main


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["pca", "--epsilion", "1"], "usage: dpprecond pca", "--epsilion: did you mean --epsilon?"),
    (["fl", "--clinets", "5"], "usage: dpprecond fl", "did you mean --clients?"),
    (["experiment", "run", "x.toml", "--jbos", "2"], "usage: dpprecond experiment run",
     "did you mean --jobs?"),
    (["fl", "--max-epsilon=4", "--epsilom=2"], "usage: dpprecond fl",
     "--epsilom: did you mean --epsilon?"),
])
def test_a_mistyped_flag_names_the_closest_flag_of_its_subcommand(
        argv: list[str], usage: str, hint: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert hint in err


def test_an_unknown_word_points_to_the_subcommand_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["pca", "banana"])
    assert exc.value.code == 2
    assert "unrecognized argument: banana (see dpprecond pca --help)" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected", "absent"), [
    (["fl", "--clients", "0", "--rounds", "1"], "Expected --clients >= 1, got --clients=0",
     "n_clients"),
    (["fl", "--rounds", "0"], "Expected --rounds >= 1", "n_rounds"),
    (["pca", "-k", "0"], "Expected -k >= 1", "n_components"),
    (["pca", "--n-components", "0"], "Expected --n-components >= 1", "n_components"),
    (["fl", "--rounds", "2", "--max-epsilon", "0.5"], "> --max-epsilon=0.5", "max_epsilon"),
    (["fl", "--epsilon", "0"], "for a non-private run give --epsilon inf", "target_epsilon"),
    (["fl", "--epsilon", "-2"], "--epsilon must be > 0, got --epsilon -2", "target_epsilon"),
    (["pca", "--row-norm", "0"], "got --row-norm 0; give the largest norm", "row_norm"),
    (["fl", "--row-norm", "0"], "got --row-norm 0; give the largest norm", "row_norm"),
    (["fl", "--algorithm", "scaffold", "--lr", "0.1"],
     "--lr does not apply to --algorithm scaffold", "learning_rate"),
    (["fl", "--option", "foo=1"], "--option foo: not an option of --algorithm", "Unknown"),
])
def test_errors_speak_in_flags(argv: list[str], expected: str, absent: str,
                               capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and absent not in err and "Traceback" not in err, err


def test_an_option_given_as_name_value_keeps_its_name(capsys: pytest.CaptureFixture) -> None:
    """``--option local_steps=0``: the user typed local_steps, not --local-steps."""
    assert main(["fl", "--algorithm", "scaffold", "--option", "local_steps=0"]) == 2
    err = capsys.readouterr().err
    assert "local_steps" in err and "--local-steps" not in err


@pytest.mark.parametrize("center", [True, 1.0, "mean"])
def test_a_bad_center_lists_the_valid_values(center: object) -> None:
    from dpprecond.pca import fit_private_pca

    X = np.random.default_rng(0).random((30, 4))
    with pytest.raises((TypeError, ValueError)) as exc:
        fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-6, row_norm=2.0,
                        center=center)
    text = str(exc.value)
    assert "None (uncentered)" in text and "'private'" in text and "shape (4,)" in text


def test_a_skipped_csv_header_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                          capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "table.csv"
    path.write_text("a,b,c\n1,2,3\n4,5,6\n0,1,0\n2,2,2\n")
    with caplog.at_level(logging.WARNING, logger="dpprecond.data.tabular"):
        assert main(["pca", "--data", str(path), "--row-norm", "10", "-k", "1",
                     "--method", "analyze_gauss", "--seed", "0"]) == 0
    notes = [r.getMessage() for r in caplog.records if r.name == "dpprecond.data.tabular"]
    assert len(notes) == 1 and str(path) in notes[0] and "(a,b,c)" in notes[0]
    assert "table.csv (4 x 3)" in capsys.readouterr().out
    caplog.clear()
    path.write_text("1,2,3\n4,5,6\n0,1,0\n2,2,2\n")  # no header: not a word
    with caplog.at_level(logging.WARNING, logger="dpprecond.data.tabular"):
        assert main(["pca", "--data", str(path), "--row-norm", "10", "-k", "1",
                     "--method", "analyze_gauss", "--seed", "0"]) == 0
    assert not [r for r in caplog.records if r.name == "dpprecond.data.tabular"]
