"""Secure aggregation on Flower's SecAgg+: the same releases as the engine's simulation."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from flwr.simulation import run_simulation

from dpprecond.adapters.flower import PartitionedDataset
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.data import featurized_dataset
from dpprecond.adapters.flower.protocol import simulator_seeds
from dpprecond.adapters.flower.secagg import (
    SecAggDPClient,
    SecAggDPStrategy,
    make_secagg_client_app,
    make_secagg_server_app,
    plan_from_config,
    plan_to_config,
)
from dpprecond.fl import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import secure_plan, simulate_secure

K, SEED, PART = 3, 11, 5
CONFIG = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                  trust="secure-aggregation", adaptive_clip=None)  # refused there
CLIENT_LEVEL = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=8.0,
                        mechanism="client-level", local_steps=2, local_lr=0.2,
                        trust="secure-aggregation")  # client-level DP-FedAvg
RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}


def _engine_data() -> ClientData:
    loader = PartitionedDataset("digits", seed=PART)
    parts = [loader(ClientInfo(i, K, {}, {})) for i in range(K)]
    X = np.concatenate([p.X for p in parts])
    y = np.concatenate([p.y for p in parts])
    bounds = np.cumsum([0] + [p.X.shape[0] for p in parts]).astype(np.int64)
    return ClientData(X, y, bounds, 10)


def test_plan_round_trips_and_a_foreign_request_is_refused():
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, ds.X_train.shape[0],
                                max_client_rows=10)
    sent = plan_to_config(strategy.plan_, CONFIG.clip_norm)
    assert plan_from_config(sent) == (strategy.plan_, CONFIG.clip_norm)
    client = SecAggDPClient(model, ds.X_train[:10], ds.y_train[:10], 0)
    with pytest.raises(ValueError, match="SecAggDPStrategy"):
        client.fit([strategy._params], {"round": 1})
    # a plan whose scale or modulus is not the one its inputs give is refused
    with pytest.raises(ValueError, match="plan-bits"):
        client.fit([strategy._params], {**sent, "round": 1, "plan-bits": sent["plan-bits"] - 1})
    # a client with more rows than the plan's sensitivity covers refuses to answer
    big = SecAggDPClient(model, ds.X_train[:11], ds.y_train[:11], 0)
    with pytest.raises(ValueError, match="max_client_rows"):
        big.fit([strategy._params], {**sent, "round": 1})
    assert client.fit([strategy._params], {**sent, "round": 1})[0][0].shape == (
        model.n_params + 1,)
    with pytest.raises(ValueError, match="trust='secure-aggregation'"):
        SecAggDPStrategy(LinearSoftmax(64, 10), "fedgd", FLConfig(n_rounds=2, clip_norm=1.0,
                         target_epsilon=1.0), K, 100)


def test_adaptive_clipping_of_a_covariance_method_is_refused_as_the_engine_refuses_it():
    """Under secure aggregation adaptive clipping runs with the one-message gradient
    methods (the count is a coordinate of the round's sum); the engine refuses it for a
    covariance method, and SecAgg+ on Flower with the same named error."""
    from dataclasses import replace

    from dpprecond.fl.adaptive_clip import AdaptiveClip

    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    config = replace(CONFIG, adaptive_clip=AdaptiveClip())
    with pytest.raises(ValueError, match="adaptive_clip") as engine:
        simulate_secure(model, _engine_data(), "fedfc", config, X_test=ds.X_test,
                        y_test=ds.y_test, seed=SEED)
    with pytest.raises(ValueError, match="adaptive_clip") as flower:
        SecAggDPStrategy(model, "fedfc", config, K, ds.X_train.shape[0])
    assert str(flower.value) == str(engine.value)
    assert "trust='secure-aggregation'" in str(flower.value) and "'fedfc'" in str(flower.value)


def test_the_clients_messages_decode_to_the_engines_sum_bitwise():
    """Each SecAgg+ client's message (its own clipped gradient sum, one kernel call on its
    rows, rounded and noised from its stream ``(t, i)``) is the one the engine forms from
    its all-clients kernel call: their modular sum decodes to the engine's round sum
    exactly (no Ray: the messages are summed here)."""
    from dpprecond.fl.client import round_generators
    from dpprecond.secagg.fl import secure_gradient_sum
    from dpprecond.secagg.skellam import aggregate, decode

    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], 10)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, data.X.shape[0],
                                max_client_rows=int(np.diff(data.bounds).max()))
    plan = strategy.plan_
    params = np.random.default_rng(0).standard_normal(model.n_params) * 0.05
    for t in (1, 2):
        config = {"round": t, **plan_to_config(plan, CONFIG.clip_norm)}
        messages = []
        for i in range(K):
            lo, hi = data.bounds[i], data.bounds[i + 1]
            sent = SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], i, SEED).fit(
                [params], config)[0][0]
            vector = sent / plan.modulus  # SecAgg+ multiplies by the weight 1 / m
            assert np.array_equal(vector * plan.modulus, sent)  # exact: m = 2^bits
            assert vector[-1] == hi - lo
            messages.append(np.mod(vector[:-1].astype(np.int64), plan.modulus))
        root = simulator_seeds(SEED).noise  # run_federated(seed=SEED)'s noise root
        engine = secure_gradient_sum(model, params, data.X, data.y, data.bounds,
                                     CONFIG.clip_norm, plan, round_generators(root, t - 1, K))
        assert np.array_equal(decode(aggregate(messages, plan), plan, K), engine)


def test_secure_mode_on_secagg_plus_clients(monkeypatch):
    """Secure mode on Flower's SecAgg+: a strategy with secure=True puts plan-secure in
    every request; a client asked for it (or set secure itself, the node config's
    secure-noise) draws its rounding and Skellam share from the OS CSPRNG, and the decoded
    sum is the clipped gradient sum within its noise; a seeded client refuses it, and a
    secure strategy or client refuses a seed."""
    from dpprecond.fl.models import clip_rows_safely
    from dpprecond.secagg.skellam import aggregate, decode
    from tests.spies import share_sources

    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], 10)
    with pytest.raises(ValueError, match="secure=True refuses seeds"):
        SecAggDPStrategy(model, "fedgd", CONFIG, K, data.X.shape[0], seed=SEED, secure=True)
    with pytest.raises(ValueError, match="secure=True refuses seeds"):
        SecAggDPClient(model, data.X, data.y, 0, SEED, secure=True)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, data.X.shape[0],
                                max_client_rows=int(np.diff(data.bounds).max()), secure=True)
    plan = strategy.plan_
    config = {"round": 1, **plan_to_config(plan, CONFIG.clip_norm), "plan-secure": True}
    params = np.random.default_rng(0).standard_normal(model.n_params) * 0.05
    with pytest.raises(ValueError, match="secure mode refuses seeds"):
        SecAggDPClient(model, data.X[:10], data.y[:10], 0, SEED).fit([params], config)
    kinds = share_sources(monkeypatch)
    messages = []
    for i in range(K):
        lo, hi = data.bounds[i], data.bounds[i + 1]
        # client 0 is asked by the request, client 1 also set secure by its operator,
        # client 2 is asked only by its operator (a request without plan-secure)
        ask = config if i < 2 else {k: v for k, v in config.items() if k != "plan-secure"}
        client = SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], i, secure=i > 0)
        sent = client.fit([params], ask)[0][0]
        messages.append(np.mod((sent / plan.modulus)[:-1].astype(np.int64), plan.modulus))
    assert kinds == ["SecureGenerator"] * K
    got = decode(aggregate(messages, plan), plan, K)
    exact = clip_rows_safely(model.per_example_grads(params, data.X, data.y),
                             CONFIG.clip_norm).sum(axis=0)
    # the decoded sum's noise has std plan.noise_std(K) per coordinate; 7 std bounds the
    # largest of the coordinates but with probability ~1e-9 per coordinate
    assert np.abs(got - exact).max() <= 7 * plan.noise_std(K) + K / plan.scale
    assert np.abs(got - exact).max() > 0  # noise was added
    from flwr.common import ndarrays_to_parameters

    fit = strategy.configure_fit(1, ndarrays_to_parameters([params]), _Everyone(K))  # type: ignore[arg-type]
    assert all(ins.config["plan-secure"] is True for _, ins in fit)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedgd", "fedfc", "fednew", "fedgd-client-level",
                                    "sofim-lagged-adaptive"])
def test_secagg_plus_simulation_releases_the_engines_sums(method):
    """A seeded SecAgg+ run under Ray ends at the simulator's model: the gradient methods'
    T rounds, the covariance methods' setup sum (round 1) then their T rounds, the
    client-level DP-FedAvg's rounds of clipped updates, and adaptive clipping's rounds
    (each its own plan, the count in the sum)."""
    config = CONFIG
    if method == "fedgd-client-level":
        method, config = "fedgd", CLIENT_LEVEL
    elif method == "sofim-lagged-adaptive":
        from dataclasses import replace

        method, config = "sofim-lagged", replace(CONFIG, adaptive_clip="auto", n_rounds=3)
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    data = _engine_data()
    ref = simulate_secure(model, data, method, config, X_test=ds.X_test, y_test=ds.y_test,
                          seed=simulator_seeds(SEED).simulation)  # run_federated(seed=SEED)'s
    holder: dict[str, SecAggDPStrategy] = {}

    def strategy_fn(context):  # the defaults: both plan for clients of at most N rows
        holder["s"] = SecAggDPStrategy(model, method, config, K, data.X.shape[0],
                                       X_test=ds.X_test, y_test=ds.y_test, seed=SEED)
        return holder["s"]

    run_simulation(make_secagg_server_app(strategy_fn, timeout=600.0),
                   make_secagg_client_app(PartitionedDataset("digits", seed=PART),
                                          noise_seed=SEED),
                   num_supernodes=K, backend_config=RAY)
    got = holder["s"].result()
    assert len(got.history) == config.n_rounds
    assert all(r["n_replied"] == K for r in got.history)
    if ref.config["adaptive_clip"] is not None:  # "auto" resolved to adaptive clipping
        assert got.config["clip_norms"] == ref.config["clip_norms"]
        assert len(set(got.config["clip_norms"])) == 3  # the clip moved every round
    # integer sums decoded identically; the server step is the same float arithmetic
    np.testing.assert_allclose(got.params, ref.params, rtol=1e-12, atol=1e-14)
    assert got.epsilon == pytest.approx(ref.epsilon, rel=1e-12)
    assert got.noise_multiplier == ref.noise_multiplier
    assert holder["s"].plan_ == secure_plan(model, config, data, ref.noise_multiplier, K)
    for key in ("sensitivity", "scale", "modulus_bits", "noise_std", "wrap_probability"):
        assert got.config[key] == ref.config[key], key
    assert got.events == ref.events
    if method in ("fedfc", "fednew"):
        assert got.config["setup"] == ref.config["setup"]
        assert got.config["noise_multipliers"] == ref.config["noise_multipliers"]


class _DropsInRound2(SecAggDPClient):
    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        if self.client_id == 2 and int(config["round"]) == 2:
            raise RuntimeError("client 2 goes offline mid-run")
        return super().fit(parameters, config)


def _dropping_app():
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp

    from dpprecond.adapters.flower.client_app import client_info

    loader = PartitionedDataset("digits", seed=PART)

    def client_fn(context):  # type: ignore[no-untyped-def]
        info = client_info(context)
        local = loader(info)
        return _DropsInRound2(local.model, local.X, local.y, info.client_id,
                              SEED).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


def _client_data(n: int) -> ClientData:
    loader = PartitionedDataset("digits", seed=PART)
    parts = [loader(ClientInfo(i, n, {}, {})) for i in range(n)]
    return ClientData(np.concatenate([p.X for p in parts]),
                      np.concatenate([p.y for p in parts]),
                      np.cumsum([0] + [p.X.shape[0] for p in parts]).astype(np.int64), 10)


def _check_a_dropout(n: int, min_clients: int, num_shares: int | None) -> list[int]:
    """Client 2 of ``n`` goes offline in round 2 of 2; the run must equal a replay of the
    engine's pieces on the clients whose shares were released; returns the replies."""
    from dpprecond.fl.client import round_generators
    from dpprecond.secagg.fl import secure_gradient_sum

    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    data = _client_data(n)
    sizes = np.diff(data.bounds)
    holder: dict[str, SecAggDPStrategy] = {}

    def strategy_fn(context):  # type: ignore[no-untyped-def]
        holder["s"] = SecAggDPStrategy(model, "fedgd", CONFIG, n, data.X.shape[0],
                                       seed=SEED, min_clients=min_clients,
                                       num_shares=num_shares)
        return holder["s"]

    run_simulation(make_secagg_server_app(strategy_fn, timeout=120.0), _dropping_app(),
                   num_supernodes=n, backend_config=RAY)
    got = holder["s"]
    # both rounds are charged, whatever happened to round 2
    assert len(got.events) == 2 and got.ledger.epsilon > 0
    replay = SecAggDPStrategy(model, "fedgd", CONFIG, n, data.X.shape[0], seed=SEED,
                              min_clients=min_clients)
    params, state = replay._params, replay._state
    root = simulator_seeds(SEED).noise  # run_federated(seed=SEED)'s noise root
    replies = [r["n_replied"] for r in got.history_]
    rounds = [list(range(n)), [i for i in range(n) if i != 2]][:len(replies)]
    for t, clients in enumerate(rounds):
        total = secure_gradient_sum(model, params, data.X, data.y, data.bounds,
                                    CONFIG.clip_norm, replay.plan_,
                                    round_generators(root, t, n), clients)
        upd, state = replay.transform.update(total / sizes[clients].sum(), state, params)
        params = params + upd
    np.testing.assert_allclose(got._params, params, rtol=1e-12, atol=1e-14)
    return replies


@pytest.mark.slow
def test_a_dropout_mid_run_meets_the_noise_or_skips_the_round():
    # SecAgg+ recovered the survivors' sum: 2 shares >= min_clients = 2
    assert _check_a_dropout(K, 2, None) == [3, 2]
    # fewer shares than the noise needs: round 2 released nothing, the model is kept
    assert _check_a_dropout(K, K, None) == [3]


@pytest.mark.slow
def test_a_dropout_in_a_sparse_ring_is_recovered_from_its_neighbours():
    """K = 5 on a ring of 3 with min_clients = 3: t = ceil(3 * 3 / 5) = 2 of the dropped
    client's 3 shares (its two neighbours') recover its masks, and the 4 survivors' sum
    (>= 3 shares) is released."""
    assert _check_a_dropout(5, 3, 3) == [5, 4]


def test_a_callers_ledger_is_checked_before_any_message():
    from dpprecond import PrivacyBudgetExceededError
    from dpprecond.accounting import PrivacyLedger

    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    with pytest.raises(PrivacyBudgetExceededError):
        SecAggDPStrategy(model, "fedgd", CONFIG, K, ds.X_train.shape[0],
                         ledger=PrivacyLedger(1e-5, 1.0, accountant="rdp"))
    from flwr.app import Context, RecordDict

    from dpprecond.adapters.flower.app import secagg_strategy_from_run_config

    rc = {"algorithm": "fedgd", "n-rounds": 2, "clip-norm": 1.0, "target-epsilon": 4.0,
          "noise-multiplier": "", "trust": "secure-aggregation", "weighting": "size",
          "adaptive-clip": False, "max-epsilon": 1.0}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(PrivacyBudgetExceededError):
        secagg_strategy_from_run_config(ctx, n_clients=K)
    rc["max-epsilon"] = 5.0
    strategy = secagg_strategy_from_run_config(ctx, n_clients=K)
    assert strategy.caller_ledger is not None and strategy.caller_ledger.max_epsilon == 5.0


def _secaggplus_arithmetic(sent: list[np.ndarray], m: int, rng: np.random.Generator
                           ) -> np.ndarray:
    """What Flower's SecAgg+ hands the strategy for the clients' ``sent`` vectors, with
    Flower's own quantization and masking arithmetic (``secaggplus_mod``'s weight,
    ``quantize``, masks and ``parameters_mod``; the workflow's ``dequantize``, offset and
    total ratio), the pairwise masks cancelling as in the protocol."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    from dpprecond.adapters.flower.secagg import SECAGG_MODULUS as M

    q_ratio = round(1 / float(m) * m)  # num_examples = 1, max_weight = m
    masks = [rng.integers(0, M, sent[0].shape) for _ in sent]
    masks[-1] = np.mod(-np.sum(masks[:-1], axis=0), M)  # pairwise masks sum to 0 mod M
    total = np.zeros(sent[0].shape, dtype=np.int64)
    for vector, mask in zip(sent, masks, strict=True):
        q = quantize([vector * (q_ratio / m)], float(m // 2), m)[0]
        total = np.mod(total + q + mask, M)
    value = dequantize([total], float(m // 2), m)[0]
    value += -(len(sent) - 1) * (m // 2)
    return value * (m / (q_ratio * len(sent)))


@pytest.mark.parametrize("n_clients", [3, 40])
def test_secaggplus_arithmetic_decodes_the_sum_when_its_own_modulus_wraps(n_clients):
    """K * 2^bits beyond SecAgg+'s modulus 2^31 (K = 40 at 27 bits): its modular sum wraps,
    and the strategy still decodes the clients' secure sum exactly (the weight factor is
    1 per client, the sum is read modulo 2^bits)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    from dpprecond.secagg.skellam import aggregate, decode

    rng = np.random.default_rng(3)
    bounds = np.linspace(0, 1200, n_clients + 1).astype(np.int64)
    X = rng.standard_normal((1200, 64))
    y = rng.integers(0, 10, 1200)
    model = LinearSoftmax(64, 10)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, n_clients, 1200)
    plan = strategy.plan_
    assert n_clients < 10 or n_clients * plan.modulus > 2**31  # the wrap is exercised
    params = rng.standard_normal(model.n_params) * 0.05
    config = {"round": 1, **plan_to_config(plan, CONFIG.clip_norm)}
    sent = [SecAggDPClient(model, X[lo:hi], y[lo:hi], i, SEED).fit([params], config)[0][0]
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]
    messages = [np.mod((v[:-1] / plan.modulus).astype(np.int64), plan.modulus) for v in sent]
    handed = _secaggplus_arithmetic(sent, plan.modulus, rng)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
    before = strategy._params.copy()
    new, _ = strategy.aggregate_fit(1, [(None, fitres)] * n_clients, [])
    G = decode(aggregate(messages, plan), plan, n_clients) / 1200
    updates, _ = strategy.method.transform_for(
        (plan.noise_std(n_clients) / 1200) ** 2).update(
        G, strategy.transform.init(before), before)
    assert np.array_equal(parameters_to_ndarrays(new)[0], before + updates)


def test_fashion_mnist_shape_fits_secaggplus_and_the_simulator_plans_the_same():
    """p = 7,850, N = 60,000 (34 bits at the 2^-10 scale): the plan coarsens its scale
    to fit 2^30 at a rounding inflation within the accounted 2^-6, for K = 20 and 100,
    and the simulator's plan is the deployment's."""
    from dpprecond.secagg.fl import ACCOUNTED_INFLATION, FIT_BITS, round_event
    from dpprecond.secagg.sums import ROUNDING_INFLATION, plan_sum

    model = LinearSoftmax(784, 10)
    for n_clients in (20, 100):
        strategy = SecAggDPStrategy(model, "sofim-lagged", CONFIG, n_clients, 60_000)
        plan = strategy.plan_
        assert plan.bits == FIT_BITS
        assert ROUNDING_INFLATION < plan.inflation <= ACCOUNTED_INFLATION
        finest = plan_sum(plan.dim, plan.sensitivity, plan.noise_multiplier,
                          n_rows=60_000, n_clients=n_clients, min_clients=n_clients)
        assert finest.bits == 34 and finest.inflation <= ROUNDING_INFLATION
        assert plan.scale == finest.scale / 16  # the finest scale that fits
        bounds = np.linspace(0, 60_000, n_clients + 1).astype(np.int64)
        data = ClientData(np.zeros((60_000, 784)), np.zeros(60_000, np.int64), bounds, 10)
        assert secure_plan(model, CONFIG, data, plan.noise_multiplier, n_clients) == plan
        assert strategy.release_ == round_event(plan.noise_multiplier)
        assert plan_from_config(plan_to_config(plan, CONFIG.clip_norm))[0] == plan


def test_a_moment_request_is_checked_by_the_client():
    """The setup sum's request: the client answers with the simulator's message, and
    refuses a plan of the wrong size, one whose sensitivity does not cover its rows, an
    unknown kind and a quantization range that is not a power of two above its modulus."""
    from dpprecond.fl.client import stream
    from dpprecond.fl.methods import FedFC
    from dpprecond.secagg.fl import moment_parts, moment_plan
    from dpprecond.secagg.sums import client_message

    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], 10)
    strategy = SecAggDPStrategy(model, "fedfc", CONFIG, K, data.X.shape[0])
    plan, row_clip = strategy.setup_plan_, strategy.row_clip_
    assert plan == moment_plan(FedFC(), data, strategy.multipliers_["z_cov"], K)
    q = strategy.quantization_range
    config = {"round": 0, "secagg-range": q, **plan_to_config(plan, row_clip, "moment")}
    lo, hi = data.bounds[0], data.bounds[1]
    client = SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], 0, SEED)
    sent = client.fit([strategy._params], config)[0][0]
    part = moment_parts(data.X, data.bounds, row_clip)[0]
    expected = client_message(part, plan, stream(simulator_seeds(SEED).setup, 0, 0))
    assert np.array_equal(np.mod((sent[:-1] / q).astype(np.int64), plan.modulus), expected)
    assert sent[-1] == (hi - lo) * q
    other = SecAggDPClient(LinearSoftmax(10, 10), data.X[lo:hi, :10], data.y[lo:hi], 0)
    with pytest.raises(ValueError, match="moment coordinates"):
        other.fit([np.zeros(110)], config)
    with pytest.raises(ValueError, match="does not cover"):
        SecAggDPClient(model, np.tile(data.X[lo:hi], (3000, 1)), np.tile(
            data.y[lo:hi], 3000), 0).fit([strategy._params], config)
    for bad, match in (({"plan-kind": "hessian"}, "plan-kind"),
                       ({"secagg-range": q // 2 ** 12}, "secagg-range"),
                       ({"secagg-range": q + 1}, "secagg-range"),
                       ({"secagg-range": 2 ** 31}, "secagg-range")):
        with pytest.raises(ValueError, match=match):
            client.fit([strategy._params], {**config, **bad})


def test_a_covariance_run_whose_setup_sum_failed_stops_with_a_named_error():
    """SecAgg+ halted round 1 (the setup sum): round 2 raises before any request, with
    the setup's epsilon charged; after a completed setup the gradient rounds run."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    from dpprecond.adapters.flower.secagg import SetupSumIncompleteError

    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], 10)

    class _Manager:
        def sample(self, num_clients, min_num_clients):  # type: ignore[no-untyped-def]
            return list(range(num_clients))

    strategy = SecAggDPStrategy(model, "fednew", CONFIG, K, data.X.shape[0], seed=SEED)
    params = ndarrays_to_parameters([strategy._params])
    setup = strategy.configure_fit(1, params, _Manager())
    assert setup[0][1].config["plan-kind"] == "moment" and strategy.ledger.epsilon > 0
    with pytest.raises(SetupSumIncompleteError, match=r"setup sum.*charged"):
        strategy.configure_fit(2, params, _Manager())
    assert len(strategy.events) == 1  # the failed setup's event only
    # a completed setup: the clients' messages through SecAgg+'s arithmetic
    q = strategy.quantization_range
    sent = [SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], i, SEED).fit(
        [strategy._params], dict(setup[0][1].config))[0][0]
        for i, (lo, hi) in enumerate(itertools.pairwise(data.bounds))]
    handed = _secaggplus_arithmetic(sent, q, np.random.default_rng(0))
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
    strategy.aggregate_fit(1, [(None, fitres)] * K, [])
    assert strategy._state is not None
    assert strategy.configure_fit(2, params, _Manager())[0][1].config["plan-kind"] == \
        "gradient"


@pytest.mark.parametrize(("n_clients", "num_shares", "min_clients", "s_flower", "t_flower"), [
    (5, None, None, 5, 5),     # SecAgg: every client, every share (no dropout recovered)
    (5, None, 3, 5, 3),        # t = k_min with every client sharing (unchanged)
    (5, None, 1, 5, 2),        # Flower reads an int threshold of 1 as "all": t >= 2
    (21, 7, None, 7, 7),       # a ring of 7: all 7 shares needed, as min_clients = K
    (21, 7, 15, 7, 5),         # t = ceil(7 * 15 / 21) = 5
    (100, 15, 90, 15, 14),     # ceil(13.5) = 14
    (20, 20, None, 20, 20),    # s = K (even): every client
])
def test_num_shares_sets_flowers_neighbourhood_and_threshold(n_clients, num_shares,
                                                             min_clients, s_flower, t_flower):
    """The workflow Flower runs: ``s`` shares per client (Flower's runtime rounding of the
    fraction gives ``s`` back) and a threshold ``t = ceil(s k_min / K)`` in [2, s]."""
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, n_clients, ds.X_train.shape[0],
                                min_clients=min_clients, num_shares=num_shares)
    wf = strategy.workflow()
    shares = (round(wf.num_shares * n_clients) if isinstance(wf.num_shares, float)
              else wf.num_shares)
    threshold = (round(wf.reconstruction_threshold * shares)
                 if isinstance(wf.reconstruction_threshold, float)
                 else wf.reconstruction_threshold)
    assert (shares, threshold) == (s_flower, t_flower)
    assert strategy.reconstruction_threshold == t_flower
    # the released sums do not depend on the neighbourhood
    assert strategy.plan_ == SecAggDPStrategy(model, "fedgd", CONFIG, n_clients,
                                              ds.X_train.shape[0],
                                              min_clients=min_clients).plan_


@pytest.mark.parametrize(("num_shares", "match"), [
    (4, "odd num_shares"), (2, "num_shares"), (9, "num_shares"), (3.0, "num_shares")])
def test_a_bad_num_shares_is_refused_by_name(num_shares, match):
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    with pytest.raises((ValueError, TypeError), match=match):
        SecAggDPStrategy(model, "fedgd", CONFIG, 7, ds.X_train.shape[0],
                         num_shares=num_shares)


def test_the_run_config_checks_secagg_num_shares_before_anything_starts():
    from dpprecond.adapters.flower.app import RunConfigError, check_run_config

    rc = {"algorithm": "fedgd", "n-rounds": 2, "clip-norm": 1.0, "target-epsilon": 4.0,
          "trust": "secure-aggregation", "weighting": "size", "adaptive-clip": False,
          "n-clients": 7}
    check_run_config({**rc, "secagg-num-shares": 5})
    check_run_config({**rc, "secagg-num-shares": 0})
    with pytest.raises(RunConfigError, match=r"odd secagg-num-shares.*or 0 for every client"):
        check_run_config({**rc, "secagg-num-shares": 4})
    with pytest.raises(RunConfigError, match="secagg-num-shares <= 7"):
        check_run_config({**rc, "secagg-num-shares": 9})  # more than n-clients
    with pytest.raises(RunConfigError, match="secagg-num-shares >= 3"):
        check_run_config({**rc, "secagg-num-shares": 2})
    # n-clients = 0 (the federation's size): only odd and >= 3 can be checked here
    check_run_config({**rc, "n-clients": 0, "secagg-num-shares": 9})
    with pytest.raises(RunConfigError, match="odd secagg-num-shares"):
        check_run_config({**rc, "n-clients": 0, "secagg-num-shares": 8})
    with pytest.raises(RunConfigError, match="secagg-num-shares=5 applies to"):
        check_run_config({**rc, "trust": "local", "secagg-num-shares": 5})


def test_min_replies_is_met_by_min_clients_or_refused_under_secure_aggregation():
    """Under secure aggregation a released round holds at least min-clients shares, so
    min-replies is honoured by it: a min-replies above min-clients, or above the
    federation's size (either trust model), is refused before anything starts, and once
    the federation's size is known (n-clients = 0)."""
    from flwr.app import Context, RecordDict

    from dpprecond.adapters.flower.app import (
        RunConfigError,
        check_run_config,
        secagg_strategy_from_run_config,
        strategy_from_run_config,
    )

    rc = {"algorithm": "fedgd", "n-rounds": 2, "clip-norm": 1.0, "target-epsilon": 4.0,
          "trust": "secure-aggregation", "weighting": "size", "adaptive-clip": False,
          "n-clients": 7}
    check_run_config({**rc, "min-replies": 7})  # min-clients = 0: all 7 shares
    check_run_config({**rc, "min-replies": 4, "min-clients": 4})
    with pytest.raises(RunConfigError, match=r"min-replies=5 exceeds min-clients=4.*"
                                             r"set min-clients >= 5"):
        check_run_config({**rc, "min-replies": 5, "min-clients": 4})
    with pytest.raises(RunConfigError, match=r"min-replies=8 exceeds the federation's 7 "
                                             r"clients.*min-replies <= 7"):
        check_run_config({**rc, "min-replies": 8})
    local = {**rc, "trust": "local", "weighting": "uniform"}
    check_run_config({**local, "min-replies": 7})
    with pytest.raises(RunConfigError, match="min-replies=8 exceeds the federation's 7"):
        check_run_config({**local, "min-replies": 8})
    # n-clients = 0: the size comes from the SuperNodes, checked when the strategy is built
    check_run_config({**rc, "n-clients": 0, "min-replies": 8})
    for config, build in ((rc, secagg_strategy_from_run_config),
                          (local, strategy_from_run_config)):
        ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**config, "n-clients": 0, "min-replies": 8})
        with pytest.raises(RunConfigError, match="min-replies=8 exceeds the federation's 7"):
            build(ctx, n_clients=7)


@pytest.mark.slow
def test_a_sparse_secagg_plus_ring_releases_the_engines_sums():
    """K = 5 SuperNodes, each sharing with 2 neighbours of a ring (num_shares = 3): the
    pairwise masks still cancel in the sum, and the run ends at the simulator's model."""
    n = 5
    loader = PartitionedDataset("digits", seed=PART)
    data = _client_data(n)
    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    ref = simulate_secure(model, data, "fedgd", CONFIG, X_test=ds.X_test, y_test=ds.y_test,
                          seed=simulator_seeds(SEED).simulation)
    holder: dict[str, SecAggDPStrategy] = {}

    def strategy_fn(context):  # type: ignore[no-untyped-def]
        holder["s"] = SecAggDPStrategy(model, "fedgd", CONFIG, n, data.X.shape[0],
                                       X_test=ds.X_test, y_test=ds.y_test, seed=SEED,
                                       num_shares=3)
        return holder["s"]

    run_simulation(make_secagg_server_app(strategy_fn, timeout=600.0),
                   make_secagg_client_app(loader, noise_seed=SEED),
                   num_supernodes=n, backend_config=RAY)
    got = holder["s"].result()
    assert [r["n_replied"] for r in got.history] == [n, n]
    np.testing.assert_allclose(got.params, ref.params, rtol=1e-12, atol=1e-14)
    assert got.epsilon == pytest.approx(ref.epsilon, rel=1e-12)
    assert got.events == ref.events



class _Everyone:
    """A client manager stand-in: every one of ``n`` clients is sampled."""

    def __init__(self, n: int) -> None:
        self.n = n

    def sample(self, num_clients: int, min_num_clients: int) -> list[int]:
        return list(range(self.n))


def _run_on_secaggplus_arithmetic(method: str, config: FLConfig, check_request: Any):
    """A seeded run through the strategy and the clients, each round's sum formed by
    SecAgg+'s own arithmetic (no Ray); ``check_request(fit_config, sent_vectors)`` looks at
    every round's request and the clients' vectors. Returns ``(strategy, simulator run)``."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    data = _engine_data()
    ref = simulate_secure(model, data, method, config, X_test=ds.X_test,
                          y_test=ds.y_test, seed=simulator_seeds(SEED).simulation)
    strategy = SecAggDPStrategy(model, method, config, K, data.X.shape[0],
                                X_test=ds.X_test, y_test=ds.y_test, seed=SEED)
    rng = np.random.default_rng(0)
    params = strategy.initialize_parameters(_Everyone(K))
    for t in range(1, config.n_rounds + 1):
        [(_, fit), *_] = strategy.configure_fit(t, params, _Everyone(K))
        current = parameters_to_ndarrays(fit.parameters)
        sent = []
        for i in range(K):
            lo, hi = data.bounds[i], data.bounds[i + 1]
            sent.append(SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], i, SEED).fit(
                current, fit.config)[0][0])
        check_request(fit.config, sent, strategy)
        handed = _secaggplus_arithmetic(sent, strategy.quantization_range, rng)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
        params, _ = strategy.aggregate_fit(t, [(None, fitres)] * K, [])
        assert params is not None
        strategy.evaluate(t, params)
    got = strategy.result()
    np.testing.assert_allclose(got.params, ref.params, rtol=1e-12, atol=1e-14)
    assert got.events == ref.events and got.epsilon == pytest.approx(ref.epsilon, rel=1e-12)
    for key in ("sensitivity", "scale", "modulus_bits", "noise_std"):
        assert got.config[key] == ref.config[key], key
    return strategy, ref


def test_a_client_level_run_on_secaggplus_arithmetic_is_the_simulators_run():
    """Client-level DP-FedAvg (2 local steps): the requests ask for clipped updates
    (``plan-unit = "client"``), each client's count coordinate is 1 (the server divides
    by the clients, learns no size), and the run ends at ``simulate_secure``'s model with
    the same plan, events and epsilon."""
    from dpprecond.secagg.fl import client_level_plan

    def check(fit_config, sent, strategy):
        assert fit_config["plan-unit"] == "client"
        assert fit_config["plan-local-steps"] == 2 and fit_config["plan-local-lr"] == 0.2
        assert all(v[-1] == strategy.quantization_range for v in sent)  # 1, times q

    strategy, ref = _run_on_secaggplus_arithmetic("fedgd", CLIENT_LEVEL, check)
    assert strategy.plan_ == client_level_plan(strategy.model, 1.0, ref.noise_multiplier,
                                               n_clients=K, min_clients=K)


def test_an_adaptive_clip_run_on_secaggplus_arithmetic_is_the_simulators_run():
    """Adaptive clipping (the default, ``"auto"``) on SecAgg+: every round's request has
    the round's clip and the count's weight, each client's part ends with its weighted
    count, and the run ends at ``simulate_secure``'s model with the same clips, plans,
    events and epsilon (the count costs no epsilon: one event per round, as without)."""
    from dataclasses import replace

    clips = []

    def check(fit_config, sent, strategy):
        assert fit_config["plan-count-weight"] > 0 and fit_config["plan-dim"] == \
            strategy.model.n_params + 1
        clips.append(fit_config["plan-clip-norm"])

    config = replace(CONFIG, n_rounds=4, adaptive_clip="auto", clip_norm=10.0)
    strategy, ref = _run_on_secaggplus_arithmetic("sofim-lagged", config, check)
    assert clips == ref.config["clip_norms"] == strategy.result().config["clip_norms"]
    assert clips[0] == 10.0 and clips[-1] < clips[0]  # the median norm is below 10 here
    assert [r["clip_norm"] for r in strategy.history_] == clips
    fixed = simulate_secure(strategy.model, _engine_data(), "sofim-lagged",
                            replace(config, adaptive_clip=None), X_test=np.zeros((1, 64)),
                            y_test=np.zeros(1, np.int64), seed=simulator_seeds(SEED).simulation)
    assert fixed.events == ref.events and fixed.epsilon == ref.epsilon


def test_a_client_level_request_is_checked_by_the_client():
    """A client answers a client-level request only with a plan whose sensitivity covers
    ``2 * plan-clip-norm`` and a known unit; a record-level plan is answered as before."""
    from dpprecond.secagg.fl import client_level_plan

    ds = featurized_dataset("digits")
    model = LinearSoftmax(ds.n_features, ds.n_classes)
    client = SecAggDPClient(model, ds.X_train[:10], ds.y_train[:10], 0)
    params = [np.zeros(model.n_params)]
    plan = client_level_plan(model, 1.0, 2.0, n_clients=K, min_clients=K)
    good = {"round": 1, **plan_to_config(plan, 1.0, unit="client", local_steps=2)}
    assert client.fit(params, good)[0][0][-1] == plan.modulus  # count 1, times q = m
    with pytest.raises(ValueError, match="2 \\* plan-clip-norm"):
        client.fit(params, {**plan_to_config(plan, 2.0, unit="client"), "round": 1})
    with pytest.raises(ValueError, match="plan-unit='user'"):
        client.fit(params, {**good, "plan-unit": "user"})
    with pytest.raises(ValueError, match="plan-local-steps"):
        client.fit(params, {**good, "plan-local-steps": 0})
    with pytest.raises(ValueError, match="unit='client'"):
        plan_to_config(plan, 1.0, "moment", unit="client")


def test_the_run_config_checks_client_level_before_anything_starts():
    """The app's pre-flight check accepts client-level DP under secure aggregation (the
    default weighting resolves to uniform) and refuses it under local trust, which has no
    trusted aggregator on Flower, and with size weights, by name."""
    from dpprecond.adapters.flower.app import RunConfigError, check_run_config

    base = {"target-epsilon": 4.0, "noise-multiplier": "", "algorithm": "fedgd",
            "mechanism": "client-level", "local-steps": 3, "adaptive-clip": False}
    check_run_config({**base, "trust": "secure-aggregation"})
    check_run_config({**base, "trust": "secure-aggregation", "weighting": "uniform"})
    with pytest.raises(RunConfigError, match="trusted aggregator"):
        check_run_config({**base, "trust": "local", "weighting": "uniform"})
    with pytest.raises(RunConfigError, match="weighting='uniform'"):
        check_run_config({**base, "trust": "secure-aggregation", "weighting": "size"})
    with pytest.raises(RunConfigError, match=r"client-level.*fedfc"):
        check_run_config({**base, "trust": "secure-aggregation", "algorithm": "fedfc"})
