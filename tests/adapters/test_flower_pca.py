"""Federated private PCA on Flower: the in-process trust="local" fit, one round per pass.

Everything runs in process on a small stand-in for Flower's Grid that calls the real
ClientApp with a persistent Context per node (no Ray). Digits (1,797 rows, d = 64) split
over 5 clients.

Why "to the last bits" and not bit for bit: the in-process fit adds the K exact parts
(``FederatedRows``) and then the summed noise of the K client streams (``LocalNoise``);
on Flower each client adds its own noise to its own part and the server adds the K noisy
parts. The draws are the same numbers (each client's stream), the sum is formed in
another order, so each released entry can differ in its last bits (relative ~1e-16),
and the eigenvectors by ~1e-15. The tolerances below are 1e-12: one wrong draw moves a
component by ~1e-2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from dpprecond import PrivacyBudgetExceededError
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower import make_client_app
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.pca import (
    ClientMissingError,
    SplitRows,
    add_pca_handler,
    fit_pca_on_flower,
    make_pca_client_app,
    make_pca_server_app,
)
from dpprecond.pca import fit_private_pca
from dpprecond.pca.api import planned_event
from dpprecond.pca.remote import ClientState, client_answer

K = 5
SEED = 11
ROW_NORM = 16.0 * 8.0  # digits: 64 pixels in [0, 16], a public bound from the range
FIT = dict(target_epsilon=2.0, target_delta=1e-5, row_norm=ROW_NORM)
ATOL = 1e-12


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    bounds = np.linspace(0, X.shape[0], K + 1).astype(np.int64)
    return X, bounds


def _loader(digits) -> Callable[[ClientInfo], np.ndarray]:
    return SplitRows(*digits)


class PCAGrid:
    """Flower's Grid interface over in-process ClientApps (node ids 201, 202, ...).

    ``drop(client, request)`` loses a message (no reply); a raising ClientApp becomes an
    Error reply as in Flower's runtime. ``sent`` counts messages, ``kinds`` the kind of
    each round.
    """

    def __init__(self, app: ClientApp, n_nodes: int = K, *,
                 node_config: Callable[[int], dict] | None = None,
                 drop: Callable[[int, dict], bool] = lambda client, req: False) -> None:
        self.app, self.drop = app, drop
        self.nodes = list(range(201, 201 + n_nodes))[::-1]  # not in client order
        cfg = node_config or (lambda i: {"partition-id": i, "num-partitions": n_nodes})
        self.client_of = {n: n_nodes - 1 - j for j, n in enumerate(self.nodes)}
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg(self.client_of[n]),
                                    state=RecordDict(), run_config={}) for n in self.nodes}
        self.sent = 0
        self.kinds: list[str] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        import json

        replies = []
        messages = list(messages)
        for msg in messages:
            self.sent += 1
            node = msg.metadata.dst_node_id
            req = json.loads(str(msg.content["pca-request"]["json"]))
            if self.drop(self.client_of[node], req):
                continue
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as exc:
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=msg)
            replies.append(reply)
        if messages:
            self.kinds.append(json.loads(str(messages[0].content["pca-request"]["json"]))
                              ["kind"])
        return replies


@pytest.fixture(autouse=True)
def _task_identity():
    """The process identity Flower's runtimes set before a ServerApp builds messages."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _seeded_grid(digits, **kwargs) -> PCAGrid:
    return PCAGrid(make_pca_client_app(_loader(digits), noise_seed=SEED), **kwargs)


CASES = [("analyze_gauss", {}), ("power", {}), ("power", {"power_init": "private"}),
         ("auto", {}), ("auto", {"branch": "iterate"}), ("auto", {"center": "private"})]


@pytest.mark.parametrize(("method", "options"), CASES)
def test_flower_fit_is_the_in_process_local_fit(digits, method: str, options: dict) -> None:
    X, bounds = digits
    ref = fit_private_pca(X, 4, method=method, seed=SEED, clients=bounds, trust="local",
                          **FIT, **options)
    grid = _seeded_grid(digits)
    got = fit_pca_on_flower(grid, 4, method=method, **FIT, **options)
    np.testing.assert_allclose(got.components, ref.components, rtol=0, atol=ATOL)
    if ref.explained_variance is not None:
        np.testing.assert_allclose(got.explained_variance, ref.explained_variance,
                                   rtol=1e-12)
        np.testing.assert_allclose(got.explained_variance_ratio,
                                   ref.explained_variance_ratio, rtol=1e-12)
    assert got.dp_event == ref.dp_event  # the same dp_accounting event ...
    assert got.epsilon == ref.epsilon  # ... hence the same epsilon, bit for bit
    assert got.info["n_clients"] == K and got.info["trust"] == "local"
    assert got.info.get("branch") == ref.info.get("branch")
    if got.mean is not None:
        np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-12)
    # every pass one round to every client: registration, rounding bounds, then releases
    assert grid.kinds[:2] == ["register", "slack"]
    assert grid.sent == K * len(grid.kinds)
    n_release = grid.kinds.count("release")
    expected = {"analyze_gauss": 1, "power": 10 + (options.get("power_init") == "private")}
    if method in expected:
        assert n_release == expected[method]
    # a real comparison: another seed gives other components
    other = fit_private_pca(X, 4, method=method, seed=SEED + 1, clients=bounds, **FIT,
                            **options)
    assert np.abs(other.components - ref.components).max() > 1e-6


def test_the_refusal_states_the_secure_sums_true_sizes() -> None:
    """The numbers of the refusal are plan_sum's (Gram sums at noise multiplier 1, and at
    the worst scale for digits: tests/adapters/test_flower_pca_secagg.py)."""
    import math

    from dpprecond.adapters.flower.pca import SECURE_AGGREGATION_REFUSAL
    from dpprecond.adapters.flower.secagg import SECAGG_MODULUS
    from dpprecond.pca.secure_plan import MAX_FIT_INFLATION, gram_modulus_bits
    from dpprecond.secagg.fl import FIT_BITS
    from dpprecond.secagg.sums import plan_sum

    for d, n, bits in ((64, 1437, 28), (784, 60_000, 37)):
        plan = plan_sum(d * (d + 1) // 2, math.sqrt(2.0), 1.0, n_rows=n, n_clients=5,
                        min_clients=5)
        assert plan.bits == bits
        assert f"{bits}" in SECURE_AGGREGATION_REFUSAL
    assert "28 to 29 bits" in SECURE_AGGREGATION_REFUSAL  # 29: the worst scale
    for n, bits in ((60_000, 30), (600_000, 34)):  # at the coarsest scale, 2^-3
        assert gram_modulus_bits(784, n, 5, 1.0, inflation=MAX_FIT_INFLATION) == bits
    assert "30 bits, at epsilon 1" in SECURE_AGGREGATION_REFUSAL
    assert "34 bits at 2^-3" in SECURE_AGGREGATION_REFUSAL and MAX_FIT_INFLATION == 2.0**-3
    assert SECAGG_MODULUS == 2**31 and FIT_BITS == 30  # a 2^30 quantization range at most
    assert "2^30" in SECURE_AGGREGATION_REFUSAL and "not wired" not in SECURE_AGGREGATION_REFUSAL


@pytest.mark.parametrize(("settings", "error", "match"), [
    ({"method": "fixed"}, ValueError, "does not run on Flower"),
    ({"method": "select"}, ValueError, "does not run on Flower"),
    ({"method": "exact"}, ValueError, "does not run on Flower"),
    ({"method": "auto", "add_noise": False}, ValueError, "private only"),
    ({"row_norm": None}, ValueError, "row_norm is required"),
    ({"row_norm": -1.0}, ValueError, "row_norm"),
    ({"target_epsilon": -1.0}, ValueError, "target_epsilon"),
    ({"mean_trials": 3.0}, TypeError, "Unknown option"),  # select's, not auto's
    ({"seed": 3}, ValueError, "clients draw the noise"),
    ({"trust": "none"}, ValueError, "trust"),
    ({"timeout": 0.0}, ValueError, "timeout"),
])
def test_config_errors_come_before_any_message(digits, settings, error, match) -> None:
    grid = _seeded_grid(digits)
    kw = {**FIT, **settings}
    with pytest.raises(error, match=match):
        fit_pca_on_flower(grid, 4, **kw)
    with pytest.raises(error, match=match):
        make_pca_server_app(4, **kw)
    assert grid.sent == 0


def test_a_missing_client_stops_the_fit_with_the_privacy_spent(digits) -> None:
    seen = {"n": 0}

    def drop(client: int, req: dict) -> bool:  # client 2's third release never arrives
        if client == 2 and req["kind"] == "release":
            seen["n"] += 1
            return seen["n"] == 3
        return False

    ledger = PrivacyLedger(1e-5)
    with pytest.raises(ClientMissingError, match=r"client\(s\) \[2\].*no reply.*cannot drop "
                       r"a client.*3 release\(s\) were asked.*2 answered.*epsilon=.*ledger"
                       ) as info:
        fit_pca_on_flower(_seeded_grid(digits, drop=drop), 4, method="power", ledger=ledger,
                          **FIT)
    assert info.value.clients == [2] and info.value.releases_made == 2
    planned = planned_event("power", target_epsilon=2.0, target_delta=1e-5)
    assert ledger.events == [planned]  # charged the plan (it bounds what was released)

    def fail(info: ClientInfo) -> np.ndarray:
        if info.client_id == 1:
            raise OSError("disk gone")
        return _loader(digits)(info)

    with pytest.raises(ClientMissingError, match=r"\[1\] did not register.*disk gone.*"
                       "Nothing was released"):
        fit_pca_on_flower(PCAGrid(make_pca_client_app(fail, noise_seed=SEED)), 4, **FIT,
                          connect_timeout=0.5)
    # a node that never registers: named, nothing released
    with pytest.raises(ClientMissingError, match=r"\[4\] did not register.*Nothing"):
        fit_pca_on_flower(_seeded_grid(digits, drop=lambda c, r: c == 4), 4, **FIT,
                          connect_timeout=0.3)


def test_the_ledger_and_its_cap(digits) -> None:
    X, bounds = digits
    ledger = PrivacyLedger(1e-5, max_epsilon=2.5)
    got = fit_pca_on_flower(_seeded_grid(digits), 4, ledger=ledger, **FIT)
    assert ledger.events == [got.dp_event]
    ref_ledger = PrivacyLedger(1e-5, max_epsilon=2.5)
    fit_private_pca(X, 4, seed=SEED, clients=bounds, ledger=ref_ledger, **FIT)
    assert ledger.events == ref_ledger.events
    grid = _seeded_grid(digits)  # a second fit at epsilon 2 exceeds the cap of 2.5
    with pytest.raises(PrivacyBudgetExceededError):
        fit_pca_on_flower(grid, 4, ledger=ledger, **FIT)
    assert grid.sent == 0 and len(ledger.events) == 1


def test_server_app_and_the_fl_client_app(digits) -> None:
    """make_pca_server_app runs the fit; the FL ClientApp answers PCA with add_pca_handler."""
    from dpprecond.adapters.flower import PartitionedDataset

    X, bounds = digits
    seen = []
    app = make_pca_server_app(4, method="analyze_gauss", **FIT,
                              on_result=lambda result, ctx: seen.append(result))
    client = add_pca_handler(make_client_app(PartitionedDataset("digits", seed=0)),
                             _loader(digits), noise_seed=SEED)
    grid = PCAGrid(client)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={}))  # type: ignore[arg-type]
    ref = fit_private_pca(X, 4, method="analyze_gauss", seed=SEED, clients=bounds, **FIT)
    assert len(seen) == 1 and seen[0].epsilon == ref.epsilon
    np.testing.assert_allclose(seen[0].components, ref.components, atol=ATOL)


def test_unseeded_clients_draw_fresh_noise(digits) -> None:
    app = make_pca_client_app(_loader(digits))
    a = fit_pca_on_flower(PCAGrid(app), 4, method="analyze_gauss", **FIT)
    b = fit_pca_on_flower(PCAGrid(app), 4, method="analyze_gauss", **FIT)
    assert np.abs(a.components - b.components).max() > 1e-6
    assert a.epsilon == b.epsilon
    secure = PCAGrid(app, node_config=lambda i: {"partition-id": i, "num-partitions": K,
                                                  "secure-noise": True})
    c = fit_pca_on_flower(secure, 4, method="power", **FIT)
    assert np.isfinite(c.components).all()


def test_secure_mode_from_the_server(digits) -> None:
    got = fit_pca_on_flower(PCAGrid(make_pca_client_app(_loader(digits))), 4,
                            method="analyze_gauss", secure=True, **FIT)
    assert np.isfinite(got.components).all()
    with pytest.raises(ClientMissingError, match="Secure mode refuses seeds"):
        fit_pca_on_flower(_seeded_grid(digits), 4, method="analyze_gauss", secure=True, **FIT)


@pytest.mark.slow
def test_ray_simulation_is_the_in_process_fit(digits) -> None:
    """Flower's own runtime (Ray actors, real message routing) on 3 SuperNodes."""
    from flwr.simulation import run_simulation

    X, _ = digits
    bounds = np.linspace(0, X.shape[0], 4).astype(np.int64)
    seen = []
    server = make_pca_server_app(4, method="auto", connect_timeout=900, timeout=900, **FIT,
                                 on_result=lambda result, ctx: seen.append(result))
    run_simulation(server, make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED),
                   num_supernodes=3,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "logging_level": "error"}})
    ref = fit_private_pca(X, 4, method="auto", seed=SEED, clients=bounds, **FIT)
    assert len(seen) == 1 and seen[0].epsilon == ref.epsilon
    np.testing.assert_allclose(seen[0].components, ref.components, atol=ATOL)


def test_a_run_config_seed_needs_the_nodes_consent(digits) -> None:
    grid = PCAGrid(make_pca_client_app(_loader(digits)))
    for ctx in grid.contexts.values():
        ctx.run_config["noise-seed"] = SEED
    with pytest.raises(ClientMissingError, match="did not consent"):
        fit_pca_on_flower(grid, 4, method="analyze_gauss", **FIT)


def test_min_noise_multiplier_is_enforced_by_the_client(digits) -> None:
    def cfg(i: int) -> dict:
        return {"partition-id": i, "num-partitions": K, "min-noise-multiplier": 50.0}

    with pytest.raises(ClientMissingError, match="min-noise-multiplier=50"):
        fit_pca_on_flower(_seeded_grid(digits, node_config=cfg), 4, method="analyze_gauss",
                          **FIT)


def _client(X: np.ndarray, state: ClientState, req: dict, arrays=()) -> np.ndarray:
    base = {"fit": "f", "row_norm": 1.0, "secure": False, "pending": []}
    return client_answer({**base, **req}, list(arrays), X, client_id=0, state=state,
                         noise_seed=1)


def test_the_client_refuses_correlated_noise_and_unknown_passes() -> None:
    """A server cannot cancel a client's noise by combining its draws, nor run code."""
    X = np.random.default_rng(0).standard_normal((50, 4)) / 4
    state = ClientState()
    gram = {"op": "pass", "shape": [4, 4], "kind": "gram", "args": [], "mean": None,
            "row_scaled": False, "row_sq": False}
    draw = {"id": 0, "stream": 1, "kind": "symmetric", "shape": [4, 4], "std": 0.5,
            "draws": "square"}
    noise0 = {"op": "draw", "shape": [4, 4], "id": 0}
    first = _client(X, state, {"kind": "release", "pending": [draw], "value": gram,
                               "noise": noise0, "std": 0.5})
    with pytest.raises(ValueError, match="correlated"):  # G - W after G + W
        _client(X, state, {"kind": "release", "value": gram, "std": 0.5,
                           "noise": {"op": "neg", "shape": [4, 4], "args": [noise0]}})
    with pytest.raises(ValueError, match="unknown pass"):
        _client(X, state, {"kind": "release", "value": {**gram, "kind": "os.system"},
                           "noise": noise0, "std": 0.5})
    with pytest.raises(ValueError, match="never drew"):
        _client(X, state, {"kind": "release", "value": gram, "std": 0.5,
                           "noise": {"op": "draw", "shape": [4, 4], "id": 7}})
    with pytest.raises(ValueError, match="not a public draw"):
        _client(X, state, {"kind": "public", "id": 0})
    assert first.shape == (4, 4)
