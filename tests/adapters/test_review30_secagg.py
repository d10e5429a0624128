"""Review 30: Flower's SecAgg+ carries the secure sums exactly; dropouts, plans, requests.

- Flower's own arithmetic (``secaggplus_mod``'s weight, ``quantize``, masks and
  ``parameters_mod``; the workflow's ``factor_extract``, ``dequantize``, offset and total
  ratio) on worst-case messages (every entry at ``-m/2`` or ``m/2 - 1``), K = 300 with 37
  dropouts: the strategy decodes exactly the integer sum modulo ``m`` and the count.
- The float error of that recovery is below ``2^-8`` up to the strategy's largest
  federation, and it is not beyond (so the cap is needed).
- SecAgg+'s reconstruction threshold, as the strategy sets it, halts every round that
  would hold fewer than ``min_clients`` shares (Flower's own setup and threshold check).
- A setup round with dropouts reports its survivors.
- The simulator and the strategy plan the same sums for every method SecAgg+ runs.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters

import dpprecond.adapters.flower.secagg as secagg_mod
from dpprecond.adapters.flower.secagg import (
    SECAGG_MODULUS,
    SecAggDPClient,
    SecAggDPStrategy,
    plan_to_config,
)
from dpprecond.fl import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.methods import METHODS, CovarianceMethod, make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import moment_plan, round_event, secure_multipliers, secure_plan
from dpprecond.secagg.skellam import InsufficientNoiseError, decode

CONFIG = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                  trust="secure-aggregation", adaptive_clip=None)


def _flower_sum(replies: list[tuple[list[np.ndarray], int]], workflow: Any,
                rng: np.random.Generator) -> np.ndarray:
    """What SecAgg+ hands ``aggregate_fit`` for the survivors' ``(arrays, num_examples)``,
    step by step with Flower's functions and the workflow's settings (pairwise masks
    drawn here, summing to 0 modulo M as the protocol's do once the dropped clients'
    masks are removed)."""
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_combine,
        factor_extract,
        parameters_addition,
        parameters_mod,
        parameters_multiply,
    )
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    M, target = workflow.modulus_range, workflow.quantization_range
    clip, max_weight = workflow.clipping_range, workflow.max_weight
    shapes = [(1,), replies[0][0][0].shape]
    masks = [[rng.integers(0, M, s) for s in shapes] for _ in replies]
    for j in range(2):
        masks[-1][j] = np.mod(-sum(mk[j] for mk in masks[:-1]), M)
    total: list[np.ndarray] | None = None
    for (arrays, num_examples), mask in zip(replies, masks, strict=True):  # secaggplus_mod
        q_ratio = round(num_examples / max_weight * target)
        params = parameters_multiply(arrays, q_ratio / target)
        quantized = factor_combine(q_ratio, quantize(params, clip, target))
        masked = parameters_mod(parameters_addition(quantized, mask), M)
        total = masked if total is None else parameters_addition(total, masked)
    assert total is not None
    q_total, recon = factor_extract(parameters_mod(total, M))  # the workflow's unmask
    vec = dequantize(recon, clip, target)[0]
    vec += -(len(replies) - 1) * clip
    vec *= target / q_total
    return vec


def _fit_all(monkeypatch: pytest.MonkeyPatch, model: LinearSoftmax, sizes: list[int],
             messages: np.ndarray, config: dict[str, Any], params: np.ndarray
             ) -> list[tuple[list[np.ndarray], int]]:
    """Every client's reply through ``SecAggDPClient.fit`` (its checks, its encoding),
    its message replaced by ``messages[i]``."""
    replies = []
    for i, n in enumerate(sizes):
        monkeypatch.setattr(secagg_mod, "secure_message",
                            lambda *a, _m=messages[i], **k: _m)
        client = SecAggDPClient(model, np.zeros((n, model.n_features)),
                                np.zeros(n, np.int64), i)
        arrays, num_examples, _ = client.fit([params], config)
        replies.append((arrays, num_examples))
    return replies


def test_worst_case_messages_decode_exactly_through_secaggplus(monkeypatch):
    K, dropped, N = 300, 37, 120_000
    model = LinearSoftmax(64, 10)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, N, min_clients=K - dropped)
    plan = strategy.plan_
    m, q = plan.modulus, strategy.quantization_range
    assert plan.bits == 30 and q == m  # the largest modulus SecAgg+ carries
    assert K * m > SECAGG_MODULUS  # SecAgg+'s own sum wraps many times
    rng = np.random.default_rng(30)
    survivors = K - dropped
    sizes = [int(s) for s in rng.multinomial(N - K, np.ones(K) / K) + 1]
    lo, hi = m // 2, m // 2 - 1  # -m/2 and m/2 - 1 as messages in [0, m)
    messages = np.where(rng.random((K, plan.dim)) < 0.5, lo, hi).astype(np.int64)
    messages[:, 0], messages[:, 1] = lo, hi  # all clients at one extreme
    config = {"round": 1, "secagg-range": q, **plan_to_config(plan, CONFIG.clip_norm)}
    replies = _fit_all(monkeypatch, model, sizes, messages, config, strategy._params)
    handed = _flower_sum(replies[:survivors], strategy.workflow(), rng)
    seen: dict[str, Any] = {}

    def spy(total, p, n_shares):  # type: ignore[no-untyped-def]
        seen.update(total=np.array(total), n_shares=n_shares)
        return decode(total, p, n_shares)

    monkeypatch.setattr(secagg_mod, "decode", spy)
    before = strategy._params.copy()
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
    new, metrics = strategy.aggregate_fit(1, [(None, fitres)] * survivors, [])
    centred = np.mod(messages[:survivors] + m // 2, m) - m // 2
    exact = np.mod(centred.sum(axis=0), m)
    assert np.array_equal(seen["total"], exact) and seen["n_shares"] == survivors
    G = decode(exact, plan, survivors) / sum(sizes[:survivors])  # the survivors' count
    updates, _ = strategy.transform.update(G, strategy.transform.init(before), before)
    from flwr.common import parameters_to_ndarrays
    assert np.array_equal(parameters_to_ndarrays(new)[0], before + updates)
    assert metrics["n-replied"] == survivors


def test_the_float_error_of_the_recovery_is_below_2_to_minus_8_up_to_the_cap():
    """SecAgg+ hands ``T q / K'`` in float64 (``T = S - K' q/2``, ``|T| <= K' q/2 + M``);
    the strategy's ``rint(average K' / q)`` errs by at most ``3 2^-53 |T|``: below ``2^-8``
    for ``K' <= 2^14`` at ``q = 2^30``, and it is refused beyond. At 10^7 clients the
    recovery would be wrong."""
    from flwr.common.secure_aggregation.quantization import dequantize

    M, q = SECAGG_MODULUS, 2**30
    limit = secagg_mod.MAX_SECAGG_CLIENTS
    assert limit == 2**14

    def worst(k: int) -> tuple[float, int]:
        c = np.arange(0, k + 1, max(k // 4000, 1))  # c clients at -q/2, the rest at q/2-1
        sums = c * (-(q // 2)) + (k - c) * (q // 2 - 1)
        S = np.mod(sums + k * (q // 2), M)  # SecAgg+'s modular sum of x_i + q/2
        vec = dequantize([S], float(q // 2), q)[0]
        vec += -(k - 1) * (q // 2)
        vec *= q / k
        got = vec * (k / q)
        wrong = np.mod(np.rint(got).astype(np.int64), q) != np.mod(sums, q)
        return float(np.max(np.abs(got - (S - k * (q // 2))))), int(wrong.sum())

    for k in (2, 3, 299, 300, limit - 1, limit):
        err, wrong = worst(k)
        assert err <= 2.0**-8 and wrong == 0, k
    assert worst(10_000_003)[1] > 0  # why a cap is needed
    model = LinearSoftmax(4, 2)
    SecAggDPStrategy(model, "fedgd", CONFIG, limit, 10 * limit)
    with pytest.raises(ValueError, match="n_clients=16385"):
        SecAggDPStrategy(model, "fedgd", CONFIG, limit + 1, 10 * limit)


class _Strategy:
    """The ``configure_fit`` SecAgg+'s setup stage reads (K proxies)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def configure_fit(self, rnd, params, cm):  # type: ignore[no-untyped-def]
        return [(SimpleNamespace(node_id=i + 1), FitIns(params, {})) for i in range(self.k)]


class _Grid:
    """Every node answers SecAgg+'s setup with (dummy) public keys; the requests are kept."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_and_receive(self, msgs, timeout=None):  # type: ignore[no-untyped-def]
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.common.secure_aggregation.secaggplus_constants import (
            RECORD_KEY_CONFIGS,
            Key,
        )
        msgs = list(msgs)
        self.sent.extend(msgs)
        return [Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
            {Key.PUBLIC_KEY_1: b"1", Key.PUBLIC_KEY_2: b"2"})}), reply_to=m) for m in msgs]


def _setup_stage(workflow: Any, K: int, grid: _Grid | None = None) -> Any:
    """Flower's SecAgg+ setup stage of ``workflow`` for K nodes: its state."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server import ServerConfig
    from flwr.server.compat import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(ctx, ServerConfig(num_rounds=1), _Strategy(K))
    legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: 1})
    legacy.state.array_records[MAIN_PARAMS_RECORD] = \
        compat.parameters_to_arrayrecord(ndarrays_to_parameters([np.zeros(2)]), True)
    state = WorkflowState()
    assert workflow.setup_stage(grid or _Grid(), legacy, state)
    return state


@pytest.fixture()
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's Message needs a run and task id outside a running app."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def test_secaggplus_halts_every_round_below_min_clients(_task_identity):
    """Flower's own setup stage and threshold check with the strategy's workflow: a round
    goes on only with at least ``min_clients`` survivors, for every set of survivors,
    every ``min_clients`` and neighbourhoods of every ``s`` (the full ring and rings of 3,
    5, 7); and the clients' own check (:func:`check_secaggplus_request`) accepts every
    such workflow."""
    from dpprecond.adapters.flower.secagg import check_secaggplus_request

    model = LinearSoftmax(4, 2)
    for K in (2, 3, 4, 5, 8, 9):
        for s, k_min in itertools.product(sorted({K, *(x for x in (3, 5, 7) if x < K)}),
                                          range(1, K + 1)):
            strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, 1000, min_clients=k_min,
                                        num_shares=None if s == K else s)
            workflow = strategy.workflow()
            state = _setup_stage(workflow, K)
            ids = sorted(state.sampled_node_ids)
            for alive in itertools.product((False, True), repeat=K):
                state.active_node_ids = {i for i, a in zip(ids, alive, strict=True) if a}
                if workflow._check_threshold(state):
                    assert sum(alive) >= k_min, (K, s, k_min, alive)
            state.active_node_ids = set(ids)
            assert workflow._check_threshold(state)
            check_secaggplus_request(*_client_request(strategy, workflow, K))


def _client_request(strategy: SecAggDPStrategy, workflow: Any, K: int) -> tuple[Any, Any]:
    """Node 1's fit request of round 1 as SecAgg+ hands it to the ClientApp, and its
    context after Flower's ``secaggplus_mod`` ran the setup stage ``workflow`` sent."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
    from flwr.compat.common import recorddict_compat as compat

    grid = _Grid()
    _setup_stage(workflow, K, grid)
    ctxt = Context(run_id=1, node_id=1, node_config={"partition-id": 0,
                                                     "num-partitions": K},
                   state=RecordDict(), run_config={})
    setup = next(m for m in grid.sent if m.metadata.dst_node_id == 1)
    secaggplus_mod(setup, ctxt, lambda m, c: m)  # Flower writes this node's SecAgg+ state
    fit = strategy.configure_fit(1, ndarrays_to_parameters([strategy._params]),
                                 _Manager())[0][1]
    content = compat.fitins_to_recorddict(fit, keep_input=True)
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({})  # the collect stage's
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN), ctxt


class _Manager:
    def sample(self, num_clients, min_num_clients):  # type: ignore[no-untyped-def]
        return list(range(num_clients))


def test_a_client_answers_only_through_the_strategys_secaggplus(_task_identity):
    """The dual ClientApp (the example app's) refuses a secure-sum fit request that did
    not come through SecAgg+ (its share would reach the server unmasked), and every
    client refuses SecAgg+ settings that are not the strategy's (a rescaled or clipped
    share, a threshold below min_clients)."""
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server.workflow import SecAggPlusWorkflow

    from dpprecond.adapters.flower import PartitionedDataset
    from dpprecond.adapters.flower.secagg import (
        check_secaggplus_request,
        make_dual_client_app,
    )

    K, n = 3, 1437
    model = LinearSoftmax(64, 10)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, K, n, min_clients=3)
    fit = strategy.configure_fit(1, ndarrays_to_parameters([strategy._params]),
                                 _Manager())[0][1]
    plain = Message(compat.fitins_to_recorddict(fit, keep_input=True), dst_node_id=1,
                    message_type=MessageType.TRAIN)  # a strategy run without SecAgg+
    app = make_dual_client_app(PartitionedDataset("digits", seed=5))
    ctxt = Context(run_id=1, node_id=1, node_config={"partition-id": 0,
                                                     "num-partitions": K},
                   state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="unmasked"):
        app(plain, ctxt)
    msg, ctxt = _client_request(strategy, strategy.workflow(), K)
    check_secaggplus_request(msg, ctxt)  # the strategy's own workflow: answered
    q = strategy.quantization_range
    for workflow, match in (
            (SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=1.0), "target_range"),
            (SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=1.0, max_weight=1.0,
                                clipping_range=float(q // 2), quantization_range=q,
                                modulus_range=SECAGG_MODULUS), "max_weight"),
            (SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=2,
                                max_weight=float(q), clipping_range=float(q // 2),
                                quantization_range=q, modulus_range=SECAGG_MODULUS),
             "threshold")):
        msg, ctxt = _client_request(strategy, workflow, K)
        with pytest.raises(ValueError, match=match):
            check_secaggplus_request(msg, ctxt)


def test_a_setup_round_with_dropouts_reports_its_survivors(monkeypatch):
    """FedFC's setup sum reached by 2 of 3 clients (min_clients=2): decoded from the
    survivors (their shares, their records), and reported as 2 replies; a sum of fewer
    shares than min_clients is refused (``decode``) and the setup is not used."""
    model = LinearSoftmax(5, 3)
    K, sizes = 3, [4, 6, 5]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((sum(sizes), 5))
    strategy = SecAggDPStrategy(model, "fedfc", CONFIG, K, sum(sizes), min_clients=2,
                                seed=1)

    setup = strategy.configure_fit(1, ndarrays_to_parameters([strategy._params]),
                                   _Manager())
    config = dict(setup[0][1].config)
    bounds = np.cumsum([0, *sizes])
    replies = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        arrays, n, _ = SecAggDPClient(model, X[lo:hi], np.zeros(hi - lo, np.int64), i,
                                      7).fit([strategy._params], config)
        replies.append((arrays, n))
    handed = _flower_sum(replies[:2], strategy.workflow(), rng)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
    with pytest.raises(InsufficientNoiseError):
        strategy.aggregate_fit(1, [(None, fitres)], [])
    assert strategy._state is None
    _, metrics = strategy.aggregate_fit(1, [(None, fitres)] * 2, [])
    assert strategy._state is not None
    assert metrics["n-replied"] == 2 and strategy.setup_["n_replied"] == 2


SECAGG_METHODS = [name for name in METHODS
                  if name not in ("fedavg", "scaffold", "fedprox")]


@pytest.mark.parametrize("name", SECAGG_METHODS)
def test_the_simulator_and_the_strategy_plan_the_same_sums(name):
    """Same inputs (``max_client_rows``, ``FIT_BITS``, the inflation cap), same plans and
    events, for every method SecAgg+ runs, at the defaults and explicit values (one
    coarsened case: 650 parameters over 24,000 records)."""
    for d, n, K, k_min, rows in ((64, 1797, 4, None, None), (64, 24_000, 6, 4, 5000),
                                 (20, 500, 3, 2, 200)):
        model = LinearSoftmax(d, 10)
        bounds = np.linspace(0, n, K + 1).astype(np.int64)
        data = ClientData(np.zeros((n, d)), np.zeros(n, np.int64), bounds, 10)
        method = make_method(name)
        strategy = SecAggDPStrategy(model, method, CONFIG, K, n, min_clients=k_min,
                                    max_client_rows=rows)
        zs = secure_multipliers(method, CONFIG)
        z = zs["z_grad"] if isinstance(method, CovarianceMethod) else zs["z"]
        k = K if k_min is None else k_min
        assert strategy.plan_ == secure_plan(model, CONFIG, data, z, k, rows)
        assert strategy.release_ == round_event(z)
        if isinstance(method, CovarianceMethod):
            assert strategy.setup_plan_ == moment_plan(method, data, zs["z_cov"], k, rows)
            assert strategy.setup_release_ == round_event(zs["z_cov"])
        else:
            assert strategy.setup_plan_ is None


def test_the_client_refuses_what_the_threat_model_says_it_refuses():
    """docs/secure_aggregation.md, "What a SecAgg+ client checks": a raised scale, a
    shrunk modulus, a sensitivity below its rows', the wrong size, an unknown kind, a bad
    secagg-range, no noise, min_clients above n_clients, a noise multiplier below its
    floor; the honest request is answered."""
    model = LinearSoftmax(6, 3)
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((20, 6)), rng.integers(0, 3, 20)
    strategy = SecAggDPStrategy(model, "fedgd", CONFIG, 4, 80, max_client_rows=20)
    plan = strategy.plan_
    good = {"round": 1, "secagg-range": strategy.quantization_range,
            **plan_to_config(plan, CONFIG.clip_norm)}
    client = SecAggDPClient(model, X, y, 0, min_noise_multiplier=plan.noise_multiplier)
    assert client.fit([strategy._params], good)[0][0].shape == (model.n_params + 1,)
    bad = [({"plan-scale": plan.scale * 2}, "plan-scale"),
           ({"plan-bits": plan.bits - 1}, "plan-bits"),
           ({"plan-sensitivity": plan.sensitivity / 2}, "plan-scale|does not cover"),
           ({"plan-clip-norm": CONFIG.clip_norm * 2}, "does not cover"),
           ({"plan-kind": "hessian"}, "plan-kind"),
           ({"secagg-range": plan.modulus // 2}, "secagg-range"),
           ({"secagg-range": 3 * plan.modulus}, "secagg-range"),
           ({"plan-noise-multiplier": 0.0}, "noise_multiplier"),
           ({"plan-min-clients": 5}, "min_clients"),
           ({"plan-noise-multiplier": plan.noise_multiplier / 2}, "floor")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            client.fit([strategy._params], {**good, **change})
    # a gradient plan of another size: its scale and modulus re-derived, the part refused
    other = SecAggDPStrategy(LinearSoftmax(7, 3), "fedgd", CONFIG, 4, 80,
                             max_client_rows=20).plan_
    with pytest.raises(ValueError, match="shape"):
        client.fit([strategy._params], {**good, **plan_to_config(other, CONFIG.clip_norm),
                                        "secagg-range": other.modulus})
