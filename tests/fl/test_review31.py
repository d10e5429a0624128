"""Review 31: client-level DP under secure aggregation, probed adversarially.

Each test pins one finding of the review (docs/secure_aggregation.md, client-level parts):
an overflowing local step must not raise or warn (a client whose data makes its
non-private local steps overflow would otherwise fail its round under warnings-as-errors,
a data-dependent dropout the sum does not cover), and a control the experiment schema
accepts must not be silently dropped.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpprecond.fl import FLConfig
from dpprecond.fl.client import client_level_updates
from dpprecond.fl.data import ClientData
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import simulate_secure

BOUNDS = np.array([0, 7, 19, 20, 40])
D_FEAT, N_CLASSES, C = 30, 5, 0.5


def _extreme_client() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forty records; client 1's rows (7:19) at norm 1e300, the others' standard normal;
    and the same data with client 1's rows replaced by standard normal ones."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, D_FEAT))
    y = rng.integers(0, N_CLASSES, 40)
    clean = X.copy()
    X[7:19] *= 1e300 / np.linalg.norm(X[7:19], axis=1, keepdims=True)
    return X, clean, y


@pytest.mark.parametrize("local_lr", [1e10, 1e300])
def test_an_overflowing_client_level_update_counts_as_zero_without_a_warning(
        local_lr: float) -> None:
    """Client 1's records at norm 1e300 and a large public ``local_lr``: its non-private
    local steps overflow. The update must count as zero (the documented rule) without a
    RuntimeWarning (pytest turns dpprecond's into errors, as a deployment running with
    warnings as errors would: the client would then drop out because of its data), and
    the other clients' parts must be those of the clean data, bitwise."""
    X, clean, y = _extreme_client()
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.zeros(model.n_params)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        P = client_level_updates(model, params, X, y, BOUNDS, C, local_steps=3,
                                 local_lr=local_lr)
        Q = client_level_updates(model, params, clean, y, BOUNDS, C, local_steps=3,
                                 local_lr=local_lr)
    assert np.isfinite(P).all() and np.all(np.linalg.norm(P, axis=1) <= C)
    assert np.array_equal(P[[0, 2, 3]], Q[[0, 2, 3]])
    assert float(np.linalg.norm(P[1] - Q[1])) <= 2 * C


def test_a_secure_client_level_run_on_an_overflowing_client_completes() -> None:
    """The same client in a whole secure run (``local_lr = 1e10``): every round's sum is
    formed (no warning escapes), and the run is charged its T events."""
    X, _, y = _extreme_client()
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    config = FLConfig(n_rounds=2, clip_norm=C, target_epsilon=2.0, mechanism="client-level",
                      local_steps=3, local_lr=1e10, trust="secure-aggregation")
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = simulate_secure(model, data, "fedgd", config, X_test=X[:5], y_test=y[:5],
                              seed=0)
    assert len(res.events) == 2 and np.isfinite(res.params).all()


def test_an_experiment_with_secure_aggregation_on_fixed_features_runs_it() -> None:
    """``[data] trust = "secure-aggregation"`` on pixel features (review31: it was silently
    trained under local trust): every run's spec carries the trust, its training runs the
    secure sums with size weights, as ``run_federated`` does with the same seed tree; the
    ids of local-trust runs do not change; a method the secure sums cannot run, and
    ``experiment tune --private``, are refused by name."""
    from dpprecond.experiments.config import expand_runs, parse_config, run_id
    from dpprecond.experiments.private_tuning import check_private_tuning
    from dpprecond.experiments.runner import DataCache, execute_run

    raw = {"name": "t", "data": {"name": "digits", "features": "pixels",
                                 "trust": "secure-aggregation"},
           "federation": {"clients": [4], "partitions": ["iid"]},
           "privacy": {"epsilons": [2.0], "delta": 1e-5, "clip_norm": 1.0,
                       "accountant": "rdp"},
           "protocol": {"kind": "per-round", "rounds": 2, "seeds": [0]},
           "methods": {"fedgd": {"algorithm": "fedgd", "learning_rate": 0.1}},
           "tuning": {"grid": {"fedgd": {"learning_rate": [0.1, 0.2]}}}}
    cfg = parse_config(raw)
    [spec] = expand_runs(cfg)
    assert spec["trust"] == "secure-aggregation"
    record, _ = execute_run(spec, DataCache())
    from dpprecond.secagg.fl import secure_noise_multiplier

    secure = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=2.0, accountant="rdp",
                      weighting="size", trust="secure-aggregation")
    z = secure_noise_multiplier(secure)  # the Skellam sums' multiplier, not the Gaussian's
    assert record["noise_multiplier"] == z
    assert record["epsilon_spent"] <= 2.0
    local = parse_config({**raw, "data": {"name": "digits", "features": "pixels"}})
    [local_spec] = expand_runs(local)
    assert "trust" not in local_spec and run_id(local_spec) != run_id(spec)
    with pytest.raises(ValueError, match=r"trust = 'secure-aggregation'.*scaffold"):
        parse_config({**raw, "methods": {"scaffold": {"algorithm": "scaffold"}}, "tuning": {}})
    with pytest.raises(ValueError, match=r"tune --private.*trust"):
        check_private_tuning(cfg, 64, 10)


def test_a_secure_client_level_run_calls_the_callback_every_round() -> None:
    """``run_federated(..., callback=f)`` under secure aggregation calls ``f`` with each
    round's history record, as under local trust (review31: it was dropped, and with it
    ``dpprecond fl``'s round lines)."""
    from dpprecond.fl import run_federated

    X, _, y = _extreme_client()
    X = np.random.default_rng(1).standard_normal(X.shape)
    config = FLConfig(n_rounds=2, clip_norm=C, target_epsilon=2.0, mechanism="client-level",
                      local_steps=2, trust="secure-aggregation")
    seen: list[dict[str, float]] = []
    res = run_federated(X, y, X, y, N_CLASSES, algorithm="fedgd", n_clients=4,
                        config=config, seed=0, callback=seen.append)
    assert seen == res.history
