"""Review 32b: a SuperNode's own secure-mode setting on Flower's SecAgg+ PCA releases.

Node config ``secure-noise=true`` is documented as the operator's own demand for
secure-mode noise "whatever the server asks" (docs/flower.md). On SecAgg+ PCA such a node
draws its rounding uniforms, its Skellam shares and its public draws from the OS CSPRNG
(it used to refuse every release); a seeded one refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context

from dpprecond.adapters.flower.pca import ClientMissingError, SplitRows, fit_pca_on_flower
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)
from tests.adapters.test_flower_pca_secagg import FIT, Grid, K
from tests.spies import public_draw_sources, recording_app, share_sources


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    return X, np.linspace(0, X.shape[0], K + 1).astype(np.int64)


@pytest.mark.parametrize("dual", [False, True])
def test_a_secure_noise_node_answers_secagg_plus_pca_from_the_csprng(
        digits, monkeypatch, dual) -> None:
    """Every node sets secure-noise=true (the server does not ask for secure mode): each
    answers every SecAgg+ PCA release with a rounding and Skellam share from a
    SecureGenerator, and its public draws (the power method's start) too; the fit's
    event and epsilon are unchanged, and the result does not claim secure mode (the
    server did not ask for it). A node without it draws from numpy; a seeded node with
    it refuses, by name, before any release."""
    from dpprecond.adapters.flower.pca import make_pca_client_app
    from dpprecond.adapters.flower.secagg import make_dual_client_app

    def app(**kw: object) -> object:
        rows = SplitRows(*digits)
        return make_dual_client_app(rows, pca=True, **kw) if dual \
            else make_pca_client_app(rows, **kw)

    def cfg(i: int) -> dict:
        return {"partition-id": i, "num-partitions": K, "secure-noise": True}

    shares, public = share_sources(monkeypatch), public_draw_sources(monkeypatch)
    got = fit_pca_on_flower(Grid(app(), node_config=cfg), 4,  # type: ignore[arg-type]
                            method="power", **FIT)
    sums = got.info["secure_aggregation"]
    assert shares == ["SecureGenerator"] * (K * sums["n_sums"]) and sums["n_sums"] > 1
    assert public == ["SecureGenerator"] * K and sums["secure"] is False
    shares.clear()
    public.clear()
    plain = fit_pca_on_flower(Grid(app()), 4, method="power", **FIT)  # type: ignore[arg-type]
    assert shares == ["Generator"] * (K * sums["n_sums"]) and public == ["Generator"] * K
    assert plain.dp_event == got.dp_event and plain.epsilon == got.epsilon
    recording, errors = recording_app(app(noise_seed=3))  # type: ignore[arg-type]
    seeded = Grid(recording, node_config=cfg)  # type: ignore[arg-type]
    with pytest.raises(ClientMissingError, match="refuses seeds"):
        fit_pca_on_flower(seeded, 4, method="power", **FIT)
    assert "train" not in seeded.types
    assert len(errors) == K and all("refuses seeds" in e for e in errors)


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


def test_the_pca_preflight_passes_secure_mode_under_secure_aggregation() -> None:
    """check_pca_run_config (the ServerApp's first step and the pre-flight CLI's check)
    passes trust='secure-aggregation' with secure=true on to the fit (which runs it, as
    fit_pca_on_flower does), and still refuses it with a noise-seed."""
    from dpprecond.adapters.flower.app import RunConfigError
    from dpprecond.adapters.flower.pca_app import check_pca_run_config

    rc = {"row-norm": 8.0, "trust": "secure-aggregation", "secure": True}
    settings = check_pca_run_config(rc)
    assert settings.trust == "secure-aggregation" and settings.secure is True
    assert settings.fit_kwargs()["secure"] is True
    assert check_pca_run_config({**rc, "secure": False}).secure is False
    assert check_pca_run_config({**rc, "trust": "local"}).secure is True
    with pytest.raises(RunConfigError, match="secure=true refuses seeds"):
        check_pca_run_config({**rc, "noise-seed": 3})
