"""The Flower adapter: same numbers as the in-process simulator, dropout, privacy guards.

Two tests start Flower's Ray simulation (``run_simulation``); Ray's start-up (about 5 s)
and the actors' first imports dominate their wall time. Everything else runs in process on
a small stand-in for Flower's Grid, which calls the real ClientApp object.

Flower is a hard requirement here: CI installs ``.[all]``, which includes the ``flower``
extra, so a missing flwr fails these tests instead of skipping them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.simulation import run_simulation

from dpprecond.adapters.flower import (
    DPFedStrategy,
    PartitionedDataset,
    RoundRequest,
    client_message,
    client_rng,
    make_client_app,
    make_server_app,
    query_reply,
    simulator_seeds,
    train_reply,
)
from dpprecond.adapters.flower.app import config_from_run_config
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.data import featurized_dataset
from dpprecond.adapters.flower.protocol import aggregate, epsilon_after_rounds
from dpprecond.fl import ClientData, FLConfig, run_federated
from dpprecond.fl import client as client_mod
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.server import make_optimizer

SEED = 7
K = 4
T = 3
# Explicit noise and clipping (never the defaults): noise std per coordinate of a message is
# 2 z C / |D_i| = 2 * 1.3 * 1 / 359 ~ 7e-3, so one wrong noise draw moves a parameter by
# far more than the tolerances below.
CONFIG = FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=None, noise_multiplier=1.3)
RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}

# Tolerance of "same model up to summation order". Both engines run the same operations on
# the same numbers with the same noise draws; what may differ is how BLAS blocks the
# forward product X W (all clients at once in the simulator, one client per Flower node),
# which can change the last bits of a logit (relative 1e-16 times the length-65 dot).
# Clipped sums of <= 360 examples, a well-conditioned server step (rho = 0.5) and three
# rounds keep that far below 1e-10 relative; a single wrong noise draw would be ~1e-3.
RTOL, ATOL = 1e-10, 1e-13


@pytest.fixture(scope="module")
def digits():
    return featurized_dataset("digits")


@pytest.fixture(scope="module")
def reference(digits):
    """The in-process simulator on the same partition, seed and noise."""
    return run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test,
                         digits.n_classes, algorithm="sofim", n_clients=K, config=CONFIG,
                         seed=SEED)


def _strategy(digits, algorithm: str = "sofim", config: FLConfig = CONFIG,
              **kwargs) -> DPFedStrategy:
    return DPFedStrategy(LinearSoftmax(digits.n_features, digits.n_classes),
                         make_optimizer(algorithm), config, K, X_test=digits.X_test,
                         y_test=digits.y_test, seed=SEED, **kwargs)


# ---------------------------------------------------------------------------------------
# Ray simulations (run_simulation)
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_flower_simulation_reproduces_the_simulator(digits, reference):
    strategy = _strategy(digits)
    run_simulation(make_server_app(lambda ctx: strategy, round_timeout=300),
                   make_client_app(PartitionedDataset("digits", seed=SEED), noise_seed=SEED),
                   num_supernodes=K, backend_config=RAY)
    result = strategy.result_
    np.testing.assert_allclose(result.params, reference.params, rtol=RTOL, atol=ATOL)
    assert np.abs(reference.params).max() > 1e-3  # the model moved: a real comparison
    assert result.noise_multiplier == reference.noise_multiplier == 1.3
    for got, want in zip(result.history, reference.history, strict=True):
        assert got["epsilon"] == want["epsilon"]
        assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=1e-12)
        assert got["clients_replied"] == [0, 1, 2, 3]


def _faulty_client_app(load_data, failing_client: int, failing_round: int) -> ClientApp:
    """The adapter's handlers, except that one client raises in one round."""
    app = ClientApp()

    @app.query()
    def _query(message: Message, context: Context) -> Message:
        return query_reply(message, context)

    @app.train()
    def _train(message: Message, context: Context) -> Message:
        if (context.node_config["partition-id"] == failing_client
                and message.content["config"]["server-round"] == failing_round):
            raise RuntimeError("simulated crash of this client")
        return train_reply(message, context, load_data, noise_seed=SEED)

    return app


def _replay(digits, algorithm: str, dropped: dict[int, set[int]]) -> np.ndarray:
    """Flower-free replay of a seeded run in which ``dropped[t]`` miss round ``t``."""
    load = PartitionedDataset("digits", seed=SEED)
    locals_ = [load(ClientInfo(i, K, {}, {})) for i in range(K)]
    model = locals_[0].model
    optimizer = make_optimizer(algorithm)
    params = np.zeros(model.n_params)
    state = optimizer.init(params)
    for t in range(1, T + 1):
        request = RoundRequest(t, CONFIG.clip_norm, CONFIG.noise_multiplier)
        present = [i for i in range(K) if i not in dropped.get(t, set())]
        U = np.stack([client_message(model, params, locals_[i].X, locals_[i].y, request,
                                     client_rng(SEED, t, i)) for i in present])
        sizes = np.array([locals_[i].X.shape[0] for i in present])
        updates, state = optimizer.update(aggregate(U, sizes), state, params)
        params = params + updates
    return params


@pytest.mark.slow
def test_a_client_that_raises_is_left_out_of_that_round(digits):
    strategy = _strategy(digits, algorithm="fedgd")
    run_simulation(make_server_app(lambda ctx: strategy, round_timeout=300),
                   _faulty_client_app(PartitionedDataset("digits", seed=SEED), 2, 2),
                   num_supernodes=K, backend_config=RAY)
    h = strategy.result_.history
    assert len(h) == T
    assert [r["clients_replied"] for r in h] == [[0, 1, 2, 3], [0, 1, 3], [0, 1, 2, 3]]
    assert [r["clients_failed"] for r in h] == [[], [2], []]
    assert "simulated crash" in h[1]["failures"]["2"]
    assert all(r["clients_timed_out"] == [] and r["clients_absent"] == [] for r in h)
    # Round 2 averages the three repliers (weights 1/3), nothing else changes.
    np.testing.assert_allclose(strategy.result_.params,
                               _replay(digits, "fedgd", {2: {2}}), rtol=RTOL, atol=ATOL)
    # Every client that was asked is charged, so dropping out does not lower epsilon.
    assert h[-1]["epsilon"] == epsilon_after_rounds(1.3, T, CONFIG.target_delta)


# ---------------------------------------------------------------------------------------
# In-process: a stand-in Grid that calls the real ClientApp
# ---------------------------------------------------------------------------------------

class LocalGrid:
    """Flower's Grid interface over in-process ClientApps (node ids 101, 102, ...).

    ``silent`` node ids never answer (a timeout); ``tamper`` rewrites a reply.
    """

    def __init__(self, app: ClientApp, n_nodes: int = K, *, node_config: Callable | None = None,
                 silent: Callable[[int, str], bool] = lambda node, kind: False,
                 tamper: Callable[[int, Message, Message], Message] | None = None) -> None:
        self.app = app
        self.nodes = list(range(101, 101 + n_nodes))
        cfg = node_config or (lambda i: {"partition-id": i, "num-partitions": n_nodes})
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg(i),
                                    state=RecordDict(), run_config={})
                         for i, n in enumerate(self.nodes)}
        self.silent = silent
        self.tamper = tamper

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if self.silent(node, msg.metadata.message_type):
                continue
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as exc:  # what Flower's runtime does with a raising ClientApp
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=msg)
            if self.tamper is not None:
                reply = self.tamper(node, msg, reply)
            replies.append(reply)
        return replies


@pytest.fixture(autouse=True)
def _task_identity():
    """The process identity Flower's runtimes set before a ServerApp builds messages."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture(scope="module")
def seeded_app():
    return make_client_app(PartitionedDataset("digits", seed=SEED), noise_seed=SEED)


def test_local_grid_reproduces_the_simulator_for_every_server_transform(digits, seeded_app):
    for algorithm in ("fedgd", "sofim", "sofim-momentum", "sofim-lagged", "adam", "yogi"):
        ref = run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test,
                            digits.n_classes, algorithm=algorithm, n_clients=K, config=CONFIG,
                            seed=SEED)
        result = _strategy(digits, algorithm).run(LocalGrid(seeded_app), timeout=10)
        np.testing.assert_allclose(result.params, ref.params, rtol=RTOL, atol=ATOL,
                                   err_msg=algorithm)
        assert [r["epsilon"] for r in result.history] == [r["epsilon"] for r in ref.history]


def test_size_weighting_and_poisson_mechanism_match_the_simulator(digits, seeded_app):
    for config in (FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=None,
                            noise_multiplier=1.3, weighting="size"),
                   FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=None,
                            noise_multiplier=1.3, mechanism="poisson", sampling_rate=0.5,
                            local_steps=2, local_lr=0.5)):
        ref = run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test,
                            digits.n_classes, algorithm="sofim", n_clients=K, config=config,
                            seed=SEED)
        result = _strategy(digits, config=config).run(LocalGrid(seeded_app), timeout=10)
        np.testing.assert_allclose(result.params, ref.params, rtol=RTOL, atol=ATOL)
        assert result.epsilon == ref.epsilon


def test_timeouts_malformed_replies_and_absent_clients_are_recorded(digits, seeded_app):
    def silent(node: int, kind: str) -> bool:
        return node == 102 and kind == "train"  # client 1 never answers a round

    def tamper(node: int, request: Message, reply: Message) -> Message:
        if node == 103 and request.metadata.message_type == "train":  # a 3-vector message
            bad = RecordDict({"message": ArrayRecord({"message": Array(np.zeros(3))}),
                              "metrics": reply.content["metrics"]})
            return Message(bad, reply_to=request)
        return reply

    grid = LocalGrid(seeded_app, n_nodes=3, silent=silent, tamper=tamper,
                     node_config=lambda i: {"partition-id": i, "num-partitions": K})
    strategy = _strategy(digits, connect_timeout=0.5)
    result = strategy.run(grid, timeout=1)
    for r in result.history:
        assert r["clients_replied"] == [0]
        assert r["clients_timed_out"] == [1]
        assert r["clients_failed"] == [2] and "malformed" in r["failures"]["2"]
        assert r["clients_absent"] == [3]  # never connected
    assert result.epsilon == epsilon_after_rounds(1.3, T, CONFIG.target_delta)


def test_a_round_without_enough_replies_leaves_the_model_unchanged(digits, seeded_app):
    grid = LocalGrid(seeded_app, silent=lambda node, kind: kind == "train" and node != 101)
    result = _strategy(digits, min_replies=2).run(grid, timeout=1)
    assert all(r["n_replied"] == 1 and r["update_norm"] == 0.0 for r in result.history)
    np.testing.assert_array_equal(result.params, np.zeros_like(result.params))


def test_misconfigured_federations_are_refused(digits, seeded_app):
    dup = LocalGrid(seeded_app, node_config=lambda i: {"partition-id": min(i, 2),
                                                       "num-partitions": K})
    with pytest.raises(ValueError, match="client ids \\[2\\]"):
        _strategy(digits).run(dup, timeout=1)
    wrong_k = LocalGrid(seeded_app, node_config=lambda i: {"partition-id": i,
                                                           "num-partitions": 5})
    with pytest.raises(ValueError, match="num-partitions=5"):
        _strategy(digits).run(wrong_k, timeout=1)
    nobody = LocalGrid(seeded_app, silent=lambda node, kind: True)
    with pytest.raises(RuntimeError, match="No client registered"):
        _strategy(digits, connect_timeout=0.3).run(nobody, timeout=1)


def test_strategy_validates_its_settings(digits):
    model = LinearSoftmax(digits.n_features, digits.n_classes)
    with pytest.raises(ValueError, match="trusted aggregator"):
        DPFedStrategy(model, make_optimizer("sofim"),
                      FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=None,
                               noise_multiplier=1.0, mechanism="client-level"), K)
    with pytest.raises(TypeError, match="FLConfig"):
        DPFedStrategy(model, make_optimizer("sofim"), {"n_rounds": 2}, K)  # type: ignore
    with pytest.raises(ValueError, match="n_clients"):
        DPFedStrategy(model, make_optimizer("sofim"), CONFIG, 0)
    strategy = DPFedStrategy(model, make_optimizer("sofim"), CONFIG, K)
    with pytest.raises(ValueError, match="calibrated"):
        strategy.start(LocalGrid(ClientApp()), None, num_rounds=T + 1)  # type: ignore


# ---------------------------------------------------------------------------------------
# The client: same numbers as the simulator, unpredictable noise by default, consent
# ---------------------------------------------------------------------------------------

def test_seed_tree_and_client_message_match_the_simulator(digits):
    """Row i of the simulator's messages from one client alone (to the last bits: the
    forward product of one client's rows may round differently from all clients' rows)."""
    load = PartitionedDataset("digits", seed=SEED)
    locals_ = [load(ClientInfo(i, K, {}, {})) for i in range(K)]
    model = locals_[0].model
    parts = [np.arange(sum(len(x.y) for x in locals_[:i]),
                       sum(len(x.y) for x in locals_[:i + 1])) for i in range(K)]
    data = ClientData.from_partition(np.vstack([x.X for x in locals_]),
                                     np.concatenate([x.y for x in locals_]), parts, 10)
    params = np.random.default_rng(0).standard_normal(model.n_params) * 0.1
    for t in (1, 3):
        rngs = client_mod.round_generators(simulator_seeds(SEED).noise, t - 1, K)
        U = client_mod.full_batch_messages(model, params, data.X, data.y, data.bounds, 1.0,
                                           1.3, rngs)
        request = RoundRequest(t, 1.0, 1.3)
        for i in range(K):
            u = client_message(model, params, locals_[i].X, locals_[i].y, request,
                               client_rng(SEED, t, i))
            np.testing.assert_allclose(u, U[i], rtol=RTOL, atol=ATOL)
    # The seed tree is run_federated's: one round of SGD with lr 1 from zeros is -G.
    config = FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=None, noise_multiplier=1.3)
    ref = run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                        algorithm="fedgd", learning_rate=1.0, n_clients=K, config=config,
                        seed=SEED)
    zero = np.zeros(model.n_params)
    G = aggregate(np.stack([client_message(model, zero, x.X, x.y, RoundRequest(1, 1.0, 1.3),
                                           client_rng(SEED, 1, i))
                            for i, x in enumerate(locals_)]), np.full(K, 1))
    np.testing.assert_allclose(ref.params, -G, rtol=RTOL, atol=ATOL)


def _train_message(params: np.ndarray, request: RoundRequest) -> Message:
    content = RecordDict({"params": ArrayRecord({"params": Array(params)}),
                          "config": ConfigRecord(request.to_config())})
    return Message(content, dst_node_id=101, message_type="train")


def _context(node_config: dict, run_config: dict | None = None) -> Context:
    return Context(run_id=1, node_id=101, node_config={"partition-id": 1,
                                                       "num-partitions": K, **node_config},
                   state=RecordDict(), run_config=run_config or {})


def _reply_message(reply: Message) -> np.ndarray:
    return reply.content["message"]["message"].numpy()


def test_unseeded_clients_draw_fresh_noise_and_seeds_need_the_nodes_consent(digits):
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    msg = _train_message(params, RoundRequest(1, 1.0, 1.3))
    a = _reply_message(train_reply(msg, _context({}), load))
    b = _reply_message(train_reply(msg, _context({}), load))
    assert np.abs(a - b).max() > 1e-3  # OS entropy: two calls, two noise draws
    seeded = _reply_message(train_reply(msg, _context({}), load, noise_seed=SEED))
    with pytest.raises(ValueError, match="allow-seeded-noise"):
        train_reply(msg, _context({}, {"noise-seed": SEED}), load)
    consented = train_reply(msg, _context({"allow-seeded-noise": True}, {"noise-seed": SEED}),
                            load)
    np.testing.assert_array_equal(_reply_message(consented), seeded)
    empty = _context({}, {"noise-seed": ""})  # empty string = fresh entropy, no consent needed
    assert np.abs(_reply_message(train_reply(msg, empty, load)) - seeded).max() > 1e-3


def test_client_guards(digits):
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    msg = _train_message(params, RoundRequest(1, 1.0, 0.5))
    with pytest.raises(ValueError, match="min-noise-multiplier=1"):
        train_reply(msg, _context({"min-noise-multiplier": 1.0}), load)
    nobody = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="--node-config"):
        train_reply(msg, nobody, load)
    with pytest.raises(ValueError, match="needs 650 finite"):
        train_reply(_train_message(np.zeros(3), RoundRequest(1, 1.0, 0.5)), _context({}), load)
    with pytest.raises(ValueError, match="clip_norm"):
        RoundRequest(1, float("inf"), 1.0).validated()
    with pytest.raises(ValueError, match="local_steps=1"):
        RoundRequest(1, 1.0, 1.0, local_steps=2).validated()
    with pytest.raises(ValueError, match="missing"):
        RoundRequest.from_config({"server-round": 1})


def test_run_config_needs_exactly_one_noise_setting():
    with pytest.raises(ValueError, match="exactly one"):
        config_from_run_config({"target-epsilon": 1.0, "noise-multiplier": 1.0})
    with pytest.raises(ValueError, match="exactly one"):
        config_from_run_config({"target-epsilon": "", "noise-multiplier": ""})
    cfg = config_from_run_config({"target-epsilon": 2.0, "noise-multiplier": "",
                                  "n-rounds": 5, "clip-norm": 3.0})
    assert (cfg.target_epsilon, cfg.noise_multiplier, cfg.n_rounds) == (2.0, None, 5)


def test_importing_dpprecond_does_not_import_flower_and_a_missing_flwr_names_the_extra():
    code = ("import sys, dpprecond, dpprecond.fl, dpprecond.adapters\n"
            "assert 'flwr' not in sys.modules, 'dpprecond imported flwr'\n"
            "sys.modules['flwr'] = None\n"
            "try:\n    import dpprecond.adapters.flower\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "pip install 'dpprecond[flower]'" in out.stdout
