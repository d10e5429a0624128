"""Paired tests and summaries used by the experiment reports."""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["McNemarResult", "mcnemar_exact", "rounds_to_reach"]


class McNemarResult(tuple):
    """``(b, c, p_value)``: ``b`` = A right and B wrong, ``c`` = B right and A wrong."""

    __slots__ = ()

    def __new__(cls, b: int, c: int, p_value: float) -> McNemarResult:
        return super().__new__(cls, (b, c, p_value))

    @property
    def b(self) -> int:
        """Examples A classifies correctly and B does not."""
        return self[0]

    @property
    def c(self) -> int:
        """Examples B classifies correctly and A does not."""
        return self[1]

    @property
    def p_value(self) -> float:
        """Two-sided exact p-value."""
        return self[2]


def mcnemar_exact(pred_a: np.ndarray, pred_b: np.ndarray, y: np.ndarray) -> McNemarResult:
    """Exact (binomial) McNemar test of two classifiers on the same test examples.

    Under the null hypothesis that both err equally often, the ``b + c`` discordant pairs
    split as ``Binomial(b + c, 1/2)``; the two-sided p-value is
    ``scipy.stats.binomtest(b, b + c, 0.5).pvalue`` (1 when there is no discordant pair).
    """
    pred_a, pred_b, y = np.asarray(pred_a), np.asarray(pred_b), np.asarray(y)
    if not (pred_a.shape == pred_b.shape == y.shape):
        raise ValueError(f"Predictions and labels must have the same shape, got "
                         f"{pred_a.shape}, {pred_b.shape} and {y.shape}.")
    right_a, right_b = pred_a == y, pred_b == y
    b = int(np.sum(right_a & ~right_b))
    c = int(np.sum(~right_a & right_b))
    p = 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)
    return McNemarResult(b, c, p)


def rounds_to_reach(curve: np.ndarray, target: float) -> int | None:
    """First round (1-based) at which ``curve`` reaches ``target``; ``None`` if never."""
    hits = np.flatnonzero(np.asarray(curve) >= target)
    return int(hits[0]) + 1 if len(hits) else None
