"""The one in-memory format every loader returns."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Dataset", "check_file_labels", "default_data_root", "error_text"]


def default_data_root() -> Path:
    """Where loaders look for data files by default.

    ``$DPPRECOND_DATA`` when set, else ``~/.cache/dpprecond``. Nothing is downloaded there
    implicitly: users put the files there (or pass a path).
    """
    env = os.environ.get("DPPRECOND_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpprecond"


def error_text(exc: BaseException, limit: int = 160) -> str:
    """``"Type: message"`` of a low-level exception, shortened to quote in an error message.

    Readers of damaged files get messages that can quote kilobytes of binary garbage; the
    start is enough to tell what went wrong.
    """
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_FILE_FIX = "the file is corrupt or not in the expected format"


def check_file_labels(where: str, labels: np.ndarray, n_classes: int, *,
                      fix: str = _FILE_FIX) -> np.ndarray:
    """Labels read from a data file: integers in ``[0, n_classes)``, returned as int64.

    ``where`` names the file and field in the error message, ``fix`` ends it. Any dtype
    other than integers (floats, booleans, text, objects) means the file is not in the
    expected format: ``ValueError``, as for any other corrupt content.
    """
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise ValueError(f"{where} must be integers in [0, {n_classes}), got dtype "
                         f"{labels.dtype}; {fix}.")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{where} must be integers in [0, {n_classes}), got values in "
                         f"[{labels.min()}, {labels.max()}]; {fix}.")
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
        Class labels in ``[0, n_classes)`` (checked: an integer dtype and the range).
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
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, numbers.Integral):
            raise TypeError(f"Dataset {self.name!r}: n_classes must be an integer, got "
                            f"{self.n_classes!r}.")
        if self.n_classes < 1:
            raise ValueError(f"Dataset {self.name!r}: n_classes must be >= 1, got "
                             f"{self.n_classes}.")
        for split in ("train", "test"):
            X, y = getattr(self, f"X_{split}"), getattr(self, f"y_{split}")
            if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
                raise ValueError(f"Dataset {self.name!r}: X_{split} {X.shape} and "
                                 f"y_{split} {y.shape} do not match (expected (n, d) and (n,)).")
            check_file_labels(f"Dataset {self.name!r}: y_{split}", y, self.n_classes,
                              fix="encode the classes as 0..n_classes-1 or raise n_classes")
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
