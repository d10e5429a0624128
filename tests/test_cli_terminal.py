"""The CLI in a real terminal (tmux): what a person sees, and what a log file gets.

A terminal shows the progress bars drawn in place (the pane holds the rendered screen: no
raw cursor moves such as ``[A`` left in it); the same commands with their output in a file
write plain lines, with no escape sequence or carriage return. Skipped when tmux is not
installed (``apt-get install tmux``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

TINY = """
name = "tiny"
output = "out"
[data]
name = "digits"
[federation]
clients = [3]
partitions = ["iid", "dirichlet"]
[privacy]
epsilons = [2]
[protocol]
kind = "per-round"
rounds = 40
seeds = [0]
reference = "fedgd"
[methods.fedgd]
algorithm = "fedgd"
"""


class Terminal:
    """A tmux server of our own (its own socket), one window per command."""

    def __init__(self, socket: str, cwd: Path) -> None:
        self.socket, self.cwd = socket, cwd

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, cwd=self.cwd)
        if done.returncode:
            raise AssertionError(f"tmux {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout

    def run(self, name: str, command: str, timeout: float = 120.0) -> str:
        """Run ``command`` in a 120 x 40 terminal; the screen when it has finished."""
        env = f"PYTHONPATH={shlex.quote(str(Path(__file__).resolve().parents[1] / 'src'))}"
        script = f"{env} {command}; echo EXIT=$?"
        self.tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "40",
                  "bash", "--norc", "-c", f"{script}; sleep 600")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.tmux("capture-pane", "-p", "-t", name)
            if "EXIT=" in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{command!r} did not finish in {timeout} s:\n{screen}")

    def colours(self, name: str) -> str:
        """The screen with its attributes (``capture-pane -e``: colour codes kept)."""
        return self.tmux("capture-pane", "-p", "-e", "-t", name)


@pytest.fixture()
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(f"dpprecond-test-{os.getpid()}-{tmp_path.name}", tmp_path)
    try:
        yield term
    finally:
        subprocess.run(["tmux", "-L", term.socket, "kill-server"], capture_output=True)


def _cli(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", "dpprecond.cli", *args))


def test_fl_progress_renders_in_a_terminal_and_is_plain_in_a_file(
        terminal: Terminal, tmp_path: Path) -> None:
    args = ("fl", "--rounds", "40", "--clients", "5", "--progress", "--features", "pca:8",
            "--seed", "0", "--out", str(tmp_path / "fl"))
    screen = terminal.run("fl", _cli(*args))
    assert "EXIT=0" in screen, screen
    assert "rounds: 100%" in screen and "40/40" in screen, screen  # the bar, drawn
    assert "features pca:8: 100%" in screen, screen  # the features stage has its bar
    assert "[A" not in screen and "\x1b" not in screen
    assert "total epsilon per record 2.0000" not in screen  # (epsilon 1: the default)
    assert "total epsilon per record 1.0000" in screen
    sgr = [part for part in terminal.colours("fl").split("\x1b[")[1:]
           if part[:1].isdigit() and "m" in part[:6]]
    assert not sgr, f"colour codes on the screen: {sgr[:3]}"
    log = tmp_path / "fl.log"
    screen = terminal.run("fl-file", f"{_cli(*args)} > {log} 2>&1")
    assert "EXIT=0" in screen, screen
    text = log.read_text()
    assert "\x1b" not in text and "\r" not in text, repr(text[:300])
    assert sum(ln.startswith("round ") for ln in text.splitlines()) == 40


def test_experiment_bars_nest_in_a_terminal_and_are_lines_in_a_file(
        terminal: Terminal, tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    screen = terminal.run("sweep", _cli("experiment", "run", str(config)))
    assert "EXIT=0" in screen, screen
    assert "tiny sweep: 100%" in screen and "2/2" in screen, screen
    assert "[A" not in screen and "\x1b" not in screen
    log = tmp_path / "sweep.log"
    again = _cli("experiment", "run", str(config), "--output", str(tmp_path / "again"))
    screen = terminal.run("sweep-file", f"{again} > {log} 2>&1")
    assert "EXIT=0" in screen, screen
    text = log.read_text()
    assert "\x1b" not in text and "\r" not in text, repr(text[:300])
    assert "tiny sweep: run 1 of 2 done" in text and "tiny sweep: run 2 of 2 done" in text
