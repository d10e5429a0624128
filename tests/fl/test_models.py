"""Closed-form per-example gradients against torch autograd; clipping; the torch wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.clipping import SHRINK
from dpprecond.fl.models import LinearSoftmax, TorchModel, clip_factors

torch = pytest.importorskip("torch")


def torch_per_example_grads(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Independent reference: autograd of cross-entropy, one example at a time."""
    out = []
    for x, t in zip(X, y, strict=True):
        Wt = torch.tensor(W, dtype=torch.float64, requires_grad=True)
        xt = torch.tensor(np.r_[x, 1.0], dtype=torch.float64)
        loss = torch.nn.functional.cross_entropy((xt @ Wt)[None], torch.tensor([int(t)]))
        (g,) = torch.autograd.grad(loss, Wt)
        out.append(g.numpy().ravel())
    return np.array(out)


def test_closed_form_equals_autograd(problem: tuple) -> None:
    X, y, _, _ = problem
    X, y = X[:25], y[:25]
    model = LinearSoftmax(X.shape[1], 3)
    W = np.random.default_rng(3).standard_normal(model.n_params)
    G = model.per_example_grads(W, X, y)
    ref = torch_per_example_grads(W.reshape(-1, 3), X, y)
    np.testing.assert_allclose(G, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.per_example_grad_norms(W, X, y),
                               np.linalg.norm(ref, axis=1), rtol=1e-10)


@pytest.mark.parametrize("clip_norm", [0.05, 1.0, 3.0, np.inf])
def test_clipped_sums_equal_explicit_clipping(problem: tuple, clip_norm: float) -> None:
    X, y, _, _ = problem
    model = LinearSoftmax(X.shape[1], 3)
    rng = np.random.default_rng(4)
    bounds = np.array([0, 30, 31, 100, len(y)])
    for params in (rng.standard_normal(model.n_params),
                   rng.standard_normal((4, model.n_params))):
        G = np.concatenate([model.per_example_grads(params if params.ndim == 1 else params[i],
                                                    X[bounds[i]:bounds[i + 1]],
                                                    y[bounds[i]:bounds[i + 1]])
                            for i in range(4)])
        norms = np.linalg.norm(G, axis=1)
        # every clipped gradient also carries SHRINK = 1 - 2^-30 (dpprecond.clipping)
        Gc = G * np.minimum(1.0, clip_norm / norms)[:, None] * (SHRINK if clip_norm < np.inf else 1)
        ref = np.add.reduceat(Gc, bounds[:-1], axis=0)
        got = model.clipped_grad_sums(params, X, y, bounds, clip_norm)
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
        assert np.all(np.linalg.norm(Gc, axis=1) <= clip_norm)


def test_clip_factors_edge_cases() -> None:
    np.testing.assert_array_equal(clip_factors(np.array([0.0, 1.0, 4.0]), 2.0), [1, 1, 0.5])
    np.testing.assert_array_equal(clip_factors(np.array([5.0]), np.inf), [1.0])


def test_torch_model_matches_closed_form(problem: tuple) -> None:
    X, y, Xt, yt = problem
    d, k = X.shape[1], 3
    module = torch.nn.Linear(d, k).double()
    tm = TorchModel(module, chunk_size=17)
    lin = LinearSoftmax(d, k)
    flat = tm.init_params(np.random.default_rng(0))
    Wt, b = flat[:d * k].reshape(k, d), flat[d * k:]
    W = np.vstack([Wt.T, b]).ravel()  # same model in LinearSoftmax's layout

    def to_torch_layout(g: np.ndarray) -> np.ndarray:
        g = g.reshape(-1, d + 1, k)
        return np.concatenate([g[:, :d].transpose(0, 2, 1).reshape(len(g), -1), g[:, d]], 1)

    np.testing.assert_allclose(tm.per_example_grads(flat, X[:40], y[:40]),
                               to_torch_layout(lin.per_example_grads(W, X[:40], y[:40])),
                               rtol=1e-9, atol=1e-12)
    bounds = np.array([0, 50, 120, len(y)])
    np.testing.assert_allclose(tm.clipped_grad_sums(flat, X, y, bounds, 0.7),
                               to_torch_layout(lin.clipped_grad_sums(W, X, y, bounds, 0.7)),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(tm.evaluate(flat, Xt, yt), lin.evaluate(W, Xt, yt), rtol=1e-9)


def test_torch_mlp_trains_in_simulator(problem: tuple) -> None:
    from dpprecond.fl import FLConfig, run_federated

    X, y, Xt, yt = problem
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, 3)).double()
    before = TorchModel(mlp).init_params(None).copy()
    res = run_federated(X, y, Xt, yt, 3, algorithm="sofim-momentum", n_clients=3,
                        model=TorchModel(mlp), learning_rate=1.0,
                        config=FLConfig(n_rounds=15, noise_multiplier=0.0))
    assert res.final_accuracy > 0.8  # separable blobs
    # training moved the flat parameters, never the module's own tensors
    np.testing.assert_array_equal(TorchModel(mlp).init_params(None), before)
    assert not np.allclose(res.params, before)


def test_torch_model_rejects_non_module() -> None:
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        TorchModel(object())


def test_block_products_with_empty_blocks() -> None:
    from dpprecond.fl.models import block_products

    rng = np.random.default_rng(5)
    X, R = rng.standard_normal((20, 4)), rng.standard_normal((20, 3))
    bounds = np.array([0, 0, 7, 7, 20, 20])
    got = block_products(X, R, bounds)
    for i in range(5):
        a, b = bounds[i], bounds[i + 1]
        np.testing.assert_allclose(got[i], X[a:b].T @ R[a:b], atol=1e-12)
    model = LinearSoftmax(4, 3)
    y = rng.integers(0, 3, 20)
    sums = model.clipped_grad_sums(rng.standard_normal(model.n_params), X, y, bounds, 1.0)
    assert np.all(sums[[0, 2, 4]] == 0.0) and np.all(sums[[1, 3]] != 0.0)
