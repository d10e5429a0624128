"""Validation of user input at the library boundary.

Every public entry point calls these helpers once, before any computation, so that a bad
value fails fast with a message that names the parameter, the value received and what is
expected. Values give ``ValueError``; wrong types give ``TypeError``. Nothing here asserts.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "SeedLike",
    "check_array",
    "check_choice",
    "check_delta",
    "check_epsilon",
    "check_fraction",
    "check_int",
    "check_labels",
    "check_positive",
    "check_random_state",
    "check_seed",
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


def check_epsilon(value: Any, name: str = "epsilon") -> float:
    """Check a privacy parameter epsilon: a finite real > 0."""
    if _is_real(value) and float(value) <= 0:
        raise ValueError(
            f"Expected {name} > 0, got {name}={value!r}. A smaller epsilon is more private; "
            "for a non-private run use the non-private method instead of epsilon <= 0.")
    return check_positive(name, value)


def check_delta(value: Any, name: str = "delta") -> float:
    """Check a privacy parameter delta: a real in the open interval (0, 1)."""
    if not _is_real(value):
        raise TypeError(f"Expected {name} to be a real number in (0, 1), got {value!r}.")
    v = float(value)
    if not (0.0 < v < 1.0):
        raise ValueError(
            f"Expected {name} in the open interval (0, 1), got {name}={value!r}. "
            "A common choice is delta well below 1/n, e.g. 1e-6.")
    return v


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


def check_array(name: str, value: Any, *, ndim: int | None = 2, min_rows: int = 1,
                dtype: type = np.float64, copy: bool = False) -> np.ndarray:
    """Convert to a finite float array of the given number of dimensions.

    Refuses NaN and infinity (naming how many entries and the first position), object or
    string data, and arrays with fewer than ``min_rows`` rows. The input is never changed.
    """
    try:
        arr = np.array(value, dtype=dtype, copy=copy or None)
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
        raise ValueError(f"{name} contains {len(bad)} NaN or infinite entries (first at index "
                         f"{tuple(int(i) for i in bad[0])}); remove or impute them first.")
    return arr


def check_labels(name: str, y: Any, n_classes: int, n_rows: int | None = None) -> np.ndarray:
    """Check integer class labels in ``[0, n_classes)``, one per row."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"Expected {name} to be 1-D, got shape {arr.shape}.")
    if n_rows is not None and arr.shape[0] != n_rows:
        raise ValueError(f"Expected {name} to have {n_rows} entries (one per row), "
                         f"got {arr.shape[0]}.")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"Expected integer class labels in {name}, got dtype {arr.dtype}.")
        arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        lo, hi = int(arr.min()), int(arr.max())
        raise ValueError(f"Expected {name} in [0, {n_classes}), got values in [{lo}, {hi}]; "
                         "encode classes as 0..n_classes-1 or raise n_classes.")
    return arr.astype(np.int64, copy=False)


def check_random_state(seed: Any) -> np.random.Generator:
    """Return a numpy ``Generator`` from ``None``, an int, a SeedSequence or a Generator.

    ``np.random.RandomState`` is accepted for scikit-learn compatibility and converted by
    drawing a seed from it (which advances it, as scikit-learn's own helpers do).
    """
    if seed is None or isinstance(seed, (numbers.Integral, np.random.SeedSequence)):
        if isinstance(seed, numbers.Integral) and int(seed) < 0:
            raise ValueError(f"Expected random_state >= 0, got random_state={seed}.")
        return np.random.default_rng(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, np.random.RandomState):
        return np.random.default_rng(seed.randint(0, 2**31 - 1))
    raise TypeError(f"Expected random_state to be None, an int, a SeedSequence or a "
                    f"numpy Generator, got {type(seed).__name__}.")


#: What every entry point accepts as ``seed`` (``None``: fresh OS entropy).
SeedLike = int | np.random.SeedSequence | np.random.Generator | None


def check_seed(seed: Any, name: str = "seed") -> np.random.SeedSequence:
    """The root ``SeedSequence`` of a run from ``None``, an int, a SeedSequence or a Generator.

    ``None`` (the default of every entry point) draws fresh entropy from the operating
    system, so the noise of a release cannot be predicted. A fixed seed is for reproducible
    research: anyone who knows it can regenerate the noise, so never publish a release made
    with a seed you also publish. A ``Generator`` contributes a child of its seed sequence
    (it is advanced, like spawning).
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
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if int(seed) < 0:
            raise ValueError(f"Expected {name} >= 0, got {name}={seed}.")
        return np.random.SeedSequence(int(seed))
    raise TypeError(f"Expected {name} to be None (fresh OS entropy), an int >= 0, a "
                    f"SeedSequence or a numpy Generator, got {type(seed).__name__}.")
