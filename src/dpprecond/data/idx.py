"""IDX files (the MNIST family's format) and the Fashion-MNIST loader."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from dpprecond.data.base import Dataset

__all__ = ["DEFAULT_FASHION_MNIST_DIR", "load_fashion_mnist", "read_idx"]

DEFAULT_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "X_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "X_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or ``.gz``) into an array of its declared shape.

    Raises ``ValueError`` on a bad magic number or a size that does not match the header.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}).")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                         f"file holds {len(raw) - offset} bytes; the file is truncated or corrupt.")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(shape)


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def load_fashion_mnist(path: str | os.PathLike | None = None) -> Dataset:
    """Load Fashion-MNIST (60000 train, 10000 test, 28x28 grey) from a directory of IDX files.

    Parameters
    ----------
    path : path-like, optional
        Directory holding the four IDX files (plain or gzipped). Defaults to the Debian
        package location ``/usr/share/datasets/fashion-mnist``.
    """
    directory = Path(path) if path is not None else DEFAULT_FASHION_MNIST_DIR
    found = {key: _find(directory, stem) for key, stem in FASHION_MNIST_FILES.items()}
    missing = [FASHION_MNIST_FILES[k] for k, v in found.items() if v is None]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {directory}: missing {', '.join(missing)} (plain or "
            ".gz). Install the Debian package (apt-get install dataset-fashion-mnist) or put "
            "the four IDX files in one directory and pass it as path / --data-path.")
    arrays = {key: read_idx(p) for key, p in found.items()}  # type: ignore[arg-type]
    for split in ("train", "test"):
        X, y = arrays[f"X_{split}"], arrays[f"y_{split}"]
        if X.ndim != 3 or y.ndim != 1 or X.shape[0] != y.shape[0]:
            raise ValueError(f"Fashion-MNIST {split} files do not match: images {X.shape}, "
                             f"labels {y.shape} (expected (n, 28, 28) and (n,)).")
    def images(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0], -1).astype(np.float64) / 255.0

    return Dataset("fashion-mnist", images(arrays["X_train"]),
                   arrays["y_train"].astype(np.int64), images(arrays["X_test"]),
                   arrays["y_test"].astype(np.int64), n_classes=10,
                   image_shape=(*arrays["X_train"].shape[1:], 1))
