"""Review 33a: the Flower-side privacy controls (the PCA app's pre-flight bound on the
secure sums, check_secure_shape).

``check_secure_shape`` refuses, before any node is contacted, a dataset no federation
could carry on SecAgg+; with ``n-clients = 0`` it bounds the federation it has not met.
A refusal there must hold for every federation that could register: a shape the exact
check after registration (``check_modulus`` at the registered ``K``) accepts must not be
refused beforehand.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dpprecond.adapters.flower.pca import SecureAggregationUnavailableError
from dpprecond.adapters.flower.pca_app import check_pca_run_config, check_secure_shape
from dpprecond.adapters.flower.pca_secagg import check_modulus
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)

DIGITS = (1437, 64)  # the digits training split's rows and pixels


@pytest.fixture(scope="module")
def digits():
    """sklearn's digits and the bounds of 3 clients (tests/adapters/test_review32b.py)."""
    import numpy as np
    from sklearn.datasets import load_digits

    from tests.adapters.test_flower_pca_secagg import K

    X = load_digits().data.astype(np.float64)
    return X, np.linspace(0, X.shape[0], K + 1).astype(np.int64)


def _exact(settings, n_clients: int) -> None:
    """The check after registration, at the registered federation's size."""
    n, d = DIGITS
    check_modulus(d, n, n_clients, settings.min_clients, method=settings.method,
                  n_components=settings.n_components, target_epsilon=settings.target_epsilon,
                  target_delta=settings.target_delta, center=settings.center)


def test_an_unknown_federation_with_min_clients_above_two_is_not_refused() -> None:
    """n-clients = 0, min-clients = 3: every federation that may run has K >= 3; bounding
    it at 2 clients asked for a plan with min_clients > n_clients and refused digits
    (which a federation of 10 runs) as 'no plan at the worst scale'."""
    rc = {"row-norm": 8.0, "trust": "secure-aggregation", "min-clients": 3,
          "n-clients": 0, "n-components": 5, "method": "auto"}
    settings = check_pca_run_config(rc)
    _exact(settings, 10)  # the federation registers 10 clients: it runs
    check_secure_shape(settings)  # so the pre-flight must not refuse it
    check_secure_shape(replace(settings, n_clients=10))


@pytest.mark.parametrize("center", ["", "private"])
def test_an_unknown_federation_whose_sums_have_no_plan_at_two_clients_is_not_refused(
        center) -> None:
    """n-clients = 0 and every client a share (min-clients = 0): at K = 2 each Skellam
    share carries half the noise variance, and at epsilon 0.02 auto's steps need shares
    above the samplers' 2^50 (no plan), while at K = 10 every share is a tenth and the
    whole fit fits 2^30. A share's mean falls as K grows, so a refusal at 2 clients for
    want of a plan is no refusal at every K: the pre-flight must leave it to the exact
    check after registration (before the charge)."""
    rc = {"row-norm": 8.0, "trust": "secure-aggregation", "n-clients": 0,
          "n-components": 5, "method": "auto", "target-epsilon": 0.02, "center": center}
    settings = check_pca_run_config(rc)
    with pytest.raises(SecureAggregationUnavailableError, match="no plan"):
        _exact(settings, 2)  # two clients: refused after registration, as before
    _exact(settings, 10)  # ten: it runs
    check_secure_shape(settings)


def test_an_unknown_federation_whose_sums_need_too_many_bits_is_still_refused(
        monkeypatch) -> None:
    """The bits a sum needs grow with K (its signal bound and its rounding), so a shape
    that needs more than 2^30 at the fewest clients is refused, with or without
    min-clients (600,000 rows of 784 pixels: 34 bits at 2^-3)."""
    from types import SimpleNamespace

    import dpprecond.adapters.flower.data as data

    shape = SimpleNamespace(X_train=SimpleNamespace(shape=(600_000, 784)))
    monkeypatch.setattr(data, "raw_dataset", lambda name, path=None: shape)
    rc = {"row-norm": 28.0, "trust": "secure-aggregation", "n-clients": 0,
          "n-components": 3, "method": "analyze_gauss", "target-epsilon": 2.0}
    for extra in ({}, {"min-clients": 3}):
        with pytest.raises(SecureAggregationUnavailableError,
                           match=r"modulus of 2\^34 even at the coarsest"):
            check_secure_shape(check_pca_run_config({**rc, **extra}))


# -- the SecAgg+ FL ClientApp of the Python API (make_secagg_client_app) ---------------


def _secagg_fl_run(app, node_config, *, secure: bool = False):
    """One SecAgg+ FL round of fedgd on digits over the in-process Grid (every SecAgg+
    stage through secaggplus_mod); the strategy's result."""
    from types import SimpleNamespace

    from flwr.app import Context, RecordDict

    from dpprecond.adapters.flower import PartitionedDataset
    from dpprecond.adapters.flower.client_app import ClientInfo
    from dpprecond.adapters.flower.secagg import SecAggDPStrategy, run_secagg
    from dpprecond.fl import FLConfig
    from tests.adapters.test_flower_pca_secagg import Grid, K

    config = FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=None)
    loader = PartitionedDataset("digits", seed=5)
    n_rows = sum(loader(ClientInfo(i, K, {}, {})).X.shape[0] for i in range(K))
    model = loader(ClientInfo(0, K, {}, {})).model
    grid = Grid(app(loader), node_config=lambda i: {"partition-id": i, "num-partitions": K,
                                                     **node_config})
    grid.run = SimpleNamespace(run_id=1)  # type: ignore[attr-defined]  (read by Flower)
    strategy = SecAggDPStrategy(model, "fedgd", config, K, n_rows, secure=secure)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={})
    return run_secagg(grid, context, strategy), strategy  # type: ignore[arg-type]


def test_make_secagg_client_app_honours_the_node_configs_secure_noise(monkeypatch) -> None:
    """A SuperNode whose operator set secure-noise=true draws its SecAgg+ shares from the
    CSPRNG whatever the server asks, under make_secagg_client_app as under the dual
    ClientApp (it built SecAggDPClient without reading the node config: numpy shares)."""
    from dpprecond.adapters.flower.secagg import make_secagg_client_app
    from tests.adapters.test_flower_pca_secagg import K
    from tests.spies import share_sources

    kinds = share_sources(monkeypatch)
    result, _ = _secagg_fl_run(make_secagg_client_app, {"secure-noise": True})
    assert [r["n_replied"] for r in result.history] == [K]
    assert kinds == ["SecureGenerator"] * K
    kinds.clear()
    result, _ = _secagg_fl_run(make_secagg_client_app, {})
    assert kinds == ["Generator"] * K


def test_make_secagg_client_app_honours_the_node_configs_noise_floor() -> None:
    """Node config min-noise-multiplier=Z: every client of make_secagg_client_app refuses
    a round whose sum's noise multiplier is below Z, by name (it answered: no floor), so
    nothing is released; at a floor below the plan's the round runs."""
    from dpprecond.adapters.flower.secagg import make_secagg_client_app
    from tests.adapters.test_flower_pca_secagg import K
    from tests.spies import recording_app

    def app(loader):
        recording, got = recording_app(make_secagg_client_app(loader))
        app.errors = got  # type: ignore[attr-defined]
        return recording

    result, strategy = _secagg_fl_run(app, {"min-noise-multiplier": 1e6})
    assert result.history == []
    assert app.errors and all("floor" in e for e in app.errors)  # type: ignore[attr-defined]
    low = 0.5 * strategy.plan_.noise_multiplier
    result, _ = _secagg_fl_run(app, {"min-noise-multiplier": low})
    assert [r["n_replied"] for r in result.history] == [K]


# -- the FL app's run config under secure aggregation ------------------------------------


@pytest.mark.parametrize(("extra", "match"), [
    ({"n-clients": 5, "min-clients": 6}, r"min-clients=6 exceeds n-clients=5"),
    ({"n-clients": 1}, r"n-clients=1"),
])
def test_the_fl_preflight_refuses_a_secure_federation_secaggplus_refuses(extra, match) -> None:
    """check_run_config (the ServerApp's first check and the pre-flight CLI) passed
    min-clients above an explicit n-clients, and a one-client federation, under
    trust='secure-aggregation', which SecAggDPStrategy then refused with its own
    parameter names (min_clients, n_clients) after the dataset was loaded; the pre-flight
    said the run config was valid. Both are refused there now, naming the run-config
    keys; a federation whose size comes from the SuperNodes (n-clients = 0) is checked
    once the size is known."""
    from flwr.app import Context, RecordDict

    from dpprecond.adapters.flower.app import (
        RunConfigError,
        check_run_config,
        secagg_strategy_from_run_config,
    )

    base = {"trust": "secure-aggregation", "noise-multiplier": 1.0, "algorithm": "fedgd",
            "weighting": "size"}
    with pytest.raises(RunConfigError, match=match):
        check_run_config({**base, **extra})
    check_run_config({**base, "n-clients": 5, "min-clients": 5})
    rc = {**base, "n-clients": 0, "min-clients": 6}
    check_run_config(rc)  # the size is not known yet
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(RunConfigError, match=r"min-clients=6 exceeds n-clients=5"):
        secagg_strategy_from_run_config(context, n_clients=5)


def test_the_example_pca_server_app_checks_the_shape_before_contacting_a_node(
        monkeypatch) -> None:
    """examples/flower-pca-app's ServerApp (what `flwr run` runs) refuses, under secure
    aggregation, a dataset whose sums SecAgg+ cannot carry before any node is contacted,
    as the library's pca_app.server_app does (it skipped check_secure_shape: the nodes
    were registered first and the shape refused only then)."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    from flwr.app import Context, RecordDict

    import dpprecond.adapters.flower.data as data
    from dpprecond.adapters.flower.pca import make_pca_client_app
    from dpprecond.adapters.flower.pca_app import load_pca_rows
    from tests.adapters.test_flower_pca_secagg import Grid

    path = (Path(__file__).resolve().parents[2] / "examples" / "flower-pca-app" / "pca_app"
            / "server_app.py")
    spec = importlib.util.spec_from_file_location("review33a_example_pca_server", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    shape = SimpleNamespace(X_train=SimpleNamespace(shape=(600_000, 784)))
    monkeypatch.setattr(data, "raw_dataset", lambda name, path=None: shape)
    rc = {"row-norm": 28.0, "trust": "secure-aggregation", "n-components": 3,
          "method": "analyze_gauss", "target-epsilon": 2.0, "connect-timeout": 0.5}
    grid = Grid(make_pca_client_app(load_pca_rows))
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(SecureAggregationUnavailableError,
                       match=r"modulus of 2\^34 even at the coarsest"):
        example.main(grid, context)
    assert grid.types == {}  # no node contacted


def test_a_secagg_plus_fl_client_refuses_a_plan_for_another_federation_size() -> None:
    """The SecAgg+ PCA client refuses a plan whose n_clients is not its num-partitions
    (a share carries 1 / min_clients of the noise, min_clients <= n_clients: a server
    announcing 1,000 clients to a federation of 3 would have each share carry a
    thousandth, the sum of the 3 a 333th of the variance). The FL client answered any
    n_clients; given its node's size it now refuses another by name."""
    import numpy as np

    from dpprecond.adapters.flower import PartitionedDataset
    from dpprecond.adapters.flower.client_app import ClientInfo
    from dpprecond.adapters.flower.secagg import SecAggDPClient, plan_to_config
    from dpprecond.fl.models import LinearSoftmax
    from dpprecond.secagg.fl import part_sensitivity, round_plan

    local = PartitionedDataset("digits", seed=5)(ClientInfo(0, 3, {}, {}))
    model = local.model
    assert isinstance(model, LinearSoftmax)
    n = 1437
    plan = round_plan(model.n_params, part_sensitivity(model, 1.0, n, np.float64), 2.0,
                      n_rows=n, n_clients=1000, min_clients=1000)
    config = {"round": 1, "secagg-range": plan.modulus, **plan_to_config(plan, 1.0)}
    params = [np.zeros(model.n_params)]
    client = SecAggDPClient(model, local.X, local.y, 0, n_clients=3)
    with pytest.raises(ValueError, match=r"plan-n-clients=1000 is not this node's "
                                         r"num-partitions=3"):
        client.fit(params, config)
    ok = round_plan(model.n_params, part_sensitivity(model, 1.0, n, np.float64), 2.0,
                    n_rows=n, n_clients=3, min_clients=3)
    client.fit(params, {"round": 1, "secagg-range": ok.modulus, **plan_to_config(ok, 1.0)})


@pytest.mark.parametrize("dual", [False, True])
def test_both_secagg_plus_fl_client_apps_check_the_federation_size(dual) -> None:
    """Three nodes told num-partitions=4 refuse a SecAgg+ FL round planned for 3 clients
    (both ClientApps pass the node's size to SecAggDPClient): nothing is released."""
    from dpprecond.adapters.flower.secagg import make_dual_client_app, make_secagg_client_app
    from tests.spies import recording_app

    def app(loader):
        inner = make_dual_client_app(loader) if dual else make_secagg_client_app(loader)
        recording, got = recording_app(inner)
        app.errors = got  # type: ignore[attr-defined]
        return recording

    result, _ = _secagg_fl_run(app, {"num-partitions": 4})
    assert result.history == []
    assert app.errors and all("num-partitions=4" in e  # type: ignore[attr-defined]
                              for e in app.errors)  # type: ignore[attr-defined]


def test_a_registered_federation_smaller_than_min_clients_is_refused_by_name(digits) -> None:
    """min_clients=5 with n_clients unset, and 3 SuperNodes register: refused after
    registration, before any release, as a min_clients above the federation's size (it
    was a SecureAggregationUnavailableError saying the Gram sum 'has no plan at the worst
    scale' and advising fewer rows or features)."""
    from dpprecond.adapters.flower.pca import (
        ClientMissingError,
        SplitRows,
        fit_pca_on_flower,
        make_pca_client_app,
    )
    from tests.adapters.test_flower_pca_secagg import FIT, Grid

    grid = Grid(make_pca_client_app(SplitRows(*digits)))
    with pytest.raises(ValueError, match=r"min_clients=5 exceeds the 3 clients that "
                                         r"registered") as info:
        fit_pca_on_flower(grid, 4, method="analyze_gauss", min_clients=5,  # type: ignore
                          connect_timeout=0.5, **FIT)
    assert not isinstance(info.value, (SecureAggregationUnavailableError, ClientMissingError))
    assert set(grid.types) == {"query.pca"}  # registration only: nothing released


def test_a_nan_noise_floor_is_refused_by_the_local_noise_clientapp() -> None:
    """Node config min-noise-multiplier=nan (TOML's nan): the SecAgg+ FL and PCA paths
    refuse it by name; the local-noise FL path compared `z < nan` (always false) and
    answered every request, with no floor at all."""
    import numpy as np

    from dpprecond.adapters.flower import PartitionedDataset
    from dpprecond.adapters.flower.client_app import train_reply
    from dpprecond.adapters.flower.protocol import RoundRequest
    from dpprecond.fl.tasks import GradientTask
    from tests.adapters.test_flower import _context, _train_message

    load = PartitionedDataset("digits", seed=5)
    params = np.zeros(load.dataset().n_features * load.dataset().n_classes
                      + load.dataset().n_classes)
    msg = _train_message(params, RoundRequest(1, GradientTask(1.0, 0.5)))
    with pytest.raises(ValueError, match="min-noise-multiplier"):
        train_reply(msg, _context({"min-noise-multiplier": float("nan")}), load)
    train_reply(msg, _context({"min-noise-multiplier": 0.25}), load)  # a real floor


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_every_client_app_refuses_a_bad_noise_seed_when_built(bad) -> None:
    """make_client_app checked noise_seed when built; the SecAgg+ ClientApps only when
    a request came (review33a's note): each factory now refuses it at once, by name."""
    from dpprecond.adapters.flower.client_app import make_client_app
    from dpprecond.adapters.flower.pca import make_pca_client_app
    from dpprecond.adapters.flower.secagg import make_dual_client_app, make_secagg_client_app

    factories = [make_client_app, make_secagg_client_app, make_pca_client_app,
                 make_dual_client_app,
                 lambda load, noise_seed: make_dual_client_app(load, noise_seed=noise_seed,
                                                               pca=True)]
    for factory in factories:
        with pytest.raises((TypeError, ValueError), match="noise_seed"):
            factory(lambda info: None, noise_seed=bad)
