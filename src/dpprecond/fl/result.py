"""The outcome of a federated run, and the one way a method argument becomes a Method.

Both live below :mod:`dpprecond.fl.engine` so that the runners built beside the engine
(the secure-aggregation rounds of :mod:`dpprecond.secagg.fl`, the Flower strategies) use
them without importing the engine, and the engine can dispatch to them without a cycle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._files import write_json
from dpprecond.fl.methods import GradientMethod, Method, make_method
from dpprecond.fl.server import GradientTransformation

__all__ = ["FLResult", "as_method"]


@dataclass
class FLResult:
    """Outcome of a run: final parameters, per-round history and the privacy figures.

    ``events`` lists every private release of one client, in order (one entry per release),
    so that what was charged can be checked against what was released; ``epsilon`` is
    their composition at ``delta`` (``inf`` for a non-private run).
    """

    params: np.ndarray
    history: list[dict[str, float]]
    noise_multiplier: float
    epsilon: float
    delta: float
    config: dict[str, Any] = field(default_factory=dict)
    events: list[dp_event.DpEvent] = field(default_factory=list)

    @property
    def final_accuracy(self) -> float:
        """Test accuracy after the last round."""
        return self.history[-1]["test_accuracy"]

    @property
    def n_releases(self) -> int:
        """How many private releases each client made."""
        return len(self.events)

    def to_dict(self) -> dict[str, Any]:
        """The run as written to disk: privacy figures, settings, history and the released
        model (``params``, the final parameters: post-processing of the releases)."""
        return {"noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon,
                "delta": self.delta, "n_releases": self.n_releases, "config": self.config,
                "history": self.history, "params": self.params}

    def save_json(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as strict JSON, atomically (:func:`dpprecond._files.
        write_json`: a non-private run's ``epsilon`` is ``null``; docs/outputs.md)."""
        write_json(path, self.to_dict())


def as_method(method: Method | GradientTransformation | str) -> Method:
    """A :class:`~dpprecond.fl.methods.Method` from a method, a server transform or a name."""
    if isinstance(method, Method):
        return method
    if isinstance(method, GradientTransformation):
        return GradientMethod(method)
    if isinstance(method, str):
        return make_method(method)
    raise TypeError(f"Expected a Method, a GradientTransformation or a method name, got "
                    f"{type(method).__name__}.")
