"""Fixtures shared by every test directory: a user's labelled file, a spy on releases, and
warnings shown as the command line shows them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import dpprecond.secure as secure_module


@pytest.fixture()
def shown_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warnings written to stderr as outside pytest (which records them instead): the
    default ``showwarning`` writes ``warnings.formatwarning(...)``, the CLI's one line."""
    import sys
    import warnings

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: object = None, line: str | None = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "showwarning", show)


@pytest.fixture
def lab_file(tmp_path: Path) -> Path:
    """``lab.npz``: ``X`` of shape (300, 5) and ``y`` in {0, 1, 2} (the repros of issue 17)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "lab.npz"
    np.savez(path, X=rng.standard_normal((300, 5)), y=rng.integers(0, 3, 300))
    return path


class ReleaseSpy:
    """Whether each release went through secure mode (``noise.release`` asks ``is_secure``)."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    @property
    def all_secure(self) -> bool:
        """At least one release, and every one drawn in secure mode."""
        return bool(self.calls) and all(self.calls)

    @property
    def none_secure(self) -> bool:
        """At least one release, and none drawn in secure mode."""
        return bool(self.calls) and not any(self.calls)


@pytest.fixture
def release_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReleaseSpy]:
    """Record, for every noisy release of any mechanism, whether its source was secure."""
    spy = ReleaseSpy()
    real = secure_module.is_secure

    def is_secure(rng: object) -> bool:
        out = real(rng)
        spy.calls.append(out)
        return out

    monkeypatch.setattr(secure_module, "is_secure", is_secure)
    yield spy


def pytest_configure(config: pytest.Config) -> None:
    """The marker of the tests that run the documents' commands (tests/test_docs_commands.py)."""
    config.addinivalue_line("markers", "docs: runs a command of README.md or of a doc's quick "
                                       "start, on small data")
