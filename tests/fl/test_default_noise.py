"""Hole 3 of the privacy issue: the default noise must be unpredictable.

With a public default seed, anyone can regenerate the noise of a default release and
subtract it. Every entry point draws from fresh OS entropy unless a seed is passed; a seed
is for reproducible research, and then the same seed gives the same release.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, run_federated, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import iid_partition
from dpprecond.fl.server import sgd

from .conftest import make_problem

ENTRY_POINTS = [run_federated, simulate]


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_no_entry_point_has_a_fixed_default_seed(fn) -> None:
    assert inspect.signature(fn).parameters["seed"].default is None


def test_default_runs_draw_fresh_noise_and_a_seed_reproduces() -> None:
    X, y, Xt, yt = make_problem(n=120)
    cfg = FLConfig(n_rounds=2, target_epsilon=1.0)
    a = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, config=cfg)
    b = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, config=cfg)
    assert not np.array_equal(a.params, b.params)
    c = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, config=cfg, seed=7)
    d = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, config=cfg, seed=7)
    np.testing.assert_array_equal(c.params, d.params)
    assert "seed" not in a.to_dict()["config"] and "seed" not in c.to_dict()["config"]


@pytest.mark.parametrize("name", ["scaffold", "fedfc", "fednew"])
def test_baselines_draw_fresh_noise_by_default(name: str) -> None:
    X, y, Xt, yt = make_problem(n=120)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 3, 1), 3)
    runs = [simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name),
                     FLConfig(n_rounds=2, target_epsilon=1.0), X_test=Xt, y_test=yt)
            for _ in range(2)]
    assert not np.array_equal(runs[0].params, runs[1].params)


def test_simulate_accepts_a_generator() -> None:
    X, y, Xt, yt = make_problem(n=120)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 3, 1), 3)
    cfg = FLConfig(n_rounds=2, target_epsilon=1.0)
    runs = [simulate(LinearSoftmax(X.shape[1], 3), data, sgd(), cfg, X_test=Xt, y_test=yt,
                     seed=np.random.default_rng(5)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].params, runs[1].params)


def test_cli_fl_defaults_to_fresh_noise(tmp_path, capsys) -> None:
    from dpprecond.cli import build_parser

    args = build_parser().parse_args(["fl", "--out", str(tmp_path)])
    assert args.seed is None
    args = build_parser().parse_args(["pca"])
    assert args.seed is None
