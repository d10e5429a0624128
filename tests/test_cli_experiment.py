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
