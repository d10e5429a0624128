"""The PCA app's run config (``dpprecond.adapters.flower.pca_app``), in process.

Parsing and every refusal, the pre-flight check of ``examples/flower-pca-app``, the
clients' rows (the FL app's split, raw pixels) and one whole run on a stand-in Grid that
calls the real ClientApp (its result equals the in-process ``trust="local"`` fit; the
files it writes). ``flwr run`` itself is the smoke test in ``test_flower_cli.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from dpprecond.adapters.flower.app import RunConfigError
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.data import PartitionedDataset, raw_dataset
from dpprecond.adapters.flower.pca import make_pca_client_app
from dpprecond.adapters.flower.pca_app import (
    PCA_RUN_CONFIG_KEYS,
    check_pca_app,
    check_pca_run_config,
    load_pca_rows,
    pca_settings_from_run_config,
    run_pca_from_run_config,
)
from dpprecond.pca import fit_private_pca
from tests.adapters.test_flower_pca import PCAGrid, _task_identity  # noqa: F401

APP = Path(__file__).resolve().parents[2] / "examples" / "flower-pca-app"
BASE = {"row-norm": 8.0}


def test_the_example_apps_run_config_is_valid_and_documented() -> None:
    settings = check_pca_app(APP)
    assert settings.method == "auto" and settings.n_components == 5
    assert settings.row_norm == 8.0 and settings.n_clients is None  # 0: the federation
    assert settings.center is None and settings.output_dir is None
    assert settings.ledger() is None and settings.noise_seed is None
    text = (APP / "pyproject.toml").read_text(encoding="utf-8")
    assert "dependencies = []" in text
    for key in PCA_RUN_CONFIG_KEYS:  # every key the app reads is in its table
        assert f"\n{key} = " in text, key


def test_overrides_are_parsed_as_flwr_run_parses_them() -> None:
    s = check_pca_app(APP, ["method='power' n-components=3 center='private'",
                            "max-epsilon=2.0 n-clients=4 output-dir='/tmp/x'"])
    assert (s.method, s.n_components, s.center, s.n_clients, s.output_dir) == (
        "power", 3, "private", 4, "/tmp/x")
    ledger = s.ledger()
    assert ledger is not None and ledger.max_epsilon == 2.0
    kwargs = s.fit_kwargs()
    assert kwargs["timeout"] == 600.0 and kwargs["connect_timeout"] == 120.0
    assert kwargs["secure"] is False and kwargs["row_norm"] == 8.0


@pytest.mark.parametrize(("change", "match"), [
    ({"max_epsilon": 2.0}, "did you mean 'max-epsilon'"),
    ({"algorithm": "sofim"}, "Unknown run config key 'algorithm'"),
    ({"method": "analyse_gauss"}, "did you mean 'analyze_gauss'"),
    ({"method": "fixed"}, "does not run on Flower"),
    ({"row-norm": ""}, "row-norm is required.*8.0 for digits"),
    ({"row-norm": -1.0}, "row-norm > 0"),
    ({"row-norm": "8"}, "row-norm to be a number"),
    ({"target-epsilon": 0.0}, "target-epsilon > 0"),
    ({"target-delta": 1.5}, "target-delta"),
    ({"n-components": 0}, "n-components >= 1"),
    ({"n-clients": -1}, "n-clients"),
    ({"center": "privat"}, "did you mean 'private'"),
    ({"secure": "yes"}, "secure to be true or false"),
    ({"noise-seed": 3, "secure": True}, "secure=true refuses seeds"),
    ({"noise-seed": -1}, "noise-seed"),
    ({"data": "digit"}, "did you mean 'digits'"),
    ({"partition": "skewed"}, "partition"),
    ({"round-timeout": 0.0}, "round-timeout > 0"),
    ({"max-epsilon": 0.5}, "max_epsilon=0.5"),  # the plan (epsilon 1) is above the cap
    ({"trust": "secure_aggregation"}, "did you mean 'secure-aggregation'"),
    ({"min-clients": 2}, "applies to trust='secure-aggregation'"),
    ({"min-clients": -1}, "min-clients"),
    ({"trust": "secure-aggregation", "method": "fixed"}, "does not run on Flower"),
    ({"trust": "secure-aggregation", "noise-seed": 3, "secure": True},
     "secure=true refuses seeds"),
])
def test_every_bad_key_or_value_is_a_named_error(change: dict[str, Any], match: str) -> None:
    with pytest.raises(RunConfigError, match=match):
        check_pca_run_config({**BASE, **change})


def test_the_defaults_need_only_the_row_norm() -> None:
    s = pca_settings_from_run_config(BASE)
    assert (s.method, s.target_epsilon, s.target_delta, s.secure) == ("auto", 1.0, 1e-6, False)
    with pytest.raises(RunConfigError, match="row-norm is required"):
        check_pca_run_config({})


def _info(i: int, k: int, run_config: dict[str, Any]) -> ClientInfo:
    return ClientInfo(i, k, run_config, {"partition-id": i, "num-partitions": k})


def test_a_clients_rows_are_its_part_of_the_fl_apps_split() -> None:
    rc = {**BASE, "partition": "dirichlet", "alpha": 0.5, "partition-seed": 3}
    X = raw_dataset("digits").X_train
    fl = PartitionedDataset.from_run_config(rc)  # the FL app's loader
    seen = []
    for i in range(3):
        rows = load_pca_rows(_info(i, 3, rc))
        idx = fl.indices(_info(i, 3, rc))
        np.testing.assert_array_equal(rows, X[idx])
        assert fl(_info(i, 3, rc)).y.shape == (rows.shape[0],)  # same records as the FL app
        assert rows.min() >= 0.0 and rows.max() <= 1.0  # raw pixels: row norm <= sqrt(64)
        seen.append(idx)
    assert sorted(np.concatenate(seen).tolist()) == list(range(X.shape[0]))


def _run_app(grid_cls: Any, rc: dict[str, Any], K: int, seed: int) -> tuple[Any, Any, Any]:
    """The app's whole run on ``grid_cls`` (a stand-in Grid) with ``K`` consenting nodes,
    and the in-process fit of the same rows, seed and trust (analyze_gauss, k = 3, eps 2)."""
    grid = grid_cls(make_pca_client_app(load_pca_rows), n_nodes=K,
                    node_config=lambda i: {"partition-id": i, "num-partitions": K,
                                           "allow-seeded-noise": True})
    for ctx in grid.contexts.values():
        ctx.run_config.update(rc)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    result = run_pca_from_run_config(grid, context)

    parts = [load_pca_rows(_info(i, K, rc)) for i in range(K)]
    bounds = np.cumsum([0] + [p.shape[0] for p in parts])
    ref = fit_private_pca(np.vstack(parts), 3, method="analyze_gauss", target_epsilon=2.0,
                          target_delta=1e-6, row_norm=8.0, seed=seed, clients=bounds,
                          trust=rc.get("trust", "local"))
    return grid, result, ref


def test_a_whole_run_is_the_in_process_fit_and_writes_its_files(tmp_path: Path) -> None:
    K, seed = 3, 11
    rc = {**BASE, "n-components": 3,
          "method": "analyze_gauss", "target-epsilon": 2.0, "output-dir": str(tmp_path),
          "noise-seed": seed}
    _, result, ref = _run_app(PCAGrid, rc, K, seed)
    assert result.epsilon == ref.epsilon and result.info["n_clients"] == K
    np.testing.assert_allclose(result.components, ref.components, atol=1e-12)

    saved = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert saved["epsilon"] == result.epsilon and saved["delta"] == 1e-6
    assert saved["trust"] == "local" and saved["row_norm"] == 8.0
    assert "one row of one client" in saved["privacy_unit"]
    np.testing.assert_array_equal(np.load(tmp_path / "components.npy"), result.components)
    assert result.explained_variance is not None
    np.testing.assert_array_equal(np.load(tmp_path / "explained_variance.npy"),
                                  result.explained_variance)
    assert not (tmp_path / "mean.npy").exists()  # no centering: nothing released


def test_a_secure_aggregation_run_is_the_in_process_secure_fit(tmp_path: Path) -> None:
    """trust = "secure-aggregation" in the run config: every release through SecAgg+ (the
    stand-in Grid runs Flower's workflow and secaggplus_mod), the same components, event
    and epsilon as the in-process secure fit with the same seed; result.json says so."""
    from tests.adapters.test_flower_pca_secagg import Grid

    K, seed = 3, 11
    rc = {**BASE, "n-components": 3, "method": "analyze_gauss", "target-epsilon": 2.0,
          "output-dir": str(tmp_path), "noise-seed": seed, "trust": "secure-aggregation"}
    settings = check_pca_run_config(rc)
    assert settings.trust == "secure-aggregation" and settings.min_clients is None
    grid, result, ref = _run_app(Grid, rc, K, seed)
    assert result.dp_event == ref.dp_event and result.epsilon == ref.epsilon
    assert np.array_equal(result.components, ref.components)  # integer sums: bit for bit
    assert grid.types["train"] > 0  # the releases went through SecAgg+'s train messages
    saved = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert saved["trust"] == "secure-aggregation" and saved["epsilon"] == result.epsilon


def test_the_preflight_check_exits_non_zero_on_a_bad_run_config() -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dpprecond.adapters.flower.pca_app",
                               str(APP), *args], capture_output=True, text=True, timeout=120)

    good = check("--run-config", "method='power' target-epsilon=2.0")
    assert good.returncode == 0, good.stderr
    typo = check("--run-config", "methd='auto'")
    assert typo.returncode == 2 and "did you mean 'method'" in typo.stderr
    value = check("--run-config", "row-norm=''")
    assert value.returncode == 2 and "row-norm is required" in value.stderr


def test_a_secure_run_on_a_shape_secaggplus_cannot_carry_contacts_no_node(monkeypatch) -> None:
    """Ten times Fashion-MNIST's rows (600,000, d = 784) need 34 bits even at the coarsest
    rounding scale (2^-3), above SecAgg+'s 2^30: under secure aggregation the app refuses
    it from the run config's dataset before any message (n-clients = 0 is bounded at 2
    clients), and the pre-flight check exits with the same reason; digits (1,797 rows,
    d = 64) and Fashion-MNIST's own shape (37 bits at 2^-10, 30 at 2^-3) pass."""
    from types import SimpleNamespace

    import dpprecond.adapters.flower.data as data
    from dpprecond.adapters.flower.pca import SecureAggregationUnavailableError
    from dpprecond.adapters.flower.pca_app import check_secure_shape
    from tests.adapters.test_flower_pca_secagg import Grid

    rc = {**BASE, "n-components": 3, "method": "analyze_gauss", "target-epsilon": 2.0,
          "trust": "secure-aggregation", "row-norm": 28.0}
    check_secure_shape(check_pca_run_config(rc))  # digits: fits
    check_secure_shape(check_pca_run_config({**rc, "trust": "local"}))
    fmnist = SimpleNamespace(X_train=SimpleNamespace(shape=(60_000, 784)))
    monkeypatch.setattr(data, "raw_dataset", lambda name, path=None: fmnist)
    check_secure_shape(check_pca_run_config({**rc, "n-clients": 20}))  # coarsened: fits
    shape = SimpleNamespace(X_train=SimpleNamespace(shape=(600_000, 784)))
    monkeypatch.setattr(data, "raw_dataset", lambda name, path=None: shape)
    for n_clients in (0, 20):
        run = {**rc, "n-clients": n_clients}
        grid = Grid(make_pca_client_app(load_pca_rows))
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                          run_config=run)
        with pytest.raises(SecureAggregationUnavailableError,
                           match=r"modulus of 2\^34 even at the coarsest"):
            run_pca_from_run_config(grid, context)
        assert grid.types == {}  # no node contacted
    check_secure_shape(check_pca_run_config({**rc, "trust": "local"}))  # local: no bound
    with pytest.raises(RunConfigError, match=r"modulus of 2\^34"):
        check_pca_app(APP, ["trust='secure-aggregation' row-norm=28.0"])
