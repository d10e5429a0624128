"""Telling a run whose test loss climbs: every method, after its last round.

A private run can fail without an error: its noise (or too large a step) drives the
weights away, the test loss climbs round after round and the accuracy ends near or below
chance. :func:`check_history` reads a run's history (post-processing of the released
model: no privacy cost) and warns with :class:`DivergenceWarning` when the last round's
test loss is at least :data:`CLIMB_RATIO` times the lowest of the run, or not finite. The
engine calls it once at the end of every run (:func:`dpprecond.fl.engine.simulate`), so
every method of :mod:`dpprecond.fl.methods` is watched the same way; the paper's form
``sofim`` also warns at the start that its preconditioner acts on the noise.

The threshold is deliberately loose: a test loss that wanders by a few tens of percent is
common at small epsilon; one that ends at 1.5 times its lowest has been measured only in
runs that are dominated by their noise or their step size (digits, K = 20, T = 70, seed
0, every method at its defaults: at epsilon 1 all but adam, yogi, sofim-momentum and
fednew end at 2.2 to 35 times their lowest test loss; at epsilon 4 only the paper's form
``sofim`` does (15x; fedavg and scaffold end at 1.45x and 1.42x); no non-private run
climbs).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CLIMB_RATIO", "Climb", "DivergenceWarning", "check_history", "find_climb"]

#: The last round's test loss over the run's lowest at which a run is said to climb.
CLIMB_RATIO = 1.5
#: Fewer rounds than this say nothing about a trend.
MIN_ROUNDS = 3


class DivergenceWarning(UserWarning):
    """A run's test loss climbed: the model at its end is worse than earlier in the run."""


@dataclass(frozen=True)
class Climb:
    """Where a run's test loss was lowest and where it ended (rounds counted from 1)."""

    best_round: int
    best_loss: float
    last_round: int
    last_loss: float
    last_accuracy: float
    best_accuracy: float
    best_accuracy_round: int

    @property
    def ratio(self) -> float:
        """Last loss over the lowest (``inf`` for a non-finite last loss)."""
        if not math.isfinite(self.last_loss) or self.best_loss <= 0:
            return math.inf
        return self.last_loss / self.best_loss

    def describe(self, method: str) -> str:
        """One message: the numbers, what they mean, what to change."""
        ratio = "not finite" if math.isinf(self.ratio) else f"{self.ratio:.1f} times its lowest"
        return (f"method {method!r}: the test loss climbed from {self.best_loss:.3g} "
                f"(round {self.best_round}) to {self.last_loss:.3g} (round "
                f"{self.last_round}), {ratio}; final test accuracy {self.last_accuracy:.3f} "
                f"(best {self.best_accuracy:.3f}, round {self.best_accuracy_round}). The "
                "updates are dominated by the noise or the step size is too large: raise "
                "epsilon, lower the learning rate (learning_rate, or local_lr for the "
                "local-step methods) or run fewer rounds (docs/fl.md).")


def find_climb(history: Sequence[dict[str, Any]],
               ratio: float = CLIMB_RATIO) -> Climb | None:
    """The run's climb, when its last test loss is ``>= ratio`` x its lowest (or not
    finite) after at least :data:`MIN_ROUNDS` rounds; else ``None``."""
    if len(history) < MIN_ROUNDS:
        return None
    losses = [float(h["test_loss"]) for h in history]
    accs = [float(h["test_accuracy"]) for h in history]
    finite = [(loss, i) for i, loss in enumerate(losses) if math.isfinite(loss)]
    last = losses[-1]
    if not finite:
        return None
    best, i_best = min(finite)
    if math.isfinite(last) and not (best > 0 and last >= ratio * best):
        return None
    i_acc = max(range(len(accs)), key=accs.__getitem__)
    return Climb(int(history[i_best]["round"]), best, int(history[-1]["round"]), last,
                 accs[-1], accs[i_acc], int(history[i_acc]["round"]))


def check_history(history: Sequence[dict[str, Any]], method: str) -> Climb | None:
    """Warn (:class:`DivergenceWarning`) when the run's test loss climbed; return the climb."""
    climb = find_climb(history)
    if climb is not None:
        warnings.warn(climb.describe(method), DivergenceWarning, stacklevel=3)
    return climb
