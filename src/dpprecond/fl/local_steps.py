"""Per-client local steps of the baselines: DP-FedAvg, DP-SCAFFOLD and DP-FedProx.

Pure functions of (model, parameters, client data, clipping, noise, generators), vectorized
over clients (one row per client), so the engine runs all clients at once and a Flower
client runs its own row alone (the single block ``bounds = [0, n]``).

Every local step is the paper's message at the client's local iterate ``y``:
``g~ = (sum_{x in D_i} clip_C(grad l(y; x)) + N(0, (2 z C)^2 I)) / |D_i|``. Privacy unit:
one record, replace-one; each step is a Gaussian release with sensitivity ``2C`` and noise
multiplier ``z`` (event ``Gaussian(z)``), so ``local_steps`` releases per round. What is
added to ``g~`` afterwards (SCAFFOLD's control-variate correction, FedProx's proximal
gradient) is a function of the client's earlier releases and of server broadcasts:
post-processing, free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpprecond.fl.client import add_client_noise, local_deltas, noise_inflation
from dpprecond.fl.models import FLModel
from dpprecond.noise import NoiseSource

__all__ = ["local_step_deltas", "updated_controls"]


def local_step_deltas(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                      bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                      rngs: Sequence[NoiseSource], *, local_steps: int, local_lr: float,
                      correction: np.ndarray | None = None, proximal_mu: float = 0.0,
                      x_sq_norms: np.ndarray | None = None) -> np.ndarray:
    """Every client's model change after ``local_steps`` noisy full-batch steps, (K, p).

    Client ``i`` starts from ``params`` and repeats
    ``y <- y - local_lr (g~ + c_i + mu (y - params))`` where ``g~`` is the noisy clipped
    mean gradient at ``y`` (module docstring), ``c_i`` the optional control-variate
    correction (``correction[i]``, public to the client) and ``mu (y - params)`` the
    gradient of FedProx's proximal term ``mu/2 ||y - params||^2`` (``proximal_mu``; 0: none,
    and the steps are exactly DP-FedAvg's). Returns ``y_L - params``.

    Privacy unit: one record, replace-one; ``local_steps`` events ``Gaussian(z)`` per round,
    sensitivity ``2C`` each. Client ``i`` draws its steps' noise from ``rngs[i]`` in step
    order.
    """
    std = 2.0 * noise_multiplier * clip_norm * noise_inflation(model, X, bounds) \
        if noise_multiplier else 0.0
    return local_deltas(model, params, X, y, bounds, clip_norm, local_steps=local_steps,
                        local_lr=local_lr, release=lambda S: add_client_noise(S, std, rngs),
                        correction=correction, proximal_mu=proximal_mu,
                        x_sq_norms=x_sq_norms)


def updated_controls(c_i: np.ndarray, c: np.ndarray, delta_y: np.ndarray, *,
                     local_steps: int, local_lr: float) -> np.ndarray:
    """DP-SCAFFOLD's new client control variates ``c_i+ = c_i - c - delta_y / (L eta_l)``.

    Row-wise (one row per client), so a client computes its own row alone; post-processing
    of its releases and of the server's ``c``.
    """
    return c_i - c - delta_y / (local_steps * local_lr)
