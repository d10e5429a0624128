"""DP-SCAFFOLD and DP-FedAvg: several noisy clipped local steps per round.

Both use the paper's client mechanism for *every local step*: client ``i`` at local step
``l`` of round ``t`` computes

    g~ = (sum_{x in D_i} clip_C(grad l(y_i; x)) + N(0, (2 z C)^2 I)) / |D_i|

at its local iterate ``y_i`` (record-level privacy, replace-one adjacency; the clipped sum
has l2 sensitivity ``2C``; noise multiplier ``z``). DP-SCAFFOLD (Karimireddy et al., 2020,
with the DP client step of Noble et al., 2022) corrects the local step with control variates:

    y_i <- y_i - eta_l (g~ - c_i + c)                      (``local_steps`` times)
    c_i+ = c_i - c + (theta - y_i) / (local_steps eta_l)
    theta <- theta + eta_g mean_i (y_i - theta),  c <- c + mean_i (c_i+ - c_i)

DP-FedAvg is the same loop without control variates (``c_i = c = 0``). Everything a client
sends (``y_i - theta``, ``c_i+ - c_i``) and every state it keeps is a function of its noisy
``g~`` and of public server broadcasts, so it is post-processing.

Accounting: each local step is one Gaussian release, ``T * local_steps`` releases per client
in all, composed exactly (``SelfComposed(Gaussian(z), T * local_steps)``). There is no extra
noise factor beyond the sensitivity (the authors' code doubles the noise; we do not), and
the noise is calibrated for this release schedule, so a given epsilon means the same total
privacy loss per client as for the one-release-per-round methods.

Noise streams: the generator of client ``i`` in round ``t`` is
:func:`dpprecond.fl.client.stream` ``(noise_root, t, i)``; its ``local_steps`` noise vectors
are drawn from it in step order.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache

import numpy as np
from dp_accounting import dp_event
from tqdm.auto import tqdm

from dpprecond import accounting
from dpprecond._validation import (
    SeedLike,
    check_array,
    check_delta,
    check_epsilon,
    check_int,
    check_labels,
    check_positive,
    check_seed,
)
from dpprecond.fl import client as client_mod
from dpprecond.fl.accounting import calibrate_noise_multiplier
from dpprecond.fl.baseline_common import BaselineResult, check_privacy, history_record
from dpprecond.fl.models import FLModel
from dpprecond.fl.simulator import ClientData

__all__ = ["local_steps_events", "run_fedavg", "run_scaffold", "scaffold_noise_multiplier"]

logger = logging.getLogger(__name__)


def local_steps_events(noise_multiplier: float, n_rounds: int,
                       local_steps: int) -> list[dp_event.DpEvent]:
    """The releases of one client in order: one ``Gaussian(z)`` per local step."""
    n = check_int("n_rounds", n_rounds, low=1) * check_int("local_steps", local_steps, low=1)
    return [accounting.gaussian(noise_multiplier)] * n


def scaffold_noise_multiplier(target_epsilon: float, target_delta: float, n_rounds: int,
                              local_steps: int, accountant: str = "pld") -> float:
    """Smallest ``z`` such that ``n_rounds * local_steps`` Gaussian releases meet the target."""
    check_int("local_steps", local_steps, low=1)
    return calibrate_noise_multiplier(float(target_epsilon), float(target_delta),
                                      int(n_rounds) * int(local_steps), "full-batch",
                                      accountant=accountant)  # type: ignore[arg-type]


@lru_cache(maxsize=8192)
def _epsilon_after_releases(z: float, n_releases: int, delta: float, accountant: str) -> float:
    if z == 0:
        return float("inf")
    ev = dp_event.SelfComposedDpEvent(accounting.gaussian(z), n_releases)
    return accounting.epsilon_of(ev, delta, accountant)  # type: ignore[arg-type]


def run_scaffold(model: FLModel, data: ClientData, *, X_test: np.ndarray, y_test: np.ndarray,
                 n_rounds: int = 70, local_steps: int = 5, local_lr: float = 0.1,
                 global_lr: float = 1.0, control_variates: bool = True,
                 clip_norm: float = 10.0, target_epsilon: float | None = None,
                 target_delta: float = 1e-5, noise_multiplier: float | None = None,
                 accountant: str = "pld",
                 seed: SeedLike = None,
                 progress: bool = False) -> BaselineResult:
    """DP-SCAFFOLD (``control_variates=True``) or DP-FedAvg (``False``), full participation.

    Privacy unit: one record of one client, replace-one. Sensitivity of each local step's
    clipped sum: ``2 * clip_norm``; noise std ``2 z clip_norm`` per coordinate. Accounting:
    ``n_rounds * local_steps`` compositions of ``Gaussian(z)``, ``z`` calibrated for exactly
    that schedule from ``(target_epsilon, target_delta)`` unless ``noise_multiplier`` is
    given (exactly one of the two; ``noise_multiplier=0`` is a non-private run).

    Parameters
    ----------
    model : FLModel
        Model with per-client parameters support in ``clipped_grad_sums``.
    data : ClientData
        Client-contiguous training data.
    X_test, y_test : ndarray
        Evaluation data (test or validation split), accuracy recorded after every round.
    n_rounds, local_steps : int
        ``T`` and the local steps per round.
    local_lr, global_lr : float
        ``eta_l`` and ``eta_g``.
    control_variates : bool
        SCAFFOLD's correction (``False`` gives DP-FedAvg with full-batch local steps).
    clip_norm, target_epsilon, target_delta, noise_multiplier, accountant
        Privacy settings (see above); ``clip_norm=inf`` only for non-private runs.
    seed : None, int, SeedSequence or Generator
        Root: ``spawn(2)`` gives the init stream and the noise root; ``None`` (default) is
        fresh OS entropy, a fixed seed is for reproducible research only.
    progress : bool
        tqdm bar over rounds.

    Returns
    -------
    BaselineResult
        History per round, final parameters, ``z``, epsilon spent and the release events.
    """
    n_rounds = check_int("n_rounds", n_rounds, low=1)
    local_steps = check_int("local_steps", local_steps, low=1)
    local_lr = check_positive("local_lr", local_lr)
    global_lr = check_positive("global_lr", global_lr)
    check_privacy(clip_norm, target_epsilon, target_delta, noise_multiplier)
    X_test = check_array("X_test", X_test)
    y_test = check_labels("y_test", y_test, data.n_classes, n_rows=X_test.shape[0])
    if noise_multiplier is not None:
        z = float(noise_multiplier)
    else:
        z = scaffold_noise_multiplier(check_epsilon(target_epsilon, "target_epsilon"),
                                      check_delta(target_delta, "target_delta"), n_rounds,
                                      local_steps, accountant)
    root = check_seed(seed)
    init_seq, noise_root = root.spawn(2)
    K = data.n_clients
    sizes = data.sizes.astype(np.float64)[:, None]
    std = 2.0 * z * clip_norm if z else 0.0
    params = model.init_params(np.random.default_rng(init_seq))
    c_i = np.zeros((K, params.shape[0]))
    c = np.zeros(params.shape[0])
    x_sq = np.einsum("ij,ij->i", data.X, data.X)
    events: list[dp_event.DpEvent] = []
    history: list[dict[str, float]] = []
    name = "DP-SCAFFOLD" if control_variates else "DP-FedAvg"
    logger.info("%s: K=%d, T=%d, local_steps=%d, z=%.4g", name, K, n_rounds, local_steps, z)
    for t in tqdm(range(n_rounds), disable=not progress, desc="rounds", unit="round"):
        start = time.perf_counter()
        rngs = client_mod.round_generators(noise_root, t, K)
        Y = np.tile(params, (K, 1))
        correction = (c - c_i) if control_variates else None
        for _ in range(local_steps):
            S = model.clipped_grad_sums(Y, data.X, data.y, data.bounds, clip_norm,
                                        x_sq_norms=x_sq)
            if std:
                for i, rng in enumerate(rngs):
                    S[i] += std * rng.standard_normal(S.shape[1])
            events.append(accounting.gaussian(z))
            G = S / sizes
            if correction is not None:
                G += correction
            Y -= local_lr * G
        delta_y = Y - params  # (K, p)
        if control_variates:
            c_new = c_i - c - delta_y / (local_steps * local_lr)
            c = c + (c_new - c_i).mean(axis=0)
            c_i = c_new
        update = global_lr * delta_y.mean(axis=0)
        params = params + update
        seconds = time.perf_counter() - start
        eps = _epsilon_after_releases(z, (t + 1) * local_steps, float(target_delta), accountant)
        history.append(history_record(model, params, X_test, y_test, t, eps, update, seconds))
    return BaselineResult(params, history, z, history[-1]["epsilon"], float(target_delta),
                          {"method": "scaffold" if control_variates else "fedavg",
                           "n_rounds": n_rounds, "local_steps": local_steps,
                           "local_lr": local_lr, "global_lr": global_lr,
                           "clip_norm": clip_norm, "target_epsilon": target_epsilon,
                           "accountant": accountant}, events=events)


def run_fedavg(model: FLModel, data: ClientData, **kwargs: object) -> BaselineResult:
    """DP-FedAvg: :func:`run_scaffold` with ``control_variates=False`` (same accounting)."""
    return run_scaffold(model, data, control_variates=False, **kwargs)  # type: ignore[arg-type]
