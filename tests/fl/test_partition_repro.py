"""Partitions cover every example once; seeded runs are exactly reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, client, run_federated, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import client_weights, dirichlet_partition, iid_partition
from dpprecond.fl.server import sofim


def assert_covers_once(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def test_iid_partition_covers_once_and_is_balanced() -> None:
    parts = iid_partition(1003, 10, 0)
    assert_covers_once(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("alpha", "n_clients"), [(0.5, 20), (0.01, 50), (100.0, 7)])
def test_dirichlet_partition_covers_once_and_repairs_empty(alpha: float, n_clients: int) -> None:
    y = np.random.default_rng(0).integers(0, 10, 2000)
    parts = dirichlet_partition(y, n_clients, alpha, 1, min_size=3)
    assert len(parts) == n_clients
    assert_covers_once(parts, 2000)
    assert min(len(p) for p in parts) >= 3


def test_dirichlet_skew_and_seeding() -> None:
    y = np.repeat(np.arange(10), 200)
    a = dirichlet_partition(y, 20, 0.05, 3)
    b = dirichlet_partition(y, 20, 0.05, 3)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    # strong skew: most clients are dominated by one class
    top_share = [np.bincount(y[p], minlength=10).max() / len(p) for p in a]
    assert np.median(top_share) > 0.7
    c = dirichlet_partition(y, 20, 0.05, 4)
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def test_dirichlet_too_many_clients() -> None:
    with pytest.raises(ValueError, match="n_clients"):
        dirichlet_partition(np.zeros(10, dtype=int), 11, 0.5, 0)


def test_client_weights() -> None:
    np.testing.assert_allclose(client_weights(np.array([1, 3]), "uniform"), [0.5, 0.5])
    np.testing.assert_allclose(client_weights(np.array([1, 3]), "size"), [0.25, 0.75])


def test_streams_are_the_spawn_tree() -> None:
    root = np.random.SeedSequence(42)
    t, i = 3, 5
    via_spawn = np.random.default_rng(np.random.SeedSequence(42).spawn(4)[t].spawn(6)[i])
    np.testing.assert_array_equal(client.stream(root, t, i).standard_normal(5),
                                  via_spawn.standard_normal(5))
    # independent of the order in which generators are created
    late = client.round_generators(root, t, 6)[i].standard_normal(5)
    np.testing.assert_array_equal(late, client.stream(root, t, i).standard_normal(5))


@pytest.mark.parametrize("mechanism", ["full-batch", "poisson", "client-level"])
def test_same_seed_identical_history(problem: tuple, mechanism: str) -> None:
    X, y, Xt, yt = problem
    kw = {"sampling_rate": 0.3, "local_steps": 2} if mechanism == "poisson" else {}
    config = FLConfig(n_rounds=4, noise_multiplier=1.0, clip_norm=1.0,
                      mechanism=mechanism, accountant="rdp", **kw)

    def go(seed: int) -> list[dict]:
        res = run_federated(X, y, Xt, yt, 3, algorithm="sofim", n_clients=4,
                            partition="dirichlet", config=config, seed=seed)
        return [{k: v for k, v in h.items() if k != "seconds"} for h in res.history]

    assert go(7) == go(7)
    assert go(7) != go(8)


def test_client_order_does_not_change_its_noise(client_data: ClientData) -> None:
    """Client i's message depends only on its own data and stream (t, i)."""
    model = LinearSoftmax(6, 3)
    root = np.random.SeedSequence(9)
    params = np.random.default_rng(0).standard_normal(model.n_params)
    cd = client_data
    full = client.full_batch_messages(model, params, cd.X, cd.y, cd.bounds, 1.0, 2.0,
                                      client.round_generators(root, 2, 4))
    a, b = cd.bounds[2], cd.bounds[3]
    alone = client.full_batch_messages(model, params, cd.X[a:b], cd.y[a:b], np.array([0, b - a]),
                                       1.0, 2.0, [client.stream(root, 2, 2)])
    np.testing.assert_allclose(alone[0], full[2], rtol=1e-12)


def test_history_fields_and_json(tmp_path, client_data: ClientData, problem: tuple) -> None:
    _, _, Xt, yt = problem
    res = simulate(LinearSoftmax(6, 3), client_data, sofim(), FLConfig(n_rounds=3,
                   target_epsilon=3.0, accountant="rdp"), X_test=Xt, y_test=yt, seed=1)
    assert [h["round"] for h in res.history] == [1, 2, 3]
    assert set(res.history[0]) == {"round", "test_accuracy", "test_loss", "epsilon",
                                   "update_norm", "seconds"}
    res.save_json(tmp_path / "h.json")
    import json

    loaded = json.loads((tmp_path / "h.json").read_text())
    assert loaded["history"][2]["epsilon"] == pytest.approx(res.epsilon)
