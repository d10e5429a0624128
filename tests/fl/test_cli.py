"""The ``dpprecond fl`` sub-command and the demo."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from dpprecond.cli import fl as cli_fl


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_fl.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_register_sets_run() -> None:
    args = parse(["fl", "--epsilon", "inf"])
    assert args.func is cli_fl.run
    assert math.isinf(args.epsilon) and args.algorithm == "sofim-lagged" and args.clients == 20
    assert cli_fl.privacy_level(args.epsilon, None) == {"noise_multiplier": 0.0}
    assert cli_fl.privacy_level(None, None) == {"target_epsilon": 1.0}


def test_run_writes_history_and_plot(tmp_path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "o"
    args = parse(["fl", "--data", "digits", "--clients", "4", "--rounds", "3", "--epsilon",
                  "4", "--accountant", "rdp", "--algorithm", "sofim-momentum", "--out",
                  str(out), "--seed", "2"])
    assert cli_fl.run(args) == 0
    text = capsys.readouterr().out
    assert text.count("round ") >= 3 and "final test accuracy" in text
    hist = json.loads((out / "history.json").read_text())
    assert len(hist["history"]) == 3 and hist["config"]["algorithm"] == "sofim-momentum"
    assert hist["history"][-1]["epsilon"] <= 4.0 + 1e-9
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_reports_bad_input(capsys: pytest.CaptureFixture) -> None:
    from dpprecond.cli import main

    assert main(["fl", "--clip-norm", "-1", "--rounds", "1"]) == 2
    assert "--clip-norm" in capsys.readouterr().err  # the flag the user typed


def test_bad_epsilon_text() -> None:
    with pytest.raises(SystemExit):
        parse(["fl", "--epsilon", "lots"])




def test_cli_refuses_both_levels(capsys) -> None:
    from dpprecond.cli import main

    assert main(["fl", "--epsilon", "1", "--noise-multiplier", "2", "--rounds", "1"]) == 2
    assert "not both" in capsys.readouterr().err


# -- issue 17, hole 1: --features pca:K keeps --secure, refuses --seed, honours --lr ------


def _pipeline_argv(lab_file, out, *extra: str) -> list[str]:
    return ["fl", "--data", str(lab_file), "--rounds", "3", "--features", "pca:3",
            "--row-norm", "3", "--clients", "4", "--out", str(out), *extra]


@pytest.mark.parametrize("features", ["pixels", "pca:3", "random:3"])
def test_secure_refuses_seed_on_every_feature_path(lab_file, tmp_path, features,
                                                   capsys: pytest.CaptureFixture) -> None:
    from dpprecond.cli import main

    argv = _pipeline_argv(lab_file, tmp_path / "o", "--secure", "--seed", "1")
    argv[argv.index("pca:3")] = features
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--secure refuses --seed" in err
    assert not (tmp_path / "o" / "history.json").exists()


def test_pca_features_draw_every_release_in_secure_mode(lab_file, tmp_path,
                                                        release_spy) -> None:
    from dpprecond.cli import main

    assert main(_pipeline_argv(lab_file, tmp_path / "o", "--secure")) == 0
    # the PCA's releases (M1, the probe, M2 or the iterations) and one message per client
    # and round, every one from the CSPRNG and snapped
    assert release_spy.all_secure and len(release_spy.calls) >= 3 + 3 * 4


def test_pca_features_honour_the_learning_rate(lab_file, tmp_path) -> None:
    from dpprecond.cli import main

    out = tmp_path / "o"
    assert main(_pipeline_argv(lab_file, out, "--algorithm", "fedgd", "--lr", "0.125")) == 0
    hist = json.loads((out / "history.json").read_text())
    assert hist["config"]["learning_rate"] == 0.125


@pytest.mark.parametrize("features", ["pca:3", "random:3", "pixels"])
def test_max_epsilon_is_honoured_on_every_feature_path(lab_file, tmp_path, features,
                                                       capsys: pytest.CaptureFixture) -> None:
    """Issue 17, hole 2: ``--features pca:3 --max-epsilon 0.5`` spent 1.0 and exited 0."""
    from dpprecond.cli import main

    argv = _pipeline_argv(lab_file, tmp_path / "o", "--max-epsilon", "0.5")
    argv[argv.index("pca:3")] = features
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-epsilon=0.5" in err and "nothing was released" in err
    assert not (tmp_path / "o" / "history.json").exists()
    argv[argv.index("0.5")] = "1"
    assert main(argv) == 0
    hist = json.loads((tmp_path / "o" / "history.json").read_text())
    assert hist["history"][-1]["epsilon"] <= 1.0 + 1e-9


# -- --trust: the trust model of the whole run -----------------------------------------------


def test_trust_secure_aggregation_runs_the_skellam_rounds(tmp_path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """``--trust secure-aggregation`` on digits: the training's distributed Skellam rounds,
    size weighting chosen and said, and the epsilon of the run's Skellam composition."""
    import numpy as np

    from dpprecond.accounting import epsilon_of
    from dpprecond.features import load_features
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.fl.engine import plan_event
    from dpprecond.fl.methods import make_method
    from dpprecond.fl.models import LinearSoftmax

    out = tmp_path / "o"
    args = parse(["fl", "--data", "digits", "--clients", "4", "--rounds", "3", "--epsilon",
                  "1", "--algorithm", "fedgd", "--trust", "secure-aggregation", "--out",
                  str(out), "--seed", "5"])
    assert cli_fl.run(args) == 0
    text = capsys.readouterr().out
    assert "trust: secure-aggregation" in text and "weighting size (chosen for it" in text
    hist = json.loads((out / "history.json").read_text())
    assert hist["config"]["trust"] == "secure-aggregation"
    assert hist["config"]["weighting"] == "size" and hist["config"]["accountant"] == "rdp"
    config = FLConfig(n_rounds=3, clip_norm=args.clip_norm, target_epsilon=1.0,
                      weighting="size", trust="secure-aggregation")
    planned = epsilon_of(plan_event(LinearSoftmax(64, 10), make_method("fedgd"), config),
                         1e-5, "rdp")  # the T Skellam sums, from dp_accounting's RDP
    spent = hist["history"][-1]["epsilon"]
    assert spent == pytest.approx(planned, rel=1e-12) and 1.0 * (1 - 1e-3) <= spent <= 1.0
    ds, _ = load_features("digits")
    api = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                        algorithm="fedgd", n_clients=4, config=config, seed=5)
    assert [h["test_accuracy"] for h in hist["history"]] == [h["test_accuracy"]
                                                             for h in api.history]
    assert np.isfinite(api.final_accuracy)


@pytest.mark.parametrize(("extra", "words"), [
    (["--weighting", "uniform"], ["--weighting size", "--weighting uniform"]),
    (["--mechanism", "poisson", "--sampling-rate", "0.5"], ["--mechanism poisson"]),
    (["--algorithm", "scaffold"], ["--algorithm scaffold", "fedgd"]),
    (["--epsilon", "inf"], ["--epsilon inf", "--trust local"]),
    (["--adaptive-clip", "--algorithm", "fedfc"], ["--adaptive-clip", "--algorithm fedfc"]),
    (["--adaptive-clip", "--mechanism", "client-level"],
     ["--adaptive-clip", "--mechanism client-level"]),
    (["--tune"], ["--tune"]),
    (["--mechanism", "client-level", "--weighting", "size"],
     ["--mechanism client-level", "uniformly", "drop --weighting"]),
    (["--mechanism", "client-level", "--algorithm", "fedfc"],
     ["--mechanism client-level", "--algorithm fedfc", "--mechanism full-batch"]),
    (["--algorithm", "fedavg"], ["--algorithm fedavg", "--mechanism client-level"]),
    (["--algorithm", "scaffold", "--mechanism", "client-level"],
     ["--mechanism client-level", "--algorithm scaffold", "no client-level form"]),
])
def test_trust_secure_aggregation_refuses_what_it_cannot_run(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        extra: list[str], words: list[str]) -> None:
    from dpprecond.cli import main

    def no_data(*a: object, **k: object) -> None:
        raise AssertionError("the data was loaded before the refusal")

    monkeypatch.setattr(cli_fl, "load_fl_data", no_data)
    assert main(["fl", "--data", "digits", "--rounds", "2", "--trust", "secure-aggregation",
                 "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    for w in ["--trust secure-aggregation", *words]:
        assert w in err, (w, err)


@pytest.mark.parametrize("trust", ["local", "secure-aggregation"])
@pytest.mark.parametrize(("extra", "words"), [
    (["--local-steps", "3"], ["--local-steps 3", "--option local_steps=3"]),
    (["--local-lr", "0.7"], ["--local-lr 0.7", "--option local_lr=0.7"]),
    (["--local-steps", "2", "--local-lr", "0.7"],
     ["--local-steps 2 and --local-lr 0.7", "--option local_steps=2 --option local_lr=0.7"]),
])
def test_a_local_step_method_refuses_the_mechanism_local_step_flags(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        trust: str, extra: list[str], words: list[str]) -> None:
    """fedavg / fedprox / scaffold set their own local steps and step size: the
    mechanism's ``--local-steps`` / ``--local-lr`` are refused (never silently ignored),
    with the ``--option`` that sets them, before any data is loaded, under either trust."""
    from dpprecond.cli import main

    def no_data(*a: object, **k: object) -> None:
        raise AssertionError("the data was loaded before the refusal")

    monkeypatch.setattr(cli_fl, "load_fl_data", no_data)
    for algorithm in ("fedprox", "fedavg"):
        assert main(["fl", "--data", "digits", "--rounds", "2", "--trust", trust,
                     "--mechanism", "client-level", "--algorithm", algorithm,
                     "--out", str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err
        for w in [f"--algorithm {algorithm} sets its own", *words]:
            assert w in err, (w, err)


def test_trust_secure_aggregation_runs_client_level_dp_fedavg(
        tmp_path, capsys: pytest.CaptureFixture) -> None:
    """``--trust secure-aggregation --mechanism client-level --local-steps 2``: the secure
    sums of clipped client updates, uniform weights said, the epsilon of the run's
    Skellam composition, and the API's run under the same seed."""
    from dpprecond.accounting import epsilon_of
    from dpprecond.features import load_features
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.fl.engine import plan_event
    from dpprecond.fl.models import LinearSoftmax

    out = tmp_path / "o"
    args = parse(["fl", "--data", "digits", "--clients", "5", "--rounds", "3", "--epsilon",
                  "4", "--algorithm", "fedgd", "--trust", "secure-aggregation",
                  "--mechanism", "client-level", "--local-steps", "2", "--clip-norm", "1",
                  "--out", str(out), "--seed", "2"])
    assert cli_fl.run(args) == 0
    text = capsys.readouterr().out
    assert "clipped client updates" in text and "weighting uniform" in text
    assert "client-level unit" in text
    hist = json.loads((out / "history.json").read_text())
    assert hist["config"]["mechanism"] == "client-level"
    assert hist["config"]["weighting"] == "uniform" and hist["config"]["sensitivity"] == 2.0
    config = FLConfig(n_rounds=3, clip_norm=1.0, target_epsilon=4.0, mechanism="client-level",
                      local_steps=2, trust="secure-aggregation")
    planned = epsilon_of(plan_event(LinearSoftmax(64, 10), "fedgd", config), 1e-5, "rdp")
    assert hist["history"][-1]["epsilon"] == pytest.approx(planned, rel=1e-12)
    ds, _ = load_features("digits")
    api = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                        algorithm="fedgd", n_clients=5, config=config, seed=2)
    assert [h["test_accuracy"] for h in hist["history"]] == [h["test_accuracy"]
                                                             for h in api.history]


def test_trust_secure_aggregation_runs_client_level_fedprox(
        tmp_path, capsys: pytest.CaptureFixture) -> None:
    """``--algorithm fedprox --mechanism client-level --trust secure-aggregation`` with
    the method's own options: the API's run under the same seed, round for round."""
    from dpprecond.features import load_features
    from dpprecond.fl import FLConfig, run_federated

    out = tmp_path / "o"
    args = parse(["fl", "--data", "digits", "--clients", "5", "--rounds", "3", "--epsilon",
                  "4", "--algorithm", "fedprox", "--option", "local_steps=2", "--option",
                  "mu=0.5", "--trust", "secure-aggregation", "--mechanism", "client-level",
                  "--clip-norm", "1", "--out", str(out), "--seed", "2"])
    assert cli_fl.run(args) == 0
    assert "client-level unit" in capsys.readouterr().out
    hist = json.loads((out / "history.json").read_text())
    assert hist["config"]["mechanism"] == "client-level"
    config = FLConfig(n_rounds=3, clip_norm=1.0, target_epsilon=4.0, mechanism="client-level",
                      trust="secure-aggregation")
    ds, _ = load_features("digits")
    api = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                        algorithm="fedprox", n_clients=5, config=config, seed=2,
                        method_options={"local_steps": 2, "mu": 0.5})
    assert [h["test_accuracy"] for h in hist["history"]] == [h["test_accuracy"]
                                                             for h in api.history]
    assert hist["history"][-1]["epsilon"] == pytest.approx(api.epsilon, rel=1e-12)


def test_trust_secure_aggregation_with_pca_features(lab_file, tmp_path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """``--features pca:K --trust secure-aggregation``: both stages, one ledger composed
    with the RDP accountant, at most the target."""
    from dpprecond.cli import main

    out = tmp_path / "o"
    assert main(_pipeline_argv(lab_file, out, "--algorithm", "fedgd", "--trust",
                               "secure-aggregation", "--seed", "1")) == 0
    text = capsys.readouterr().out
    assert "weighting size (chosen for it" in text and "RDP accountant" in text
    hist = json.loads((out / "history.json").read_text())
    assert hist["config"]["trust"] == "secure-aggregation"
    assert 1.0 * (1 - 1e-3) <= hist["total_epsilon"] <= 1.0
