"""The frozen ResNet-20 extractor: checkpoint format, loaded weights, resizing and the cache.

The checkpoint is a randomly initialised ResNet-20 (with non-trivial BatchNorm statistics)
saved by ``torch.save(model.state_dict())``, the format of the public release.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from dpprecond.data import Dataset  # noqa: E402
from dpprecond.features import RESNET20_CHECKPOINT_NAME, featurize, resolve_checkpoint  # noqa: E402
from dpprecond.features import resnet20 as rn  # noqa: E402

MEAN = torch.tensor([0.5070, 0.4865, 0.4409]).view(1, 3, 1, 1)
STD = torch.tensor([0.2673, 0.2564, 0.2761]).view(1, 3, 1, 1)


def random_model(seed: int) -> rn.CifarResNet20:
    torch.manual_seed(seed)
    model = rn.CifarResNet20(num_classes=100)
    gen = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.weight.data = 0.5 + torch.rand(c, generator=gen)
            m.bias.data = 0.2 * torch.randn(c, generator=gen)
            m.running_mean = 0.1 * torch.randn(c, generator=gen)
            m.running_var = 0.5 + torch.rand(c, generator=gen)
    return model.eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "resnet20_random.pt"
    torch.save(random_model(0).state_dict(), path)
    return path


def image_dataset(shape: tuple[int, int, int], n_train: int = 5, n_test: int = 3,
                  seed: int = 0, name: str = "imgs") -> Dataset:
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    X_tr = rng.integers(0, 256, (n_train, d)) / 255.0
    X_te = rng.integers(0, 256, (n_test, d)) / 255.0
    return Dataset(name, X_tr, rng.integers(0, 9, n_train), X_te, rng.integers(0, 9, n_test),
                   n_classes=9, image_shape=shape)


def direct_forward(model: rn.CifarResNet20, X: np.ndarray, shape: tuple[int, int, int]):
    """Reference: NCHW tensor, bilinear resize to 32, CIFAR-100 normalisation, pooled layer3."""
    x = torch.tensor(X.reshape(-1, *shape), dtype=torch.float32).permute(0, 3, 1, 2)
    if shape[2] == 1:
        x = x.repeat(1, 3, 1, 1)
    if shape[:2] != (32, 32):
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    with torch.no_grad():
        h = model.layer3(model.layer2(model.layer1(
            torch.relu(model.bn1(model.conv1((x - MEAN) / STD))))))
    return h.mean(dim=(2, 3)).numpy().astype(np.float64)


def test_state_dict_matches_public_checkpoint_layout() -> None:
    sd = rn.CifarResNet20().state_dict()
    assert len(sd) == 128  # 21 BatchNorms x 5 entries + 21 convs + fc weight and bias
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    assert shapes["conv1.weight"] == (16, 3, 3, 3)
    assert shapes["layer1.0.conv1.weight"] == (16, 16, 3, 3)
    assert shapes["layer2.0.conv1.weight"] == (32, 16, 3, 3)
    assert shapes["layer2.0.downsample.0.weight"] == (32, 16, 1, 1)
    assert shapes["layer2.0.downsample.1.running_var"] == (32,)
    assert shapes["layer3.0.downsample.0.weight"] == (64, 32, 1, 1)
    assert shapes["layer3.2.bn2.bias"] == (64,)
    assert shapes["fc.weight"] == (100, 64) and shapes["fc.bias"] == (100,)
    assert not any(k.startswith(("layer1.0.downsample", "layer2.1.downsample")) for k in sd)
    assert {k.split(".")[0] for k in sd} == {"conv1", "bn1", "layer1", "layer2", "layer3", "fc"}
    # 0.28M parameters, as published for cifar100_resnet20.
    assert sum(p.numel() for p in rn.CifarResNet20().parameters()) == 278_324


def test_features_equal_direct_forward_of_loaded_weights(ckpt: Path, tmp_path: Path) -> None:
    ds = image_dataset((32, 32, 3))
    out = featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    assert out.X_train.shape == (5, 64) and out.X_test.shape == (3, 64)
    assert out.X_train.dtype == np.float64 and out.name == "imgs+resnet20"
    assert out.image_shape is None and out.n_classes == 9
    np.testing.assert_array_equal(out.y_train, ds.y_train)
    model = random_model(0)
    np.testing.assert_allclose(out.X_train, direct_forward(model, ds.X_train, (32, 32, 3)),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.X_test, direct_forward(model, ds.X_test, (32, 32, 3)),
                               rtol=1e-5, atol=1e-5)
    # Other weights give other features: the checkpoint's weights are what is used.
    other = direct_forward(random_model(7), ds.X_train, (32, 32, 3))
    assert np.abs(other - out.X_train).max() > 1e-2
    # Post-ReLU average pooling: features are non-negative.
    assert out.X_train.min() >= 0.0


@pytest.mark.parametrize("shape", [(28, 28, 3), (28, 28, 1)])
def test_pathmnist_sizes_are_resized_bilinearly(ckpt: Path, shape: tuple[int, int, int]) -> None:
    ds = image_dataset(shape, seed=3)
    out = featurize(ds, "resnet20", checkpoint=ckpt, use_cache=False)
    np.testing.assert_allclose(out.X_train, direct_forward(random_model(0), ds.X_train, shape),
                               rtol=1e-5, atol=1e-5)


def test_deterministic_and_batch_size_free(ckpt: Path) -> None:
    ds = image_dataset((32, 32, 3), n_train=7, seed=4)
    a = featurize(ds, "resnet20", checkpoint=ckpt, use_cache=False, batch_size=3)
    b = featurize(ds, "resnet20", checkpoint=ckpt, use_cache=False, batch_size=3)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    c = featurize(ds, "resnet20", checkpoint=ckpt, use_cache=False, batch_size=1)
    np.testing.assert_allclose(a.X_train, c.X_train, rtol=1e-5, atol=1e-6)


def test_second_call_hits_the_cache(ckpt: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ds = image_dataset((32, 32, 3), seed=5)
    first = featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    entries = list(tmp_path.glob("imgs-resnet20-*.npz"))
    assert len(entries) == 1

    def boom(*args, **kwargs):
        raise AssertionError("the model ran on a cache hit")

    monkeypatch.setattr(rn, "extract_features", boom)
    monkeypatch.setattr(rn, "load_resnet20", boom)
    second = featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.X_train, second.X_train)
    np.testing.assert_array_equal(first.X_test, second.X_test)
    # Same name and sizes but other pixels: a miss (the model would run).
    changed = image_dataset((32, 32, 3), seed=6)
    with pytest.raises(AssertionError, match="cache hit"):
        featurize(changed, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    # Other checkpoint file: a miss.
    other = tmp_path / "other.pt"
    torch.save(random_model(9).state_dict(), other)
    with pytest.raises(AssertionError, match="cache hit"):
        featurize(ds, "resnet20", checkpoint=other, cache_dir=tmp_path)
    # use_cache=False never reads the cache.
    with pytest.raises(AssertionError, match="cache hit"):
        featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path, use_cache=False)


def test_corrupt_cache_entry_is_recomputed(ckpt: Path, tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    ds = image_dataset((32, 32, 3), seed=8)
    first = featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"truncated")
    again = featurize(ds, "resnet20", checkpoint=ckpt, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.X_train, again.X_train)
    assert "unreadable feature cache" in caplog.text
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave no temporary files


def test_checkpoint_resolution_and_missing_file(ckpt: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPPRECOND_RESNET20_CHECKPOINT", raising=False)
    monkeypatch.setenv("DPPRECOND_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        featurize(image_dataset((32, 32, 3)), "resnet20", cache_dir=tmp_path)
    msg = str(err.value)
    assert RESNET20_CHECKPOINT_NAME in msg and str(tmp_path / RESNET20_CHECKPOINT_NAME) in msg
    assert "github.com/chenyaofo/pytorch-cifar-models/releases" in msg
    assert "DPPRECOND_RESNET20_CHECKPOINT" in msg
    monkeypatch.setenv("DPPRECOND_RESNET20_CHECKPOINT", str(ckpt))
    assert resolve_checkpoint() == ckpt
    assert resolve_checkpoint(ckpt) == ckpt
    with pytest.raises(FileNotFoundError, match=r"nope\.pt \(from the checkpoint argument\)"):
        resolve_checkpoint(tmp_path / "nope.pt")


def test_wrapped_and_prefixed_checkpoints_load(tmp_path: Path) -> None:
    sd = random_model(0).state_dict()
    wrapped = tmp_path / "wrapped.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 200}, wrapped)
    model = rn.load_resnet20(wrapped)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, sd[k])


def test_bad_checkpoints_are_refused(tmp_path: Path) -> None:
    sd = random_model(0).state_dict()
    broken = dict(sd)
    del broken["layer2.0.downsample.0.weight"]
    broken["layer3.1.conv1.weight"] = torch.zeros(64, 64, 1, 1)
    broken["extra.weight"] = torch.zeros(1)
    torch.save(broken, tmp_path / "broken.pt")
    with pytest.raises(ValueError) as err:
        rn.load_resnet20(tmp_path / "broken.pt")
    msg = str(err.value)
    assert "missing layer2.0.downsample.0.weight" in msg and "unexpected extra.weight" in msg
    assert "layer3.1.conv1.weight: (64, 64, 1, 1) (expected (64, 64, 3, 3))" in msg
    # A file whose name carries a hash prefix must match it (torch.hub's convention).
    torch.save(sd, tmp_path / "cifar100_resnet20-00000000.pt")
    with pytest.raises(ValueError, match=r"does not start with the hash 00000000"):
        rn.load_resnet20(tmp_path / "cifar100_resnet20-00000000.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"not a readable torch checkpoint"):
        rn.load_resnet20(tmp_path / "junk.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"expected a state dict"):
        rn.load_resnet20(tmp_path / "list.pt")


def test_hash_named_checkpoint_with_matching_hash_loads(tmp_path: Path) -> None:
    from dpprecond.features.cache import file_sha256

    tmp = tmp_path / "w.pt"
    torch.save(random_model(0).state_dict(), tmp)
    named = tmp_path / f"cifar100_resnet20-{file_sha256(tmp)[:8]}.pt"
    tmp.rename(named)
    assert isinstance(rn.load_resnet20(named), rn.CifarResNet20)


def test_non_image_data_is_refused(ckpt: Path) -> None:
    ds = image_dataset((32, 32, 3))
    flat = Dataset("flat", ds.X_train, ds.y_train, ds.X_test, ds.y_test, n_classes=9)
    with pytest.raises(ValueError, match=r"image_shape=None"):
        featurize(flat, "resnet20", checkpoint=ckpt, use_cache=False)
    wrong = Dataset("wrong", ds.X_train, ds.y_train, ds.X_test, ds.y_test, n_classes=9,
                    image_shape=(28, 28, 3))
    with pytest.raises(ValueError, match=r"does not match its 3072 features"):
        featurize(wrong, "resnet20", checkpoint=ckpt, use_cache=False)
