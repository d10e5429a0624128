"""Validation of user input at the library boundary.

Every public entry point calls these helpers once, before any computation, so that a bad
value fails fast with a message that names the parameter, the value received and what is
expected. Values give ``ValueError``; wrong types give ``TypeError``. Nothing here asserts.
Every checker takes the parameter's name first, then its value (``check_int("k", k,
low=1)``, ``check_epsilon("target_epsilon", target_epsilon)``), and returns the checked
value.
"""

from __future__ import annotations

import datetime
import math
import numbers
import sys
import warnings
from collections.abc import Iterable
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "MAX_DELTA",
    "LargeDeltaWarning",
    "SeedLike",
    "check_array",
    "check_choice",
    "check_delta",
    "check_epsilon",
    "check_fraction",
    "check_int",
    "check_labels",
    "check_matrix_lazy",
    "check_positive",
    "check_random_state",
    "check_seed",
    "check_target_delta",
    "is_dask_array",
]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(name: str, value: Any, *, allow_zero: bool = False,
                   allow_inf: bool = False) -> float:
    """Return ``value`` as a float after checking that it is a finite positive real.

    Parameters
    ----------
    name : str
        Parameter name used in the error message.
    value : object
        The value to check.
    allow_zero : bool, default=False
        Accept ``0``.
    allow_inf : bool, default=False
        Accept ``+inf`` (for example a clip radius meaning "no clipping").
    """
    if not _is_real(value):
        raise TypeError(f"Expected {name} to be a real number, got {value!r} "
                        f"of type {type(value).__name__}.")
    v = float(value)
    if np.isnan(v):
        raise ValueError(f"Expected {name} to be a number, got {name}=nan.")
    if np.isinf(v) and not (allow_inf and v > 0):
        raise ValueError(f"Expected a finite {name}, got {name}={v}.")
    if v < 0 or (v == 0 and not allow_zero):
        op = ">=" if allow_zero else ">"
        raise ValueError(f"Expected {name} {op} 0, got {name}={value!r}.")
    return v


def check_epsilon(name: str, value: Any) -> float:
    """Check a privacy parameter epsilon: a finite real > 0."""
    if _is_real(value) and float(value) <= 0:
        raise ValueError(
            f"Expected {name} > 0, got {name}={value!r}. A smaller epsilon is more private; "
            "for a non-private run use the non-private method instead of epsilon <= 0.")
    return check_positive(name, value)


def check_delta(name: str, value: Any) -> float:
    """Check a privacy parameter delta: a real in the open interval (0, 1)."""
    if not _is_real(value):
        raise TypeError(f"Expected {name} to be a real number in (0, 1), got {value!r}.")
    v = float(value)
    if not (0.0 < v < 1.0):
        raise ValueError(
            f"Expected {name} in the open interval (0, 1), got {name}={value!r}. "
            "A common choice is delta well below 1/n, e.g. 1e-6.")
    return v


#: The largest delta a privacy target may have. Delta is the probability that the
#: guarantee fails outright: a mechanism that publishes every record in the clear with
#: probability delta is (0, delta)-DP, and one that publishes each record with probability
#: delta exposes about n * delta of them. Above 0.01 that is at least one record for any
#: data set of more than 100 rows, so such a target is refused, not warned about.
MAX_DELTA = 0.01


class LargeDeltaWarning(UserWarning):
    """A privacy target's delta is above ``1/n`` for the ``n`` records it protects."""


def check_target_delta(name: str, value: Any, n_records: int | None = None) -> float:
    """Check the delta of a privacy target: in (0, :data:`MAX_DELTA`], and below ``1/n``.

    A delta outside (0, 1) or above :data:`MAX_DELTA` raises ``ValueError`` naming
    ``name`` and the value. With ``n_records`` (the number of records the guarantee
    protects: the rows of the data, or every client's records), a delta above
    ``1 / n_records`` warns (:class:`LargeDeltaWarning`): the guarantee would allow a
    mechanism that publishes about ``n delta >= 1`` records in the clear. ``n_records`` is
    the size of the data set, which this check treats as public (it is the caller's own
    data; the warning goes to the caller, nothing is released).
    """
    v = check_delta(name, value)
    if v > MAX_DELTA:
        raise ValueError(
            f"{name}={value!r} is too large to protect anyone: delta is the probability that "
            f"the guarantee fails outright, and a target must have delta at most {MAX_DELTA:g} "
            "(and below 1/n for n records). Use a delta well below 1/n, e.g. 1e-6.")
    if n_records is not None and n_records > 0 and v > 1.0 / n_records:
        warnings.warn(
            f"{name}={v:g} is above 1/n = 1/{n_records} for the n = {n_records} records it "
            "protects: a guarantee with this delta allows publishing each record in the clear "
            f"with probability delta, about n * delta = {n_records * v:.3g} records. n, the "
            "size of the data, is treated as public here. Choose delta below 1/n (e.g. "
            f"{_suggest_delta(n_records):g}).",
            LargeDeltaWarning, stacklevel=3)
    return v


def _suggest_delta(n: int) -> float:
    """A power of ten at least ten times below ``1/n``."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * n)))


def check_fraction(name: str, value: Any, *, low: float = 0.0, high: float = 1.0,
                   low_open: bool = False, high_open: bool = True) -> float:
    """Check a real in an interval; the brackets of the message follow the openness flags."""
    if not _is_real(value):
        raise TypeError(f"Expected {name} to be a real number, got {value!r}.")
    v = float(value)
    lo_ok = v > low if low_open else v >= low
    hi_ok = v < high if high_open else v <= high
    if np.isnan(v) or not (lo_ok and hi_ok):
        lb = "(" if low_open else "["
        rb = ")" if high_open else "]"
        raise ValueError(f"Expected {name} in {lb}{low}, {high}{rb}, got {name}={value!r}.")
    return v


def check_int(name: str, value: Any, *, low: int | None = None,
              high: int | None = None) -> int:
    """Check an integer (numpy integers accepted, bools refused) within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected {name} to be an integer, got {value!r} "
                        f"of type {type(value).__name__}.")
    v = int(value)
    if low is not None and v < low:
        raise ValueError(f"Expected {name} >= {low}, got {name}={v}.")
    if high is not None and v > high:
        raise ValueError(f"Expected {name} <= {high}, got {name}={v}.")
    return v


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices``."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"Unknown {name}={value!r}; expected one of {options}.")
    return value


# Non-numeric dtype kinds (numpy ``dtype.kind``) and what to say about them.
_NON_NUMERIC_KINDS = {
    "U": ("text", "parse the values first (np.asarray({name}, dtype=float) if they are numbers "
                  "written as text) or encode categories as numbers"),
    "S": ("bytes", "decode and parse the values first, or encode categories as numbers"),
    "T": ("text", "parse the values first, or encode categories as numbers"),
    "M": ("dates", "convert them to numbers explicitly first (e.g. seconds since an epoch)"),
    "m": ("time spans", "convert them to numbers explicitly first (e.g. "
                        "{name} / np.timedelta64(1, 's') for seconds)"),
    "V": ("structured or raw bytes", "pass a plain numeric array (for a structured array, "
                                     "numpy.lib.recfunctions.structured_to_unstructured)"),
}
_DATE_TYPES = (np.datetime64, np.timedelta64, datetime.date, datetime.time, datetime.timedelta)


def _refuse_complex(name: str, dtype: Any) -> NoReturn:
    raise ValueError(f"Complex data not supported in {name} (dtype {dtype}): the library works "
                     f"on real numbers. Pass np.real({name}) if the imaginary part is zero, or "
                     "the real and imaginary parts as separate columns.")


def _refuse_dtype(name: str, dtype: Any) -> NoReturn:
    what, fix = _NON_NUMERIC_KINDS.get(np.dtype(dtype).kind, ("non-numeric", "convert it to "
                                                              "numbers first"))
    raise TypeError(f"Expected {name} to be a numeric array, got dtype {dtype} ({what}); "
                    f"{fix.format(name=name)}.")


def _check_object_elements(name: str, arr: np.ndarray) -> None:
    """Refuse the element types an object array must not smuggle in as numbers.

    ``float()`` would accept ``"1.5"``, ``b"2"``, ``np.datetime64`` and ``np.timedelta64``
    (the latter is a numpy integer); complex elements are refused like complex arrays. Other
    non-numbers are left to the float conversion: ``None`` becomes NaN (reported as a missing
    value), a dict or a date fails with an error that names its type.
    """
    for t in {type(v) for v in arr.flat}:
        if issubclass(t, (str, bytes)):
            raise TypeError(f"Expected {name} to be a numeric array, got an object array "
                            f"holding text ({t.__name__}); parse the values first or encode "
                            "categories as numbers.")
        if issubclass(t, _DATE_TYPES):
            raise TypeError(f"Expected {name} to be a numeric array, got an object array "
                            f"holding dates or times ({t.__name__}); convert them to numbers "
                            "explicitly first.")
        if issubclass(t, numbers.Complex) and not issubclass(t, numbers.Real):
            _refuse_complex(name, f"object holding {t.__name__}")


def check_array(name: str, value: Any, *, ndim: int | None = 2, min_rows: int = 1,
                dtype: type = np.float64, copy: bool = False) -> np.ndarray:
    """Convert to a finite float array of the given number of dimensions.

    Accepted: arrays (and nested sequences) of floats, integers and booleans; booleans are
    read as 0/1, as scikit-learn does. Object arrays are accepted when every element is a
    real number (Python or numpy int/float/bool, ``Decimal``, ``Fraction``).

    Refused, before any conversion: text (``str``/``bytes``), dates and time spans
    (``datetime64``/``timedelta64``, ``datetime`` objects), structured dtypes and other
    non-numbers with ``TypeError``; complex data with ``ValueError`` (scikit-learn's
    convention; casting would drop the imaginary part); sparse matrices (``TypeError``) and
    masked arrays with masked entries (``ValueError``). After conversion: NaN and infinity
    (naming how many entries and the first position), values beyond the float64 range, a
    wrong number of dimensions and fewer than ``min_rows`` rows, all with ``ValueError``.
    The input is never changed.

    Parameters
    ----------
    name : str
        Parameter name used in error messages.
    value : array-like
        The data.
    ndim : int or None, default=2
        Required number of dimensions (``None``: any).
    min_rows : int, default=1
        Minimum length of the first axis.
    dtype : type, default=np.float64
        Floating dtype of the result.
    copy : bool, default=False
        Always return a new array (else the input may be returned when it already fits).
    """
    if value is None:
        raise TypeError(f"Expected {name} to be a numeric array, got None.")
    if hasattr(value, "toarray") or type(value).__module__.startswith("scipy.sparse"):
        raise TypeError(f"Sparse input is not supported for {name} (got "
                        f"{type(value).__name__}); convert it with {name}.toarray() first.")
    if isinstance(value, np.ma.MaskedArray):
        n_masked = int(np.ma.getmaskarray(value).sum())
        if n_masked:
            raise ValueError(f"{name} is a masked array with {n_masked} masked entries, whose "
                             f"values would be used as data; fill them ({name}.filled(...)) or "
                             "drop their rows first.")
        value = value.data
    try:
        src = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Expected {name} to be a numeric array, got {type(value).__name__}: "
                        f"{exc}") from None
    kind = src.dtype.kind
    if kind == "c":
        _refuse_complex(name, src.dtype)
    if kind == "O":
        _check_object_elements(name, src)
    elif kind not in "biuf":
        _refuse_dtype(name, src.dtype)
    try:
        with np.errstate(over="ignore"):  # reported below as values beyond the range
            arr: np.ndarray = np.array(src, dtype=dtype, copy=copy or None)
    except OverflowError as exc:
        raise ValueError(f"{name} holds a number too large for {np.dtype(dtype).name} ({exc}); "
                         "rescale the data first.") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Expected {name} to be a numeric array, got {type(value).__name__}: "
                        f"{exc}") from None
    if ndim is not None and arr.ndim != ndim:
        hint = " Reshape 1-D data with X.reshape(-1, 1) or X.reshape(1, -1)." if ndim == 2 else ""
        raise ValueError(f"Expected {name} to be a {ndim}-D array, got shape {arr.shape}.{hint}")
    if arr.ndim >= 1 and arr.shape[0] < min_rows:
        raise ValueError(f"Expected {name} to have at least {min_rows} rows, "
                         f"got shape {arr.shape}.")
    if arr.size and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))
        first = tuple(int(i) for i in bad[0])
        if kind == "f" and np.isfinite(src[first]):
            raise ValueError(f"{name} holds {len(bad)} entries beyond the {np.dtype(dtype).name} "
                             f"range (first at index {first}: {src[first]}); rescale the data "
                             "first.")
        raise ValueError(f"{name} contains {len(bad)} NaN or infinite entries (first at index "
                         f"{first}); remove or impute them first.")
    return arr


def _fmt(v: Any) -> str:
    return str(int(v)) if float(v).is_integer() and abs(float(v)) < 2**63 else f"{float(v):g}"


def is_dask_array(value: Any) -> bool:
    """Whether ``value`` is a ``dask.array.Array`` (without importing dask).

    A dask array can only exist once ``dask.array`` is imported, so the check looks it up
    in ``sys.modules``: ``import dpprecond`` never imports dask.
    """
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(value, module.Array)


def _check_dask_blocks(name: str, value: Any) -> None:
    """A dask array's dtype, block type and shape, without computing anything."""
    kind = value.dtype.kind
    if kind == "c":
        _refuse_complex(name, value.dtype)
    if kind not in "biuf":  # object blocks cannot be checked element by element lazily
        _refuse_dtype(name, value.dtype)
    meta = getattr(value, "_meta", None)
    if isinstance(meta, np.ma.MaskedArray):
        raise TypeError(f"{name} is a dask array of masked arrays, whose masked values would "
                        f"be used as data; fill them first ({name} = dask.array.ma.filled("
                        f"{name}, value)) or drop their rows.")
    if meta is not None and type(meta) is not np.ndarray:
        raise TypeError(f"{name} is a dask array of {type(meta).__module__}."
                        f"{type(meta).__name__} blocks; the passes read numpy blocks: convert "
                        f"them first ({name}.map_blocks(lambda b: b.toarray()) for sparse "
                        "blocks, or dask.array.asarray on host memory).")
    if any(math.isnan(s) for s in value.shape):
        raise ValueError(f"{name} is a dask array of unknown shape {value.shape} (unknown "
                         f"chunk sizes); call {name}.compute_chunk_sizes() first.")


def check_matrix_lazy(name: str, value: Any, *, min_rows: int = 1) -> Any:
    """A 2-D numeric matrix, checked without reading (or copying) its values.

    A numpy array (a memory-mapped one included) or a dask array of a real dtype (bool,
    int, float) is returned as it is: its values are checked for NaN and infinity block
    by block by the pass that reads them (:class:`dpprecond.pca.rows.ClippedRows`, or
    :class:`dpprecond.adapters.dask.DaskRows` on the dask workers), so a large input is
    never converted or copied whole. Anything else (lists, object arrays, other types)
    goes through :func:`check_array`, with its messages.
    """
    lazy = isinstance(value, np.ndarray) and not isinstance(value, np.ma.MaskedArray) \
        and value.dtype.kind in "biuf"
    if is_dask_array(value):
        _check_dask_blocks(name, value)
        lazy = True
    if lazy:
        if value.ndim != 2:
            raise ValueError(f"Expected {name} to be a 2-D array, got {value.ndim}-D array of "
                             f"shape {value.shape}. Reshape your data with "
                             f"{name}.reshape(-1, 1) for a single feature or "
                             f"{name}.reshape(1, -1) for a single row.")
        if value.shape[0] < min_rows:
            raise ValueError(f"Expected {name} to have at least {min_rows} rows, "
                             f"got shape {value.shape}.")
        return value
    return check_array(name, value, ndim=2, min_rows=min_rows)


def check_labels(name: str, y: Any, n_classes: int | None = None,
                 n_rows: int | None = None) -> np.ndarray:
    """Check integer class labels in ``[0, n_classes)``, one per row; return them as int64.

    Accepted: integer and boolean arrays (booleans as 0/1) and float arrays that hold whole
    numbers exactly (labels read from a text file). Refused: text, dates, objects
    (``TypeError``: encode the classes as ``0..n_classes-1`` first); complex, NaN, infinite
    or fractional values, labels outside ``[0, n_classes)``, a shape other than
    ``(n_rows,)`` (``ValueError``).

    Parameters
    ----------
    name : str
        Parameter name used in error messages.
    y : array-like of shape (n,)
        The labels.
    n_classes : int or None, default=None
        Number of classes (an int >= 1). ``None`` checks only that labels are >= 0 (for
        example to group examples by class before the number of classes is known).
    n_rows : int or None, default=None
        Required number of labels (one per row of the data).
    """
    if n_classes is not None:
        n_classes = check_int("n_classes", n_classes, low=1)
    if isinstance(y, np.ma.MaskedArray) and np.ma.getmaskarray(y).any():
        raise ValueError(f"{name} is a masked array with masked entries; drop those rows first.")
    arr = np.asarray(y)
    kind = arr.dtype.kind
    if kind == "c":
        raise ValueError(f"Expected integer class labels in {name}, got complex dtype "
                         f"{arr.dtype}; encode the classes as 0..n_classes-1.")
    if kind not in "biuf":
        raise TypeError(f"Expected integer class labels in {name}, got dtype {arr.dtype}; encode "
                        "the classes as 0..n_classes-1 first (np.unique(y, "
                        "return_inverse=True)[1] does it).")
    if arr.ndim != 1:
        raise ValueError(f"Expected {name} to be 1-D, got shape {arr.shape}.")
    if n_rows is not None and arr.shape[0] != n_rows:
        raise ValueError(f"Expected {name} to have {n_rows} entries (one per row), "
                         f"got {arr.shape[0]}.")
    if not arr.size:
        return arr.astype(np.int64)
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.floor(arr)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"Expected integer class labels in {name}, got {bad.size} "
                             f"non-integer or non-finite value(s), first {name}[{i}]="
                             f"{arr[i].item()!r} (dtype "
                             f"{arr.dtype}).")
    lo, hi = arr.min(), arr.max()
    if n_classes is not None and (lo < 0 or hi >= n_classes):
        raise ValueError(f"Expected {name} in [0, {n_classes}), got values in "
                         f"[{_fmt(lo)}, {_fmt(hi)}]; encode classes as 0..n_classes-1 or "
                         "raise n_classes.")
    if n_classes is None and (lo < 0 or hi >= 2**63):
        raise ValueError(f"Expected {name} to be class labels 0, 1, 2, ..., got values in "
                         f"[{_fmt(lo)}, {_fmt(hi)}]; encode classes as 0..n_classes-1.")
    return arr.astype(np.int64, copy=False)


#: What every entry point accepts as ``seed`` (``None``: fresh OS entropy).
SeedLike = int | np.random.SeedSequence | np.random.Generator | None


def check_seed(name: str, seed: Any) -> np.random.SeedSequence:
    """The root ``SeedSequence`` of a run: the library's one seed checker.

    Accepts ``None``, an int ``>= 0``, a ``SeedSequence``, a numpy ``Generator`` or (for
    scikit-learn compatibility) a ``np.random.RandomState``. ``None`` (the default of every
    entry point) draws fresh entropy from the operating system, so the noise of a release
    cannot be predicted. A fixed seed is for reproducible research: anyone who knows it can
    regenerate the noise, so never publish a release made with a seed you also publish. A
    ``Generator`` contributes a child of its seed sequence (it is advanced, like spawning);
    a ``RandomState`` contributes a seed drawn from it (advancing it, as scikit-learn's own
    helpers do). ``name`` is the parameter the errors name.
    """
    if seed is None:
        return np.random.SeedSequence()
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, np.random.Generator):
        seq = seed.bit_generator.seed_seq
        if isinstance(seq, np.random.SeedSequence):
            return seq.spawn(1)[0]
        return np.random.SeedSequence(int(seed.integers(0, 2**63)))
    if isinstance(seed, np.random.RandomState):
        return np.random.SeedSequence(int(seed.randint(0, 2**31 - 1)))
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"Expected {name} >= 0, got {name}={seed}.")
        return np.random.SeedSequence(int(seed))
    raise TypeError(f"Expected {name} to be None (fresh OS entropy), an int >= 0, a "
                    f"SeedSequence or a numpy Generator, got {type(seed).__name__}.")


def check_random_state(name: str, seed: Any) -> np.random.Generator:
    """A numpy ``Generator`` for ``seed``: a ``Generator`` itself, else one on
    :func:`check_seed`'s sequence (same draws as ``np.random.default_rng(seed)``)."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(check_seed(name, seed))
