"""PathMNIST (MedMNIST v2) from MedMNIST's ``pathmnist.npz``.

The file (https://medmnist.com/, Zenodo record of MedMNIST v2) is a numpy ``.npz`` archive
with ``train_images`` (89996, 28, 28, 3) uint8, ``train_labels`` (89996, 1), ``val_images``
(10004, 28, 28, 3), ``val_labels``, ``test_images`` (7180, 28, 28, 3) and ``test_labels``:
colon-pathology tissue patches in 9 classes.

Split decision: by default the official validation split is NOT merged into the training
set. The DP-FedSOFIM paper reports a train/test protocol, and MedMNIST's own train split
is the one its benchmark (and the usual ``PathMNIST(split="train")`` loaders) train on, so
``X_train`` is the 89996 official training images and ``X_test`` the 7180 test images. The
validation images are not used (this project tunes nothing on held-out data).
``merge_val=True`` appends them to the training set (100000 images) for users who want
every labelled example in training.

The larger MedMNIST+ files (``pathmnist_64.npz`` etc.) have the same keys; pass the file
itself as ``path`` and ``image_shape`` follows the stored size.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dpprecond.data.base import Dataset, check_file_labels, default_data_root, error_text

__all__ = ["PATHMNIST_FILENAME", "PATHMNIST_KEYS", "default_pathmnist_file", "load_pathmnist"]

logger = logging.getLogger(__name__)

PATHMNIST_FILENAME = "pathmnist.npz"
PATHMNIST_URL = "https://medmnist.com/"
PATHMNIST_KEYS = ("train_images", "train_labels", "val_images", "val_labels",
                  "test_images", "test_labels")
_N_CLASSES = 9


def default_pathmnist_file() -> Path:
    """Default file: ``$DPPRECOND_DATA/pathmnist.npz``.

    Without the ``DPPRECOND_DATA`` environment variable: ``~/.cache/dpprecond/pathmnist.npz``.
    """
    return default_data_root() / PATHMNIST_FILENAME


def _resolve_file(path: str | os.PathLike | None) -> Path:
    target = default_pathmnist_file() if path is None else Path(path).expanduser()
    if target.is_dir():
        target = target / PATHMNIST_FILENAME
    if not target.is_file():
        raise FileNotFoundError(
            f"PathMNIST not found: no file {target}. Expected MedMNIST's '{PATHMNIST_FILENAME}' "
            f"(keys {', '.join(PATHMNIST_KEYS)}). Download it from MedMNIST v2 (the Zenodo record "
            f"linked from {PATHMNIST_URL}, or `pip install medmnist` then `python -m medmnist "
            "download`), then pass the file (or "
            f"its directory) as path, or put it at {default_pathmnist_file()} (the default; the "
            "environment variable DPPRECOND_DATA sets its directory).")
    return target


_REFETCH = "download pathmnist.npz again"
# What reading a damaged .npz raises (found by fuzzing): zipfile's BadZipFile (directory,
# header, CRC), zlib.error (deflate data), EOFError/OSError (truncation),
# NotImplementedError (flag bits claiming an unknown compression or encryption),
# RuntimeError (a password), and numpy's ValueError (a truncated .npy member). The readers
# below catch every Exception once the file has opened: all of them mean damaged content.


def _open_archive(fh: BinaryIO, file: Path) -> np.lib.npyio.NpzFile:
    """``np.load`` of the open zip archive ``fh``; anything else is a ``ValueError``.

    The caller opens (and closes) the file: ``np.load(path)`` leaks its file handle when the
    zip directory is damaged.
    """
    head = fh.read(6)
    fh.seek(0)
    if not head:
        raise ValueError(f"{file} is empty, not a readable .npz archive; {_REFETCH}.")
    if head == b"\x93NUMPY":
        raise ValueError(f"{file} holds a single array (.npy), not the MedMNIST .npz archive "
                         f"with keys {', '.join(PATHMNIST_KEYS)}.")
    if not head.startswith(b"PK"):
        raise ValueError(f"{file} is not a readable .npz archive (a .npz is a zip file; this one "
                         f"starts with {head!r}); {_REFETCH}.")
    try:
        return np.load(fh, allow_pickle=False)
    except Exception as exc:  # the file opened: any failure is its content (see above)
        raise ValueError(f"{file} is not a readable .npz archive: the zip file is truncated or "
                         f"corrupt ({error_text(exc)}); {_REFETCH}.") from None


def _member(archive: np.lib.npyio.NpzFile, key: str, file: Path) -> np.ndarray:
    """One array of the archive (members are read lazily: corruption shows up here)."""
    try:
        value = archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(f"{file}: {key} holds Python objects (a pickled object array), "
                             "which are never loaded (unsafe); expected a numeric array as "
                             f"in MedMNIST's {PATHMNIST_FILENAME}.") from None
        raise _unreadable_member(file, key, exc) from None
    except Exception as exc:
        # The file itself opened (its first bytes were read above), so what fails here is
        # its content: besides the errors listed above, a damaged .npy header inside the
        # archive raises tokenize.TokenError or SyntaxError from numpy's header parser.
        raise _unreadable_member(file, key, exc) from None
    if not isinstance(value, np.ndarray):  # NpzFile returns raw bytes for a non-.npy member
        raise ValueError(f"{file}: {key} is not a .npy array; the archive is corrupt or not "
                         f"MedMNIST's, {_REFETCH}.")
    return value


def _unreadable_member(file: Path, key: str, exc: Exception) -> ValueError:
    return ValueError(f"{file}: cannot read {key} ({error_text(exc)}); the archive is truncated "
                      f"or corrupt, {_REFETCH}.")


def _split(archive: np.lib.npyio.NpzFile, split: str,
           path: Path) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    images = _member(archive, f"{split}_images", path)
    labels = _member(archive, f"{split}_labels", path)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ValueError(f"{path}: {split}_images must be uint8 of shape (N, H, W, 3), got "
                         f"{images.dtype} {images.shape}.")
    if images.shape[0] == 0 or images.shape[1] == 0 or images.shape[2] == 0:
        raise ValueError(f"{path}: {split}_images holds no pixels (shape {images.shape}); "
                         f"expected N >= 1 images of H x W >= 1 x 1, {_REFETCH}.")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{path}: {split}_labels must have shape ({images.shape[0]}, 1) or "
                         f"({images.shape[0]},), got {labels.shape}.")
    labels = check_file_labels(f"{path}: {split}_labels", labels, _N_CLASSES)
    X = images.reshape(images.shape[0], -1).astype(np.float64)
    X /= 255.0
    return X, labels, tuple(int(s) for s in images.shape[1:])


def load_pathmnist(path: str | os.PathLike | None = None, *, merge_val: bool = False) -> Dataset:
    """Load PathMNIST (9 tissue classes, 28x28 RGB by default).

    Parameters
    ----------
    path : path-like, optional
        ``pathmnist.npz`` itself or the directory holding it. Default:
        ``$DPPRECOND_DATA/pathmnist.npz``, else ``~/.cache/dpprecond/pathmnist.npz``.
    merge_val : bool, default=False
        Append the official validation split to the training set. Off by default: the
        train/test protocol of the paper and of MedMNIST (see the module docstring).

    Returns
    -------
    Dataset
        ``name="pathmnist"``, ``X_*`` float64 in [0, 1] of shape (n, H*W*3), rows flattened
        row-major in (height, width, channel) order (the npz's own layout), ``y_*`` int64 in
        0..8, ``n_classes=9``, ``image_shape=(H, W, 3)`` (``(28, 28, 3)`` for pathmnist.npz).

    Raises
    ------
    FileNotFoundError
        If the file is absent; the message says where to put it.
    ValueError
        If the file is not a MedMNIST archive (empty, not a zip, truncated or corrupt,
        missing keys, object arrays, empty splits, wrong shapes, dtypes or labels); the
        message names the file and the key.
    """
    file = _resolve_file(path)
    logger.info("loading PathMNIST from %s", file)
    with open(file, "rb") as fh, _open_archive(fh, file) as archive:
        needed = PATHMNIST_KEYS if merge_val else tuple(k for k in PATHMNIST_KEYS
                                                        if not k.startswith("val_"))
        missing = [k for k in needed if k not in archive.files]
        if missing:
            raise ValueError(f"{file} lacks key(s) {', '.join(missing)} (found "
                             f"{', '.join(archive.files) or 'none'}); expected MedMNIST's "
                             f"{PATHMNIST_FILENAME} with keys {', '.join(PATHMNIST_KEYS)}.")
        X_train, y_train, shape = _split(archive, "train", file)
        X_test, y_test, shape_te = _split(archive, "test", file)
        shapes = {"train": shape, "test": shape_te}
        if merge_val:
            X_val, y_val, shapes["val"] = _split(archive, "val", file)
    if len(set(shapes.values())) != 1:
        raise ValueError(f"{file}: the splits hold images of different sizes {shapes}.")
    if merge_val:
        X_train = np.concatenate([X_train, X_val])
        y_train = np.concatenate([y_train, y_val])
    return Dataset("pathmnist", X_train, y_train, X_test, y_test, n_classes=_N_CLASSES,
                   image_shape=shape)
