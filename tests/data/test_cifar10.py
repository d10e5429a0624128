"""CIFAR-10 loader on tiny batch files pickled like the originals, written here.

The official files were written by Python 2's cPickle (protocol 2): dict keys and raw array
bytes are Python 2 ``str`` and the array refers to ``numpy.core.multiarray._reconstruct``.
``py2_batch`` emits exactly those opcodes, so the test exercises the real byte format, not
just what Python 3 would write.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from dpprecond.data import load_dataset
from dpprecond.data.cifar10 import (
    CIFAR10_FILES,
    default_cifar10_dir,
    load_cifar10,
    read_cifar_batch,
)

N_PER_BATCH = 3
N_TEST = 4


def _py2_str(b: bytes) -> bytes:
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b  # SHORT_BINSTRING
    return b"T" + struct.pack("<i", len(b)) + b  # BINSTRING


def _py2_int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])  # BININT1
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)  # BININT2
    return b"J" + struct.pack("<i", v)  # BININT


def py2_batch(data: np.ndarray, labels: list[int], batch_label: bytes) -> bytes:
    """A protocol-2 pickle of the CIFAR batch dict as Python 2 + numpy 1 wrote it."""
    n, d = data.shape
    minus_one = b"J\xff\xff\xff\xff"
    dtype = (b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R"
             + b"(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + minus_one + minus_one
             + _py2_int(0) + b"tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _py2_int(0)
             + b"\x85" + _py2_str(b"b") + b"\x87R"
             + b"(" + _py2_int(1) + _py2_int(n) + _py2_int(d) + b"\x86" + dtype
             + b"\x89" + _py2_str(np.ascontiguousarray(data, np.uint8).tobytes()) + b"tb")
    labs = b"](" + b"".join(_py2_int(int(v)) for v in labels) + b"e"
    names = b"](" + b"".join(_py2_str(f"img_{i}.png".encode()) for i in range(n)) + b"e"
    return (b"\x80\x02}(" + _py2_str(b"batch_label") + _py2_str(batch_label)
            + _py2_str(b"labels") + labs + _py2_str(b"data") + array
            + _py2_str(b"filenames") + names + b"u.")


def make_cifar_dir(directory: Path, *, seed: int = 0) -> tuple[list, list]:
    """Write data_batch_1..5, test_batch and batches.meta; return the raw (data, labels)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    raw = []
    for i, name in enumerate(CIFAR10_FILES):
        n = N_TEST if name == "test_batch" else N_PER_BATCH
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        label = b"testing batch 1 of 1" if name == "test_batch" else \
            f"training batch {i + 1} of 5".encode()
        (directory / name).write_bytes(py2_batch(data, labels, label))
        raw.append((data, labels))
    meta = {b"num_cases_per_batch": N_PER_BATCH, b"num_vis": 3072,
            b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog",
                             b"frog", b"horse", b"ship", b"truck"]}
    (directory / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return raw[:5], raw[5]


def test_loads_shapes_ranges_and_labels(tmp_path: Path) -> None:
    train, (data_te, labels_te) = make_cifar_dir(tmp_path / "cifar-10-batches-py")
    ds = load_cifar10(tmp_path / "cifar-10-batches-py")
    assert ds.name == "cifar10" and ds.n_classes == 10 and ds.image_shape == (32, 32, 3)
    assert ds.X_train.shape == (5 * N_PER_BATCH, 3072) and ds.X_test.shape == (N_TEST, 3072)
    assert ds.X_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    assert ds.X_train.min() >= 0.0 and ds.X_train.max() <= 1.0
    # Training batches concatenated in order 1..5, labels kept in file order.
    np.testing.assert_array_equal(ds.y_train, np.concatenate([lab for _, lab in train]))
    np.testing.assert_array_equal(ds.y_test, labels_te)
    # Values are exactly the bytes / 255 (a permutation of each row, nothing else).
    np.testing.assert_array_equal(np.sort(ds.X_test * 255.0, axis=1),
                                  np.sort(data_te.astype(np.float64), axis=1))


def test_pixel_layout_is_height_width_channel(tmp_path: Path) -> None:
    """Stored: R plane, G plane, B plane (each 32x32 row-major). Returned: (H, W, C) rows."""
    directory = tmp_path / "c"
    make_cifar_dir(directory)
    ds = load_cifar10(directory)
    data, _ = read_cifar_batch(directory / "test_batch")
    img = ds.X_test.reshape(N_TEST, 32, 32, 3)
    for r, c, ch in [(0, 0, 0), (0, 1, 0), (1, 0, 0), (5, 7, 1), (31, 30, 2), (17, 3, 2)]:
        np.testing.assert_array_equal(img[:, r, c, ch] * 255.0, data[:, ch * 1024 + r * 32 + c])
    # A red-only image stays red-only: channel 0 carries the first 1024 stored values.
    np.testing.assert_array_equal(img[:, :, :, 0].reshape(N_TEST, -1) * 255.0, data[:, :1024])


def test_accepts_parent_directory_registry_and_env_default(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    make_cifar_dir(tmp_path / "cifar-10-batches-py")
    direct = load_cifar10(tmp_path / "cifar-10-batches-py")
    from_parent = load_cifar10(tmp_path)
    np.testing.assert_array_equal(direct.X_train, from_parent.X_train)
    via_registry = load_dataset("cifar10", tmp_path)
    np.testing.assert_array_equal(direct.y_test, via_registry.y_test)
    monkeypatch.setenv("DPPRECOND_DATA", str(tmp_path))
    assert default_cifar10_dir() == tmp_path / "cifar-10-batches-py"
    np.testing.assert_array_equal(load_cifar10().X_test, direct.X_test)


def test_python3_pickles_load_too(tmp_path: Path) -> None:
    """Re-pickled batches (Python 3, numpy 2, str keys) are accepted as well."""
    directory = tmp_path / "p3"
    make_cifar_dir(directory)
    for name in CIFAR10_FILES:
        data, labels = read_cifar_batch(directory / name)
        (directory / name).write_bytes(pickle.dumps({"data": data, "labels": list(labels)}))
    ds = load_cifar10(directory)
    assert ds.X_train.shape == (5 * N_PER_BATCH, 3072)


def test_missing_files_name_them_and_say_where(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    make_cifar_dir(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_cifar10(tmp_path)
    msg = str(err.value)
    assert "data_batch_3, test_batch" in msg and str(tmp_path / "cifar-10-batches-py") in msg
    assert "cifar-10-python.tar.gz" in msg and "DPPRECOND_DATA" in msg
    monkeypatch.setenv("DPPRECOND_DATA", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=r"data_batch_1, data_batch_2.*empty"):
        load_dataset("cifar10")


def _rewrite(path: Path, obj: object) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


@pytest.mark.parametrize(("obj", "match"), [
    ({b"data": np.zeros((2, 3072), np.uint8)}, r"lacks key\(s\) \['labels'\]"),
    ({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]}, r"shape \(N, 3072\)"),
    ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, r"must be uint8"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, r"one label per image"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"\[0, 10\)"),
    ([1, 2, 3], r"expected a pickled dict"),
])
def test_malformed_batches_are_refused(tmp_path: Path, obj: object, match: str) -> None:
    make_cifar_dir(tmp_path)
    _rewrite(tmp_path / "data_batch_2", obj)
    with pytest.raises(ValueError, match=match):
        load_cifar10(tmp_path)


class _Evil:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (str(self.target),))


def test_pickle_cannot_run_code(tmp_path: Path) -> None:
    make_cifar_dir(tmp_path)
    marker = tmp_path / "pwned"
    _rewrite(tmp_path / "test_batch", {b"data": _Evil(marker), b"labels": [0]})
    with pytest.raises(ValueError, match=r"refusing to load global"):
        load_cifar10(tmp_path)
    assert not marker.exists()
    (tmp_path / "test_batch").write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"not a CIFAR python-version batch"):
        load_cifar10(tmp_path)
