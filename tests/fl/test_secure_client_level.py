"""Client-level DP under secure aggregation: each client's part is its clipped update.

The part's sensitivity on worst-case neighbouring clients (also at extreme magnitudes), the
decoded sum against the exact sum of the clipped updates within the rounding and noise the
plan states, a whole run against the trusted aggregator's mechanism, the run's epsilon as
the composition of its sum events, and the refusals that name the setting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.fl import FLConfig
from dpprecond.fl.client import client_level_sensitivity, client_level_updates, round_generators
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import plan_event, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.result import as_method
from dpprecond.secagg.fl import (
    check_secure_aggregation,
    client_level_plan,
    round_event,
    secure_gradient_sum,
    secure_plan,
    simulate_secure,
)
from dpprecond.secagg.sums import ROUNDING_INFLATION
from tests.secagg.rounding_checks import assert_rounded_parts_within_plan

BOUNDS = np.array([0, 7, 19, 20, 40])  # four clients, one of a single record
D_FEAT, N_CLASSES, C = 30, 5, 0.5


def _config(**kw: object) -> FLConfig:
    base: dict[str, object] = dict(n_rounds=3, clip_norm=C, target_epsilon=2.0,
                                   mechanism="client-level", local_steps=3,
                                   trust="secure-aggregation")
    base.update(kw)
    return FLConfig(**base)  # type: ignore[arg-type]


def _data(seed: int, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D_FEAT)), rng.integers(0, N_CLASSES, n)


@pytest.mark.parametrize("magnitude", [1.0, 1e8, 1e300])
def test_replacing_a_whole_client_moves_only_its_part_by_at_most_2c(magnitude: float) -> None:
    """Client 1's records replaced by their negations at ``magnitude`` (at ``params = 0``
    the updates' feature blocks are opposite, so the move approaches ``2C``): only its
    part moves, by at most ``2C`` as computed; every part is finite with norm at most
    ``C``; the rounded parts differ by an integer vector within the plan's ``D2`` and
    ``D1``. At ``1e300`` the non-private local steps overflow and the update counts as
    zero (a function of that client's data alone)."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.zeros(model.n_params)
    plan = client_level_plan(model, C, 1.0, n_clients=4, min_clients=4)
    assert plan.sensitivity == client_level_sensitivity(C) == 2 * C
    assert plan.inflation <= ROUNDING_INFLATION
    for seed in range(3):
        X, y = _data(seed)
        X[7:19] *= magnitude / np.linalg.norm(X[7:19], axis=1, keepdims=True)
        X2 = X.copy()
        X2[7:19] = -X[7:19]
        with np.errstate(over="ignore"):
            P = client_level_updates(model, params, X, y, BOUNDS, C, local_steps=1)
            P2 = client_level_updates(model, params, X2, y, BOUNDS, C, local_steps=1)
        assert np.isfinite(P).all() and np.isfinite(P2).all()
        assert np.all(np.linalg.norm(P, axis=1) <= C)
        assert np.array_equal(P[[0, 2, 3]], P2[[0, 2, 3]])  # bitwise: the others' parts
        moved = float(np.linalg.norm(P[1] - P2[1]))
        assert moved <= 2 * C
        if magnitude == 1e8:  # opposite feature blocks, the bias block ~ 1e-8 of them
            assert moved >= 2 * C * (1 - 1e-6)
        assert_rounded_parts_within_plan(P[1], P2[1], plan, seed)


def test_the_decoded_sum_is_the_clipped_updates_sum_within_rounding_and_noise() -> None:
    """At ``z = 1e-5`` the decoded sum differs from the exact sum of the clipped updates by
    at most ``K / gamma`` (one rounding per client) plus 6 noise stds per coordinate."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(4)
    params = np.random.default_rng(5).standard_normal(model.n_params) * 0.1
    plan = client_level_plan(model, C, 1e-5, n_clients=4, min_clients=4)
    rngs = [np.random.default_rng([9, i]) for i in range(4)]
    got = secure_gradient_sum(model, params, X, y, BOUNDS, C, plan, rngs,
                              client_level=True, local_steps=2, local_lr=0.3)
    exact = client_level_updates(model, params, X, y, BOUNDS, C, local_steps=2,
                                 local_lr=0.3).sum(axis=0)
    tol = 4 / plan.scale + 6 * plan.noise_std(4)
    assert np.max(np.abs(got - exact)) <= tol
    assert np.max(np.abs(exact)) > 100 * tol  # the check is not vacuous


def test_a_run_ends_near_the_trusted_aggregators_run_at_small_noise() -> None:
    """The same client-level DP-FedAvg (3 local steps) with the trusted aggregator's
    Gaussian (``trust="local"``) and with the secure sum, both at ``z = 1e-4``: the same
    updates up to the noise, so the final models agree to 1e-3 of their size; both divide
    by the number of clients (uniform weights)."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(6)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    kw = dict(target_epsilon=None, noise_multiplier=1e-4, n_rounds=4)
    secure = simulate_secure(model, data, "fedgd", _config(**kw), X_test=X, y_test=y, seed=1)
    local = simulate(model, data, "fedgd", _config(trust="local", **kw), X_test=X, y_test=y,
                     seed=1)
    size = float(np.max(np.abs(local.params)))
    assert size > 1e-2
    assert np.max(np.abs(secure.params - local.params)) <= 1e-3 * size
    assert secure.config["trust"] == "secure-aggregation"
    assert secure.config["mechanism"] == "client-level"
    assert secure.config["sensitivity"] == 2 * C


def test_a_runs_epsilon_is_the_composition_of_its_sum_events() -> None:
    """Every round records ``round_event(z)``; the run's epsilon is dp_accounting's RDP
    epsilon of ``T`` of them, at the target; the planned event (from the settings) is
    the recorded composition; the plan is the client-level one for ``K`` clients."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(7)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    config = _config(n_rounds=4, target_epsilon=3.0)
    res = simulate_secure(model, data, "sofim-lagged", config, X_test=X, y_test=y, seed=0)
    z = res.noise_multiplier
    assert res.events == [round_event(z)] * 4
    total = dp_event.SelfComposedDpEvent(round_event(z), 4)
    assert res.epsilon == pytest.approx(epsilon_of(total, 1e-5, "rdp"), rel=1e-12)
    assert 3.0 * (1 - 1e-3) <= res.epsilon <= 3.0
    assert epsilon_of(plan_event(model, "sofim-lagged", config), 1e-5, "rdp") == \
        pytest.approx(res.epsilon, rel=1e-12)
    plan = secure_plan(model, config, data, z, 4)
    assert plan == client_level_plan(model, C, z, n_clients=4, min_clients=4)
    assert plan.n_rows == 4  # the modulus is sized for K parts of norm <= C
    assert res.config["noise_std"] == plan.noise_std(4)
    assert math.isclose(res.config["noise_std"], z * 2 * C * (1 + plan.inflation))


def test_the_streams_are_the_clients_own_round_streams() -> None:
    """Round ``t``'s sum uses client ``i``'s stream ``(t, i)``, as the record-level
    rounds (so a SecAgg+ client with the same seed sends the same message)."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(8)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    config = _config(n_rounds=1, target_epsilon=None, noise_multiplier=0.5)
    res = simulate_secure(model, data, "fedgd", config, X_test=X, y_test=y, seed=3)
    init_seq, noise_root, _ = np.random.SeedSequence(3).spawn(3)  # simulate_secure's tree
    params0 = model.init_params(np.random.default_rng(init_seq))
    plan = secure_plan(model, config, data, 0.5, 4)
    G = secure_gradient_sum(model, params0, X, y, BOUNDS, C, plan,
                            round_generators(noise_root, 0, 4),
                            client_level=True, local_steps=3, local_lr=config.local_lr) / 4
    transform = as_method("fedgd").transform_for((plan.noise_std(4) / 4) ** 2)
    updates, _ = transform.update(G, transform.init(params0), params0)
    assert np.array_equal(res.params, params0 + updates)


def test_what_client_level_secure_aggregation_does_not_run_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"client-level.*fedfc"):
        check_secure_aggregation(as_method("fedfc"), _config().validated(), secure=False)
    with pytest.raises(ValueError, match=r"config\.local_steps=3"):  # the method's own steps
        check_secure_aggregation(as_method("fedavg"), _config().validated(), secure=False)
    with pytest.raises(ValueError, match="scaffold has no client-level form"):
        check_secure_aggregation(as_method("scaffold"), _config(local_steps=1).validated(),
                                 secure=False)
    with pytest.raises(ValueError, match="mechanism='client-level' \\(fedavg, fedprox"):
        check_secure_aggregation(as_method("fedavg"),
                                 _config(mechanism="full-batch", weighting="size",
                                         local_steps=1).validated(), secure=False)
    with pytest.raises(ValueError, match="weighting='uniform'"):
        _config(weighting="size").validated()
    with pytest.raises(ValueError, match="mechanism='full-batch' or 'client-level'"):
        check_secure_aggregation(as_method("fedgd"),
                                 _config(mechanism="poisson", sampling_rate=0.5,
                                         local_steps=1).validated(), secure=False)
