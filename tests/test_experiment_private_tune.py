"""``dpprecond experiment tune --private``: a private selection per cell, charged in full."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.cli import main
from dpprecond.experiments import private_tuning
from dpprecond.experiments.config import load_config
from dpprecond.experiments.tuning import NOT_CHARGED
from dpprecond.fl.divergence import DivergenceWarning
from dpprecond.selection import repeat_and_select_event, trial_shape
from tests.strict_json import load_strict

TINY = """
name = "tiny"
output = "out"
[data]
name = "digits"
features = "{features}"
{data}
[federation]
clients = [4]
[privacy]
epsilons = [1]
clip_norm = 1.0
[protocol]
rounds = 3
[methods.fedgd]
algorithm = "fedgd"
[methods.adam]
algorithm = "adam"
[tuning]
epsilons = [1, 2]
mean_trials = 1.5
trials = "logarithmic"
[tuning.grid.fedgd]
learning_rate = [0.3, 1.0]
[tuning.grid.adam]
learning_rate = [0.01, 0.03]
"""


def _file(tmp_path: Path, features: str = "pixels", data: str = "") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(features=features, data=data), encoding="utf-8")
    return path


def test_private_tune_end_to_end_charges_each_cells_epsilon(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path)
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    out = capsys.readouterr().out
    assert "selected privately" in out and "tuning included" in out
    assert NOT_CHARGED not in out
    report = load_strict(tmp_path / "out" / "tuning-private.json")  # docs/outputs.md
    assert isinstance(report, dict)
    for cell_file in (tmp_path / "out" / "tuning-private").glob("*.json"):
        assert load_strict(cell_file)["private"] is True  # type: ignore[index]
    assert report["private"] is True and "not free" in report["note"]
    assert set(report["methods"]) == {"fedgd", "adam"}
    grids = {"fedgd": [0.3, 1.0], "adam": [0.01, 0.03]}
    cfg = load_config(path)
    for label, method in report["methods"].items():
        assert [c["epsilon_target"] for c in method["cells"]] == [1.0, 2.0]
        for c in method["cells"]:
            sel = c["selection"]
            # the written total is the target, and it is what the selection's event spends
            assert c["epsilon_total"] == pytest.approx(c["epsilon_target"], rel=1e-3)
            event = repeat_and_select_event(
                dp_event.GaussianDpEvent(sel["trial_noise_multiplier"]),
                cfg.tune_mean_trials, trial_shape(cfg.tune_trials))
            assert epsilon_of(event, cfg.delta, "rdp") == pytest.approx(c["epsilon_total"])
            assert sel["n_candidates"] == 2 and "n_trials" not in sel
            assert c["params"]["learning_rate"] in grids[label]
            assert 0 <= c["test_accuracy"] <= 1
        assert method["params"]["learning_rate"] in grids[label]
    tuned = tmp_path / "tiny-tuned-private.toml"
    text = tuned.read_text()
    assert "Tuned privately" in text and "tuning included" in text
    assert "spends its epsilons again" in text and "NOT charged" not in text
    again = load_config(tuned)
    assert again.tuned_from == "tiny" and not again.tune_grid
    for m in again.methods:
        assert m.params["learning_rate"] == report["methods"][m.label]["params"][
            "learning_rate"]


def test_private_tune_resumes_from_its_cells(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path)
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    first = json.loads((tmp_path / "out" / "tuning-private.json").read_text())

    def no_run(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a finished cell was selected again")

    monkeypatch.setattr(private_tuning, "tune_private", no_run)
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    assert json.loads((tmp_path / "out" / "tuning-private.json").read_text()) == first


def test_free_tune_is_unchanged_and_says_it_is_free(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path)
    assert main(["experiment", "tune", "--no-progress", str(path)]) == 0
    assert NOT_CHARGED in capsys.readouterr().out
    assert "NOT charged" in (tmp_path / "tiny-tuned.toml").read_text()
    assert not (tmp_path / "out" / "tuning-private").exists()


def test_private_tune_refuses_pca_features_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path, features="pca:4", data='trust = "local"')
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 2
    err = capsys.readouterr().err
    assert "features = 'pca:4'" in err and "trust = 'local'" in err and "--private" in err
    assert not list((tmp_path / "out").glob("tuning-private/*.json"))


def test_private_tune_refuses_jobs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _file(tmp_path)
    assert main(["experiment", "tune", "--private", "--jobs", "2", str(path)]) == 2
    assert "--jobs=2" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tuning-private").exists()


def test_private_tune_refuses_a_grid_point_it_cannot_account(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """A training run that is not one Gaussian (a Poisson-sampled plan) is refused naming
    the grid table, before any selection runs."""
    sampled = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    monkeypatch.setattr(private_tuning, "plan_event", lambda *a, **k: sampled)
    ran: list[int] = []
    monkeypatch.setattr(private_tuning, "tune_private", lambda *a, **k: ran.append(1))
    path = _file(tmp_path)
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tuning.grid.fedgd" in err and "unsampled Gaussian" in err
    assert not ran


@pytest.mark.parametrize(("key", "value", "word"), [
    ("mean_trials", "0.5", "mean_trials"), ("trials", '"uniform"', "trials")])
def test_private_tune_settings_are_checked_at_load(tmp_path: Path, key: str, value: str,
                                                    word: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(TINY.format(features="pixels", data="").replace(
        'mean_trials = 1.5\ntrials = "logarithmic"', f"{key} = {value}"), encoding="utf-8")
    with pytest.raises(ValueError, match=word):
        load_config(path)


def test_non_private_cells_are_a_search_without_guarantee(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "inf.toml"
    path.write_text(TINY.format(features="pixels", data="").replace(
        "epsilons = [1, 2]", 'epsilons = ["inf"]'), encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    assert sum("no privacy guarantee" in r.getMessage() for r in caplog.records) == 1
    report = load_strict(tmp_path / "out" / "tuning-private.json")  # null, never inf/NaN
    assert isinstance(report, dict)
    for method in report["methods"].values():
        assert all(c["epsilon_total"] is None for c in method["cells"])
        assert not any(math.isnan(c["test_accuracy"]) for c in method["cells"])


def test_progress_off_a_terminal_is_one_line_per_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Captured stderr is not a terminal: one plain line per cell (as ``experiment run``
    has one per run), naming no number of trials; ``--output`` moves every output."""
    path = _file(tmp_path)
    moved = tmp_path / "elsewhere"
    assert main(["experiment", "tune", "--private", str(path), "--output", str(moved)]) == 0
    err = capsys.readouterr().err
    assert "\x1b[" not in err and "\r" not in err and "trial" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("tiny private tuning: cell ")]
    assert [ln.split(" done")[0] for ln in lines] == [
        f"tiny private tuning: cell {i} of 4" for i in range(1, 5)]
    assert (moved / "tuning-private.json").exists() and not (tmp_path / "out").exists()
    assert load_config(tmp_path / "tiny-tuned-private.toml").output == moved.resolve()


def test_clip_norms_join_the_private_search(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """``[tuning] clip_norms`` multiplies every method's grid (4 candidates each); the free
    tuning refuses it by name (one clip serves all its methods)."""
    path = tmp_path / "clip.toml"
    path.write_text(TINY.format(features="pixels", data="").replace(
        "mean_trials = 1.5", "mean_trials = 1.5\nclip_norms = [0.5, 2.0]"), encoding="utf-8")
    cands = private_tuning.candidates_of(load_config(path), "fedgd")
    assert sorted((c.learning_rate, c.clip_norm) for c in cands) == [
        (0.3, 0.5), (0.3, 2.0), (1.0, 0.5), (1.0, 2.0)]
    assert main(["experiment", "tune", str(path), "--no-progress"]) == 2
    assert "clip_norms" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    report = load_strict(tmp_path / "out" / "tuning-private.json")
    assert isinstance(report, dict)
    for method in report["methods"].values():
        for c in method["cells"]:
            assert c["clip_norm"] in (0.5, 2.0) and c["selection"]["n_candidates"] == 4
            assert c["epsilon_total"] == pytest.approx(c["epsilon_target"], rel=1e-3)
    tuned = load_config(tmp_path / "clip-tuned-private.toml")
    clips = {m["clip_norm"] for m in report["methods"].values()}
    assert tuned.clip_norm == (clips.pop() if len(clips) == 1 else 1.0)


def test_no_trial_warning_is_shown(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A trial's divergence warning concerns a run that is not released, and their count
    would reveal the number of trials: none is shown (these trials' test loss climbs:
    server step 1 at clip 10, epsilon 2, 30 rounds, 10 clients)."""
    text = TINY.format(features="pixels", data="")
    for old, new in (("learning_rate = [0.3, 1.0]", "learning_rate = [1.0]"),
                     ("rounds = 3", "rounds = 30"), ("clients = [4]", "clients = [10]"),
                     ("epsilons = [1, 2]", "epsilons = [2]"),
                     ("clip_norm = 1.0", "clip_norm = 10.0"),
                     ("[tuning.grid.adam]\nlearning_rate = [0.01, 0.03]\n", "")):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "steep.toml"
    path.write_text(text, encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    assert not [w for w in caught if issubclass(w.category, DivergenceWarning)]
    assert "climbed" not in capsys.readouterr().err


def test_a_delta_warning_is_shown_once_per_cell(tmp_path: Path) -> None:
    """delta above 1/n warns once per cell however many trials ran (their number is
    hidden)."""
    from dpprecond import LargeDeltaWarning

    path = tmp_path / "delta.toml"
    path.write_text(TINY.format(features="pixels", data="").replace(
        "clip_norm = 1.0", "clip_norm = 1.0\ndelta = 0.001").replace(
        "mean_trials = 1.5", "mean_trials = 4"), encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["experiment", "tune", "--private", "--no-progress", str(path)]) == 0
    assert len([w for w in caught if issubclass(w.category, LargeDeltaWarning)]) == 4
