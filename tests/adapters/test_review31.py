"""Review 31: client-level DP on Flower's SecAgg+, probed adversarially.

A dropout round divides the survivors' sum by the survivors (each sends 1 as its count),
and the run's result records the privacy unit of its epsilon (a client-level run's
result.json must say it is one, as the simulator's result does).
"""

from __future__ import annotations

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from dpprecond.adapters.flower.protocol import simulator_seeds
from dpprecond.adapters.flower.secagg import SecAggDPClient, SecAggDPStrategy
from dpprecond.fl import FLConfig
from dpprecond.fl import client as client_mod
from dpprecond.fl.client import client_level_updates
from dpprecond.fl.data import ClientData
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import simulate_secure
from dpprecond.secagg.sums import secure_sum
from tests.adapters.test_flower_secagg import (
    SEED,
    K,
    _engine_data,
    _Everyone,
    _secaggplus_arithmetic,
)

CLIENT_LEVEL = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=8.0,
                        mechanism="client-level", local_steps=2, local_lr=0.2,
                        trust="secure-aggregation", accountant="pld")


def _model_and_data() -> tuple[LinearSoftmax, ClientData]:
    data = _engine_data()
    return LinearSoftmax(data.X.shape[1], data.n_classes), data


def test_a_dropout_round_is_the_survivors_mean_of_clipped_updates() -> None:
    """``min_clients = 2`` of 3, client 1 drops out: the server divides the survivors'
    decoded sum by 2 (the count coordinate of 1 per survivor), i.e. the secure sum of the
    survivors' clipped updates from their own round streams, over 2."""
    model, data = _model_and_data()
    strategy = SecAggDPStrategy(model, "fedgd", CLIENT_LEVEL, K, data.X.shape[0],
                                seed=SEED, min_clients=2)
    params = strategy.initialize_parameters(_Everyone(K))
    [(_, fit), *_] = strategy.configure_fit(1, params, _Everyone(K))
    current = parameters_to_ndarrays(fit.parameters)
    survivors = [0, 2]
    sent = []
    for i in survivors:
        lo, hi = data.bounds[i], data.bounds[i + 1]
        sent.append(SecAggDPClient(model, data.X[lo:hi], data.y[lo:hi], i, SEED).fit(
            current, fit.config)[0][0])
    handed = _secaggplus_arithmetic(sent, strategy.quantization_range,
                                    np.random.default_rng(0))
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([handed]), 1, {})
    state0 = strategy._state
    params0 = current[0]
    new, metrics = strategy.aggregate_fit(1, [(None, fitres)] * len(survivors), [])
    assert new is not None and metrics["n-replied"] == 2
    parts = client_level_updates(model, params0, data.X, data.y, data.bounds, 1.0,
                                 local_steps=2, local_lr=0.2)
    noise_root = simulator_seeds(SEED).noise
    rngs = [client_mod.stream(noise_root, 0, i) for i in range(K)]
    G = secure_sum(parts, strategy.plan_, rngs, survivors) / len(survivors)
    updates, _ = strategy.transform.update(G, state0, params0)
    np.testing.assert_allclose(parameters_to_ndarrays(new)[0], params0 + updates,
                               rtol=1e-12, atol=1e-14)


def test_a_client_level_result_records_its_privacy_unit() -> None:
    """The SecAgg+ run's result config says what its epsilon is about, as the simulator's
    does: ``mechanism = "client-level"`` (one client, replace-one), uniform weights, the
    local steps, and the RDP accountant the sums are charged with (not the run config's
    ``accountant``, which secure aggregation does not use)."""
    model, data = _model_and_data()
    strategy = SecAggDPStrategy(model, "fedgd", CLIENT_LEVEL, K, data.X.shape[0], seed=SEED)
    got = strategy.result().config
    ref = simulate_secure(model, data, "fedgd", CLIENT_LEVEL, X_test=data.X[:5],
                          y_test=data.y[:5], seed=simulator_seeds(SEED).simulation).config
    for key in ("mechanism", "weighting", "local_steps", "local_lr", "clip_norm",
                "accountant", "method", "trust"):
        assert got.get(key) == ref[key], key
    assert got["mechanism"] == "client-level" and got["accountant"] == "rdp"


def test_a_record_level_result_records_its_mechanism_too() -> None:
    """The record-level SecAgg+ result says ``mechanism = "full-batch"`` (one record)."""
    model, data = _model_and_data()
    config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=None)
    got = SecAggDPStrategy(model, "fedgd", config, K, data.X.shape[0], seed=SEED).result()
    assert got.config["mechanism"] == "full-batch" and got.config["weighting"] == "size"
