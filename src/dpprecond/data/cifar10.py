"""CIFAR-10 from the official "python version" batches directory.

The directory ``cifar-10-batches-py`` (from ``cifar-10-python.tar.gz``, see
https://www.cs.toronto.edu/~kriz/cifar.html) holds five training batches ``data_batch_1`` ..
``data_batch_5`` (10000 images each), ``test_batch`` (10000 images) and ``batches.meta``.
Each batch is a pickled dict with ``b"data"``: uint8 array of shape (N, 3072) whose row is an
image stored channel-major (1024 red, then 1024 green, then 1024 blue values, each plane
row-major 32x32) and ``b"labels"``: N ints in 0..9.

Nothing downloads implicitly. :func:`download_cifar10` fetches and unpacks the official
archive when called explicitly (never by the loader, never in tests).

Security note: the batches are pickles. They are read with a restricted unpickler that only
resolves the handful of globals a numpy array needs, so a tampered file cannot run code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond.data.base import Dataset, check_file_labels, default_data_root, error_text

__all__ = [
    "CIFAR10_ARCHIVE_MD5",
    "CIFAR10_DIRNAME",
    "CIFAR10_FILES",
    "CIFAR10_URL",
    "default_cifar10_dir",
    "download_cifar10",
    "load_cifar10",
    "read_cifar_batch",
]

logger = logging.getLogger(__name__)

CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_FILES = (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
_SIDE = 32
_CHANNELS = 3
_N_CLASSES = 10

# Globals a pickled numpy array or scalar (Python 2 cPickle or Python 3) refers to. Nothing else
# is resolvable, so a malicious pickle cannot import os.system and friends.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("copy_reg", "_reconstructor"),
    ("copyreg", "_reconstructor"),
    ("__builtin__", "object"),
    ("builtins", "object"),
}


class _ArrayOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: a CIFAR batch holds only a dict, "
                "lists, bytes and a numpy array")
        return super().find_class(module, name)


def default_cifar10_dir() -> Path:
    """Default batches directory: ``$DPPRECOND_DATA/cifar-10-batches-py``.

    Without the ``DPPRECOND_DATA`` environment variable: ``~/.cache/dpprecond/cifar-10-batches-py``.
    """
    return default_data_root() / CIFAR10_DIRNAME


def _resolve_dir(path: str | os.PathLike | None) -> Path:
    base = default_cifar10_dir() if path is None else Path(path).expanduser()
    for candidate in (base, base / CIFAR10_DIRNAME):
        if all((candidate / f).is_file() for f in CIFAR10_FILES):
            return candidate
    # Report against the subdirectory when the user gave its parent.
    where = base / CIFAR10_DIRNAME if (base / CIFAR10_DIRNAME).is_dir() else base
    missing = [f for f in CIFAR10_FILES if not (where / f).is_file()]
    raise FileNotFoundError(
        f"CIFAR-10 not found: {where} lacks {', '.join(missing)}. Expected the official "
        f"python-version files {', '.join(CIFAR10_FILES)} in a directory '{CIFAR10_DIRNAME}'. "
        f"Get cifar-10-python.tar.gz from {CIFAR10_URL}, unpack it, then pass that directory "
        f"(or its parent) as path, or put it at {default_cifar10_dir()} (the default; the "
        "environment variable DPPRECOND_DATA sets its parent directory).")


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled CIFAR batch file.

    Parameters
    ----------
    path : path-like
        A ``data_batch_*`` or ``test_batch`` file.

    Returns
    -------
    data : ndarray of shape (N, 3072), uint8
        Rows as stored: channel-major R, G, B planes of 32x32.
    labels : ndarray of shape (N,), int64

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    ValueError
        If the file is truncated or corrupt, refers to anything but a numpy array, or is not
        a dict with ``data`` (uint8, (N, 3072), N >= 1) and ``labels`` (N integers in 0..9).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR batch file not found: {path} (expected one of "
                                f"{', '.join(CIFAR10_FILES)}).")
    with open(path, "rb") as fh:
        try:
            batch = _ArrayOnlyUnpickler(fh, encoding="bytes").load()
        except Exception as exc:
            # Only pickle's own machinery and the allowed numpy reconstructors run, so every
            # exception comes from malformed bytes. Fuzzing with damaged batches raised,
            # besides UnpicklingError and EOFError: ValueError, TypeError, AttributeError,
            # IndexError, KeyError, OverflowError, LookupError (a damaged codec name),
            # MemoryError (a damaged length), numpy's SystemError/RuntimeError (a damaged
            # dtype state).
            raise ValueError(f"{path} is not a CIFAR python-version batch (unpickling failed: "
                             f"{error_text(exc)}); the file is truncated or corrupt, "
                             f"unpack {CIFAR10_URL.rsplit('/', 1)[1]} again.") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}.")
    # The official files were written by Python 2: keys come back as bytes. Accept str too.
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise ValueError(f"{path}: batch dict lacks key(s) {missing}; found "
                         f"{sorted(map(repr, batch))}. Expected the keys b'data' and "
                         "b'labels' of the python version.")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    n_pix = _SIDE * _SIDE * _CHANNELS
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != n_pix:
        raise ValueError(f"{path}: b'data' must be uint8 of shape (N, {n_pix}), got "
                         f"{data.dtype} {data.shape}.")
    if data.shape[0] == 0:
        raise ValueError(f"{path}: b'data' holds no images (shape {data.shape}); the file is "
                         "corrupt or not a CIFAR-10 batch.")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(f"{path}: b'labels' must hold one label per image ({data.shape[0]}), "
                         f"got shape {labels.shape}.")
    return data, check_file_labels(f"{path}: labels", labels, _N_CLASSES)


def _to_hwc_unit(data: np.ndarray) -> np.ndarray:
    """(N, 3072) channel-major uint8 -> (N, 3072) float64 in [0, 1], row-major (H, W, C)."""
    n = data.shape[0]
    hwc = data.reshape(n, _CHANNELS, _SIDE, _SIDE).transpose(0, 2, 3, 1)
    out = hwc.reshape(n, -1).astype(np.float64)
    out /= 255.0
    return out


def load_cifar10(path: str | os.PathLike | None = None) -> Dataset:
    """Load CIFAR-10 (50000 train, 10000 test, 32x32 RGB, 10 classes).

    Parameters
    ----------
    path : path-like, optional
        The ``cifar-10-batches-py`` directory itself or its parent. Default:
        ``$DPPRECOND_DATA/cifar-10-batches-py``, else ``~/.cache/dpprecond/cifar-10-batches-py``.

    Returns
    -------
    Dataset
        ``name="cifar10"``, ``X_*`` float64 in [0, 1] of shape (n, 3072) with each row a
        flattened (32, 32, 3) image in row-major (height, width, channel) order,
        ``y_*`` int64 in 0..9, ``n_classes=10``, ``image_shape=(32, 32, 3)``.

    Raises
    ------
    FileNotFoundError
        If any of ``data_batch_1`` .. ``data_batch_5``, ``test_batch`` is absent; the
        message says where to put them.
    ValueError
        If a file is not a CIFAR batch (wrong keys, shapes, dtypes or labels).
    """
    directory = _resolve_dir(path)
    logger.info("loading CIFAR-10 from %s", directory)
    parts = [read_cifar_batch(directory / f) for f in CIFAR10_TRAIN_FILES]
    X_train = _to_hwc_unit(np.concatenate([d for d, _ in parts]))
    y_train = np.concatenate([y for _, y in parts])
    data_te, y_test = read_cifar_batch(directory / CIFAR10_TEST_FILE)
    return Dataset("cifar10", X_train, y_train, _to_hwc_unit(data_te), y_test,
                   n_classes=_N_CLASSES, image_shape=(_SIDE, _SIDE, _CHANNELS))


def download_cifar10(root: str | os.PathLike | None = None, *, timeout: float = 60.0) -> Path:
    """Download the official archive, check its MD5 and unpack it. Explicit use only.

    Never called by the loader or the tests (this machine has no internet). Use it once on
    a machine with network access, e.g. ``python -c "from dpprecond.data.cifar10 import
    download_cifar10; download_cifar10()"``.

    Parameters
    ----------
    root : path-like, optional
        Parent directory to unpack into; default ``$DPPRECOND_DATA`` or ``~/.cache/dpprecond``.
    timeout : float, default=60
        Network timeout in seconds.

    Returns
    -------
    Path
        The ``cifar-10-batches-py`` directory.
    """
    root = default_data_root() if root is None else Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    md5 = hashlib.md5()
    with tempfile.NamedTemporaryFile(dir=root, suffix=".tar.gz", delete=False) as tmp:
        tmp_path = Path(tmp.name)
        try:
            logger.info("downloading %s", CIFAR10_URL)
            with urllib.request.urlopen(CIFAR10_URL, timeout=timeout) as resp:
                while chunk := resp.read(1 << 20):
                    md5.update(chunk)
                    tmp.write(chunk)
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise
    try:
        if md5.hexdigest() != CIFAR10_ARCHIVE_MD5:
            raise ValueError(f"Downloaded archive has MD5 {md5.hexdigest()}, expected "
                             f"{CIFAR10_ARCHIVE_MD5}; the download is corrupt, try again.")
        with tarfile.open(tmp_path, "r:gz") as tar:
            tar.extractall(root, filter="data")
    finally:
        tmp_path.unlink(missing_ok=True)
    return root / CIFAR10_DIRNAME
