"""Hole 4 of the privacy issue: a typo in an experiment file is an error, not a default.

Unknown keys and wrong types used to be dropped silently: ``epsilon = [0.1]`` ran at
epsilon 1, ``clipnorm = 0.5`` at clip 10, ``rounds = [2, 3]`` only T = 2, and
``epsilons = []`` ran nothing and exited 0. Each must fail at load time with a message
naming the table and the key (and the closest valid key for a typo).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dpprecond.experiments.config import load_config, parse_config

BASE = """
name = "t"
output = "out"
[data]
name = "digits"
[federation]
clients = [4]
[privacy]
epsilons = [1.0]
[protocol]
rounds = 2
seeds = [0]
reference = "fedgd"
[methods.fedgd]
algorithm = "fedgd"
learning_rate = 0.1
"""


def parse(text: str, tmp_path: Path):
    return parse_config(tomllib.loads(text), base_dir=tmp_path)


def test_the_base_file_parses(tmp_path: Path) -> None:
    cfg = parse(BASE, tmp_path)
    assert cfg.epsilons == (1.0,) and cfg.rounds == 2


@pytest.mark.parametrize("old, new, match", [
    ("epsilons = [1.0]", "epsilon = [0.1]", r"\[privacy\].*'epsilon'.*did you mean 'epsilons'"),
    ("[privacy]", "[privacy]\nclipnorm = 0.5", r"\[privacy\].*'clipnorm'.*'clip_norm'"),
    ("rounds = 2", "rounds = [2, 3]", r"protocol.rounds.*integer.*rounds_list"),
    ("epsilons = [1.0]", "epsilons = []", r"privacy.epsilons.*at least one"),
    ('reference = "fedgd"', 'reference = "fedgdd"', r"protocol.reference.*'fedgdd'.*fedgd"),
    ("[federation]", "[federation]\npartition = ['iid']", r"'partition'.*'partitions'"),
    ("[data]", "[data]\nfeature = 'pixels'", r"\[data\].*'feature'.*'features'"),
    ("seeds = [0]", "seeds = [0]\nround = 3", r"\[protocol\].*'round'"),
    ("learning_rate = 0.1", "learning_rat = 0.1",
     r"methods.fedgd.*'learning_rat'.*'learning_rate'"),
    ("learning_rate = 0.1", "learning_rate = -0.1", r"learning_rate"),
    ("learning_rate = 0.1", 'learning_rate = "0.1"', r"learning_rate"),
    ("[privacy]", '[privacy]\nclip_norm = "10"', r"privacy.clip_norm"),
    ("[privacy]", "[privacy]\ndelta = 1.5", r"privacy.delta"),
    ("clients = [4]", "clients = [0]", r"federation.clients"),
    ("clients = [4]", "clients = 4.5", r"federation.clients"),
    ('name = "digits"', 'name = "digitz"', r"data.name.*digitz"),
])
def test_typos_and_wrong_types_are_errors(tmp_path: Path, old: str, new: str,
                                          match: str) -> None:
    assert old in BASE
    with pytest.raises(ValueError, match=match):
        parse(BASE.replace(old, new, 1), tmp_path)


def test_method_parameters_are_checked_against_the_method(tmp_path: Path) -> None:
    text = BASE + '[methods.sc]\nalgorithm = "scaffold"\nlocal_step = 5\n'
    with pytest.raises(ValueError, match=r"methods.sc.*'local_step'.*'local_steps'"):
        parse(text, tmp_path)
    text = BASE + '[methods.s]\nalgorithm = "sofim"\nrho = 0.0\n'
    with pytest.raises(ValueError, match=r"methods.s.*rho"):
        parse(text, tmp_path)


def test_tuning_grid_keys_are_checked(tmp_path: Path) -> None:
    text = BASE + "[tuning.grid.fedgd]\nlearning_rte = [0.1, 1.0]\n"
    with pytest.raises(ValueError, match=r"tuning.grid.fedgd.*'learning_rte'"):
        parse(text, tmp_path)


def test_relative_output_resolves_against_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "exp.toml"
    path.parent.mkdir()
    path.write_text(BASE)
    assert load_config(path).output == tmp_path / "sub" / "out"


def test_cli_refuses_a_typo_before_running(tmp_path: Path, capsys) -> None:
    from dpprecond.cli import main

    path = tmp_path / "exp.toml"
    path.write_text(BASE.replace("epsilons = [1.0]", "epsilon = [0.1]"))
    assert main(["experiment", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'epsilon'" in err and "epsilons" in err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_tune_writes_the_tuned_file_next_to_the_config(tmp_path: Path, capsys) -> None:
    from dpprecond.cli import main

    path = tmp_path / "exp.toml"
    path.write_text(BASE + "[tuning]\nepsilons = [1.0]\n"
                    "[tuning.grid.fedgd]\nlearning_rate = [0.1, 0.3]\n")
    assert main(["experiment", "tune", str(path), "--no-progress"]) == 0
    tuned = tmp_path / "exp-tuned.toml"
    cfg = load_config(tuned)
    assert cfg.tuned_from == "t" and cfg.output == tmp_path / "out"
    assert cfg.method("fedgd").params["learning_rate"] in (0.1, 0.3)
    assert f"dpprecond experiment run {tuned}" in capsys.readouterr().out


def test_tune_report_option_keeps_the_untuned_report(tmp_path: Path) -> None:
    """--report gives the tuned file its own report directory, written relative to the
    tuned file so that the file stays valid when the repository moves."""
    from dpprecond.cli import main

    path = tmp_path / "exp.toml"
    path.write_text(BASE + "[tuning]\nepsilons = [1.0]\n"
                    "[tuning.grid.fedgd]\nlearning_rate = [0.1, 0.3]\n")
    assert main(["experiment", "tune", str(path), "--no-progress",
                 "--report", str(tmp_path / "docs" / "tuned")]) == 0
    tuned = tmp_path / "exp-tuned.toml"
    assert 'report = "docs/tuned"' in tuned.read_text()
    cfg = load_config(tuned)
    assert cfg.report_dir.resolve() == (tmp_path / "docs" / "tuned").resolve()
    assert cfg.output == tmp_path / "out"  # the runs are still shared with the source


def test_private_pca_features_run_through_the_runner(tmp_path: Path) -> None:
    """A pca:K experiment: each run's PCA and training share one ledger; methods of a seed
    see the same features (paired)."""
    from dpprecond.experiments.runner import load_records, run_experiment

    text = (BASE.replace('name = "digits"', 'name = "digits"\nfeatures = "pca:8"\n'
                         'pca_share = 0.3')
            .replace("rounds = 2", "rounds = 3")
            + '[methods.adam]\nalgorithm = "adam"\n')
    cfg = parse(text, tmp_path)
    assert cfg.pca == {"share": 0.3, "method": "auto", "trust": "local"}
    assert run_experiment(cfg, progress=False) == 2
    recs = load_records(cfg, with_predictions=True)
    for r in recs:
        assert r["n_releases"] == 1 + 3  # the PCA fit's event, then one per round
        assert r["epsilon_spent"] == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="features"):
        parse(BASE.replace('name = "digits"', 'name = "digits"\nfeatures = "pca:0"'),
              tmp_path)


def test_secure_aggregation_sweeps_refuse_what_the_skellam_rounds_cannot_run(
        tmp_path: Path) -> None:
    """``[data] trust = "secure-aggregation"`` with pca:K is the trust model of both
    stages: a method or epsilon its training cannot run is refused at load time."""
    pca = BASE.replace('name = "digits"', 'name = "digits"\nfeatures = "pca:8"\n'
                       'trust = "secure-aggregation"')
    assert parse(pca, tmp_path).pca["trust"] == "secure-aggregation"
    with pytest.raises(ValueError, match=r"\[data\] trust.*methods\.sc\.algorithm"):
        parse(pca + '[methods.sc]\nalgorithm = "scaffold"\n', tmp_path)
    with pytest.raises(ValueError, match=r"\[data\] trust.*'inf'"):
        parse(pca.replace("epsilons = [1.0]", 'epsilons = [1.0, "inf"]'), tmp_path)
