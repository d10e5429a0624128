"""What one client computes for one request, without Flower.

Each function is a call of the engine's client mechanism (:mod:`dpprecond.fl.client`) on
one client: the client's examples are the single block ``bounds = [0, n]`` of the engine's
client-contiguous layout, and its generator is the one-element list of generators, so the
result is row ``i`` of what :func:`dpprecond.fl.engine.simulate` computes for all clients
at once. Privacy unit, sensitivity and event of every release: see :mod:`dpprecond.fl.client`
(all replace-one record level except the Poisson option, add/remove-one).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dpprecond.adapters.flower.protocol import KEYS, RoundRequest
from dpprecond.fl import client as client_mod
from dpprecond.fl.methods import LocalStepsMethod
from dpprecond.fl.models import FLModel

__all__ = ["ControlState", "client_reply", "settle_control"]


class ControlState(NamedTuple):
    """A SCAFFOLD client's control variate ``c_i`` and the one it computed last.

    ``pending`` (computed in round ``pending_round``) becomes ``c_i`` only once the server
    reports that round's reply as aggregated (:func:`settle_control`).
    """

    control: np.ndarray
    pending: np.ndarray | None = None
    pending_round: int = 0


def settle_control(state: ControlState, accepted_round: int) -> np.ndarray:
    """The client's ``c_i`` at the start of a round.

    The pending ``c_i+`` is committed if the server aggregated the reply of its round
    (``accepted_round == pending_round``); otherwise the reply was lost, failed or came too
    late, the server's ``c`` did not move with it, and ``c_i`` stays as it was.
    """
    if state.pending is not None and state.pending_round == accepted_round:
        return state.pending
    return state.control


def _one_client(X: np.ndarray) -> np.ndarray:
    return np.array([0, X.shape[0]], dtype=np.int64)


def client_reply(model: FLModel, params: np.ndarray | None, X: np.ndarray, y: np.ndarray,
                 request: RoundRequest, rng: Any, *, control: np.ndarray | None = None,
                 client_control: np.ndarray | None = None
                 ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """One client's released arrays for ``request`` (names of :func:`~.protocol.reply_shapes`).

    Parameters
    ----------
    model, params : FLModel, ndarray
        The model and the server's current parameters (unused by ``"second-moment"``).
    X, y : ndarray
        The client's own examples.
    request : RoundRequest
        What to release (validated by the caller).
    rng : Generator or SecureGenerator
        The client's noise source (:func:`~.protocol.client_rng`).
    control, client_control : ndarray, optional
        SCAFFOLD (``request.control_variates``): the server's ``c`` and this client's ``c_i``.

    Returns
    -------
    arrays : dict
        ``{"message": u_i}``, ``{"delta-y": ..., "delta-c": ...}`` or ``{"moment": C_i}``.
    new_control : ndarray or None
        SCAFFOLD: the client's ``c_i+`` (to keep, pending, in its state); else ``None``.
    """
    bounds = _one_client(X)
    r = request
    if r.kind == "second-moment":
        moments = client_mod.second_moment_releases(X, bounds, r.clip_norm,
                                                     r.noise_multiplier, [rng])
        return {KEYS.moment: next(moments)}, None
    assert params is not None  # every other kind gets the model (checked by the caller)
    if r.kind == "gradient":
        if r.mechanism == "full-batch":
            U = client_mod.full_batch_messages(model, params, X, y, bounds, r.clip_norm,
                                               r.noise_multiplier, [rng])
        else:
            U = client_mod.poisson_local_messages(
                model, params, X, y, bounds, r.clip_norm, r.noise_multiplier, [rng],
                sampling_rate=r.sampling_rate, local_steps=r.local_steps, local_lr=r.local_lr)
        return {KEYS.message: U[0]}, None
    correction = None
    if r.control_variates:
        if control is None or client_control is None:
            raise ValueError("A SCAFFOLD request needs the server's control variate and the "
                             "client's own.")
        correction = (control - client_control)[None, :]
    delta_y = client_mod.local_step_deltas(
        model, params, X, y, bounds, r.clip_norm, r.noise_multiplier, [rng],
        local_steps=r.local_steps, local_lr=r.local_lr, correction=correction)
    if not r.control_variates or control is None or client_control is None:
        return {KEYS.delta_y: delta_y[0]}, None
    method = LocalStepsMethod("scaffold", local_steps=r.local_steps, local_lr=r.local_lr)
    c_new = method.updated_controls(client_control[None, :], control, delta_y)[0]
    return {KEYS.delta_y: delta_y[0], KEYS.delta_c: c_new - client_control}, c_new
