"""A user's own labelled data from one file (for ``dpprecond fl`` and the Python API).

- ``.npz``: arrays ``X_train``, ``y_train``, ``X_test``, ``y_test`` (the user's own split),
  or ``X`` and ``y`` (split here, see below); optional scalar ``n_classes``.
- ``.csv``/``.txt``/``.tsv`` (via :func:`dpprecond.data.tabular.load_matrix`): one row per
  record, the label in column ``label_column`` (default: the last), numeric features in the
  others.

When the file has no split, a stratified ``test_fraction`` of the rows is held out by a
fixed rule (a permutation seeded with 0, per class): the split uses no private randomness
and no statistics of the data, so it is the same for every run. Labels must be integers;
``n_classes`` defaults to ``max(label) + 1`` (a file with a class absent from the data
should store ``n_classes``).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from dpprecond.data.base import Dataset
from dpprecond.data.tabular import load_matrix

__all__ = ["load_labelled"]


def _split(X: np.ndarray, y: np.ndarray,
           test_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"Expected test_fraction in (0, 1), got test_fraction="
                         f"{test_fraction!r}.")
    rng = np.random.default_rng(0)  # a fixed, public split rule
    test = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test.append(idx[:round(test_fraction * len(idx))])
    mask = np.zeros(len(y), dtype=bool)
    mask[np.concatenate(test)] = True
    if mask.all() or not mask.any():
        raise ValueError(f"test_fraction={test_fraction} leaves an empty train or test set "
                         f"for {len(y)} rows; change it or store a split in the file.")
    return X[~mask], y[~mask], X[mask], y[mask]


def _labels(where: str, y: np.ndarray) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{where}: labels must be 1-D, got shape {y.shape}.")
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ValueError(f"{where}: labels must be integers, got non-integer values.")
        y = y.astype(np.int64)
    if y.dtype.kind not in "iub":
        raise ValueError(f"{where}: labels must be integers, got dtype {y.dtype}.")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{where}: labels must be >= 0, got {int(y.min())}.")
    return y


def _same_rows(path: Path, x_name: str, X: np.ndarray, y_name: str, y: np.ndarray) -> None:
    if np.ndim(X) < 1 or len(X) != len(y):
        raise ValueError(f"{path}: {x_name} has {np.shape(X)[0] if np.ndim(X) else 0} rows "
                         f"but {y_name} has {len(y)} labels; give one label per row.")


def load_labelled(path: str | os.PathLike, *, label_column: int = -1,
                  test_fraction: float = 0.2) -> Dataset:
    """Load a labelled data set from ``.npz`` or ``.csv`` (see the module docstring).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` (naming the file and
    the fix) for unusable content.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file not found: {path}. Give a .npz or .csv file.")
    if path.suffix.lower() == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise ValueError(f"{path} is not a readable .npz file ({exc}).") from None
        n_classes = int(arrays["n_classes"]) if "n_classes" in arrays else None
        if {"X_train", "y_train", "X_test", "y_test"} <= set(arrays):
            X_tr, y_tr = arrays["X_train"], _labels(f"{path}: y_train", arrays["y_train"])
            X_te, y_te = arrays["X_test"], _labels(f"{path}: y_test", arrays["y_test"])
        elif {"X", "y"} <= set(arrays):
            X, y = arrays["X"], _labels(f"{path}: y", arrays["y"])
            _same_rows(path, "X", X, "y", y)
            X_tr, y_tr, X_te, y_te = _split(X, y, test_fraction)
        else:
            raise ValueError(f"{path} holds {sorted(arrays)}; expected X_train, y_train, "
                             "X_test, y_test (or X and y).")
        for name, X in (("X_train", X_tr), ("X_test", X_te)):
            if X.ndim != 2 or X.dtype.kind not in "biuf":
                raise ValueError(f"{path}: {name} must be a 2-D numeric array, got shape "
                                 f"{X.shape} and dtype {X.dtype}.")
        _same_rows(path, "X_train", X_tr, "y_train", y_tr)
        _same_rows(path, "X_test", X_te, "y_test", y_te)
    elif path.suffix.lower() in (".csv", ".txt", ".tsv"):
        M = load_matrix(path)
        if M.shape[1] < 2:
            raise ValueError(f"{path} has {M.shape[1]} column(s); a labelled file needs the "
                             "features and one label column.")
        col = label_column % M.shape[1]
        y = _labels(f"{path}: column {col}", M[:, col])
        X = np.delete(M, col, axis=1)
        X_tr, y_tr, X_te, y_te = _split(X, y, test_fraction)
        n_classes = None
    else:
        raise ValueError(f"Unsupported labelled data file {path}; expected .npz or .csv.")
    top = int(max(y_tr.max(initial=0), y_te.max(initial=0))) + 1
    n_classes = top if n_classes is None else n_classes
    if top > n_classes:
        raise ValueError(f"{path}: labels up to {top - 1} but n_classes={n_classes}.")
    return Dataset(path.stem, np.asarray(X_tr, dtype=np.float64), y_tr,
                   np.asarray(X_te, dtype=np.float64), y_te, n_classes=max(n_classes, 2))
