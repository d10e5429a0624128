"""Plain numeric matrices from ``.npy`` or ``.csv`` files (for PCA on the user's data)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["load_matrix"]


def load_matrix(path: str | os.PathLike, *, delimiter: str = ",",
                skip_header: bool | None = None) -> np.ndarray:
    """Load a 2-D float matrix from a ``.npy`` or ``.csv``/``.txt`` file.

    For CSV, a first line that does not parse as numbers is taken as a header and skipped
    (``skip_header=None``); pass ``True``/``False`` to force. Non-finite values are left in
    place for the caller's validation to report.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file not found: {path}. Give the path of an existing "
                                ".npy or .csv file.")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
    elif suffix in (".csv", ".txt", ".tsv"):
        if suffix == ".tsv":
            delimiter = "\t"
        if skip_header is None:
            with open(path, encoding="utf-8") as fh:
                first = fh.readline()
            try:
                [float(x) for x in first.strip().split(delimiter) if x.strip()]
                skip_header = False
            except ValueError:
                skip_header = True
        arr = np.loadtxt(path, delimiter=delimiter, skiprows=int(skip_header), ndmin=2,
                         dtype=np.float64)
    else:
        raise ValueError(f"Unsupported data file type {suffix!r} for {path}; expected .npy or "
                         ".csv (or .txt/.tsv).")
    if arr.ndim != 2:
        raise ValueError(f"{path} holds an array of shape {arr.shape}; expected a 2-D matrix "
                         "(one row per individual).")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{path} holds non-numeric data of dtype {arr.dtype}.")
    return arr.astype(np.float64, copy=False)
