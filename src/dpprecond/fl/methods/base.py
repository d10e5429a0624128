"""What a federated method is: a client half, a server half and a release schedule.

A :class:`Method` is one definition that every driver runs the same way: the round engine
(:func:`dpprecond.fl.engine.simulate`, all clients in one process, vectorized) and the
Flower adapter (:mod:`dpprecond.adapters.flower`, one client per node). Neither names a
method; both call these halves:

1. **release schedule** (:meth:`Method.schedule`, a :class:`dpprecond.fl.accounting.
   Schedule`): what one client releases over a run as a function of one noise scale. The
   noise is calibrated from it once per run, and the per-release events the ledgers record
   come from :meth:`~dpprecond.fl.accounting.Schedule.releases`, the one derivation;
2. **client half** (:meth:`Method.setup_task`, :meth:`Method.round_task`): the
   :class:`~dpprecond.fl.tasks.ClientTask` a client runs (what it computes, clips, noises
   and releases, with its sensitivity), built from public settings only;
3. **server half** (:meth:`Method.server_init`, :meth:`Method.server_update`): an
   optax-style ``init``/``update`` over the replies of the clients that answered, in
   client-id order (the engine: all of them), with the public quantities the step needs
   (the repliers' sizes, hence the noise variance of their aggregate) passed at update
   time. Post-processing of the releases: no privacy cost.

Adding a method is one module with a subclass (or a factory over an existing class) and one
line in the registry :data:`dpprecond.fl.methods.METHODS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpprecond.fl.accounting import Schedule
from dpprecond.fl.config import FLConfig
from dpprecond.fl.models import FLModel
from dpprecond.fl.tasks import ClientTask

__all__ = ["Method", "NoisyPreconditionerWarning", "RunSpec", "full_batch_only"]


class NoisyPreconditionerWarning(UserWarning):
    """A method whose preconditioner is known to act on the noise runs with noise."""


@dataclass(frozen=True)
class RunSpec:
    """The public settings of one run that both halves of a method see.

    ``multipliers`` are the calibrated noise multipliers of the method's schedule (``z``;
    or ``z_cov`` and ``z_grad``); ``n_clients`` is the federation size ``K``.
    """

    config: FLConfig
    multipliers: dict[str, float]
    model: FLModel
    n_clients: int


def full_batch_only(name: str, config: FLConfig) -> None:
    """Refuse a config whose mechanism is not the full-batch one (``ValueError``)."""
    if config.mechanism != "full-batch":
        raise ValueError(f"{name} defines its own releases on top of the full-batch client "
                         f"mechanism; got mechanism={config.mechanism!r}. Use "
                         "mechanism='full-batch' and set the method's own options.")


class Method:
    """A named algorithm: release schedule, client half and server half (module docstring).

    Subclasses implement :meth:`schedule`, :meth:`round_task`, :meth:`server_init` and
    :meth:`server_update`; the others have defaults for methods without a setup phase,
    client state or broadcasts.
    """

    name: str = "method"

    # -- the release schedule ------------------------------------------------------------

    def schedule(self, config: FLConfig) -> Schedule:
        """What one client releases over the run (for calibration and the ledgers)."""
        raise NotImplementedError

    def check(self, config: FLConfig, model: FLModel) -> None:
        """Refuse settings the method cannot run with (``ValueError``/``TypeError``)."""

    def noise_multiplier(self, multipliers: Mapping[str, float]) -> float:
        """The per-round gradient release's noise multiplier (reported in results)."""
        return float(multipliers.get("z", multipliers.get("z_grad", 0.0)))

    def describe(self) -> dict[str, Any]:
        """Name and options (JSON-ready), for results and checkpoints."""
        return {"method": self.name}

    # -- the client half -----------------------------------------------------------------

    def setup_task(self, run: RunSpec) -> ClientTask | None:
        """The one-off release before the first round, if the method has one."""
        return None

    def round_task(self, run: RunSpec) -> ClientTask:
        """What every client computes and releases in each round."""
        raise NotImplementedError

    def reports_sizes(self, config: FLConfig) -> bool:
        """True when the server step needs the repliers' sizes ``|D_i|`` (public under the
        record-level, replace-one unit); otherwise the driver passes ones."""
        return False

    # -- the server half -----------------------------------------------------------------

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        """The server's initial state; after the setup phase, from the released ``setup``
        arrays (one row per client of ``clients``, in that order)."""
        raise NotImplementedError

    def broadcast(self, state: Any) -> dict[str, np.ndarray]:
        """Arrays sent with the parameters (the round task's ``broadcast_names``)."""
        return {}

    def eligible(self, clients: Sequence[int], state: Any) -> list[int]:
        """The clients asked in a round, among those available (sorted)."""
        return sorted(clients)

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        """One server step on the replies (name -> one row per client of ``clients``,
        sorted; ``sizes`` their ``|D_i|``): ``(update, new state)``."""
        raise NotImplementedError
