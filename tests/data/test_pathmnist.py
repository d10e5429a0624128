"""PathMNIST loader on a tiny ``pathmnist.npz`` in MedMNIST's format, written here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpprecond.data import load_dataset
from dpprecond.data.pathmnist import PATHMNIST_KEYS, default_pathmnist_file, load_pathmnist

SIZES = {"train": 7, "val": 3, "test": 5}


def make_npz(path: Path, *, side: int = 28, compressed: bool = True, seed: int = 0,
             drop: str | None = None, **override: np.ndarray) -> dict[str, np.ndarray]:
    """MedMNIST layout: images (N, H, W, 3) uint8, labels (N, 1) uint8, classes 0..8."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for split, n in SIZES.items():
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 9, size=(n, 1), dtype=np.uint8)
    arrays["train_labels"][:2, 0] = [0, 8]  # both ends of the label range
    arrays.update(override)
    if drop is not None:
        del arrays[drop]
    path.parent.mkdir(parents=True, exist_ok=True)
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return arrays


@pytest.mark.parametrize("compressed", [True, False])
def test_loads_train_and_test_without_val(tmp_path: Path, compressed: bool) -> None:
    raw = make_npz(tmp_path / "pathmnist.npz", compressed=compressed)
    ds = load_pathmnist(tmp_path / "pathmnist.npz")
    assert ds.name == "pathmnist" and ds.n_classes == 9 and ds.image_shape == (28, 28, 3)
    assert ds.X_train.shape == (SIZES["train"], 28 * 28 * 3)
    assert ds.X_test.shape == (SIZES["test"], 28 * 28 * 3)
    assert ds.X_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    assert ds.X_train.min() >= 0.0 and ds.X_train.max() <= 1.0
    # (N, 1) labels flattened; images kept in their (H, W, C) layout, scaled by 1/255.
    np.testing.assert_array_equal(ds.y_train, raw["train_labels"][:, 0])
    np.testing.assert_array_equal(ds.y_test, raw["test_labels"][:, 0])
    np.testing.assert_array_equal(ds.X_test.reshape(-1, 28, 28, 3) * 255.0, raw["test_images"])
    assert ds.y_train.min() == 0 and ds.y_train.max() == 8


def test_merge_val_appends_validation(tmp_path: Path) -> None:
    raw = make_npz(tmp_path / "pathmnist.npz")
    ds = load_pathmnist(tmp_path, merge_val=True)
    assert ds.X_train.shape[0] == SIZES["train"] + SIZES["val"]
    np.testing.assert_array_equal(ds.y_train[SIZES["train"]:], raw["val_labels"][:, 0])
    np.testing.assert_array_equal(ds.X_train[SIZES["train"]:].reshape(-1, 28, 28, 3) * 255.0,
                                  raw["val_images"])
    assert ds.X_test.shape[0] == SIZES["test"]


def test_directory_registry_env_default_and_other_sizes(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    make_npz(tmp_path / "pathmnist.npz")
    a = load_pathmnist(tmp_path)
    b = load_dataset("pathmnist", tmp_path / "pathmnist.npz")
    np.testing.assert_array_equal(a.X_train, b.X_train)
    monkeypatch.setenv("DPPRECOND_DATA", str(tmp_path))
    assert default_pathmnist_file() == tmp_path / "pathmnist.npz"
    np.testing.assert_array_equal(load_pathmnist().y_test, a.y_test)
    make_npz(tmp_path / "pathmnist_64.npz", side=64)  # MedMNIST+ file, same keys
    assert load_pathmnist(tmp_path / "pathmnist_64.npz").image_shape == (64, 64, 3)


def test_missing_file_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_pathmnist(tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "pathmnist.npz") in msg and "medmnist" in msg.lower()
    assert "DPPRECOND_DATA" in msg and "train_images" in msg
    monkeypatch.setenv("DPPRECOND_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere.pathmnist\.npz"):
        load_dataset("pathmnist")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"drop": "test_labels"}, r"lacks key\(s\) test_labels"),
    ({"train_images": np.zeros((7, 28, 28, 3), np.float32)}, r"train_images must be uint8"),
    ({"test_images": np.zeros((5, 28, 28), np.uint8)}, r"test_images must be uint8 of shape"),
    ({"train_labels": np.zeros((6, 1), np.uint8)}, r"train_labels must have shape \(7, 1\)"),
    ({"test_labels": np.full((5, 1), 9, np.uint8)}, r"\[0, 9\)"),
    ({"test_images": np.zeros((5, 32, 32, 3), np.uint8)}, r"different sizes"),
])
def test_malformed_archives_are_refused(tmp_path: Path, kwargs: dict, match: str) -> None:
    make_npz(tmp_path / "pathmnist.npz", **kwargs)
    with pytest.raises(ValueError, match=match):
        load_pathmnist(tmp_path)


def test_val_keys_only_needed_when_merged(tmp_path: Path) -> None:
    make_npz(tmp_path / "pathmnist.npz", drop="val_images")
    assert load_pathmnist(tmp_path).X_train.shape[0] == SIZES["train"]
    with pytest.raises(ValueError, match=r"lacks key\(s\) val_images"):
        load_pathmnist(tmp_path, merge_val=True)


def test_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "pathmnist.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"not a readable \.npz"):
        load_pathmnist(tmp_path)
    np.save(tmp_path / "single.npy", np.zeros(3))
    (tmp_path / "single.npy").rename(tmp_path / "pathmnist.npz")
    with pytest.raises(ValueError, match=r"single array"):
        load_pathmnist(tmp_path)
    assert set(PATHMNIST_KEYS) == {f"{s}_{k}" for s in SIZES for k in ("images", "labels")}
