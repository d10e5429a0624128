"""IDX files (the MNIST family's format) and the Fashion-MNIST loader."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from dpprecond.data.base import Dataset, check_file_labels, error_text

__all__ = ["DEFAULT_FASHION_MNIST_DIR", "load_fashion_mnist", "read_idx"]

DEFAULT_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "X_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "X_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_N_CLASSES = 10
_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped for ``.gz``; corrupt compression is a ``ValueError``."""
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path} (expected a file, plain or .gz).")
    if path.suffix != ".gz":
        return path.read_bytes()
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if not magic:
        raise ValueError(f"{path} is empty; fetch the file again.")
    if magic != _GZIP_MAGIC:
        raise ValueError(f"{path} is not gzip-compressed although its name ends in .gz (it "
                         f"starts with {magic!r}); if it is a plain IDX file, remove the .gz "
                         "suffix, otherwise fetch the file again.")
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path} is a truncated or corrupt gzip file ({error_text(exc)}); "
                         "fetch the file again (or reinstall the package that provides "
                         "it).") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or ``.gz``) into an array of its declared shape.

    The header is four magic bytes ``0, 0, dtype code, ndim`` and then ``ndim`` big-endian
    uint32 sizes; the data must be exactly ``prod(sizes)`` items.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    ValueError
        On a truncated or corrupt gzip stream, a bad magic number, a truncated header, or
        a data size that differs from what the header declares; the message names the file.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        hint = (" It looks gzip-compressed: give it a .gz suffix." if raw[:2] == _GZIP_MAGIC
                else "")
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}; expected "
                         f"0x00 0x00, a type code in {sorted(_IDX_DTYPES)} and the number of "
                         f"dimensions).{hint}")
    ndim = raw[3]
    offset = 4 + 4 * ndim
    if len(raw) < offset:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions need {offset} header "
                         f"bytes, the file has {len(raw)}); fetch the file again.")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])  # type: ignore[call-overload]
    expected = math.prod(shape) * dtype.itemsize  # exact: Python ints, no overflow
    found = len(raw) - offset
    if found < expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                         f"file holds {found} bytes; the file is truncated, fetch it again.")
    if found > expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                         f"file holds {found} bytes ({found - expected} too many); the file is "
                         "corrupt or not an IDX file, fetch it again.")
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

    Raises
    ------
    FileNotFoundError
        If a file is missing; the message says how to get the files.
    ValueError
        If a file is truncated or corrupt (see :func:`read_idx`), holds something other than
        uint8 images / labels in 0..9, or the image and label counts differ.
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
    labels = {}
    for split in ("train", "test"):
        img_file, lab_file = found[f"X_{split}"], found[f"y_{split}"]
        X, y = arrays[f"X_{split}"], arrays[f"y_{split}"]
        if X.dtype != np.uint8 or X.ndim != 3 or X.shape[0] == 0 or min(X.shape[1:]) == 0:
            raise ValueError(f"{img_file}: expected uint8 images of shape (n, height, width) "
                             f"with n >= 1, got {X.dtype} {X.shape}; the file is corrupt or not "
                             "a Fashion-MNIST image file.")
        if y.ndim != 1 or X.shape[0] != y.shape[0]:
            raise ValueError(f"Fashion-MNIST {split} files do not match: {img_file} holds "
                             f"{X.shape[0]} images but {lab_file} has labels of shape {y.shape} "
                             "(expected one label per image).")
        labels[split] = check_file_labels(f"{lab_file}: labels", y, _N_CLASSES)
    if arrays["X_train"].shape[1:] != arrays["X_test"].shape[1:]:
        raise ValueError(f"Fashion-MNIST: {found['X_train']} holds images of size "
                         f"{arrays['X_train'].shape[1:]} but {found['X_test']} of size "
                         f"{arrays['X_test'].shape[1:]}.")

    def images(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0], -1).astype(np.float64) / 255.0

    return Dataset("fashion-mnist", images(arrays["X_train"]), labels["train"],
                   images(arrays["X_test"]), labels["test"], n_classes=_N_CLASSES,
                   image_shape=(*arrays["X_train"].shape[1:], 1))
