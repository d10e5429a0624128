"""Plain numeric matrices from ``.npy`` or ``.csv`` files (for PCA on the user's data).

Every way a file can be unusable ends in one error that names the file, what is wrong and
the fix: ``FileNotFoundError`` when it is absent, ``ValueError`` for its content (empty,
truncated, not the format its suffix says, ragged rows, non-numeric cells, object, text,
date or complex arrays). NaN and infinite values are the one exception: they are read as
they are and left for the caller's validation (:func:`dpprecond._validation.check_array`)
to report with their position.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import numpy as np

from dpprecond.data.base import error_text

logger = logging.getLogger(__name__)

__all__ = ["load_matrix"]

_NPY_MAGIC = b"\x93NUMPY"
_TEXT_SUFFIXES = (".csv", ".txt", ".tsv")
_NUMERIC_KINDS = "biuf"  # booleans are read as 0/1, as scikit-learn does


def load_matrix(path: str | os.PathLike, *, delimiter: str = ",",
                skip_header: bool | None = None) -> np.ndarray:
    """Load a 2-D float matrix from a ``.npy`` or ``.csv``/``.txt``/``.tsv`` file.

    Parameters
    ----------
    path : path-like
        The file. ``.npy`` files are read without unpickling (object arrays are refused);
        text files must be UTF-8 with the same number of numeric values on every line
        (``#`` starts a comment; empty lines are skipped).
    delimiter : str, default=","
        Column separator of text files (``.tsv`` always uses a tab).
    skip_header : bool or None, default=None
        ``None``: the first line is a header (and skipped) when none of its cells is a
        number, e.g. ``a,b,c``; a first line mixing numbers and text is read as data, so a
        damaged first row is reported instead of silently dropped. ``True``/``False`` force.

    Returns
    -------
    ndarray of shape (n, d), float64
        With ``n, d >= 1``. Integer and boolean data are converted (booleans to 0/1).

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    ValueError
        If the file cannot be read as a non-empty numeric matrix; the message names the
        file, the problem (with line and column for text) and the fix.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file not found: {path}. Give the path of an existing "
                                ".npy or .csv file.")
    if skip_header is not None and not isinstance(skip_header, bool):
        raise TypeError(f"Expected skip_header to be None, True or False, got {skip_header!r}.")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = _load_npy(path)
    elif suffix in _TEXT_SUFFIXES:
        arr = _load_text(path, "\t" if suffix == ".tsv" else delimiter, skip_header)
    else:
        raise ValueError(f"Unsupported data file type {suffix!r} for {path}; expected .npy or "
                         ".csv (or .txt/.tsv).")
    if arr.ndim != 2:
        raise ValueError(f"{path} holds an array of shape {arr.shape}; expected a 2-D matrix "
                         "(one row per individual).")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{path} holds an empty matrix of shape {arr.shape}; expected at least "
                         "one row and one column.")
    with np.errstate(over="ignore"):  # long double beyond float64: inf, reported by the caller
        return arr.astype(np.float64, copy=False)


def _load_npy(path: Path) -> np.ndarray:
    with open(path, "rb") as fh:
        head = fh.read(len(_NPY_MAGIC))
    if not head:
        raise ValueError(f"{path} is empty; save the matrix again with numpy.save.")
    if head != _NPY_MAGIC:
        what = "a zip archive (.npz?)" if head.startswith(b"PK") else f"bytes {head!r}"
        raise ValueError(f"{path} is not a .npy file (it starts with {what} instead of the .npy "
                         "magic string); save the matrix with numpy.save(path, X), or give a "
                         ".csv file.")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:
        # The file opened and starts like a .npy (checked above), so what fails is its
        # content: a truncated body (ValueError, EOFError) or a damaged header, which numpy's
        # header parser reports as ValueError, SyntaxError or tokenize.TokenError.
        if isinstance(exc, ValueError) and "allow_pickle" in str(exc):
            raise ValueError(f"{path} holds an object array (Python objects, pickled), which is "
                             "never loaded (unsafe); save a numeric array instead: "
                             "numpy.save(path, X.astype(float)).") from None
        raise ValueError(f"{path} is not a readable .npy file ({error_text(exc)}); the file is "
                         "truncated or corrupt, save the matrix again with numpy.save.") from None
    kind = arr.dtype.kind
    if kind == "c":
        raise ValueError(f"{path} holds complex numbers (dtype {arr.dtype}); the library works "
                         "on real data: save np.real(X) if the imaginary part is zero, or the "
                         "real and imaginary parts as separate columns.")
    if kind not in _NUMERIC_KINDS:
        raise ValueError(f"{path} holds non-numeric data of dtype {arr.dtype}; save a numeric "
                         "matrix (floats, integers or booleans).")
    return arr


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline()
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> ValueError:
    return ValueError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} cannot be "
                      "decoded); save it as UTF-8 CSV, or as .npy.")


def _load_text(path: Path, delimiter: str, skip_header: bool | None) -> np.ndarray:
    if skip_header is None:
        cells = [c.strip() for c in _first_line(path).split("#", 1)[0].split(delimiter)]
        cells = [c for c in cells if c]
        skip_header = bool(cells) and not any(_is_number(c) for c in cells)
        if skip_header:  # say so: a dropped first row must never go unnoticed
            line = _first_line(path).strip()
            logger.warning("%s: line 1 (%s) has no number and was skipped as a header; pass "
                           "skip_header=False to read it as data.", path,
                           line if len(line) <= 60 else line[:57] + "...")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            arr = np.loadtxt(path, delimiter=delimiter, skiprows=int(skip_header), ndmin=2,
                             dtype=np.float64, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None
    except ValueError as exc:
        problem = _diagnose_text(path, delimiter, int(skip_header)) or str(exc)
        header = ("the first line was read as a header; " if skip_header else
                  "if line 1 is a header, pass skip_header=True; ")
        raise ValueError(f"{path} is not a numeric matrix: {problem}. Every line needs the same "
                         f"number of numbers separated by {delimiter!r} ({header}NaN/inf are "
                         "read and refused later).") from None
    if arr.shape[0] == 0:
        what = "only a header line" if skip_header else "no lines with data"
        raise ValueError(f"{path} holds {what}; expected one row of numbers per individual.")
    return arr


def _diagnose_text(path: Path, delimiter: str, skip: int) -> str | None:
    """The first line and column that ``np.loadtxt`` cannot read, in words (or ``None``)."""
    width, width_line = None, 0
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            content = line.split("#", 1)[0]
            if lineno <= skip or not content.strip("\r\n"):
                continue  # np.loadtxt skips empty and comment-only lines, not blank ones
            if not content.strip():
                return f"line {lineno} holds only spaces (delete it or leave it empty)"
            cells = [c.strip() for c in content.split(delimiter)]
            for col, cell in enumerate(cells, start=1):
                if not cell:
                    return (f"line {lineno}, column {col} is empty (a missing value or a "
                            f"trailing {delimiter!r})")
                if not _is_number(cell):
                    other = [d for d in (",", ";", "\t", "|") if d != delimiter and d in cell]
                    hint = f" (is the file {other[0]!r}-separated?)" if other else ""
                    return f"line {lineno}, column {col}: {cell!r} is not a number{hint}"
            if width is None:
                width, width_line = len(cells), lineno
            elif len(cells) != width:
                return (f"line {lineno} has {len(cells)} values but line {width_line} has "
                        f"{width}")
    return None
