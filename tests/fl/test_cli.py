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
