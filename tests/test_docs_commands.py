"""Every ``dpprecond`` command of the README and of the docs' quick starts runs.

The commands are read from the documents themselves (a new command is tested as soon as
it is written down), then made small: the named datasets become digits, the README's own
files (``my_data.npz``, ``my_matrix.csv``) are written from digits, and the experiment
files are the shipped ones with their grids cut down (one client count, one epsilon, 3
rounds, two methods) and their data set to digits. Everything else is run as written,
in a temporary working directory, through :func:`dpprecond.cli.main`.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

from dpprecond.cli import main

ROOT = Path(__file__).resolve().parents[1]

#: (document, the heading of its section or None for the whole file)
SOURCES = (("README.md", None), ("docs/pca.md", None), ("docs/fl.md", "## Command line"),
           ("docs/fl_noise_aware.md", None))

#: What a command's names become here (the data sets that are large or absent).
DATA = {"fashion-mnist": "digits", "cifar10": "digits", "pathmnist": "digits"}

pytestmark = pytest.mark.docs


def documented_commands() -> list[tuple[str, str]]:
    """``(document, command)`` for every ``dpprecond ...`` line of a code block."""
    out = []
    for name, heading in SOURCES:
        text = (ROOT / name).read_text(encoding="utf-8")
        if heading is not None:
            text = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                line = line.split("  #", 1)[0].strip()
                if line.startswith("dpprecond "):
                    out.append((name, line))
    return out


COMMANDS = documented_commands()


def test_the_documents_hold_the_commands() -> None:
    """The reader found them (a change of the documents' layout must not hide them)."""
    kinds = {shlex.split(c)[1] for _, c in COMMANDS}
    assert kinds == {"pca", "fl", "experiment"}
    assert len(COMMANDS) >= 14
    assert ("README.md", "dpprecond fl --data my_data.npz --algorithm scaffold --option "
            "local_steps=3 --max-epsilon 4") in COMMANDS


def _small_experiment(source: Path, target: Path) -> None:
    """The shipped experiment file with its grid cut down and digits as its data."""
    doc: dict[str, Any] = tomllib.loads(source.read_text(encoding="utf-8"))
    doc["output"] = f"../out/{source.stem}"
    doc["report"] = f"../report/{source.stem}"
    doc["data"]["name"] = "digits"
    if str(doc["data"].get("features", "pixels")).startswith(("pca:", "random:")):
        doc["data"]["features"] = doc["data"]["features"].split(":")[0] + ":8"
    doc["federation"].update(clients=[3], partitions=["iid"])
    doc["privacy"]["epsilons"] = [2]
    doc["protocol"].update(rounds=3, seeds=[0])
    keep = {doc["protocol"]["reference"], "fedgd"}
    doc["methods"] = {k: v for k, v in doc["methods"].items() if k in keep}
    if "tuning" in doc:
        doc["tuning"].update(epsilons=[2], seeds=[0])
        doc["tuning"]["grid"] = {k: {p: v[:2] for p, v in g.items()}
                                 for k, g in doc["tuning"].get("grid", {}).items() if k in keep}
    target.write_text(tomli_w.dumps(doc), encoding="utf-8")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dpprecond.features import load_features

    work = tmp_path_factory.mktemp("docs")
    ds = load_features("digits")[0]
    np.savez(work / "my_data.npz", X_train=ds.X_train, y_train=ds.y_train,
             X_test=ds.X_test, y_test=ds.y_test)
    rows = np.random.default_rng(0).uniform(-1, 1, size=(300, 8))
    np.savetxt(work / "my_matrix.csv", rows, delimiter=",")  # row norms <= sqrt(8) < 3
    (work / "experiments").mkdir()
    for path in sorted((ROOT / "experiments").glob("*.toml")):
        _small_experiment(path, work / "experiments" / path.name)
    return work


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)[1:]
    return [DATA.get(a, a) if i and argv[i - 1] == "--data" else a for i, a in enumerate(argv)]


@pytest.mark.parametrize(("doc", "command"), COMMANDS,
                         ids=[f"{d}: {c[10:60]}" for d, c in COMMANDS])
def test_a_documented_command_runs(doc: str, command: str, workdir: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture,
                                   shown_warnings: None) -> None:
    monkeypatch.chdir(workdir)
    argv = _argv(command)
    if argv[:2] == ["experiment", "compare"]:  # the sweeps it compares must have run
        for config in argv[2:]:
            if config.endswith(".toml") and not (workdir / "out" / Path(config).stem).exists():
                assert main(["experiment", "run", config, "--no-progress"]) == 0
    if argv[:2] in (["experiment", "run"], ["experiment", "report"]) and not (
            workdir / argv[2]).exists():  # a tuned file that `tune` writes first
        source = argv[2].replace("-tuned.toml", ".toml")
        assert main(["experiment", "tune", source, "--no-progress"]) == 0
    if argv[:2] == ["experiment", "report"]:
        assert main(["experiment", "run", argv[2], "--no-progress"]) == 0
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "error:" not in err, err
    if "--max-epsilon" in argv and "--epsilon" not in argv:
        assert "is a cap that only checks the plan, not a target" in out
    if "scaffold" in argv and "local_steps=3" in argv:  # the README example that climbed
        assert "warning: method 'scaffold': the test loss climbed" in err
