"""Federated private PCA on Flower's SecAgg+ (trust="secure-aggregation").

The stand-in Grid below routes every message (the plain ``query.pca`` rounds and all four
SecAgg+ stages of each release) to the real ClientApp, ``secaggplus_mod`` included, with a
persistent Context per node (no Ray). Digits (1,797 rows, d = 64) over 3 clients. The
secure sums are integer sums: a seeded fit releases the in-process secure fit's sums bit
for bit, so the components, event and epsilon are compared exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.pca import (
    SECURE_AGGREGATION_REFUSAL,
    ClientMissingError,
    SecureAggregationUnavailableError,
    SplitRows,
    fit_pca_on_flower,
    make_pca_client_app,
    make_pca_server_app,
)
from dpprecond.adapters.flower.pca_secagg import gram_modulus_bits
from dpprecond.pca import fit_private_pca
from dpprecond.secagg.fl import FIT_BITS
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)
from tests.spies import recording_app

K = 3
SEED = 11
FIT = dict(target_epsilon=2.0, target_delta=1e-5, row_norm=16.0 * 8.0,
           trust="secure-aggregation")
RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    return X, np.linspace(0, X.shape[0], K + 1).astype(np.int64)


class Grid:
    """Flower's Grid over in-process ClientApps (node ids 301, 302, ...; any message, each
    node given its own copy).

    ``fails(client, message)`` makes that client's ClientApp raise on a message (an Error
    reply, as Flower's runtime sends). ``types`` counts the message types sent.
    """

    def __init__(self, app: ClientApp, n_nodes: int = K, *,
                 node_config: Callable[[int], dict] | None = None,
                 fails: Callable[[int, Message], bool] = lambda c, m: False) -> None:
        self.app, self.fails = app, fails
        self.nodes = list(range(301, 301 + n_nodes))[::-1]  # not in client order
        self.client_of = {n: n_nodes - 1 - j for j, n in enumerate(self.nodes)}
        cfg = node_config or (lambda i: {"partition-id": i, "num-partitions": n_nodes})
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg(self.client_of[n]),
                                    state=RecordDict(), run_config={}) for n in self.nodes}
        self.types: dict[str, int] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            kind = msg.metadata.message_type
            self.types[kind] = self.types.get(kind, 0) + 1
            node = msg.metadata.dst_node_id
            try:
                if self.fails(self.client_of[node], msg):
                    raise RuntimeError("client offline")
                # a copy, as the runtime's serialization gives each node its own (SecAgg+
                # sends one content object to every node, and secaggplus_mod pops from it)
                reply = self.app(copy.deepcopy(msg), self.contexts[node])
            except Exception as exc:
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=msg)
            replies.append(reply)
        return replies


def _grid(digits, **kwargs) -> Grid:
    return Grid(make_pca_client_app(SplitRows(*digits), noise_seed=SEED), **kwargs)


@pytest.mark.parametrize(("method", "options"), [
    ("analyze_gauss", {}), ("power", {}), ("auto", {}), ("auto", {"branch": "iterate"}),
    ("auto", {"center": "private"})])
def test_secagg_plus_fit_is_the_in_process_secure_fit(digits, method, options) -> None:
    X, bounds = digits
    ref = fit_private_pca(X, 4, method=method, seed=SEED, clients=bounds, **FIT,
                          max_modulus_bits=FIT_BITS, **options)
    grid = _grid(digits)
    got = fit_pca_on_flower(grid, 4, method=method, **FIT, **options)
    assert np.array_equal(got.components, ref.components)  # integer sums: bit for bit
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    sums = got.info["secure_aggregation"]
    assert {k: v for k, v in sums.items() if not k.endswith("_per_release")} \
        == ref.info["secure_aggregation"]
    assert sums["shares_per_release"] == [K] * sums["n_sums"]
    assert max(sums["modulus_bits"]) <= FIT_BITS
    assert len(sums["seconds_per_release"]) == sums["n_sums"]
    # each release one SecAgg+ run: 4 stages of K train messages (nothing else trains)
    assert grid.types["train"] == 4 * K * sums["n_sums"]
    if ref.explained_variance is not None:
        assert np.array_equal(got.explained_variance, ref.explained_variance)


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
def test_the_fl_client_app_answers_pca_under_both_trust_models(digits, trust) -> None:
    """make_dual_client_app(..., pca=True), the example FL app's ClientApp with PCA on:
    the same fit as the PCA ClientApp's, bit for bit under secure aggregation (integer
    sums) and to float summation order under local trust; without pca=True a secure PCA
    request is refused by name and nothing is released (its nodes do not register)."""
    from dpprecond.adapters.flower.secagg import make_dual_client_app

    X, bounds = digits
    fit = {**FIT, "trust": trust}
    ref = fit_private_pca(X, 4, method="power", seed=SEED, clients=bounds, **fit)
    app = make_dual_client_app(SplitRows(*digits), noise_seed=SEED, pca=True)
    got = fit_pca_on_flower(Grid(app), 4, method="power", **fit)
    if trust == "secure-aggregation":
        assert np.array_equal(got.components, ref.components)
    else:
        np.testing.assert_allclose(got.components, ref.components, atol=1e-8)
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    if trust == "secure-aggregation":
        grid = Grid(make_dual_client_app(SplitRows(*digits), noise_seed=SEED))
        ledger = PrivacyLedger(1e-5, 10.0, accountant="rdp")
        with pytest.raises(ClientMissingError, match="No query function registered"):
            fit_pca_on_flower(grid, 4, method="analyze_gauss", ledger=ledger,
                              connect_timeout=0.5, **fit)
        assert grid.types.get("train", 0) == 0 and not ledger.events
        # PCA registration answered (query.pca added by hand), the SecAgg+ release not
        from dpprecond.adapters.flower.pca import add_pca_handler

        rows = SplitRows(*digits)
        recording, errors = recording_app(add_pca_handler(
            make_dual_client_app(rows, noise_seed=SEED), rows, noise_seed=SEED))

        with pytest.raises(ClientMissingError, match="SecAgg\\+ released nothing"):
            fit_pca_on_flower(Grid(recording), 4, method="analyze_gauss",  # type: ignore[arg-type]
                              connect_timeout=0.5, **fit)
        assert errors and all("built without PCA" in e and "pca=True" in e for e in errors)


def test_the_plan_is_charged_first_and_a_dropout_is_not_released(digits) -> None:
    """Client 2 goes offline in the second release's masked-vector stage: SecAgg+ halts
    (fewer than min_clients = K), nothing of that sum is released, the error states the
    privacy spent (the plan, charged before the first share)."""
    count = {"n": 0}

    def fails(client: int, msg: Message) -> bool:
        if client == 2 and msg.metadata.message_type == "train" \
                and "fitins.config" in msg.content.config_records:
            count["n"] += 1
            return count["n"] == 2
        return False

    ledger = PrivacyLedger(1e-5, accountant="rdp")
    with pytest.raises(ClientMissingError, match=r"min_clients=3.*released nothing.*"
                       r"already spent.*charged to the ledger"):
        fit_pca_on_flower(_grid(digits, fails=fails), 4, method="power", ledger=ledger,
                          **FIT)
    X, bounds = digits
    ref = fit_private_pca(X, 4, method="power", seed=SEED, clients=bounds, **FIT)
    assert ledger.events == [ref.dp_event]  # charged once


def test_with_min_clients_a_dropout_is_released_from_the_survivors(digits) -> None:
    """min_clients = 2: client 2 goes offline in the second release's masked-vector stage;
    SecAgg+ unmasks the two survivors' sum (2 shares, each of 1/2 of the variance), the
    fit goes on, and that release is the survivors' statistic."""
    count = {"n": 0}

    def fails(client: int, msg: Message) -> bool:
        if client == 2 and "fitins.config" in msg.content.config_records:
            count["n"] += 1
            return count["n"] == 2
        return False

    got = fit_pca_on_flower(_grid(digits, fails=fails), 4, method="power", min_clients=2,
                            **FIT)
    shares = got.info["secure_aggregation"]["shares_per_release"]
    assert shares[1] == 2 and shares[:1] + shares[2:] == [K] * (len(shares) - 1)
    X, bounds = digits
    ref = fit_private_pca(X, 4, method="power", seed=SEED, clients=bounds, min_clients=2,
                          **FIT)
    assert got.dp_event == ref.dp_event  # the plan does not depend on who answered
    assert np.abs(got.components - ref.components).max() > 1e-9  # release 2 differs


def test_a_client_refuses_a_plan_below_its_floor(digits) -> None:
    def cfg(i: int) -> dict:
        return {"partition-id": i, "num-partitions": K, "min-noise-multiplier": 50.0}

    with pytest.raises(ClientMissingError, match="released nothing"):
        fit_pca_on_flower(_grid(digits, node_config=cfg), 4, method="analyze_gauss", **FIT)


@pytest.mark.parametrize("change", ["threshold", "clipping_range"])
def test_a_client_refuses_secaggplus_settings_that_are_not_exact(digits, monkeypatch,
                                                                  change) -> None:
    """A server whose SecAgg+ runs with a reconstruction threshold that could unmask fewer
    than min_clients shares, or a clipping range that would clip the shares, gets no
    share (``check_secaggplus_state`` in the client's reply, as for the FL clients)."""
    from flwr.server.workflow import SecAggPlusWorkflow

    import dpprecond.adapters.flower.pca_secagg as pca_secagg

    def weaker(q, *, min_clients, n_clients, num_shares=None, timeout=None):  # type: ignore[no-untyped-def]
        return SecAggPlusWorkflow(
            num_shares=1.0, reconstruction_threshold=2 if change == "threshold" else 1.0,
            max_weight=float(q), quantization_range=q, modulus_range=2**31,
            clipping_range=float(q // 2) if change == "threshold" else float(q // 4),
            timeout=timeout)

    monkeypatch.setattr(pca_secagg, "exact_workflow", weaker)
    with pytest.raises(ClientMissingError, match="released nothing"):
        fit_pca_on_flower(_grid(digits), 4, method="analyze_gauss", **FIT)


def test_a_release_outside_secaggplus_is_refused(digits) -> None:
    """A train message without SecAgg+'s configs would reveal a client's message (only its
    share of the noise): the client refuses it."""
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    grid = _grid(digits)
    content = compat.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters([]), {"pca-secure-request": "{}"}), keep_input=True)
    msg = Message(content, dst_node_id=grid.nodes[0], message_type="train")
    reply = grid.send_and_receive([msg])[0]  # type: ignore[index]
    assert reply.has_error()


def test_a_shape_no_scale_fits_is_refused_before_any_release(digits) -> None:
    """d = 784, n = 60,000 (Fashion-MNIST's shape): 37 bits at the 2^-10 rounding scale, 30
    at 2^-3, where a fit on SecAgg+ takes it (the docstring's figures); ten times the
    rows, 34 bits even at 2^-3, is refused after registration, before any release."""
    from dpprecond.adapters.flower.pca_secagg import check_modulus

    assert gram_modulus_bits(784, 60_000, 3, 2.2) == 37
    assert gram_modulus_bits(784, 60_000, 3, 2.2, inflation=2.0**-3) == 30
    assert gram_modulus_bits(64, 1437, 3, 2.2) == 29 <= FIT_BITS
    assert gram_modulus_bits(64, 1437, 8, 2.2) <= FIT_BITS
    budget = {key: FIT[key] for key in ("target_epsilon", "target_delta")}
    assert check_modulus(784, 60_000, K, None, method="auto", n_components=4,
                         **budget) == 2.0**-3
    assert check_modulus(64, 1437, K, None, method="auto", n_components=4,
                         **budget) == 2.0**-10
    X = np.broadcast_to(0.5, (600_000, 784))  # no memory: the refusal comes after
    # registration (which tells the server n and d), before any release
    bounds = np.linspace(0, X.shape[0], K + 1).astype(np.int64)
    grid = Grid(make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED))
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    with pytest.raises(SecureAggregationUnavailableError,
                       match=r"d=784 features over n=600000 rows.*2\^34 even at the "
                             r"coarsest.*2\^30.*in process"):
        fit_pca_on_flower(grid, 4, ledger=ledger, **{**FIT, "row_norm": 28.0})
    assert "train" not in grid.types and ledger.events == []
    assert "2^30" in SECURE_AGGREGATION_REFUSAL and "2^-3" in SECURE_AGGREGATION_REFUSAL


@pytest.mark.parametrize(("settings", "error", "match"), [
    ({"method": "fixed"}, ValueError, "does not run on Flower"),
    ({"method": "select"}, ValueError, "does not run on Flower"),
    ({"secure": "yes"}, TypeError, "secure"),
    ({"seed": 3}, ValueError, "clients draw the noise"),
    ({"min_clients": 1}, ValueError, "min_clients"),
    ({"trust": "local", "min_clients": 2}, ValueError, "min_clients"),
])
def test_settings_are_refused_before_any_message(digits, settings, error, match) -> None:
    grid = _grid(digits)
    with pytest.raises(error, match=match):
        fit_pca_on_flower(grid, 4, **{**FIT, **settings})
    with pytest.raises(error, match=match):
        make_pca_server_app(4, **{**FIT, **settings})
    assert not grid.types


def test_secure_mode_on_secagg_plus_draws_every_share_from_the_csprng(
        digits, monkeypatch) -> None:
    """secure=True at the server on SecAgg+ (unseeded clients, the power method: sums and
    a public draw): every client's rounding and Skellam share of every sum from a
    SecureGenerator, the result says so, and the plan, event and epsilon are the
    non-secure fit's; a seeded client refuses (by name, nothing released, its nodes'
    errors recorded) and make_pca_server_app accepts the setting."""
    from tests.spies import share_sources

    X, bounds = digits
    ref = fit_private_pca(X, 4, method="power", seed=SEED, clients=bounds, **FIT,
                          max_modulus_bits=FIT_BITS)
    kinds = share_sources(monkeypatch)
    grid = Grid(make_pca_client_app(SplitRows(*digits)))
    got = fit_pca_on_flower(grid, 4, method="power", secure=True, **FIT)
    sums = got.info["secure_aggregation"]
    assert kinds == ["SecureGenerator"] * (K * sums["n_sums"]) and sums["n_sums"] > 1
    assert sums["secure"] is True and sums["shares_per_release"] == [K] * sums["n_sums"]
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    assert sums["modulus_bits"] == ref.info["secure_aggregation"]["modulus_bits"]
    assert grid.types["train"] == 4 * K * sums["n_sums"]
    np.testing.assert_allclose(got.components @ got.components.T, np.eye(4), atol=1e-8)
    plain = fit_pca_on_flower(Grid(make_pca_client_app(SplitRows(*digits))), 4,
                              method="power", **FIT)
    assert plain.info["secure_aggregation"]["secure"] is False
    assert plain.dp_event == got.dp_event and plain.epsilon == got.epsilon
    make_pca_server_app(4, method="power", secure=True, **FIT)  # accepted when built
    recording, errors = recording_app(make_pca_client_app(SplitRows(*digits),
                                                          noise_seed=SEED))
    seeded = Grid(recording)  # type: ignore[arg-type]
    ledger = PrivacyLedger(1e-5, 10.0, accountant="rdp")
    with pytest.raises(ClientMissingError, match="refuses seeds"):
        fit_pca_on_flower(seeded, 4, method="power", secure=True, ledger=ledger, **FIT)
    assert "train" not in seeded.types and ledger.events == []  # before any release
    assert len(errors) == K and all("refuses seeds" in e for e in errors)


@pytest.mark.slow
def test_ray_simulation_is_the_in_process_secure_fit(digits) -> None:
    """Flower's own runtime (Ray actors, real SecAgg+ message routing) on 3 SuperNodes."""
    from flwr.simulation import run_simulation

    X, bounds = digits
    seen = []
    server = make_pca_server_app(4, method="auto", connect_timeout=900, timeout=900, **FIT,
                                 on_result=lambda result, ctx: seen.append(result))
    run_simulation(server, make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED),
                   num_supernodes=K, backend_config=RAY)
    ref = fit_private_pca(X, 4, method="auto", seed=SEED, clients=bounds, **FIT)
    assert len(seen) == 1
    assert np.array_equal(seen[0].components, ref.components)
    assert seen[0].dp_event == ref.dp_event and seen[0].epsilon == ref.epsilon
