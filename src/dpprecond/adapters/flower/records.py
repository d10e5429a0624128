"""Typed reads of Flower records: a value of the wrong kind is a clear error, not a crash.

Flower's records hold unions (an ``ArrayRecord`` item is an ``Array``; a ``ConfigRecord``
or ``MetricRecord`` item is a number, a string, bytes or a list), and a message comes from
another process, possibly another version of the adapter. These helpers check the kind of
what was received before using it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array

__all__ = ["read_array", "read_int"]


def read_array(record: Mapping[str, Any], key: str, what: str = "message") -> np.ndarray:
    """The numpy array stored under ``key`` (``ValueError`` when absent or not an array)."""
    if key not in record:
        raise ValueError(f"The {what} has no {key!r} array; the server and the client run "
                         "different versions of the dpprecond adapter.")
    value = record[key]
    if not isinstance(value, Array):
        raise ValueError(f"The {what}'s {key!r} is a {type(value).__name__}, not an array.")
    return np.asarray(value.numpy())


def read_int(record: Mapping[str, Any], key: str, what: str = "message") -> int:
    """The integer stored under ``key`` (``ValueError`` when absent or not an integer)."""
    if key not in record:
        raise ValueError(f"The {what} has no {key!r} value.")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float)) or \
            float(value) != int(value):
        raise ValueError(f"The {what}'s {key!r} is {value!r}, not an integer.")
    return int(value)
