"""Client-level DP-FedAvg and DP-FedProx on Flower's SecAgg+: the simulator's run.

``fedavg`` and ``fedprox`` with ``mechanism="client-level"`` run their own non-private
local steps (FedProx's with the proximal term); each request carries them
(``plan-local-steps``, ``plan-local-lr``, ``plan-local-prox``), each client's message is
the simulator's :func:`~dpprecond.secagg.fl.secure_message` of its clipped update, and the
server steps the model with the simulator's server half. Pinned here: a seeded run on
SecAgg+'s own arithmetic ends at ``simulate_secure``'s model bit for bit, the client's
refusals of a bad ``plan-local-prox``, an earlier server's request without it, and the
refusals of client-level SCAFFOLD and record-level FedAvg (also by the app's run-config
check).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from dpprecond.adapters.flower.app import RunConfigError, check_run_config
from dpprecond.adapters.flower.secagg import (
    SecAggDPClient,
    SecAggDPStrategy,
    check_secagg_plus_method,
    plan_local_prox,
    plan_to_config,
)
from dpprecond.fl import FLConfig
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import client_level_plan, simulate_secure
from tests.adapters.test_flower_secagg import (
    SEED,
    K,
    _engine_data,
    _run_on_secaggplus_arithmetic,
)

# client-level: the config's local_steps stays 1, the method sets its own
CONFIG = FLConfig(n_rounds=3, clip_norm=1.0, target_epsilon=8.0, mechanism="client-level",
                  trust="secure-aggregation")
L, ETA, MU = 3, 0.2, 0.5
RC = {"target-epsilon": 4.0, "noise-multiplier": "", "mechanism": "client-level",
      "method-options.local-steps": L, "method-options.local-lr": ETA}


def _method(name: str) -> Any:
    return make_method(name, local_steps=L, local_lr=ETA,
                       **({"mu": MU} if name == "fedprox" else {}))


@pytest.mark.parametrize("name", ["fedprox", "fedavg"])
def test_a_client_level_local_step_run_on_secaggplus_is_the_simulators_run(name: str) -> None:
    """Client-level FedProx (``mu = 0.5``) and FedAvg, 3 local steps at 0.2, 3 rounds:
    every request asks for clipped updates with the method's local steps, step size and
    proximal coefficient, each client's count coordinate is 1, and the run ends at
    ``simulate_secure``'s model exactly (the same integer sums, the same server step),
    with the same updates, events and epsilon."""
    requests: list[dict[str, Any]] = []

    def check(fit_config: dict[str, Any], sent: list[np.ndarray],
              strategy: SecAggDPStrategy) -> None:
        requests.append(fit_config)
        assert all(v[-1] == strategy.quantization_range for v in sent)  # 1, times q

    strategy, ref = _run_on_secaggplus_arithmetic(_method(name), CONFIG, check)
    got = strategy.result()
    mu = MU if name == "fedprox" else 0.0
    assert len(requests) == CONFIG.n_rounds
    for fit_config in requests:
        assert fit_config["plan-unit"] == "client"
        assert (fit_config["plan-local-steps"], fit_config["plan-local-lr"],
                fit_config["plan-local-prox"]) == (L, ETA, mu)
    np.testing.assert_array_equal(got.params, ref.params)
    assert [r["update_norm"] for r in got.history] == [r["update_norm"] for r in ref.history]
    assert got.events == ref.events and got.epsilon == pytest.approx(ref.epsilon, rel=1e-12)
    assert strategy.plan_ == client_level_plan(strategy.model, 1.0, ref.noise_multiplier,
                                               n_clients=K, min_clients=K)
    for key in ("method", "mechanism", "weighting", "local_steps", "local_lr"):
        assert got.config[key] == ref.config[key], key
    assert got.config["local_steps"] == L and got.config.get("mu") == ref.config.get("mu")


def test_the_proximal_term_changes_the_run() -> None:
    """At these settings ``mu = 0.5`` moves the model away from FedAvg's, so the equality
    above would catch a client that left the proximal term out."""
    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], data.n_classes)
    runs = [simulate_secure(model, data, _method(name), CONFIG, X_test=data.X[:5],
                            y_test=data.y[:5], seed=SEED).params
            for name in ("fedprox", "fedavg")]
    assert np.abs(runs[0] - runs[1]).max() > 1e-6


def _client_and_request() -> tuple[SecAggDPClient, list[np.ndarray], dict[str, Any]]:
    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], data.n_classes)
    client = SecAggDPClient(model, data.X[:40], data.y[:40], 0, SEED)
    plan = client_level_plan(model, 1.0, 2.0, n_clients=K, min_clients=K)
    params = [np.random.default_rng(0).standard_normal(model.n_params) * 0.05]
    request = {"round": 1, **plan_to_config(plan, 1.0, unit="client", local_steps=L,
                                            local_lr=ETA, proximal_mu=MU)}
    return client, params, request


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.5", True])
def test_a_bad_plan_local_prox_is_refused_by_name(bad: Any) -> None:
    """A negative, NaN or infinite coefficient, a string or a bool is not a proximal
    coefficient: the reader and the client refuse it, naming the key and the value."""
    client, params, request = _client_and_request()
    match = re.escape(f"plan-local-prox={bad!r} is not a finite number >= 0") + \
        ".*refusing to answer"
    with pytest.raises(ValueError, match=match):
        plan_local_prox({"plan-local-prox": bad})
    with pytest.raises(ValueError, match=match):
        client.fit(params, {**request, "plan-local-prox": bad})


def test_plan_local_prox_is_written_read_and_refused_where_it_does_not_belong() -> None:
    """``plan_to_config`` writes ``plan-local-prox`` and ``plan_local_prox`` reads it back;
    a negative ``proximal_mu``, or a proximal term in a record-level round, is refused by
    the server's writer and by the client."""
    client, params, request = _client_and_request()
    assert plan_local_prox(request) == MU and isinstance(plan_local_prox(request), float)
    assert plan_local_prox({"plan-local-prox": 0}) == 0.0
    plan = client_level_plan(client.model, 1.0, 2.0, n_clients=K, min_clients=K)
    with pytest.raises(ValueError, match="proximal_mu"):
        plan_to_config(plan, 1.0, unit="client", proximal_mu=-1.0)
    with pytest.raises(ValueError, match=r"proximal_mu=0.5 with unit='record'.*"
                                         r"unit='client' or proximal_mu=0"):
        plan_to_config(plan, 1.0, proximal_mu=0.5)
    with pytest.raises(ValueError, match=r"plan-local-prox=0.5 asks for a proximal term in "
                                         r"a record-level round.*refusing to answer"):
        client.fit(params, {**request, "plan-unit": "record"})


def test_an_absent_plan_local_prox_reads_zero_and_the_fedavg_message() -> None:
    """A request without ``plan-local-prox`` (a server of an earlier version) reads 0.0:
    the client sends the message of ``mu = 0`` (FedAvg's local steps), bit for bit, and
    not FedProx's."""
    client, params, request = _client_and_request()
    old = {k: v for k, v in request.items() if k != "plan-local-prox"}
    assert plan_local_prox(old) == 0.0
    without = client.fit(params, old)[0][0]
    zero = client.fit(params, {**request, "plan-local-prox": 0.0})[0][0]
    prox = client.fit(params, request)[0][0]
    np.testing.assert_array_equal(without, zero)
    assert not np.array_equal(without, prox)


def test_client_level_scaffold_is_refused_with_the_simulators_reason() -> None:
    """Client-level SCAFFOLD: its server control variate would integrate every round's
    noise; SecAgg+ refuses it with the simulator's named error, before any message."""
    data = _engine_data()
    model = LinearSoftmax(data.X.shape[1], data.n_classes)
    scaffold = make_method("scaffold", local_steps=L, local_lr=ETA)
    with pytest.raises(ValueError, match="scaffold has no client-level form") as flower:
        check_secagg_plus_method(scaffold, CONFIG)
    with pytest.raises(ValueError, match="scaffold has no client-level form"):
        SecAggDPStrategy(model, scaffold, CONFIG, K, data.X.shape[0])
    with pytest.raises(ValueError) as engine:
        simulate_secure(model, data, scaffold, CONFIG, X_test=data.X[:5], y_test=data.y[:5],
                        seed=SEED)
    assert str(flower.value) == str(engine.value)


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_record_level_local_steps_are_refused_on_secaggplus(name: str) -> None:
    """Record-level FedAvg and FedProx (noise at every local step) are not a secure sum:
    refused by name, pointing to their client-level form."""
    record = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=None)
    with pytest.raises(ValueError, match=rf"{name!r} with mechanism='full-batch'.*"
                                         r"mechanism='client-level'"):
        check_secagg_plus_method(_method(name), record)


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_the_run_config_runs_client_level_local_steps_on_secure_aggregation(
        name: str) -> None:
    """The app's pre-flight check: client-level FedAvg and FedProx pass under
    ``trust = "secure-aggregation"``; under local trust (no trusted aggregator on Flower)
    and at the record level under secure aggregation they keep their named refusals; a
    run config's own ``local-steps`` is refused for them (the method sets its own)."""
    rc = {**RC, "algorithm": name, **({"method-options.mu": MU} if name == "fedprox" else {})}
    check_run_config({**rc, "trust": "secure-aggregation"})
    with pytest.raises(RunConfigError, match="trusted aggregator"):
        check_run_config({**rc, "trust": "local", "weighting": "uniform"})
    with pytest.raises(RunConfigError, match=rf"{name!r} with mechanism='full-batch'"):
        check_run_config({**rc, "trust": "secure-aggregation", "mechanism": "full-batch",
                          "weighting": "size", "adaptive-clip": False})
    for key, value in (("local-steps", 2), ("local-lr", 0.05)):  # the app's keys named
        with pytest.raises(RunConfigError, match=rf"Run config {key} = {value!r}: algorithm "
                                                 rf"{name!r} sets its own.*set method-options"
                                                 rf"\.{key} = {value!r}"):
            check_run_config({**rc, "trust": "secure-aggregation", key: value})


def test_a_run_config_builds_the_fedprox_strategy_with_its_local_work() -> None:
    """``secagg_strategy_from_run_config`` of client-level FedProx: its first request
    carries the method's local steps, step size and ``mu``."""
    from flwr.app import Context, RecordDict
    from flwr.common import ndarrays_to_parameters

    from dpprecond.adapters.flower.app import secagg_strategy_from_run_config
    from tests.adapters.test_flower_secagg import _Everyone

    rc = {**RC, "algorithm": "fedprox", "method-options.mu": MU, "n-rounds": 2,
          "clip-norm": 1.0, "trust": "secure-aggregation"}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    strategy = secagg_strategy_from_run_config(ctx, n_clients=K)
    [(_, fit), *_] = strategy.configure_fit(1, ndarrays_to_parameters([strategy._params]),
                                            _Everyone(K))  # type: ignore[arg-type]
    assert (fit.config["plan-unit"], fit.config["plan-local-steps"],
            fit.config["plan-local-lr"], fit.config["plan-local-prox"]) == ("client", L, ETA,
                                                                            MU)
