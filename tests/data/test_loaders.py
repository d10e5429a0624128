"""The data layer on small files in the real formats, written here."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from dpprecond.data import load_dataset, load_digits, load_fashion_mnist, load_matrix, read_idx
from dpprecond.data.idx import DEFAULT_FASHION_MNIST_DIR


def write_idx(path: Path, arr: np.ndarray, *, gz: bool = False) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def make_fashion_dir(tmp_path: Path, *, gz: bool, n_train: int = 12, n_test: int = 5) -> tuple:
    rng = np.random.default_rng(0)
    xtr = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    ytr = rng.integers(0, 10, size=n_train, dtype=np.uint8)
    xte = rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8)
    yte = rng.integers(0, 10, size=n_test, dtype=np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte", xtr, gz=gz)
    write_idx(tmp_path / "train-labels-idx1-ubyte", ytr, gz=gz)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", xte, gz=gz)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", yte, gz=gz)
    return xtr, ytr, xte, yte


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_mnist_from_idx_directory(tmp_path: Path, gz: bool) -> None:
    xtr, ytr, xte, yte = make_fashion_dir(tmp_path, gz=gz)
    ds = load_dataset("fashion-mnist", tmp_path)
    np.testing.assert_array_equal(ds.X_test, xte.reshape(5, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_train, ytr.astype(np.int64))
    assert ds.X_train.shape == (12, 784) and ds.X_test.shape == (5, 784)
    assert ds.image_shape == (28, 28, 1) and ds.n_classes == 10
    np.testing.assert_array_equal(ds.X_train, xtr.reshape(12, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_test, yte.astype(np.int64))
    assert ds.X_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    assert 0.0 <= ds.X_train.min() and ds.X_train.max() <= 1.0


def test_fashion_mnist_missing_files_say_where(tmp_path: Path) -> None:
    make_fashion_dir(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"t10k-labels-idx1-ubyte.*dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


def test_idx_rejects_truncated_and_bad_magic(tmp_path: Path) -> None:
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "a-idx3-ubyte"
    write_idx(p, arr)
    np.testing.assert_array_equal(read_idx(p), arr)
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(p)
    p.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        read_idx(p)


def test_digits_fixed_split() -> None:
    a, b = load_digits(), load_digits()
    assert a.X_train.shape[0] + a.X_test.shape[0] == 1797 and a.n_features == 64
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert a.X_train.max() <= 1.0 and set(np.unique(a.y_train)) == set(range(10))


def test_unknown_dataset_name() -> None:
    with pytest.raises(ValueError, match=r"name='mnist'"):
        load_dataset("mnist")


def test_load_matrix_npy_and_csv(tmp_path: Path) -> None:
    m = np.random.default_rng(1).normal(size=(5, 3))
    np.save(tmp_path / "m.npy", m)
    np.testing.assert_array_equal(load_matrix(tmp_path / "m.npy"), m)
    np.savetxt(tmp_path / "m.csv", m, delimiter=",", header="a,b,c", comments="")
    np.testing.assert_allclose(load_matrix(tmp_path / "m.csv"), m)
    np.savetxt(tmp_path / "n.csv", m, delimiter=",")
    np.testing.assert_allclose(load_matrix(tmp_path / "n.csv"), m)
    with pytest.raises(FileNotFoundError, match=r"nope\.npy"):
        load_matrix(tmp_path / "nope.npy")
    np.save(tmp_path / "v.npy", np.ones(3))
    with pytest.raises(ValueError, match="2-D"):
        load_matrix(tmp_path / "v.npy")
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(ValueError, match="parquet"):
        load_matrix(tmp_path / "x.parquet")


@pytest.mark.skipif(not DEFAULT_FASHION_MNIST_DIR.is_dir(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist_package() -> None:
    ds = load_fashion_mnist()
    assert ds.X_train.shape == (60000, 784) and ds.X_test.shape == (10000, 784)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
