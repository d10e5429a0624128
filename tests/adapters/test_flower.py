"""The Flower adapter: the engine's numbers for every method, dropout policies, guards.

Two tests start Flower's Ray simulation (``run_simulation``); Ray's start-up and the
actors' first imports dominate their wall time, so each runs several methods in one
ServerApp. Everything else runs in process on a small stand-in for Flower's Grid, which
calls the real ClientApp object with a persistent Context per node.

Flower is a hard requirement here: CI installs ``.[all]``, which includes the ``flower``
extra, so a missing flwr fails these tests instead of skipping them.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from dpprecond import PrivacyBudgetExceededError
from dpprecond.accounting import PrivacyLedger, gaussian
from dpprecond.adapters.flower import (
    DPFedStrategy,
    PartitionedDataset,
    RoundRequest,
    client_rng,
    make_client_app,
    query_reply,
    simulator_seeds,
    train_reply,
)
from dpprecond.adapters.flower.app import (
    RunConfigError,
    check_run_config,
    config_from_run_config,
    method_from_run_config,
)
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.client_side import client_reply
from dpprecond.adapters.flower.data import featurized_dataset
from dpprecond.adapters.flower.protocol import reply_shapes
from dpprecond.fl import METHODS, ClientData, FLConfig, make_method, method_options, run_federated
from dpprecond.fl import client as client_mod
from dpprecond.fl.accounting import resolve_scale
from dpprecond.fl.adaptive_clip import AdaptiveClip, count_root, geometric_update
from dpprecond.fl.config import MAX_NOISE_STD
from dpprecond.fl.engine import plan_event, simulate
from dpprecond.fl.local_steps import local_step_deltas, updated_controls
from dpprecond.fl.methods import Method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import client_weights
from dpprecond.fl.server import FedNewState
from dpprecond.fl.tasks import GradientTask, LocalStepsTask, RecordCountTask, SecondMomentTask
from dpprecond.secure import SecureGenerator

SEED = 7
K = 4
T = 3
# Explicit clipping and a calibrated noise (the strategy must calibrate exactly as the
# engine). Noise std per coordinate of a gradient message is 2 z C / |D_i| with z >= 1.2,
# C = 1, |D_i| ~ 359, i.e. ~7e-3: one wrong noise draw moves a parameter by far more than
# the tolerances below.
# A fixed clip and uniform weights, whatever FLConfig's defaults (adaptive clipping:
# AC_CONFIG below).
CONFIG = FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=4.0, adaptive_clip=None,
                  weighting="uniform")
# Adaptive clipping (explicitly on, whatever FLConfig's default): from C = 1 the noisy
# median moves the clip by ~30% a round (lr 0.5), so a wrong count moves the model.
AC = AdaptiveClip(learning_rate=0.5)
AC_CONFIG = FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=4.0, adaptive_clip=AC)
RAY = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
       "init_args": {"num_cpus": 2, "logging_level": "error"}}

# Tolerance of "same model up to summation order". Both engines run the same operations on
# the same numbers with the same noise draws; what may differ is how BLAS blocks the
# forward product X W (all clients at once in the engine, one client per Flower node),
# which can change the last bits of a logit (relative 1e-16 times the length-65 dot).
# Clipped sums of <= 360 examples, well-conditioned server steps and three rounds keep that
# far below 1e-10 relative; a single wrong noise draw would be ~1e-3.
RTOL, ATOL = 1e-10, 1e-13

# Ray starts its actors (and imports numpy, flwr and dpprecond in them) while the first
# registration query waits. On a loaded 2-core machine that can take minutes, and the
# strategy then goes on without the nodes that had not answered, as documented, which
# changes the run. The Ray tests therefore give registration and rounds ample time: they
# test equality with the engine, not the timeouts (tested in process below).
SIM_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def digits():
    return featurized_dataset("digits")


def _reference(digits, name: str, config: FLConfig = CONFIG):
    return run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test,
                         digits.n_classes, algorithm=name, n_clients=K, config=config,
                         seed=SEED)


def _strategy(digits, name: str = "sofim", config: FLConfig = CONFIG,
              **kwargs) -> DPFedStrategy:
    kwargs.setdefault("seed", SEED)
    return DPFedStrategy(LinearSoftmax(digits.n_features, digits.n_classes), make_method(name),
                         config, K, X_test=digits.X_test, y_test=digits.y_test, **kwargs)


def _assert_same_run(result, ref, label: str) -> None:
    np.testing.assert_allclose(result.params, ref.params, rtol=RTOL, atol=ATOL, err_msg=label)
    assert np.abs(ref.params).max() > 1e-3, label  # the model moved: a real comparison
    assert result.noise_multiplier == ref.noise_multiplier, label
    assert result.events == ref.events, label  # the same releases, in the same order
    assert [r["epsilon"] for r in result.history] == [r["epsilon"] for r in ref.history]
    assert result.epsilon == ref.epsilon, label
    if ref.config.get("adaptive_clip") is not None:  # the same clips, reported alike
        clips = ref.config["clip_norms"]
        assert len(clips) == T and len(set(clips)) == T, (label, clips)  # the clip moved
        assert result.config["clip_norms"] == clips, label
        assert [r["clip_norm"] for r in result.history] == clips, label
        assert result.config["count_noise_multiplier"] == ref.config["count_noise_multiplier"]
        assert ref.config["count_noise_multiplier"] > 0, label
        count = gaussian(ref.config["count_noise_multiplier"])
        assert sum(e == count for e in result.events) == T, label  # one count per round
    else:
        assert all(r["clip_norm"] == ref.config["clip_norm"] for r in result.history), label


def _client_data() -> tuple[ClientData, list]:
    """The 4 clients' data, stacked client-contiguously (the engine's layout)."""
    load = PartitionedDataset("digits", seed=SEED)
    locals_ = [load(ClientInfo(i, K, {}, {})) for i in range(K)]
    sizes = np.cumsum([0] + [len(x.y) for x in locals_])
    parts = [np.arange(sizes[i], sizes[i + 1]) for i in range(K)]
    data = ClientData.from_partition(np.vstack([x.X for x in locals_]),
                                     np.concatenate([x.y for x in locals_]), parts, 10)
    return data, locals_


def _replay(name: str, dropped: dict[int, set[int]]) -> np.ndarray:
    """Flower-free replay of the documented dropout policies from the engine's pieces.

    ``dropped[t]``: clients left out of round ``t`` (0: the setup round of fedfc/fednew).
    Every client draws from its engine stream; the messages of all clients are computed
    and the dropped rows discarded (streams are per client, so this changes nothing else).
    """
    data, locals_ = _client_data()
    model = locals_[0].model
    method = make_method(name)
    schedule = method.schedule(CONFIG)
    z = schedule.multipliers(resolve_scale(schedule, CONFIG))
    tree = simulator_seeds(SEED)
    params = np.zeros(model.n_params)
    args = (data.X, data.y, data.bounds, CONFIG.clip_norm)

    def gens(t: int) -> list:
        return client_mod.round_generators(tree.noise, t - 1, K)

    def present(t: int) -> list[int]:
        return [i for i in range(K) if i not in dropped.get(t, set())]

    if name in ("fedfc", "fednew"):
        moments = list(client_mod.second_moment_releases(
            data.X, data.bounds, method.feature_clip(model.n_features), z["z_cov"],
            client_mod.round_generators(tree.setup, 0, K)))
        members = present(0)  # fednew: the consensus; fedfc: the moments in P
        setup = method.setup_from_moments([moments[i] for i in members])
        state = method.server_transform(setup, 10).init(params)
        for t in range(1, T + 1):
            U = client_mod.full_batch_messages(model, params, *args, z["z_grad"], gens(t))
            if name == "fedfc":
                rows = present(t)
                upd, state = method.server_transform(setup, 10).update(U[rows], state, params)
            else:
                rows = [members.index(i) for i in present(t) if i in members]
                sub = method.server_transform(setup[rows], 10)
                upd, new = sub.update(U[[members[r] for r in rows]],
                                      FedNewState(state.duals[rows], state.consensus), params)
                duals = state.duals.copy()
                duals[rows] = new.duals
                state = FedNewState(duals, new.consensus)
            params = params + upd
        return params
    if name in ("fedavg", "scaffold"):
        c_i = np.zeros((K, model.n_params))
        state = method.server.init(params)
        for t in range(1, T + 1):
            rows = present(t)
            correction = (state.control - c_i) if method.control_variates else None
            dy = local_step_deltas(model, params, *args, z["z"], gens(t),
                                   local_steps=method.local_steps, local_lr=method.local_lr,
                                   correction=correction)
            dc = None
            if method.control_variates:
                c_new = updated_controls(c_i, state.control, dy,
                                         local_steps=method.local_steps,
                                         local_lr=method.local_lr)
                dc = np.zeros_like(c_i)
                dc[rows] = c_new[rows] - c_i[rows]
                c_i[rows] = c_new[rows]  # a client left out keeps its c_i
            upd, state = method.server.update((dy[rows], dc), state, params)
            params = params + upd
        return params
    state = method.transform.init(params)
    for t in range(1, T + 1):
        rows = present(t)
        U = client_mod.full_batch_messages(model, params, *args, z["z"], gens(t))
        upd, state = method.transform.update(client_weights(np.ones(len(rows))) @ U[rows],
                                             state, params)
        params = params + upd
    return params


# ---------------------------------------------------------------------------------------
# Ray simulations (run_simulation): at most two in the suite
# ---------------------------------------------------------------------------------------

def _server_app(strategies: list[DPFedStrategy]) -> ServerApp:
    """One ServerApp that runs several strategies one after the other on the same nodes."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        for strategy in strategies:
            strategy.run(grid, timeout=SIM_TIMEOUT)

    return app


@pytest.mark.slow
def test_flower_simulation_reproduces_the_engine(digits):
    """DP-FedSOFIM, DP-SCAFFOLD (the c_i in each node's context.state across rounds),
    DP-FedNew (a setup round), DP-FedProx (added as one module: the adapter is generic) and
    DP-FedFC with adaptive clipping (a setup round, then counts beside the messages)
    through Ray equal run_federated with the same seed."""
    runs = [("sofim", CONFIG), ("scaffold", CONFIG), ("fednew", CONFIG), ("fedprox", CONFIG),
            ("fedfc", AC_CONFIG)]  # adaptive clipping: each node's count, the engine's clip
    strategies = [_strategy(digits, name, config, connect_timeout=SIM_TIMEOUT)
                  for name, config in runs]
    run_simulation(_server_app(strategies),
                   make_client_app(PartitionedDataset("digits", seed=SEED), noise_seed=SEED),
                   num_supernodes=K, backend_config=RAY)
    for (name, config), strategy in zip(runs, strategies, strict=True):
        result = strategy.result_
        _assert_same_run(result, _reference(digits, name, config), name)
        assert all(r["clients_replied"] == [0, 1, 2, 3] for r in result.history), name


def _faulty_client_app(load_data, failing: set[tuple[int, int]]) -> ClientApp:
    """The adapter's handlers, except that client i raises in round t for (i, t) in failing
    (round 0: the setup round)."""
    app = ClientApp()

    @app.query()
    def _query(message: Message, context: Context) -> Message:
        return query_reply(message, context)

    @app.train()
    def _train(message: Message, context: Context) -> Message:
        key = (context.node_config["partition-id"], message.content["config"]["server-round"])
        if key in failing:
            raise RuntimeError("simulated crash of this client")
        return train_reply(message, context, load_data, noise_seed=SEED)

    return app


@pytest.mark.slow
def test_clients_that_raise_are_left_out_as_documented(digits):
    """Client 2 raises in round 2 and client 3 in the setup round: DP-FedGD renormalizes
    the weights, DP-SCAFFOLD keeps client 2's c_i, DP-FedNew excludes client 3 for the
    whole run; each equals a Flower-free replay of its policy and epsilon is not reduced."""
    names = ["fedgd", "scaffold", "fednew"]
    strategies = [_strategy(digits, name, connect_timeout=SIM_TIMEOUT) for name in names]
    run_simulation(_server_app(strategies),
                   _faulty_client_app(PartitionedDataset("digits", seed=SEED),
                                      {(2, 2), (3, 0)}),
                   num_supernodes=K, backend_config=RAY)
    for name, strategy in zip(names, strategies, strict=True):
        h = strategy.result_.history
        assert len(h) == T
        ref = _reference(digits, name)
        assert strategy.result_.events == ref.events  # dropping out does not lower epsilon
        assert [r["clients_failed"] for r in h] == [[], [2], []]
        assert "simulated crash" in h[1]["failures"]["2"]
        assert all(r["clients_timed_out"] == [] and r["clients_absent"] == [] for r in h)
        dropped = {2: {2}}
        if name == "fednew":
            assert strategy.setup_["clients_failed"] == [3]
            assert all(r["clients_excluded"] == [3] for r in h)  # never asked again
            assert [r["clients_replied"] for r in h] == [[0, 1, 2], [0, 1], [0, 1, 2]]
            dropped[0] = {3}
        else:
            assert [r["clients_replied"] for r in h] == [[0, 1, 2, 3], [0, 1, 3],
                                                         [0, 1, 2, 3]]
        np.testing.assert_allclose(strategy.result_.params, _replay(name, dropped),
                                   rtol=RTOL, atol=ATOL, err_msg=name)


# ---------------------------------------------------------------------------------------
# In-process: a stand-in Grid that calls the real ClientApp
# ---------------------------------------------------------------------------------------

class LocalGrid:
    """Flower's Grid interface over in-process ClientApps (node ids 101, 102, ...).

    Each node keeps one Context (its ``state`` persists across rounds, as in Flower).
    ``silent(node, request)`` drops a message unanswered (a client that never computed);
    ``late(node, request)`` lets the client compute but drops its reply (it arrived after
    the timeout); ``tamper`` rewrites a reply. ``sent`` counts the messages sent.
    """

    def __init__(self, app: ClientApp, n_nodes: int = K, *, node_config: Callable | None = None,
                 silent: Callable[[int, dict], bool] = lambda node, req: False,
                 late: Callable[[int, dict], bool] = lambda node, req: False,
                 tamper: Callable[[int, Message, Message], Message] | None = None) -> None:
        self.app = app
        self.nodes = list(range(101, 101 + n_nodes))
        cfg = node_config or (lambda i: {"partition-id": i, "num-partitions": n_nodes})
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg(i),
                                    state=RecordDict(), run_config={})
                         for i, n in enumerate(self.nodes)}
        self.silent, self.late, self.tamper = silent, late, tamper
        self.sent = 0

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            self.sent += 1
            node = msg.metadata.dst_node_id
            req = dict(msg.content["config"]) if "config" in msg.content else {}
            if msg.metadata.message_type == "train" and self.silent(node, req):
                continue
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as exc:  # what Flower's runtime does with a raising ClientApp
                reply = Message(Error(0, f"{type(exc).__name__}: {exc}"), reply_to=msg)
            if msg.metadata.message_type == "train" and self.late(node, req):
                continue
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


def test_local_grid_reproduces_the_engine_for_every_method(digits, seeded_app):
    assert sorted(METHODS) == sorted(["fedgd", "sofim", "sofim-momentum", "sofim-lagged",
                                      "adam", "yogi", "fedavg", "scaffold", "fedfc", "fednew",
                                      "fedprox"])
    for name in METHODS:
        result = _strategy(digits, name).run(LocalGrid(seeded_app), timeout=10)
        _assert_same_run(result, _reference(digits, name), name)


def test_noise_aware_sofim_matches_the_engine(digits, seeded_app):
    """The noise variance of each round's aggregate is computed from the repliers (all
    reply here): the same run as the engine's."""
    for name in ("sofim", "sofim-lagged"):
        strategy = DPFedStrategy(LinearSoftmax(digits.n_features, digits.n_classes),
                                 make_method(name, noise_aware=True), CONFIG, K,
                                 X_test=digits.X_test, y_test=digits.y_test, seed=SEED)
        result = strategy.run(LocalGrid(seeded_app), timeout=10)
        ref = run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test,
                            digits.n_classes, algorithm=name, n_clients=K, config=CONFIG,
                            seed=SEED, method_options={"noise_aware": True})
        _assert_same_run(result, ref, name)


def test_size_weighting_and_poisson_mechanism_match_the_engine(digits, seeded_app):
    for config in (replace(CONFIG, weighting="size"),
                   FLConfig(n_rounds=T, clip_norm=1.0, noise_multiplier=1.3, accountant="rdp",
                            mechanism="poisson", sampling_rate=0.5, local_steps=2,
                            local_lr=0.5, adaptive_clip=None)):
        result = _strategy(digits, config=config).run(LocalGrid(seeded_app), timeout=10)
        _assert_same_run(result, _reference(digits, "sofim", config), config.mechanism)


def test_local_grid_reproduces_the_engine_with_adaptive_clipping(digits, seeded_app):
    """Every method with adaptive clipping: each client releases its count (its own noise,
    from the engine's count stream) beside its message, the server updates the clip from
    the counts as the engine does: the same model, clips, releases and epsilons."""
    for name in METHODS:
        result = _strategy(digits, name, AC_CONFIG).run(LocalGrid(seeded_app), timeout=10)
        _assert_same_run(result, _reference(digits, name, AC_CONFIG), f"{name} adaptive")
    other = FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                     accountant="rdp", adaptive_clip=AdaptiveClip(
                         target_quantile=0.3, learning_rate=0.5, count_share=0.2))
    result = _strategy(digits, "sofim-lagged", other).run(LocalGrid(seeded_app), timeout=10)
    _assert_same_run(result, _reference(digits, "sofim-lagged", other), "size weights")


def test_adaptive_clipping_updates_the_clip_from_the_repliers_counts(digits, seeded_app):
    """Client 1 misses round 2 (no message, no count): C_3 is the geometric step from the
    three repliers' noisy counts over their records (a Flower-free replay from the count
    task and the engine's count streams), and every count asked for is charged."""
    grid = LocalGrid(seeded_app, silent=lambda node, req: node == 102 and
                     req.get("server-round") == 2)
    strategy = _strategy(digits, "fedgd", AC_CONFIG)
    params_at: dict[int, np.ndarray] = {}
    update = strategy.server_.update

    def recording(server_round, replies, sizes, params):
        params_at[server_round] = params.copy()
        return update(server_round, replies, sizes, params)

    strategy.server_.update = recording  # type: ignore[method-assign]
    result = strategy.run(grid, timeout=1)
    assert [r["clients_replied"] for r in result.history] == [[0, 1, 2, 3], [0, 2, 3],
                                                               [0, 1, 2, 3]]
    assert result.events == _reference(digits, "fedgd", AC_CONFIG).events
    clips = result.config["clip_norms"]
    _, locals_ = _client_data()
    tree = simulator_seeds(SEED)
    task = RecordCountTask(clips[1], result.config["count_noise_multiplier"])
    repliers = (0, 2, 3)
    counts = [task.release(locals_[i].model, params_at[2], locals_[i].X, locals_[i].y,
                           np.array([0, len(locals_[i].y)]),
                           [client_mod.stream(tree.counts, 1, i)]).arrays["count"][0, 0]
              for i in repliers]
    fraction = sum(counts) / sum(len(locals_[i].y) for i in repliers)
    expected = geometric_update(clips[1], fraction, AC.target_quantile, AC.learning_rate,
                                MAX_NOISE_STD / (2 * result.noise_multiplier))
    assert clips[2] == pytest.approx(expected, rel=1e-12)
    assert abs(clips[2] - clips[1]) > 1e-3  # the step moved it: a real comparison
    # a round that aggregates nothing leaves the clip where it was (its count is charged)
    nobody = LocalGrid(seeded_app, silent=lambda node, req: req.get("server-round") == 2)
    quiet = _strategy(digits, "fedgd", AC_CONFIG).run(nobody, timeout=1)
    assert quiet.history[1]["n_replied"] == 0
    assert quiet.config["clip_norms"][2] == quiet.config["clip_norms"][1]
    assert quiet.events == result.events


def test_schedule_releases_compose_to_the_calibrated_schedule():
    for name in METHODS:
        method = make_method(name)
        schedule = method.schedule(CONFIG)
        scale = resolve_scale(schedule, CONFIG)
        setup, per_round = schedule.releases(schedule.multipliers(scale))
        ledger = PrivacyLedger(CONFIG.target_delta, accountant=CONFIG.accountant)
        for event, count in setup + per_round * T:
            ledger.spend(event, count)
        plan = PrivacyLedger(CONFIG.target_delta, accountant=CONFIG.accountant)
        assert ledger.epsilon == pytest.approx(plan.epsilon_with(schedule.event(scale)),
                                               rel=1e-12), name
        assert ledger.epsilon == pytest.approx(4.0, rel=1e-3), name


def test_a_callers_ledger_is_checked_before_any_message_and_records_the_run(digits,
                                                                           seeded_app):
    ledger = PrivacyLedger(CONFIG.target_delta, max_epsilon=5.0)
    ledger.spend(make_method("fedfc").schedule(CONFIG).event(1.0))  # a prior release
    spent = ledger.epsilon
    grid = LocalGrid(seeded_app)
    with pytest.raises(PrivacyBudgetExceededError, match="max_epsilon=5"):
        _strategy(digits, "fedfc", ledger=ledger).run(grid, timeout=10)
    assert grid.sent == 0 and ledger.epsilon == spent  # refused before any message
    roomy = PrivacyLedger(CONFIG.target_delta, max_epsilon=4.5)
    result = _strategy(digits, "fedfc", ledger=roomy).run(LocalGrid(seeded_app), timeout=10)
    assert roomy.events == result.events and roomy.epsilon == result.epsilon
    _assert_same_run(result, _reference(digits, "fedfc"), "fedfc with a ledger")


def test_a_late_scaffold_reply_leaves_the_clients_control_variate_unchanged(digits,
                                                                          seeded_app):
    """Client 1 computes round 2 but its reply misses the timeout: the server's c does not
    move with it, and the client discards the c_i it computed (its next request says its
    last aggregated round was 1), exactly as if it had failed."""
    grid = LocalGrid(seeded_app, late=lambda node, req: node == 102 and
                     req.get("server-round") == 2)
    strategy = _strategy(digits, "scaffold")
    result = strategy.run(grid, timeout=1)
    assert [r["clients_timed_out"] for r in result.history] == [[], [1], []]
    np.testing.assert_allclose(result.params, _replay("scaffold", {2: {1}}), rtol=RTOL,
                               atol=ATOL)
    # c is the mean of the clients' committed c_i (each pending one was aggregated in round 3)
    controls = [grid.contexts[n].state["dpprecond-state"]["pending"].numpy()
                for n in grid.nodes]
    np.testing.assert_allclose(strategy.server_.state.control, np.mean(controls, axis=0),
                               rtol=1e-9, atol=1e-15)


def test_covariance_methods_without_a_clients_moment(digits, seeded_app):
    """Client 3 never answers the setup round. DP-FedNew runs on clients 0..2 alone, which
    is the engine on those three clients' data; DP-FedFC builds P from three moments and
    keeps all four clients in the gradient rounds."""
    silent = LocalGrid(seeded_app, silent=lambda node, req: node == 104 and
                       req.get("kind") == "second-moment")
    result = _strategy(digits, "fednew").run(silent, timeout=1)
    data, _ = _client_data()
    three = ClientData(data.X[:data.bounds[3]], data.y[:data.bounds[3]], data.bounds[:4], 10)
    ref = simulate(LinearSoftmax(64, 10), three, make_method("fednew"), CONFIG,
                   X_test=digits.X_test, y_test=digits.y_test,
                   seed=simulator_seeds(SEED).simulation)
    _assert_same_run(result, ref, "fednew on three clients")
    assert result.config["setup_round"]["clients_timed_out"] == [3]
    assert all(r["clients_excluded"] == [3] and r["clients_replied"] == [0, 1, 2]
               for r in result.history)
    grid = LocalGrid(seeded_app, silent=lambda node, req: node == 104 and
                     req.get("kind") == "second-moment")
    fedfc = _strategy(digits, "fedfc").run(grid, timeout=1)
    assert all(r["clients_replied"] == [0, 1, 2, 3] for r in fedfc.history)
    np.testing.assert_allclose(fedfc.params, _replay("fedfc", {0: {3}}), rtol=RTOL, atol=ATOL)


def test_fednew_admm_runs_over_the_repliers_of_a_round(digits, seeded_app):
    """Client 0 misses round 2: its dual stays put, the duals still sum to zero."""
    grid = LocalGrid(seeded_app, silent=lambda node, req: node == 101 and
                     req.get("server-round") == 2)
    strategy = _strategy(digits, "fednew")
    states = []
    update = strategy.server_.update

    def recording(*args, **kwargs):
        out = update(*args, **kwargs)
        states.append(strategy.server_.state)
        return out

    strategy.server_.update = recording  # type: ignore[method-assign]
    result = strategy.run(grid, timeout=1)
    duals = [state[1].duals for state in states]  # (solvers, FedNewState, members)
    np.testing.assert_array_equal(duals[1][0], duals[0][0])
    assert np.abs(duals[1][1] - duals[0][1]).max() > 0
    for d in duals:
        np.testing.assert_allclose(d.sum(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(result.params, _replay("fednew", {2: {0}}), rtol=RTOL,
                               atol=ATOL)


def test_timeouts_malformed_replies_and_absent_clients_are_recorded(digits, seeded_app):
    def tamper(node: int, request: Message, reply: Message) -> Message:
        if node == 103 and request.metadata.message_type == "train":  # a 3-vector message
            bad = RecordDict({"reply": ArrayRecord({"message": Array(np.zeros(3))}),
                              "metrics": reply.content["metrics"]})
            return Message(bad, reply_to=request)
        return reply

    grid = LocalGrid(seeded_app, n_nodes=3, silent=lambda node, req: node == 102,
                     tamper=tamper,
                     node_config=lambda i: {"partition-id": i, "num-partitions": K})
    strategy = _strategy(digits, connect_timeout=0.5)
    result = strategy.run(grid, timeout=1)
    for r in result.history:
        assert r["clients_replied"] == [0]
        assert r["clients_timed_out"] == [1]
        assert r["clients_failed"] == [2] and "malformed" in r["failures"]["2"]
        assert r["clients_absent"] == [3]  # never connected
    assert result.events == _reference(digits, "sofim").events  # everybody asked is charged


def test_a_round_without_enough_replies_leaves_the_model_unchanged(digits, seeded_app):
    grid = LocalGrid(seeded_app, silent=lambda node, req: node != 101)
    result = _strategy(digits, min_replies=2).run(grid, timeout=1)
    assert all(r["n_replied"] == 1 and r["update_norm"] == 0.0 for r in result.history)
    np.testing.assert_array_equal(result.params, np.zeros_like(result.params))
    nobody = LocalGrid(seeded_app, silent=lambda node, req: True)
    with pytest.raises(RuntimeError, match="cannot be built"):
        _strategy(digits, "fedfc").run(nobody, timeout=1)


def test_misconfigured_federations_are_refused(digits, seeded_app):
    dup = LocalGrid(seeded_app, node_config=lambda i: {"partition-id": min(i, 2),
                                                       "num-partitions": K})
    with pytest.raises(ValueError, match="client ids \\[2\\]"):
        _strategy(digits).run(dup, timeout=1)
    wrong_k = LocalGrid(seeded_app, node_config=lambda i: {"partition-id": i,
                                                           "num-partitions": 5})
    with pytest.raises(ValueError, match="num-partitions=5"):
        _strategy(digits).run(wrong_k, timeout=1)

    class NoNodes(LocalGrid):
        def get_node_ids(self) -> Iterable[int]:
            return []

    with pytest.raises(RuntimeError, match="No client registered"):
        _strategy(digits, connect_timeout=0.3).run(NoNodes(seeded_app), timeout=1)


def test_strategy_validates_its_settings(digits):
    model = LinearSoftmax(digits.n_features, digits.n_classes)
    explicit = dict(n_rounds=2, clip_norm=1.0, noise_multiplier=1.0, adaptive_clip=None)
    with pytest.raises(ValueError, match="trusted aggregator"):
        DPFedStrategy(model, "sofim", FLConfig(**explicit, mechanism="client-level"), K)
    with pytest.raises(ValueError, match="mechanism='full-batch'"):  # method.check
        DPFedStrategy(model, "fedfc", FLConfig(**explicit, mechanism="poisson",
                                               sampling_rate=0.5), K)
    with pytest.raises(TypeError, match="FLConfig"):
        DPFedStrategy(model, "sofim", {"n_rounds": 2}, K)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client and server halves"):
        DPFedStrategy(model, Method(), CONFIG, K)
    with pytest.raises(ValueError, match="n_clients"):
        DPFedStrategy(model, "sofim", CONFIG, 0)
    with pytest.raises(ValueError, match="refuses seeds"):
        DPFedStrategy(model, "sofim", CONFIG, K, seed=1, secure=True)
    strategy = DPFedStrategy(model, "sofim", CONFIG, K)
    with pytest.raises(ValueError, match="calibrated"):
        strategy.start(LocalGrid(ClientApp()), None, num_rounds=T + 1)  # type: ignore


# ---------------------------------------------------------------------------------------
# The client: the engine's streams, unpredictable noise by default, consent, secure mode
# ---------------------------------------------------------------------------------------

def test_seed_tree_is_the_engines(digits):
    """simulate(seed=tree.simulation) is run_federated(seed) (same partition), and the
    clients' seeded generators are the engine's (round, client) streams."""
    data, _ = _client_data()
    tree = simulator_seeds(SEED)
    config = FLConfig(n_rounds=2, clip_norm=1.0, noise_multiplier=1.3)
    ref = run_federated(digits.X_train, digits.y_train, digits.X_test, digits.y_test, 10,
                        algorithm="fedfc", n_clients=K, config=config, seed=SEED)
    again = simulate(LinearSoftmax(64, 10), data, "fedfc", config, X_test=digits.X_test,
                     y_test=digits.y_test, seed=tree.simulation)
    np.testing.assert_array_equal(again.params, ref.params)
    sim, part = np.random.SeedSequence(SEED).spawn(2)
    init, noise, setup = sim.spawn(3)
    counts = count_root(noise)  # adaptive clipping's count streams
    for mine, engine in ((tree.init, init), (tree.noise, noise), (tree.setup, setup),
                         (tree.partition, part), (tree.counts, counts)):
        assert (mine.entropy, mine.spawn_key) == (engine.entropy, engine.spawn_key)
    grad = RoundRequest(3, GradientTask(1.0, 1.0))
    moment = RoundRequest(0, SecondMomentTask(1.0, 1.0))
    counted = RoundRequest(3, GradientTask(1.0, 1.0), count_task=RecordCountTask(1.0, 4.0))
    assert client_rng(SEED, grad, 2).random() == client_mod.stream(noise, 2, 2).random()
    assert client_rng(SEED, moment, 2).random() == client_mod.stream(setup, 0, 2).random()
    assert client_rng(SEED, counted, 2, count=True).random() == \
        client_mod.stream(counts, 2, 2).random()
    assert client_rng(SEED, counted, 2).random() == client_mod.stream(noise, 2, 2).random()
    with pytest.raises(ValueError, match="needs a request with a count"):
        client_rng(SEED, grad, 2, count=True)


def _train_message(params: np.ndarray | None, request: RoundRequest) -> Message:
    content = RecordDict({"config": ConfigRecord(request.to_config())})
    if params is not None:
        content["params"] = ArrayRecord({"params": Array(params)})
    return Message(content, dst_node_id=101, message_type="train")


def _context(node_config: dict, run_config: dict | None = None) -> Context:
    return Context(run_id=1, node_id=101, node_config={"partition-id": 1,
                                                       "num-partitions": K, **node_config},
                   state=RecordDict(), run_config=run_config or {})


def _released(reply: Message) -> np.ndarray:
    record = reply.content["reply"]
    return next(iter(record.values())).numpy()


def test_unseeded_clients_draw_fresh_noise_and_seeds_need_the_nodes_consent(digits):
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    for msg in (_train_message(params, RoundRequest(1, GradientTask(1.0, 1.3))),
                _train_message(None, RoundRequest(0, SecondMomentTask(8.0, 1.3)))):
        a = _released(train_reply(msg, _context({}), load))
        b = _released(train_reply(msg, _context({}), load))
        assert np.abs(a - b).max() > 1e-3  # OS entropy: two calls, two noise draws
        seeded = _released(train_reply(msg, _context({}), load, noise_seed=SEED))
        with pytest.raises(ValueError, match="allow-seeded-noise"):
            train_reply(msg, _context({}, {"noise-seed": SEED}), load)
        consented = train_reply(msg, _context({"allow-seeded-noise": True},
                                              {"noise-seed": SEED}), load)
        np.testing.assert_array_equal(_released(consented), seeded)
        empty = _context({}, {"noise-seed": ""})  # empty = fresh entropy, no consent needed
        assert np.abs(_released(train_reply(msg, empty, load)) - seeded).max() > 1e-3


def test_secure_mode_at_the_client(digits, seeded_app):
    assert isinstance(client_rng(None, RoundRequest(1, GradientTask(1.0, 1.0), secure=True), 0),
                      SecureGenerator)
    assert isinstance(client_rng(None, RoundRequest(1, GradientTask(1.0, 1.0)), 0, secure=True),
                      SecureGenerator)
    assert isinstance(client_rng(None, RoundRequest(1, GradientTask(1.0, 1.0)), 0),
                      np.random.Generator)
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    msg = _train_message(params, RoundRequest(1, GradientTask(1.0, 1.3)))
    with pytest.raises(ValueError, match="Secure mode refuses seeded noise"):
        train_reply(msg, _context({"secure-noise": True}), load, noise_seed=SEED)
    # A secure run: every client's noise from the CSPRNG (the seeded app refuses, so the
    # strategy's secure request reaches the clients), two runs differ.
    unseeded = make_client_app(PartitionedDataset("digits", seed=SEED))
    runs = [_strategy(digits, "scaffold", seed=None, secure=True).run(LocalGrid(unseeded),
                                                                     timeout=10)
            for _ in range(2)]
    assert all(r["clients_replied"] == [0, 1, 2, 3] for r in runs[0].history)
    assert np.abs(runs[0].params - runs[1].params).max() > 1e-4
    refused = _strategy(digits, "fedgd", seed=None, secure=True).run(LocalGrid(seeded_app),
                                                                     timeout=10)
    assert all(r["clients_failed"] == [0, 1, 2, 3] for r in refused.history)
    assert "refuses seeded noise" in refused.history[0]["failures"]["0"]


def test_client_guards(digits):
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    msg = _train_message(params, RoundRequest(1, GradientTask(1.0, 0.5)))
    with pytest.raises(ValueError, match="min-noise-multiplier=1"):
        train_reply(msg, _context({"min-noise-multiplier": 1.0}), load)
    moment = _train_message(None, RoundRequest(0, SecondMomentTask(8.0, 0.5)))
    with pytest.raises(ValueError, match="min-noise-multiplier=1"):
        train_reply(moment, _context({"min-noise-multiplier": 1.0}), load)
    nobody = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="--node-config"):
        train_reply(msg, nobody, load)
    with pytest.raises(ValueError, match="needs 650 finite"):
        train_reply(_train_message(np.zeros(3), RoundRequest(1, GradientTask(1.0, 0.5))),
                    _context({}), load)
    scaffold = RoundRequest(2, LocalStepsTask(1.0, 1.0, local_steps=2, control_variates=True),
                            accepted_round=1)
    with pytest.raises(ValueError, match="no 'control' array"):  # SCAFFOLD without c
        train_reply(_train_message(params, scaffold), _context({}), load)
    with pytest.raises(ValueError, match="clip_norm"):
        RoundRequest(1, GradientTask(float("inf"), 1.0)).validated()
    with pytest.raises(ValueError, match="local_steps=1"):
        RoundRequest(1, GradientTask(1.0, 1.0, local_steps=2)).validated()
    with pytest.raises(ValueError, match="setup round"):
        RoundRequest(1, SecondMomentTask(1.0, 1.0)).validated()
    with pytest.raises(ValueError, match="accepted_round"):
        RoundRequest(2, LocalStepsTask(1.0, 1.0), accepted_round=2).validated()
    with pytest.raises(ValueError, match="missing"):
        RoundRequest.from_config({"server-round": 1})


def test_a_request_with_a_count_round_trips_and_is_checked(digits):
    request = RoundRequest(2, GradientTask(1.5, 1.1), report_size=True,
                           count_task=RecordCountTask(1.5, 4.0)).validated()
    assert RoundRequest.from_config(request.to_config()) == request
    assert reply_shapes(request, 650) == {"message": (650,), "count": (1,)}
    assert request.noise_multipliers == (1.1, 4.0)
    config = request.to_config()
    del config["count-noise-multiplier"]
    with pytest.raises(ValueError, match="count-noise-multiplier"):
        RoundRequest.from_config(config)
    with pytest.raises(ValueError, match="released in a round"):
        RoundRequest(0, SecondMomentTask(1.0, 1.0),
                     count_task=RecordCountTask(1.0, 1.0)).validated()
    with pytest.raises(ValueError, match="clash"):
        RoundRequest(1, GradientTask(1.0, 1.0), count_task=GradientTask(1.0, 1.0)).validated()
    with pytest.raises(TypeError, match="count"):
        RoundRequest(1, GradientTask(1.0, 1.0), count_task="count").validated()  # type: ignore[arg-type]
    load = PartitionedDataset("digits", seed=SEED)
    params = np.zeros(LinearSoftmax(digits.n_features, digits.n_classes).n_params)
    low = _train_message(params, RoundRequest(1, GradientTask(1.0, 3.0),
                                              count_task=RecordCountTask(1.0, 0.5)))
    with pytest.raises(ValueError, match=r"noise_multiplier=0\.5"):  # the count's, too
        train_reply(low, _context({"min-noise-multiplier": 1.0}), load)
    msg = _train_message(params, RoundRequest(1, GradientTask(1.0, 1.3), report_size=True,
                                              count_task=RecordCountTask(1.0, 2.0)))
    a, b = (train_reply(msg, _context({}), load).content for _ in range(2))
    size = a["metrics"]["num-examples"]
    assert size == len(load(ClientInfo(1, K, {}, {})).y)  # the count's denominator
    ca, cb = a["reply"]["count"].numpy()[0], b["reply"]["count"].numpy()[0]
    assert abs(ca - cb) > 1e-3 and -20 < ca < size + 20  # its own fresh noise, std 2
    with pytest.raises(ValueError, match="count_rng"):
        client_reply(load(ClientInfo(1, K, {}, {})).model, params, np.zeros((3, 64)),
                     np.zeros(3, dtype=np.int64), RoundRequest.from_config(
                         msg.content["config"]), np.random.default_rng(0))


def test_the_server_asks_for_the_count_and_charges_it_first(digits):
    model = LinearSoftmax(digits.n_features, digits.n_classes)
    config = FLConfig(n_rounds=T, clip_norm=1.0, target_epsilon=4.0,
                      adaptive_clip=AdaptiveClip(initial_clip=0.7))
    strategy = DPFedStrategy(model, "sofim", config, K)
    server = strategy.server_
    server.init(np.zeros(model.n_params))
    request = server.round_request(1, 2)
    z_b = server.method.describe()["count_noise_multiplier"]
    assert request.count_task == RecordCountTask(0.7, z_b) and z_b > 0
    assert request.task.clip_norm == 0.7 and request.report_size
    assert request.task.noise_multiplier == strategy.noise_multiplier_
    server.spend_round()
    assert server.ledger.events == [gaussian(z_b), gaussian(strategy.noise_multiplier_)]
    assert server.ledger.epsilon < 4.0  # one round of T
    fixed = DPFedStrategy(model, "sofim", replace(config, adaptive_clip=None), K).server_
    fixed.init(np.zeros(model.n_params))
    assert fixed.round_request(1, 2).count_task is None and fixed.round_clip == 1.0


# ---------------------------------------------------------------------------------------
# The run config and the example app
# ---------------------------------------------------------------------------------------

def test_run_config_needs_exactly_one_noise_setting_and_known_method_options():
    with pytest.raises(ValueError, match="exactly one"):
        config_from_run_config({"target-epsilon": 1.0, "noise-multiplier": 1.0})
    with pytest.raises(ValueError, match="exactly one"):
        config_from_run_config({"target-epsilon": "", "noise-multiplier": ""})
    cfg = config_from_run_config({"target-epsilon": 2.0, "noise-multiplier": "",
                                  "n-rounds": 5, "clip-norm": 3.0})
    assert (cfg.target_epsilon, cfg.noise_multiplier, cfg.n_rounds) == (2.0, None, 5)
    method = method_from_run_config({"algorithm": "scaffold", "method-options.local-steps": 3,
                                     "method-options.gamma": ""})
    assert method.describe() == make_method("scaffold", local_steps=3).describe()
    with pytest.raises(TypeError, match="gamma"):
        method_from_run_config({"algorithm": "scaffold", "method-options.gamma": 2.0})
    with pytest.raises(ValueError, match="lerning_rate"):
        method_from_run_config({"algorithm": "sofim", "method-options.lerning-rate": 0.1})


def test_run_config_adaptive_clip_is_checked_before_anything_starts():
    base = {"target-epsilon": 1.0, "noise-multiplier": "", "algorithm": "fedgd"}
    assert config_from_run_config({**base, "adaptive-clip": True}).adaptive_clip == \
        AdaptiveClip()
    assert config_from_run_config({**base, "adaptive-clip": False}).adaptive_clip is None
    default = FLConfig(target_epsilon=1.0).adaptive_clip  # "" and absent: FLConfig's
    assert config_from_run_config({**base, "adaptive-clip": ""}).adaptive_clip == default
    assert config_from_run_config(base).adaptive_clip == default
    check_run_config({**base, "adaptive-clip": True})
    for bad in ("yes", "true", 1):
        with pytest.raises(RunConfigError, match="run config adaptive-clip to be true"):
            check_run_config({**base, "adaptive-clip": bad})
    on = {**base, "adaptive-clip": True}
    with pytest.raises(RunConfigError, match="adaptive_clip needs mechanism='full-batch'"):
        check_run_config({**on, "mechanism": "poisson", "sampling-rate": 0.5})
    with pytest.raises(RunConfigError, match="noise_aware"):
        check_run_config({**on, "algorithm": "sofim", "method-options.noise-aware": True})
    # secure aggregation runs it with the gradient methods (the count rides in the secure
    # sum) and refuses it for a covariance method with the engine's own error
    secagg = FLConfig(n_rounds=2, target_epsilon=1.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=AdaptiveClip())
    plan_event(LinearSoftmax(64, 10), "fedgd", secagg)
    check_run_config({**on, "trust": "secure-aggregation", "weighting": "size"})
    with pytest.raises(ValueError, match="adaptive_clip") as engine:
        plan_event(LinearSoftmax(64, 10), "fedfc", secagg)
    with pytest.raises(RunConfigError) as app:
        check_run_config({**on, "trust": "secure-aggregation", "weighting": "size",
                          "algorithm": "fedfc"})
    assert str(engine.value) in str(app.value)


def test_example_app_lists_every_option_of_every_method():
    path = Path(__file__).resolve().parents[2] / "examples" / "flower-app" / "pyproject.toml"
    app = tomllib.loads(path.read_text())["tool"]["flwr"]["app"]
    listed = set(app["config"]["method-options"])
    every = {k.replace("_", "-") for name in METHODS for k in method_options(name)}
    assert listed == every
    assert all(v == "" for v in app["config"]["method-options"].values())  # defaults apply
    method_from_run_config({"algorithm": app["config"]["algorithm"],
                            **{f"method-options.{k}": v
                               for k, v in app["config"]["method-options"].items()}})


def test_importing_dpprecond_does_not_import_flower_and_a_missing_flwr_names_the_extra():
    code = ("import sys, dpprecond, dpprecond.fl, dpprecond.adapters\n"
            "assert 'flwr' not in sys.modules, 'dpprecond imported flwr'\n"
            "sys.modules['flwr'] = None\n"
            "try:\n    import dpprecond.adapters.flower\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "pip install 'dpprecond[flower]'" in out.stdout


def test_the_adapter_names_no_method():
    """The Flower adapter runs every method through its halves: no module of the run path
    dispatches on a method's name or class (docstrings may cite methods as examples)."""
    import ast

    from dpprecond.fl import methods as methods_pkg

    root = Path(__file__).resolve().parents[2] / "src" / "dpprecond" / "adapters" / "flower"
    classes = {name for name in methods_pkg.__all__ if name[0].isupper()} - {
        "Method", "RunSpec", "NoisyPreconditionerWarning"}
    forbidden = set(METHODS) | classes
    for module in ("server_side", "client_side", "protocol", "strategy", "client_app"):
        tree = ast.parse((root / f"{module}.py").read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        used = {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings}
        used |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        used |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
        assert not used & forbidden, (module, sorted(used & forbidden))
