"""The help of every sub-command: every option from the one table, with its default and unit."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from dpprecond.cli import build_parser
from dpprecond.cli.options import OPTIONS, option_actions


def _parsers(parser: argparse.ArgumentParser,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                          argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


ALL = list(_parsers(build_parser()))


def _help(*path: str) -> str:
    parser = dict(ALL)[path]
    return " ".join(parser.format_help().split())


def test_every_subcommand_is_walked() -> None:
    paths = {p for p, _ in ALL}
    assert {("pca",), ("fl",), ("demo",), ("experiment", "run"), ("experiment", "tune"),
            ("experiment", "report"), ("experiment", "compare")} <= paths


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[" ".join(p) or "dpprecond"
                                                       for p, _ in ALL])
def test_every_option_comes_from_the_table_and_shows_its_default_and_unit(
        path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    for action in option_actions(parser):
        name = action.option_strings[-1] if action.option_strings else action.dest
        opt = getattr(action, "option", None)
        assert opt is not None, f"{' '.join(path)} {name} is not from cli/options.OPTIONS"
        # a sub-command may change an option's default, never its flags, help or unit
        assert any(opt.flags == o.flags and opt.help == o.help and opt.unit == o.unit
                   for o in OPTIONS.values()), name
        text = " ".join(str(action.help).split())
        if action.option_strings:
            assert re.search(r"\(default: [^)]", text), f"{name}: {text}"
        else:
            assert text.endswith("(required)"), f"{name}: {text}"
        if action.type in (int, float) or (action.nargs is None and isinstance(
                action.default, float)):
            assert "unit: " in text, f"{name} is a number without a unit: {text}"


def test_the_reported_gaps_are_filled() -> None:
    tune = _help("experiment", "tune")
    assert "CONFIG experiment TOML file" in tune
    assert re.search(r"--output DIR directory of the tuning runs .* \(default: ", tune)
    assert "--no-progress no progress bars (plain output) (default: off)" in tune
    pca = _help("pca")
    assert re.search(r"--clip-radius .*\(default: sqrt\(k/n\) for fixed; unit: ", pca)
    assert re.search(r"--n-iter .*\(default: 2 for fixed, 10 for power; unit: iterations\)",
                     pca)
    assert re.search(r"--mean-trials .*\(default: 3 for select; unit: ", pca)
    lr = next(str(a.help) for a in dict(ALL)[("fl",)]._actions if "--lr" in a.option_strings)
    from dpprecond.fl.methods import METHODS, method_options

    for name in METHODS:  # every method's own number, read from its signature
        opts = method_options(name)
        assert name in lr
        if "learning_rate" in opts:
            assert f"{opts['learning_rate'].default:g}" in lr
    assert "adam, yogi 0.01" in lr


def test_demo_help_is_plain_text() -> None:
    text = dict(ALL)[("demo",)].format_help()
    assert "``" not in text and ":mod:" not in text and ":func:" not in text
    assert "auto" in text and "sofim-lagged" in text


def test_a_shared_option_has_one_help_everywhere() -> None:
    """``--delta`` of pca and fl: the same text and unit, only the default differs."""
    helps = {}
    for path, parser in ALL:
        for action in option_actions(parser):
            if "--delta" in action.option_strings:
                helps[path] = str(action.help)
    assert set(helps) == {("pca",), ("fl",)}
    assert helps[("pca",)].replace("1e-06", "D") == helps[("fl",)].replace("1e-05", "D")
