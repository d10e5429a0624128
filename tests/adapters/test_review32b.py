"""Review 32b: a SuperNode's own secure-mode setting on Flower's SecAgg+ PCA releases.

Node config ``secure-noise=true`` is documented as the operator's own demand for
secure-mode noise "whatever the server asks" (docs/flower.md). The SecAgg+ PCA client
draws its Skellam shares from numpy generators, so such a node must refuse a secure PCA
release rather than answer it with non-secure noise.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context

from dpprecond.adapters.flower.pca import ClientMissingError, SplitRows, fit_pca_on_flower
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)
from tests.adapters.test_flower_pca_secagg import FIT, Grid, K
from tests.spies import recording_app, share_sources


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    return X, np.linspace(0, X.shape[0], K + 1).astype(np.int64)


@pytest.mark.parametrize("dual", [False, True])
def test_a_secure_noise_node_refuses_a_secagg_plus_pca_release(digits, dual) -> None:
    """Every node sets secure-noise=true: none answers a SecAgg+ PCA release (whose share
    would come from a numpy generator), by name; nothing is released."""
    from dpprecond.adapters.flower.pca import make_pca_client_app
    from dpprecond.adapters.flower.secagg import make_dual_client_app

    rows = SplitRows(*digits)
    recording, errors = recording_app(
        make_dual_client_app(rows, pca=True) if dual else make_pca_client_app(rows))

    def cfg(i: int) -> dict:
        return {"partition-id": i, "num-partitions": K, "secure-noise": True}

    with pytest.raises(ClientMissingError, match="released nothing"):
        fit_pca_on_flower(Grid(recording, node_config=cfg), 4,  # type: ignore[arg-type]
                          method="analyze_gauss", connect_timeout=0.5, **FIT)
    assert errors and all("secure-noise" in e for e in errors)


@pytest.mark.parametrize("value", [True, "true"])
def test_a_secure_noise_node_draws_its_secagg_plus_fl_shares_from_the_csprng(
        monkeypatch, value) -> None:
    """make_dual_client_app on SecAgg+ FL rounds (the in-process Grid, every SecAgg+ stage
    through secaggplus_mod): a node whose config sets secure-noise (TOML true, or the
    string "true" the local-noise path accepts) draws every rounding and Skellam share
    from a SecureGenerator, as does a node asked by a secure strategy (plan-secure);
    neither: from numpy."""
    from types import SimpleNamespace

    from flwr.app import RecordDict

    from dpprecond.adapters.flower import PartitionedDataset
    from dpprecond.adapters.flower.client_app import ClientInfo
    from dpprecond.adapters.flower.secagg import (
        SecAggDPStrategy,
        make_dual_client_app,
        run_secagg,
    )
    from dpprecond.fl import FLConfig
    from dpprecond.fl.models import LinearSoftmax

    config = FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=None)
    loader = PartitionedDataset("digits", seed=5)
    n_rows = sum(loader(ClientInfo(i, K, {}, {})).X.shape[0] for i in range(K))
    model = loader(ClientInfo(0, K, {}, {})).model
    assert isinstance(model, LinearSoftmax)
    kinds = share_sources(monkeypatch)
    for secure, asked in ((value, False), (None, False), (None, True)):
        def cfg(i: int, secure: object = secure) -> dict:
            base = {"partition-id": i, "num-partitions": K}
            return base if secure is None else {**base, "secure-noise": secure}

        kinds.clear()
        grid = Grid(make_dual_client_app(loader), node_config=cfg)
        grid.run = SimpleNamespace(run_id=1)  # type: ignore[attr-defined]  (read by Flower)
        strategy = SecAggDPStrategy(model, "fedgd", config, K, n_rows, secure=asked)
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                          run_config={})
        result = run_secagg(grid, context, strategy)  # type: ignore[arg-type]
        assert [r["n_replied"] for r in result.history] == [K]
        want = "SecureGenerator" if secure is not None or asked else "Generator"
        assert kinds == [want] * K, (secure, asked, kinds)


def test_the_pca_preflight_refuses_secure_mode_under_secure_aggregation() -> None:
    """check_pca_run_config (the ServerApp's first step and the pre-flight CLI's check)
    refuses trust='secure-aggregation' with secure=true, as fit_pca_on_flower does: the
    pre-flight used to drop `secure` before check_pca_config and pass it."""
    from dpprecond.adapters.flower.app import RunConfigError
    from dpprecond.adapters.flower.pca_app import check_pca_run_config

    rc = {"row-norm": 8.0, "trust": "secure-aggregation", "secure": True}
    with pytest.raises(RunConfigError, match="secure=True is not available"):
        check_pca_run_config(rc)
    settings = check_pca_run_config({**rc, "secure": False})
    assert settings.trust == "secure-aggregation" and settings.secure is False
    assert check_pca_run_config({**rc, "trust": "local"}).secure is True
