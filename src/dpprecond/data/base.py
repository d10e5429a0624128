"""The one in-memory format every loader returns."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Dataset", "check_file_labels", "default_data_root"]


def default_data_root() -> Path:
    """Where loaders look for data files by default.

    ``$DPPRECOND_DATA`` when set, else ``~/.cache/dpprecond``. Nothing is downloaded there
    implicitly: users put the files there (or pass a path).
    """
    env = os.environ.get("DPPRECOND_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpprecond"


def check_file_labels(where: str, labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Labels read from a data file: integers in ``[0, n_classes)``, returned as int64.

    ``where`` names the file and field in the error message.
    """
    if labels.size and (not np.issubdtype(labels.dtype, np.integer)
                        or labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{where} must be integers in [0, {n_classes}), got dtype "
                         f"{labels.dtype} with range [{labels.min()}, {labels.max()}].")
    return labels.astype(np.int64)


@dataclass(frozen=True)
class Dataset:
    """A labelled train/test split.

    Attributes
    ----------
    name : str
        Dataset name (with the feature kind appended by feature extractors).
    X_train, X_test : ndarray of shape (n, d), float64
        Features. For image data straight from a loader: pixels scaled to [0, 1] and
        flattened row-major in (height, width, channels) order.
    y_train, y_test : ndarray of shape (n,), int64
        Class labels in ``[0, n_classes)``.
    n_classes : int
        Number of classes.
    image_shape : tuple of int or None
        ``(height, width, channels)`` when the rows are images, else ``None``.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            X, y = getattr(self, f"X_{split}"), getattr(self, f"y_{split}")
            if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
                raise ValueError(f"Dataset {self.name!r}: X_{split} {X.shape} and "
                                 f"y_{split} {y.shape} do not match (expected (n, d) and (n,)).")
        if self.X_train.shape[1] != self.X_test.shape[1]:
            raise ValueError(f"Dataset {self.name!r}: train has {self.X_train.shape[1]} features "
                             f"but test has {self.X_test.shape[1]}.")

    @property
    def n_features(self) -> int:
        """Number of columns of X."""
        return int(self.X_train.shape[1])

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, train={self.X_train.shape}, test={self.X_test.shape}, "
                f"n_classes={self.n_classes})")
