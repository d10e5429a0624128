"""The torch module validator: unsupported layers are named with their fix (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import TorchModel, UnsupportedModuleError, fix_module, validate_module

torch = pytest.importorskip("torch")
nn = torch.nn


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = np.random.default_rng(0).standard_normal((8, 6))
    return X, np.arange(8) % 3, np.array([0, 4, 8])


def test_batchnorm_is_named_with_the_fix_instead_of_a_torch_func_error() -> None:
    net = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3)).double()
    with pytest.raises(UnsupportedModuleError, match=r"1 \(BatchNorm1d\).*GroupNorm\(1, 5\)"
                       r"(.|\n)*fix_module"):
        TorchModel(net)
    fixed = fix_module(net)
    assert isinstance(fixed[1], nn.GroupNorm) and fixed[1].weight.dtype == torch.float64
    assert isinstance(net[1], nn.BatchNorm1d)  # the original is untouched
    X, y, bounds = _data()
    model = TorchModel(fixed)
    sums = model.clipped_grad_sums(model.init_params(None), X, y, bounds, 1.0)
    assert np.all(np.isfinite(sums)) and np.linalg.norm(sums, axis=1).max() <= 4.0


def test_every_unsupported_kind_is_listed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm2d(40)
            self.inst = nn.InstanceNorm1d(4, track_running_stats=True)
            self.drop = nn.Dropout(0.3)
            self.rnn = nn.LSTM(3, 4)
            self.ok = nn.LayerNorm(4)

    problems = {p.name: p for p in validate_module(Net())}
    assert set(problems) == {"norm", "inst", "drop", "rnn"}
    assert problems["norm"].fix.startswith("GroupNorm(8, 40)")  # gcd(32, 40) groups
    assert problems["rnn"].fix is None
    with pytest.raises(UnsupportedModuleError, match=r"rnn \(LSTM\).*no automatic fix"):
        fix_module(Net())


def test_fixed_dropout_and_instance_norm_train() -> None:
    net = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.Unflatten(1, (2, 3)),
                        nn.InstanceNorm1d(2, affine=True, track_running_stats=True),
                        nn.Flatten(), nn.Linear(6, 3)).double()
    fixed = fix_module(net)
    assert validate_module(fixed) == []
    assert isinstance(fixed[1], nn.Identity) and not fixed[3].track_running_stats
    X, y, bounds = _data()
    model = TorchModel(fixed)
    assert np.all(np.isfinite(model.clipped_grad_sums(model.init_params(None), X, y,
                                                      bounds, 1.0)))


def test_layer_norm_option_and_bad_arguments() -> None:
    net = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))
    assert isinstance(fix_module(net, norm="layer")[1], nn.LayerNorm)
    with pytest.raises(ValueError, match="norm='batch'"):
        fix_module(net, norm="batch")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        validate_module("not a module")
    with pytest.raises(UnsupportedModuleError, match="module itself"):
        fix_module(nn.BatchNorm1d(3))
