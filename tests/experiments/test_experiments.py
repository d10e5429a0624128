"""Experiment runner: config parsing, resumable tiny sweep, report, tuning, McNemar."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpprecond.experiments.config import expand_runs, load_config, parse_config, run_id
from dpprecond.experiments.report import write_report
from dpprecond.experiments.runner import (
    DataCache,
    load_records,
    run_experiment,
    validation_split,
)
from dpprecond.experiments.stats import mcnemar_exact, rounds_to_reach
from dpprecond.experiments.tuning import NOT_CHARGED, select_best, tuned_config_text

TINY = """
name = "tiny"
output = "out"
[data]
name = "digits"  # the tests inject their own loader (blobs) into the DataCache
[federation]
clients = [3]
partitions = ["iid", "dirichlet"]
alpha = 0.5
[privacy]
epsilons = [2, "inf"]
clip_norm = 1.0
accountant = "rdp"
[protocol]
kind = "per-round"
rounds = 3
seeds = [0, 1]
reference = "sofim"
[methods.fedgd]
algorithm = "fedgd"
learning_rate = 0.5
[methods.sofim]
algorithm = "sofim"
[methods.scaffold]
algorithm = "scaffold"
local_steps = 2
[methods.fedfc]
algorithm = "fedfc"
[methods.fednew]
algorithm = "fednew"
rho = 5.0
[tuning]
validation_fraction = 0.2
epsilons = [2]
[tuning.grid.fedgd]
learning_rate = [0.1, 1.0]
"""


def blobs(_: str) -> tuple:
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 4)) * 3
    y = rng.integers(0, 3, 260)
    X = centers[y] + rng.standard_normal((260, 4))
    return X[:200], y[:200], X[200:], y[200:], 3


def tiny_config(tmp_path: Path, text: str = TINY):
    import tomllib

    return parse_config(tomllib.loads(text), base_dir=tmp_path)


def test_parse_and_expand(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    assert cfg.epsilons == (2.0, None)
    assert cfg.output == tmp_path / "out"
    runs = expand_runs(cfg)
    assert len(runs) == 1 * 2 * 2 * 2 * 5
    assert [r["seed"] for r in runs[:20]] == [0] * 20  # seed-major
    assert len({run_id(r) for r in runs}) == len(runs)
    per_t = tiny_config(tmp_path, TINY.replace('kind = "per-round"',
                                               'kind = "per-T"\nrounds_list = [1, 2]'))
    assert sorted({r["rounds"] for r in expand_runs(per_t)}) == [1, 2]
    tune = expand_runs(cfg, tuning=True)
    assert {r["evaluation"] for r in tune} == {"validation"}
    assert len(tune) == 2 * 1 * (2 + 4)  # partitions x eps x (fedgd grid + 4 untuned)


@pytest.mark.parametrize("bad, match", [
    ('[bogus]\nx = 1', "unknown key 'bogus'"),
    ('[methods.x]\nalgorithm = "nope"', "algorithm"),
    ('[protocol]\nkind = "per-T"', "rounds_list"),
])
def test_bad_configs_are_named(tmp_path: Path, bad: str, match: str) -> None:
    import tomllib

    base = '[data]\nname = "digits"\n'
    if "methods" not in bad:
        base += '[methods.fedgd]\nalgorithm = "fedgd"\n'
    with pytest.raises(ValueError, match=match):
        parse_config(tomllib.loads(base + bad), base_dir=tmp_path)


def test_shipped_configs_parse() -> None:
    root = Path(__file__).resolve().parents[2] / "experiments"
    names = {p.stem for p in root.glob("*.toml")}
    assert {"digits", "fashion-mnist", "cifar10", "pathmnist", "cifar10-per-T",
            "pathmnist-per-T"} <= names
    paper_grids = {"digits", "fashion-mnist", "cifar10", "pathmnist"}
    every_baseline = {"fedgd", "sofim", "scaffold", "fedfc", "fednew", "fedavg", "adam", "yogi"}
    for path in root.glob("*.toml"):
        cfg = load_config(path)
        assert len(expand_runs(cfg)) > 0
        algorithms = {m.algorithm for m in cfg.methods}
        # every grid compares against the plain baseline and the preconditioned method
        assert {"fedgd", "sofim"} <= algorithms, path.name
        if path.stem.removesuffix("-per-T") in paper_grids:
            # the paper-regime grids carry every baseline; the feature-regime grids
            # (pca64, random64) run a focused subset, documented in their headers
            assert every_baseline <= algorithms, path.name


def test_tiny_sweep_resumes_and_reports(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    cache = DataCache(cfg, loader=blobs)
    total = len(expand_runs(cfg))
    assert run_experiment(cfg, progress=False, max_runs=7, cache=cache) == 7
    assert run_experiment(cfg, progress=False, cache=cache) == total - 7  # resumes
    assert run_experiment(cfg, progress=False, cache=cache) == 0  # nothing redone
    recs = load_records(cfg, with_predictions=True)
    assert len(recs) == total
    for r in recs:
        assert len(r["accuracy"]) == 3
        assert r["predictions"].shape == (60,)
        if r["spec"]["epsilon"] is not None:
            assert r["epsilon_spent"] <= 2.0 + 1e-9
        expected = {"scaffold": 3 * 2, "fedfc": 3 + 1, "fednew": 3 + 1}
        assert r["n_releases"] == expected.get(r["spec"]["algorithm"], 3)
    md = write_report(cfg, cache=cache)
    text = md.read_text()
    # One section per (K, partition), accuracy + rounds + McNemar tables, figures exist.
    assert text.count("## digits, K = 3") == 2
    assert "Finished runs: 40 of 40" in text
    # Written values, not tuned: the report must not claim a tuning that did not happen.
    assert NOT_CHARGED not in text and "not tuned on this data" in text
    table = [ln for ln in text.splitlines() if ln.startswith("| fedgd |")]
    assert len(table) >= 2
    header = next(ln for ln in text.splitlines() if ln.startswith("| method |"))
    assert header.count("|") == 4  # method + 2 epsilons
    rows = [ln for ln in text.splitlines() if re.match(r"\| (fedgd|sofim|scaffold|fedfc|"
                                                       r"fednew) \| .*±", ln)]
    assert any("**" in ln for ln in rows)
    assert all(re.search(r"\d+\.\d\d ± \d+\.\d\d", ln) for ln in rows)
    assert "sofim vs" in text and "p̃ =" in text
    for png in re.findall(r"\]\((.+?\.png)\)", text):
        assert (md.parent / png).stat().st_size > 1000
    with (md.parent / "results.csv").open() as fh:
        rows_csv = list(csv.DictReader(fh))
    assert len(rows_csv) == total
    assert {r["epsilon"] for r in rows_csv} == {"2", "non-private"}
    assert len(json.loads((md.parent / "results.json").read_text())) == total
    # every output is strict JSON (docs/outputs.md): non-private epsilons are null
    from tests.strict_json import load_strict

    assert len(load_strict(md.parent / "results.json")) == total  # type: ignore[arg-type]
    for path in (cfg.output / "runs").glob("*.json"):
        rec = load_strict(path)
        assert isinstance(rec, dict) and (rec["epsilon_spent"] is None) == (
            rec["spec"]["epsilon"] is None)


def test_parallel_jobs_give_the_same_runs(tmp_path: Path) -> None:
    serial = tiny_config(tmp_path)
    parallel = dataclasses.replace(serial, output=tmp_path / "parallel")
    run_experiment(serial, progress=False, cache=DataCache(serial, loader=blobs),
                   where={"seed": 0})
    seen: list[str] = []
    n = run_experiment(parallel, progress=False, cache=DataCache(parallel, loader=blobs),
                       where={"seed": 0}, jobs=2, on_record=lambda r: seen.append(r["id"]))
    a = {r["id"]: r for r in load_records(serial, with_predictions=True)}
    b = {r["id"]: r for r in load_records(parallel, with_predictions=True)}
    assert n == len(seen) == len(b) == len(a) == 20 and set(seen) == set(a)
    for rid, r in a.items():
        assert b[rid]["accuracy"] == r["accuracy"]
        assert b[rid]["noise_multiplier"] == r["noise_multiplier"]
        np.testing.assert_array_equal(b[rid]["predictions"], r["predictions"])
    # Resume and max_runs work the same way with workers.
    assert run_experiment(parallel, progress=False, cache=DataCache(parallel, loader=blobs),
                          jobs=2, max_runs=3) == 3
    with pytest.raises(ValueError, match="jobs"):
        run_experiment(parallel, progress=False, jobs=0)


def test_partial_report_lists_missing_runs(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    cache = DataCache(cfg, loader=blobs)
    run_experiment(cfg, progress=False, max_runs=5, cache=cache)
    text = write_report(cfg, cache=cache).read_text()
    assert "Not run yet" in text and "Finished runs: 5 of 40" in text
    assert "not run" in text
    # A config written by `tune` says so, and says the tuning is not charged.
    tuned = dataclasses.replace(cfg, tuned_from="blobs")
    text = write_report(tuned, cache=cache).read_text()
    assert NOT_CHARGED in text and "from the experiment 'blobs'" in text


def test_changed_hyperparameter_is_a_new_run(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    cfg2 = tiny_config(tmp_path, TINY.replace("learning_rate = 0.5", "learning_rate = 0.25"))
    a = {run_id(s) for s in expand_runs(cfg)}
    b = {run_id(s) for s in expand_runs(cfg2)}
    assert len(a - b) == 8 and len(a & b) == 32


def test_tuning_uses_validation_split_only(tmp_path: Path) -> None:
    cfg = dataclasses.replace(tiny_config(tmp_path), methods=tiny_config(tmp_path).methods[:1],
                              reference="fedgd")
    cache = DataCache(cfg, loader=blobs)
    run_experiment(cfg, tuning=True, progress=False, cache=cache)
    recs = load_records(cfg, tuning=True, with_predictions=True)
    assert len(recs) == 4
    for r in recs:
        assert r["predictions"].shape == (40,)  # 20% of the 200 training rows, not test
    best = select_best(cfg, recs)
    assert best["fedgd"]["params"]["learning_rate"] in (0.1, 1.0)
    text = tuned_config_text(cfg, best)
    assert "NOT charged" in text
    import tomllib

    tuned = parse_config(tomllib.loads(text), base_dir=tmp_path)
    assert tuned.method("fedgd").params == best["fedgd"]["params"]
    assert tuned.tuned_from == cfg.name


def test_validation_split_is_stratified_and_disjoint() -> None:
    y = np.repeat(np.arange(4), [50, 30, 20, 100])
    tr, va = validation_split(y, 0.1, np.random.default_rng(0))
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == len(y)
    assert np.bincount(y[va]).tolist() == [5, 3, 2, 10]


def test_mcnemar_exact_matches_binomial() -> None:
    y = np.zeros(100, dtype=int)
    a = y.copy()
    b = y.copy()
    a[:3] = 1   # a wrong on 3 where b is right  -> c = 3
    b[10:22] = 1  # b wrong on 12 where a is right -> b = 12
    res = mcnemar_exact(a, b, y)
    assert (res.b, res.c) == (12, 3)
    expected = min(1.0, 2 * stats.binom.cdf(3, 15, 0.5))
    assert res.p_value == pytest.approx(expected)
    assert mcnemar_exact(y, y, y).p_value == 1.0
    with pytest.raises(ValueError, match="same shape"):
        mcnemar_exact(a[:5], b, y)


def test_rounds_to_reach() -> None:
    assert rounds_to_reach(np.array([0.1, 0.5, 0.7]), 0.5) == 2
    assert rounds_to_reach(np.array([0.1, 0.2]), 0.5) is None


def test_cli_run_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpprecond.cli import main

    text = TINY.replace('name = "blobs"', 'name = "digits"').replace(
        'partitions = ["iid", "dirichlet"]', 'partitions = ["iid"]').replace(
        "seeds = [0, 1]", "seeds = [0]").replace('epsilons = [2, "inf"]', 'epsilons = ["inf"]')
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    out = tmp_path / "res"
    assert main(["experiment", "run", str(path), "--output", str(out), "--no-progress"]) == 0
    assert "5 new runs" in capsys.readouterr().out
    assert main(["experiment", "report", str(path), "--output", str(out)]) == 0
    assert (out / "report.md").exists()
    assert main(["experiment", "run", str(tmp_path / "missing.toml")]) == 2


def test_where_runs_part_of_the_grid_first(tmp_path: Path) -> None:
    from dpprecond.cli.experiment import _where

    cfg = tiny_config(tmp_path)
    cache = DataCache(cfg, loader=blobs)
    where = _where(["partition=iid", "seed=1", "epsilon=inf"])
    assert where == {"partition": "iid", "seed": 1, "epsilon": None}
    assert run_experiment(cfg, progress=False, cache=cache, where=where) == 5
    assert run_experiment(cfg, progress=False, cache=cache) == 35


def test_per_t_protocol_runs_and_reports(tmp_path: Path) -> None:
    text = TINY.replace('kind = "per-round"', 'kind = "per-T"\nrounds_list = [1, 3]').replace(
        'partitions = ["iid", "dirichlet"]', 'partitions = ["iid"]').replace(
        "seeds = [0, 1]", "seeds = [0]")
    cfg = tiny_config(tmp_path, text)
    cache = DataCache(cfg, loader=blobs)
    assert run_experiment(cfg, progress=False, cache=cache) == 2 * 2 * 5
    recs = load_records(cfg)
    assert sorted({len(r["accuracy"]) for r in recs}) == [1, 3]
    # each T is its own calibration: the T = 1 run meets epsilon = 2 on its own
    one = [r for r in recs if r["spec"]["rounds"] == 1 and r["spec"]["epsilon"] == 2.0]
    assert all(r["epsilon_spent"] == pytest.approx(2.0, rel=1e-2) for r in one)
    md = write_report(cfg, cache=cache)
    assert (md.parent / "accuracy_vs_T_K3_iid.png").exists()
    assert "after T = 3 rounds" in md.read_text()


def test_compare_pools_settings_and_pairs_runs(tmp_path: Path) -> None:
    """``comparison_report``: the mean accuracy and the difference from the reference are
    the pooled means of the finished runs, and the McNemar counts are those of the paired
    runs (same setting and seed), recomputed here from the records."""
    from dpprecond.experiments.compare import comparison_figure, comparison_report

    cfg = tiny_config(tmp_path)
    cache = DataCache(cfg, loader=blobs)
    run_experiment(cfg, progress=False, cache=cache)
    recs = load_records(cfg, with_predictions=True)
    text = comparison_report([cfg, cfg], labels=["a", "b"], caches=[cache, cache])
    y = blobs("")[3]

    def final(method: str, eps: float | None) -> dict[tuple, dict]:
        return {(r["spec"]["clients"], r["spec"]["partition"], r["spec"]["seed"]): r
                for r in recs if r["spec"]["method"] == method
                and r["spec"]["epsilon"] == eps}

    ref, other = final("fedgd", 2.0), final("fedfc", 2.0)
    mean = 100 * np.mean([r["final_accuracy"] for r in other.values()])
    diff = mean - 100 * np.mean([r["final_accuracy"] for r in ref.values()])
    tests = [mcnemar_exact(other[k]["predictions"], ref[k]["predictions"], y) for k in ref]
    up = sum(t.p_value < 0.05 and t.b > t.c for t in tests)
    down = sum(t.p_value < 0.05 and t.b < t.c for t in tests)
    cell = f"{mean:.1f} ({diff:+.1f}; {up}↑ {down}↓ /{len(tests)})"
    rows = [ln for ln in text.splitlines() if ln.startswith("| a | fedfc |")]
    assert len(rows) == 2 and cell in rows[0]  # accuracy table, then rounds table
    assert "40 of 40 runs finished" in text and text.count("| b | fedgd |") == 2
    with pytest.raises(ValueError, match="reference='adam'"):
        comparison_report([cfg], reference="adam", caches=[cache])
    png = comparison_figure([cfg, cfg], tmp_path / "cmp.png", labels=["a", "b"])
    assert png.stat().st_size > 1000


def test_kernel_precision_and_backend_settings(tmp_path: Path) -> None:
    """[protocol] precision/backend reach the runs; the default leaves the ids unchanged."""
    default = tiny_config(tmp_path)
    assert all("precision" not in s and "backend" not in s for s in expand_runs(default))
    f32 = tiny_config(tmp_path, TINY.replace('reference = "sofim"',
                                             'reference = "sofim"\nprecision = "float32"'))
    ids = {run_id(s) for s in expand_runs(f32)}
    assert all(s["precision"] == "float32" for s in expand_runs(f32))
    assert not ids & {run_id(s) for s in expand_runs(default)}
    run_experiment(f32, progress=False, cache=DataCache(f32, loader=blobs),
                   where={"seed": 0, "method": "fedgd", "partition": "iid"})
    runs = load_records(f32)
    assert runs and all(0.0 <= r["final_accuracy"] <= 1.0 for r in runs)
    with pytest.raises(ValueError, match="precision"):
        tiny_config(tmp_path, TINY.replace('reference = "sofim"',
                                           'reference = "sofim"\nprecision = "float16"'))
    pca = TINY.replace('name = "digits"', 'name = "digits"\nfeatures = "pca:3"').replace(
        'reference = "sofim"', 'reference = "sofim"\nbackend = "torch"')
    with pytest.raises(ValueError, match="backend='torch'"):
        tiny_config(tmp_path, pca)
