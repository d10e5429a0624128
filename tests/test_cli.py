"""The command line as a user runs it: tables, JSON, and clear errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpprecond.cli import main
from tests.strict_json import load_strict


def test_pca_digits_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    rc = main(["pca", "--data", "digits", "-k", "3", "--method", "analyze_gauss",
               "--method", "select", "--epsilon", "2", "--seed", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "analyze_gauss" in text and "select" in text and "eps spent" in text
    payload = json.loads(out.read_text())
    methods = [r["method"] for r in payload["results"]]
    assert methods == ["exact", "analyze_gauss", "select"]
    assert payload["results"][0]["sin_theta"] == 0.0
    # every row is what the library gives for the same seed (the table measures the fit)
    from dpprecond.cli.pca import load_pca_matrix
    from dpprecond.pca import fit_private_pca, sin_theta

    X, row_norm, _ = load_pca_matrix("digits")
    exact = fit_private_pca(X, 3, method="exact", target_epsilon=None, target_delta=1e-6,
                            row_norm=row_norm).basis
    for r in payload["results"][1:]:
        assert 0 < r["epsilon"] <= 2.0 + 1e-9  # select may spend less (docs/pca.md)
        res = fit_private_pca(X, 3, method=r["method"], target_epsilon=2.0,
                              target_delta=1e-6, row_norm=row_norm, seed=1)
        assert r["sin_theta"] == pytest.approx(sin_theta(res.basis, exact), abs=1e-9)


def test_pca_on_a_csv_file_needs_row_norm(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    m = np.random.default_rng(0).normal(size=(200, 4))
    path = tmp_path / "m.csv"
    np.savetxt(path, m, delimiter=",")
    assert main(["pca", "--data", str(path), "-k", "2", "--method", "analyze_gauss"]) == 2
    assert "--row-norm is required" in capsys.readouterr().err
    assert main(["pca", "--data", str(path), "-k", "2", "--method", "analyze_gauss",
                 "--row-norm", "4", "--epsilon", "1"]) == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["pca", "--data", "missing.npy", "--row-norm", "1"], "missing.npy"),
    (["pca", "--epsilon", "0"], "--epsilon > 0, got --epsilon=0"),
    (["pca", "--delta", "1"], "--delta in the open interval (0, 1), got --delta=1.0"),
    (["pca", "-k", "0"], "Expected -k >= 1, got -k=0"),
    (["pca", "--data", "mnist"], "Unknown --data 'mnist'"),
    (["pca", "--data", "data.npz"], "--data 'data.npz': no such file"),
    (["pca", "--row-norm", "-1"], "--row-norm must be a finite public bound > 0"),
    (["pca", "--trust", "secure-aggregation"], "--trust secure-aggregation applies to "
     "federated PCA only: give --clients K"),
    (["pca", "--clients", "1"], "--clients >= 2"),
    (["pca", "--clients", "3", "--method", "select"], "--method select does not run "
     "federated"),
    (["pca", "--clients", "3", "--trust", "secure-aggregation", "--secure", "--seed", "1"],
     "--secure refuses --seed"),
])
def test_pca_bad_input_is_one_clear_line(argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_no_command_prints_help(capsys: pytest.CaptureFixture) -> None:
    assert main([]) == 2
    assert "pca" in capsys.readouterr().out


def test_demo_shows_the_defaults_beside_their_baselines(capsys: pytest.CaptureFixture) -> None:
    """``make demo``: the default PCA beside Analyze Gauss on digits and on the synthetic
    low-coherence case (where the default iterates and wins), then the default federated
    method beside DP-FedGD."""
    assert main(["demo"]) == 0
    text = capsys.readouterr().out
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] in ("auto", "analyze_gauss") and parts[1] in ("1", "4"):
            rows[(parts[0], parts[1])] = float(parts[4])  # sin-theta, synthetic case
    assert "(iterated)" in text and "(completed Analyze Gauss)" in text
    # what to read comes first: captured variance, then sin-theta, explained under the table
    header = next(ln for ln in text.splitlines() if ln.startswith("method"))
    assert header.index("capt. var") < header.index("sin-theta")
    assert "read this first" in text and "not found" in text
    for eps in ("1", "4"):
        assert rows[("auto", eps)] < 0.75 * rows[("analyze_gauss", eps)]
    fl = [ln.split() for ln in text.splitlines() if ln.strip().startswith(("1 ", "4 ", "inf "))]
    assert [r[0] for r in fl] == ["1", "4", "inf"] and all(len(r) == 3 for r in fl)
    assert "sofim-lagged" in text and "fedgd" in text


# -- issue 17, hole 10: one strict JSON format for every output, with the released values --


def test_pca_json_is_strict_and_holds_the_released_components(tmp_path: Path) -> None:
    """``dpprecond pca --json`` wrote bare Infinity/NaN and no components."""
    out = tmp_path / "r.json"
    assert main(["pca", "-k", "2", "--method", "auto", "--method", "analyze_gauss",
                 "--epsilon", "1", "--seed", "0", "--json", str(out)]) == 0
    payload = load_strict(out)
    exact, *fits = payload["results"]
    assert exact["epsilon"] is None and exact["components"] is None  # not a release
    for r in fits:
        V = np.array(r["components"])
        assert V.shape == (2, 64) and np.allclose(V @ V.T, np.eye(2), atol=1e-9)
        assert len(r["explained_variance"]) == 2 and 0 < r["epsilon"] <= 1.0
    from dpprecond.cli.pca import load_pca_matrix
    from dpprecond.pca import fit_private_pca

    X, row_norm, _ = load_pca_matrix("digits")
    res = fit_private_pca(X, 2, method="auto", target_epsilon=1.0, target_delta=1e-6,
                          row_norm=row_norm, seed=0)
    np.testing.assert_allclose(np.array(fits[0]["components"]), res.components, atol=1e-12)


@pytest.mark.parametrize("features", ["pixels", "pca:3"])
def test_fl_history_is_strict_and_holds_the_released_model(lab_file: Path, tmp_path: Path,
                                                           features: str) -> None:
    """FL outputs wrote epsilons as "inf" strings, and no model."""
    out = tmp_path / "o"
    assert main(["fl", "--data", str(lab_file), "--rounds", "2", "--clients", "3",
                 "--epsilon", "inf", "--features", features, "--row-norm", "3",
                 "--out", str(out)]) == 0
    hist = load_strict(out / "history.json")
    assert hist["epsilon"] is None and hist["history"][-1]["epsilon"] is None
    assert len(hist["params"]) == (5 if features == "pixels" else 3) * 3 + 3
    if features == "pca:3":
        assert np.array(hist["pca_components"]).shape == (3, 5)
    else:
        assert "pca_components" not in hist


def test_experiment_run_of_a_binary_file_names_the_file(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """``experiment run file.npy`` ended in a bare "'utf-8' codec can't decode"."""
    bad = tmp_path / "file.npy"
    np.save(bad, np.zeros(3))
    assert main(["experiment", "run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a TOML experiment file" in err


def test_pca_json_names_the_centering_mode(tmp_path: Path) -> None:
    """``center`` held the mode ("none"/"private"), not a centre: it is ``centering`` now,
    and the old key stays (deprecated) with the same value."""
    out = tmp_path / "c.json"
    assert main(["pca", "-k", "2", "--method", "analyze_gauss", "--center", "private",
                 "--seed", "0", "--json", str(out)]) == 0
    payload = load_strict(out)
    assert payload["centering"] == "private" == payload["center"]


@pytest.mark.parametrize("trust", ["local", "secure-aggregation"])
def test_pca_with_clients_is_the_federated_fit(tmp_path: Path, trust: str,
                                               capsys: pytest.CaptureFixture) -> None:
    """``--clients K --trust T``: every row of the table is ``fit_private_pca(X,
    clients=bounds, trust=T)`` with the same seed (contiguous blocks in row order), and
    the JSON says who held the rows; ``--max-epsilon`` checks the trust model's plan."""
    import re

    out = tmp_path / "f.json"
    assert main(["pca", "-k", "3", "--method", "all", "--epsilon", "2", "--seed", "4",
                 "--clients", "3", "--trust", trust, "--max-epsilon", "8",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"3 clients (contiguous blocks of 599-599 rows), trust={trust}" in text
    total = float(re.search(r"spend epsilon ([0-9.]+) in total", text).group(1))  # type: ignore[union-attr]
    payload = load_strict(out)
    assert payload["n_clients"] == 3 and payload["trust"] == trust
    from dpprecond.cli.pca import client_bounds, load_pca_matrix
    from dpprecond.pca import fit_private_pca

    X, row_norm, _ = load_pca_matrix("digits")
    bounds = client_bounds(X.shape[0], 3)
    assert bounds.tolist() == [0, 599, 1198, 1797]
    fits = payload["results"][1:]
    assert [r["method"] for r in fits] == ["auto", "analyze_gauss", "fixed", "power"]
    for r in fits:
        ref = fit_private_pca(X, 3, method=r["method"], target_epsilon=2.0,
                              target_delta=1e-6, row_norm=row_norm, seed=4, clients=bounds,
                              trust=trust)  # type: ignore[arg-type]
        assert r["epsilon"] == ref.epsilon
        np.testing.assert_allclose(np.array(r["components"]), ref.components, atol=1e-12)
    # the composition of the trust model's four plans: a cap below it refuses before any
    # fit (the secure plans are Skellam events, a little above the Gaussian ones)
    assert 2.0 < total < 8.0
    assert main(["pca", "-k", "3", "--method", "all", "--epsilon", "2", "--clients", "3",
                 "--trust", trust, "--max-epsilon", f"{0.99 * total}"]) == 2
    err = capsys.readouterr().err
    assert f"total epsilon to {total:.3f} > --max-epsilon" in err
    assert "nothing was released" in err
