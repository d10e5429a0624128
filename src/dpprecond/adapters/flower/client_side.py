"""What one client computes for one request, without Flower.

The request carries the method's client task (:class:`dpprecond.fl.tasks.ClientTask`, the
client half the engine runs too); :func:`client_reply` runs it on this one client: the
client's examples are the single block ``bounds = [0, n]`` of the engine's
client-contiguous layout and its generator is the one-element list of generators, so the
result is row ``i`` of what :func:`dpprecond.fl.engine.simulate` computes for all clients
at once. A request with a count (adaptive clipping) releases it with the task, at the
same parameters, with the client's count stream, through the engine's own
:func:`dpprecond.fl.tasks.release_round` (so the count comes from the same computation:
inside the linear head's gradient pass). Privacy unit, sensitivity and event
of every release: see the task's module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from dpprecond.adapters.flower.protocol import RoundRequest
from dpprecond.fl.client import Stream
from dpprecond.fl.models import FLModel
from dpprecond.fl.tasks import release_round

__all__ = ["ClientState", "client_reply", "settle_state"]


class ClientState(NamedTuple):
    """A stateful task's client state (e.g. SCAFFOLD's ``c_i``) and the one it computed last.

    ``pending`` (computed in round ``pending_round``) becomes the state only once the server
    reports that round's reply as aggregated (:func:`settle_state`).
    """

    state: np.ndarray
    pending: np.ndarray | None = None
    pending_round: int = 0


def settle_state(state: ClientState, accepted_round: int) -> np.ndarray:
    """The client's state at the start of a round.

    The pending state is committed if the server aggregated the reply of its round
    (``accepted_round == pending_round``); otherwise the reply was lost, failed or came too
    late, the server's state did not move with it, and the client's stays as it was.
    """
    if state.pending is not None and state.pending_round == accepted_round:
        return state.pending
    return state.state


def client_reply(model: FLModel, params: np.ndarray | None, X: np.ndarray, y: np.ndarray,
                 request: RoundRequest, rng: Stream, *,
                 broadcast: Mapping[str, np.ndarray] | None = None,
                 client_state: np.ndarray | None = None,
                 count_rng: Stream | None = None
                 ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """One client's released arrays for ``request`` (names of :func:`~.protocol.reply_shapes`).

    Parameters
    ----------
    model, params : FLModel, ndarray
        The model and the server's current parameters (``None`` for a setup task).
    X, y : ndarray
        The client's own examples.
    request : RoundRequest
        What to release (validated by the caller).
    rng : Generator or SecureGenerator
        The client's noise source (:func:`~.protocol.client_rng`).
    broadcast, client_state : optional
        The server's broadcast arrays (the task's ``broadcast_names``) and, for a stateful
        task, this client's state.
    count_rng : Generator or SecureGenerator, optional
        The noise source of the request's count (``client_rng(..., count=True)``); needed
        when the request has one.

    Returns
    -------
    arrays : dict
        The released arrays, one per name of the task's reply.
    new_state : ndarray or None
        A stateful task's new client state (to keep, pending); else ``None``.
    """
    bounds = np.array([0, X.shape[0]], dtype=np.int64)
    if request.count_task is not None and count_rng is None:
        raise ValueError("The request asks for a count: pass its noise source count_rng "
                         "(client_rng(..., count=True)).")
    out = release_round(request.task, request.count_task, model, params, X, y, bounds,
                        [rng], None if count_rng is None else [count_rng],
                        broadcast=broadcast,
                        client_state=None if client_state is None else client_state[None, :])
    arrays = {name: rows[0] for name, rows in out.arrays.items()}
    return arrays, None if out.client_state is None else out.client_state[0]
