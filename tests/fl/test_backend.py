"""The torch backend of the linear head's kernel against the numpy default (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.backend import cuda_available, get_backend
from dpprecond.fl.kernels import clipped_sums, rounding_slack
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import iid_partition
from tests.fl.conftest import FIXED

from .conftest import make_problem

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def setup():
    X, y, Xt, yt = make_problem(n=1500, d=12, k=4, seed=3)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 5, 0), 4)
    model = LinearSoftmax(12, 4)
    params = np.random.default_rng(2).standard_normal(model.n_params) * 0.3
    return data, model, params, Xt, yt


def _kernel(data: ClientData, params: np.ndarray, device: str | None, dtype, C: float):
    Xd = data.X.astype(dtype)
    x_sq = np.einsum("ij,ij->i", Xd, Xd, dtype=np.float64)
    if device is None:
        return clipped_sums(Xd, data.y, params.reshape(13, 4), data.bounds, C, x_sq)[0]
    be = get_backend("torch", device)
    return clipped_sums(be.asarray(Xd), data.y, params.reshape(13, 4), data.bounds, C,
                        be.asarray(x_sq))[0]


@pytest.mark.parametrize("C", [0.3, 5.0, np.inf])
def test_torch_cpu_float64_sums_equal_numpy_within_the_rounding_bound(setup, C: float) -> None:
    data, _, params, _, _ = setup
    a = _kernel(data, params, None, np.float64, C)
    b = _kernel(data, params, "cpu", np.float64, C)
    # both are within n gamma_n C_eff of the exact sum (fl/kernels.py), so within twice that
    n = int(np.diff(data.bounds).max())
    scale = C if np.isfinite(C) else float(np.abs(a).max())
    assert np.abs(a - b).max() <= 2 * rounding_slack(n) * n * scale
    assert np.abs(a - b).max() <= 1e-12 * float(np.abs(a).max())  # the stated tolerance


def test_torch_cpu_float32_matches_numpy_float32(setup) -> None:
    data, _, params, _, _ = setup
    a = _kernel(data, params, None, np.float32, 0.5)
    b = _kernel(data, params, "cpu", np.float32, 0.5)
    n = int(np.diff(data.bounds).max())
    assert np.abs(a - b).max() <= 2 * rounding_slack(n, np.float32) * n * 0.5


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_same_seed_gives_the_same_run_on_both_backends(setup, precision: str) -> None:
    data, model, _, Xt, yt = setup
    runs = [simulate(model, data, make_method("sofim-lagged"),
                     FLConfig(**FIXED, n_rounds=6, target_epsilon=4.0, precision=precision,
                              backend=b), X_test=Xt, y_test=yt, seed=11)
            for b in ("numpy", "torch")]
    assert runs[0].epsilon == runs[1].epsilon
    assert runs[0].noise_multiplier == runs[1].noise_multiplier
    tol = 1e-9 if precision == "float64" else 1e-4
    np.testing.assert_allclose(runs[1].params, runs[0].params, rtol=0, atol=tol)


def test_secure_mode_on_torch_draws_no_torch_randomness(setup, monkeypatch) -> None:
    data, model, _, Xt, yt = setup
    import dpprecond.secure as secure

    calls = {"n": 0}
    real = secure.SecureGenerator.standard_normal

    def counted(self, size=None):
        calls["n"] += 1
        return real(self, size)

    def refuse(*args, **kwargs):
        raise AssertionError("torch's random number generator was used")

    monkeypatch.setattr(secure.SecureGenerator, "standard_normal", counted)
    for name in ("randn", "normal", "rand", "randn_like", "manual_seed"):
        monkeypatch.setattr(torch, name, refuse)
    res = simulate(model, data, "fedgd", FLConfig(**FIXED, n_rounds=2, target_epsilon=2.0,
                                                  backend="torch", device="cpu"),
                   X_test=Xt, y_test=yt, secure=True)
    assert calls["n"] == 2 * data.n_clients  # one draw per client and round, from the CSPRNG
    assert np.all(np.isfinite(res.params))


def test_backend_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="backend"):
        FLConfig(**FIXED, target_epsilon=1.0, backend="jax").validated()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"device='cpu' needs backend='torch'"):
        FLConfig(**FIXED, target_epsilon=1.0, device="cpu").validated()
    if not cuda_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            get_backend("torch", "cuda")
    with pytest.raises(ValueError, match="device='tpu9'"):
        get_backend("torch", "tpu9")


def test_torch_model_refuses_the_torch_backend(setup) -> None:
    from dpprecond.fl import TorchModel

    data, _, _, Xt, yt = setup
    model = TorchModel(torch.nn.Linear(12, 4).double())
    with pytest.raises(ValueError, match="backend='numpy'"):
        simulate(model, data, "fedgd", FLConfig(**FIXED, n_rounds=1, target_epsilon=1.0,
                                                backend="torch"), X_test=Xt, y_test=yt)


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_kernel_equals_numpy(setup, dtype) -> None:  # pragma: no cover - GPU only
    data, _, params, _, _ = setup
    a = _kernel(data, params, None, dtype, 0.5)
    b = _kernel(data, params, "cuda", dtype, 0.5)
    n = int(np.diff(data.bounds).max())
    assert np.abs(a - b).max() <= 2 * rounding_slack(n, dtype) * n * 0.5


@pytest.mark.parametrize("C", [0.3, 5.0, np.inf])
def test_torch_counts_equal_numpy_counts(setup, C: float) -> None:
    """Adaptive clipping's counts from the torch pass are the numpy pass's (the norms
    agree to rounding; no norm of this data lies within rounding of the clip)."""
    data, _, params, _, _ = setup
    x_sq = np.einsum("ij,ij->i", data.X, data.X)
    W = params.reshape(13, 4)
    be = get_backend("torch", "cpu")
    _, _, a = clipped_sums(data.X, data.y, W, data.bounds, C, x_sq, return_counts=True)
    _, _, b = clipped_sums(be.asarray(data.X), data.y, W, data.bounds, C, be.asarray(x_sq),
                           return_counts=True)
    np.testing.assert_array_equal(a, b)
    if np.isinf(C):
        assert a.sum() == 1500  # every norm is within an infinite clip
    elif C == 0.3:
        assert 0 < a.sum() < 1500  # the clip splits the records
