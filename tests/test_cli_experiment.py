"""``dpprecond experiment`` as a user sees it: notices once, plain progress off a terminal,
reports that refuse to overwrite another experiment's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dpprecond.cli import main

TINY = """
name = "tiny"
output = "out"
[data]
name = "digits"
[federation]
clients = [3]
partitions = ["iid", "dirichlet"]
alpha = 0.5
[privacy]
epsilons = ["inf"]
clip_norm = 1.0
[protocol]
kind = "per-round"
rounds = 3
seeds = [0, 1]
reference = "fedgd"
[methods.fedgd]
algorithm = "fedgd"
"""


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_the_non_private_notice_is_said_once(tiny: Path, caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert main(["experiment", "run", str(tiny), "--no-progress"]) == 0
    notices = [r.getMessage() for r in caplog.records if "non-private" in r.getMessage()]
    assert notices == ["tiny: 4 of the 4 runs to do are non-private (epsilon inf, "
                       "noise_multiplier=0): reference runs with no privacy guarantee."]
    assert "4 new runs" in capsys.readouterr().out


def test_progress_off_a_terminal_is_plain_lines(tiny: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """captured stderr is not a terminal: one line per run, no redraws or cursor moves."""
    assert main(["experiment", "run", str(tiny)]) == 0
    err = capsys.readouterr().err
    assert "\x1b[" not in err and "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("tiny sweep: run ")]
    assert [ln.split(" done")[0] for ln in lines] == [f"tiny sweep: run {i} of 4"
                                                      for i in range(1, 5)]
    assert all("accuracy " in ln for ln in lines)


def test_report_refuses_a_directory_of_another_experiment_file(
        tiny: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["experiment", "run", str(tiny), "--no-progress", "--max-runs", "2"]) == 0
    assert main(["experiment", "report", str(tiny)]) == 0
    report_dir = tiny.parent / "out"
    manifest = (report_dir / "manifest.json").read_text()
    assert '"config": "../tiny.toml"' in manifest
    before = (report_dir / "report.md").read_text()
    other = tiny.parent / "other.toml"  # another file, the same report directory
    other.write_text(TINY.replace('seeds = [0, 1]', 'seeds = [0]'))
    capsys.readouterr()
    assert main(["experiment", "report", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{report_dir} holds the report of {tiny}" in err
    assert "--output DIR" in err and "--force" in err
    assert (report_dir / "report.md").read_text() == before  # untouched
    assert main(["experiment", "report", str(tiny)]) == 0  # its own file may rewrite it
    assert main(["experiment", "report", str(other), "--output",
                 str(tiny.parent / "elsewhere")]) == 0
    assert main(["experiment", "report", str(other), "--force"]) == 0
    assert '"config": "../other.toml"' in (report_dir / "manifest.json").read_text()


def test_a_tuned_file_replaces_its_source_report_not_the_reverse(
        tiny: Path, capsys: pytest.CaptureFixture) -> None:
    """``tune`` without --report: the tuned report replaces the untuned one (documented);
    the untuned file may then not overwrite the tuned report."""
    assert main(["experiment", "run", str(tiny), "--no-progress", "--max-runs", "1"]) == 0
    assert main(["experiment", "report", str(tiny)]) == 0
    tuned = tiny.parent / "tiny-tuned.toml"
    tuned.write_text(TINY.replace('output = "out"', 'output = "out"\ntuned_from = "tiny"'))
    assert main(["experiment", "report", str(tuned)]) == 0
    capsys.readouterr()
    assert main(["experiment", "report", str(tiny)]) == 2
    assert f"holds the report of {tuned}" in capsys.readouterr().err
