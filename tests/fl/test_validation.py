"""Bad input gets clear errors naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, run_federated
from dpprecond.fl.accounting import Schedule, calibrate
from dpprecond.fl.partition import iid_partition


def test_labels_out_of_range(problem: tuple) -> None:
    X, y, Xt, yt = problem
    bad = y.copy()
    bad[0] = 3
    with pytest.raises(ValueError, match=r"y.*\[0, 3\)"):
        run_federated(X, bad, Xt, yt, 3, config=FLConfig(n_rounds=1, target_epsilon=1.0))
    with pytest.raises(ValueError, match="y_test"):
        run_federated(X, y, Xt, yt - 1, 3, config=FLConfig(n_rounds=1, target_epsilon=1.0))


def test_features_with_nan(problem: tuple) -> None:
    X, y, Xt, yt = problem
    X = X.copy()
    X[5, 2] = np.nan
    with pytest.raises(ValueError, match=r"X_train contains 1 NaN"):
        run_federated(X, y, Xt, yt, 3, config=FLConfig(n_rounds=1, target_epsilon=1.0))


def test_empty_client(problem: tuple) -> None:
    X, y, _, _ = problem
    parts = iid_partition(len(y), 3, 0)
    parts.append(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="Client 3 has no data"):
        ClientData.from_partition(X, y, parts, 3)


def test_partition_must_cover_once(problem: tuple) -> None:
    X, y, _, _ = problem
    parts = iid_partition(len(y), 3, 0)
    parts[0] = np.r_[parts[0], parts[1][:1]]
    with pytest.raises(ValueError, match="exactly once"):
        ClientData.from_partition(X, y, parts, 3)


@pytest.mark.parametrize("eps", [0.0, -1.0])
def test_epsilon_not_positive(eps: float) -> None:
    with pytest.raises(ValueError, match="target_epsilon > 0"):
        FLConfig(target_epsilon=eps).validated()
    with pytest.raises(ValueError, match="epsilon > 0"):
        calibrate(Schedule("rounds", 10), eps, 1e-5)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 2.0])
def test_delta_outside_unit_interval(delta: float) -> None:
    with pytest.raises(ValueError, match=r"target_delta in the open interval \(0, 1\)"):
        FLConfig(target_delta=delta, target_epsilon=1.0).validated()


@pytest.mark.parametrize("clip", [0.0, -2.0])
def test_clip_norm_not_positive(clip: float) -> None:
    with pytest.raises(ValueError, match="clip_norm > 0"):
        FLConfig(clip_norm=clip, target_epsilon=1.0).validated()


def test_private_run_needs_finite_clip() -> None:
    with pytest.raises(ValueError, match="finite clip_norm"):
        FLConfig(clip_norm=np.inf, target_epsilon=1.0).validated()


@pytest.mark.parametrize(("kwargs", "name"), [({"rho": 0.0}, "rho"), ({"rho": -1.0}, "rho"),
                                              ({"beta": 1.0}, "beta"),
                                              ({"beta": -0.5}, "beta")])
def test_bad_sofim_hyperparameters_via_run(problem: tuple, kwargs: dict, name: str) -> None:
    X, y, Xt, yt = problem
    with pytest.raises(ValueError, match=name):
        run_federated(X, y, Xt, yt, 3, algorithm="sofim", method_options=kwargs,
                      config=FLConfig(n_rounds=1, noise_multiplier=0.0))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mechanism": "local"}, "mechanism"),
    ({"sampling_rate": 0.5}, "mechanism='poisson'"),
    ({"mechanism": "poisson", "sampling_rate": 0.0}, "sampling_rate"),
    ({"local_steps": 2}, "local_steps"),
    ({"mechanism": "client-level", "weighting": "size"}, "uniform"),
    ({"n_rounds": 0}, "n_rounds"),
])
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FLConfig(**{"target_epsilon": 1.0, **kwargs}).validated()


def test_wrong_types() -> None:
    with pytest.raises(TypeError, match="n_rounds"):
        FLConfig(n_rounds=2.5, target_epsilon=1.0).validated()
    with pytest.raises(TypeError, match="clip_norm"):
        FLConfig(clip_norm="10", target_epsilon=1.0).validated()


def test_feature_mismatch(problem: tuple) -> None:
    X, y, Xt, yt = problem
    with pytest.raises(ValueError, match="features"):
        run_federated(X, y, Xt[:, :3], yt, 3, config=FLConfig(n_rounds=1, target_epsilon=1.0))
