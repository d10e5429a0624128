"""DP-FedFC: a one-off private feature second moment as the server's preconditioner.

Every client releases, once, its normalized feature second-moment matrix
``C_i = (sum_{x in D_i} x^ x^T + E_i) / |D_i|`` where ``x^ = clip_{C_x}([x, 1])`` (rows of the
bias-augmented features clipped to ``row_clip``) and ``E_i`` is symmetric Gaussian noise
(independent ``N(0, (z_cov sqrt(2) C_x^2)^2)`` entries on and above the diagonal, mirrored
below). Then, every round, it sends the paper's noisy clipped mean gradient (noise
multiplier ``z_grad``, :func:`dpprecond.fl.client.full_batch_messages`). The server keeps

    P = (PSD(mean_i C_i) + gamma I)^{-1}

(``PSD`` clips negative eigenvalues to 0, post-processing) and updates the linear head
``W`` (shape ``(d + 1, k)``) with ``W <- W - eta P G_t``, the gradient matrix preconditioned
on its feature side: for a linear softmax head the Fisher is ``E[x~ x~^T] (x) Sigma`` and
``P`` inverts its feature factor.

Privacy unit: one record of one client, replace-one. Sensitivity of the upper triangle of
``sum x^ x^^T``: ``|| a a^T - b b^T ||_{triu} <= sqrt(2) C_x^2`` for ``||a||, ||b|| <= C_x``
(attained by orthogonal ``a, b`` of norm ``C_x``), so the covariance release is a Gaussian
mechanism with multiplier ``z_cov``; each gradient release one with ``z_grad`` (sensitivity
``2C``). Accounting per client: ``Compose(Gaussian(z_cov), SelfComposed(Gaussian(z_grad),
T))``, calibrated exactly by dp_accounting.

Choices (the description leaves them open; named parameters): the budget split
``covariance_share`` (share ``s`` of ``mu^2`` in GDP terms, see
:func:`dpprecond.fl.baseline_common.covariance_split_noise`; default 0.2); rows of
``[x, 1]`` clipped to ``row_clip`` (default ``None`` = ``sqrt(d + 1)``, the largest norm of
fixed-standardized pixel features in ``[-1, 1]^d``, so pixel rows are never clipped);
uniform client weights; eigenvalue clipping before the ridge ``gamma``.

Noise streams: the covariance noise of client ``i`` comes from ``stream(cov_root, 0, i)``,
the gradient noise of round ``t`` from ``stream(noise_root, t, i)``, where
``init, noise_root, cov_root = SeedSequence(seed).spawn(3)``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
from dp_accounting import dp_event
from tqdm.auto import tqdm

from dpprecond import accounting
from dpprecond._validation import (
    SeedLike,
    check_array,
    check_epsilon,
    check_int,
    check_labels,
    check_positive,
    check_seed,
)
from dpprecond.fl import client as client_mod
from dpprecond.fl.baseline_common import (
    BaselineResult,
    calibrate_covariance_split,
    check_privacy,
    covariance_split_noise,
    history_record,
    split_epsilon_after,
)
from dpprecond.fl.models import LinearSoftmax, clip_rows_safely
from dpprecond.fl.simulator import ClientData

__all__ = [
    "covariance_sensitivity",
    "fedfc_events",
    "private_second_moments",
    "psd_part",
    "resolve_noise",
    "run_fedfc",
]

logger = logging.getLogger(__name__)


def covariance_sensitivity(row_clip: float) -> float:
    """Replace-one l2 sensitivity of the upper triangle of ``sum_x x^ x^^T``: ``sqrt(2) C_x^2``."""
    return math.sqrt(2.0) * row_clip**2


def clip_rows(X: np.ndarray, row_clip: float) -> np.ndarray:
    """``[X, 1]`` with every row scaled to norm at most ``row_clip`` (copy), (n, d + 1).

    Overflow-safe for every finite input (:func:`dpprecond.fl.models.clip_rows_safely`).
    """
    Xt = np.hstack([X, np.ones((X.shape[0], 1), dtype=X.dtype)])
    return clip_rows_safely(Xt, row_clip)


def private_second_moments(X: np.ndarray, bounds: np.ndarray, row_clip: float,
                           noise_multiplier: float,
                           rngs: list[np.random.Generator]) -> Iterator[np.ndarray]:
    """Yield every client's released ``C_i`` (``(d + 1, d + 1)``, symmetric), in client order.

    ``C_i = (sum x^ x^^T + E_i) / |D_i|``, ``E_i`` symmetric with independent
    ``N(0, (z sqrt(2) C_x^2)^2)`` entries on and above the diagonal (drawn from ``rngs[i]``).
    A generator, so that only one ``(d + 1)^2`` matrix per client is alive at a time.
    """
    Xt = clip_rows(X, row_clip)
    d1 = Xt.shape[1]
    iu = np.triu_indices(d1)
    std = noise_multiplier * covariance_sensitivity(row_clip) if noise_multiplier else 0.0
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        S = Xt[lo:hi].T @ Xt[lo:hi]
        if std:
            E = np.zeros((d1, d1))
            E[iu] = std * rngs[i].standard_normal(len(iu[0]))
            S += E + np.triu(E, 1).T
        yield S / (hi - lo)


def psd_part(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (clipped at 0) and eigenvectors of a symmetric matrix."""
    w, V = np.linalg.eigh((S + S.T) / 2.0)
    return np.maximum(w, 0.0), V


def resolve_noise(n_rounds: int, clip_norm: float, target_epsilon: float | None,
                  target_delta: float, noise_multiplier: float | None,
                  covariance_share: float, accountant: str) -> tuple[float, float]:
    """``(z_cov, z_grad)``: calibrated from the target, from an explicit overall scale
    (``noise_multiplier`` is then the scale of the split, i.e. the run is
    ``1/noise_multiplier``-GDP; ``noise_multiplier=0`` is a non-private run, ``(0, 0)``)."""
    check_privacy(clip_norm, target_epsilon, target_delta, noise_multiplier)
    if noise_multiplier is not None:
        return covariance_split_noise(float(noise_multiplier), n_rounds, covariance_share)
    return calibrate_covariance_split(check_epsilon(target_epsilon, "target_epsilon"),
                                      float(target_delta), n_rounds, float(covariance_share),
                                      accountant)


def fedfc_events(z_cov: float, z_grad: float, n_rounds: int) -> list[dp_event.DpEvent]:
    """One client's releases in order: the covariance, then one gradient per round."""
    T = check_int("n_rounds", n_rounds, low=1)
    return [accounting.gaussian(z_cov)] + [accounting.gaussian(z_grad)] * T


class CovarianceRun(NamedTuple):
    """Validated inputs, noise multipliers and streams of a covariance-then-gradients run."""

    row_clip: float
    X_test: np.ndarray
    y_test: np.ndarray
    z_cov: float
    z_grad: float
    init_seq: np.random.SeedSequence
    noise_root: np.random.SeedSequence
    cov_root: np.random.SeedSequence
    data: ClientData

    def second_moments(self) -> Iterator[np.ndarray]:
        """Each client's private second-moment release (the run's first release)."""
        return private_second_moments(
            self.data.X, self.data.bounds, self.row_clip, self.z_cov,
            client_mod.round_generators(self.cov_root, 0, self.data.n_clients))

    def gradient_rounds(self, model: LinearSoftmax, step: Callable[[np.ndarray], np.ndarray],
                        *, n_rounds: int, clip_norm: float, target_delta: float,
                        accountant: str, progress: bool,
                        ) -> tuple[np.ndarray, list[dict[str, float]], list[dp_event.DpEvent]]:
        """The ``n_rounds`` gradient rounds that follow the covariance release.

        Every round each client releases its noisy clipped mean gradient
        (:func:`dpprecond.fl.client.full_batch_messages`, one ``Gaussian(z_grad)``);
        ``step`` maps the ``(K, n_params)`` messages to the server's update. Returns the
        final parameters, the per-round history and every release event in order (the
        covariance release first).
        """
        data, K = self.data, self.data.n_clients
        events: list[dp_event.DpEvent] = [accounting.gaussian(self.z_cov)]
        params = model.init_params(np.random.default_rng(self.init_seq))
        x_sq = np.einsum("ij,ij->i", data.X, data.X)
        history: list[dict[str, float]] = []
        for t in tqdm(range(n_rounds), disable=not progress, desc="rounds", unit="round"):
            start = time.perf_counter()
            U = client_mod.full_batch_messages(model, params, data.X, data.y, data.bounds,
                                               clip_norm, self.z_grad,
                                               client_mod.round_generators(self.noise_root, t,
                                                                           K),
                                               x_sq_norms=x_sq)
            events.append(accounting.gaussian(self.z_grad))
            update = step(U)
            params = params + update
            eps = split_epsilon_after(self.z_cov, self.z_grad, t + 1, float(target_delta),
                                      accountant)
            history.append(history_record(model, params, self.X_test, self.y_test, t, eps,
                                          update, time.perf_counter() - start))
        return params, history, events


def setup_covariance_run(data: ClientData, d1: int, *, n_rounds: int, row_clip: float | None,
                         X_test: Any, y_test: Any, clip_norm: float,
                         target_epsilon: float | None, target_delta: float,
                         noise_multiplier: float | None, covariance_share: float,
                         accountant: str, seed: SeedLike) -> CovarianceRun:
    """Shared set-up of DP-FedFC and DP-FedNew: validate, calibrate the split, spawn streams.

    ``row_clip`` defaults to ``sqrt(d1)`` (the norm of ``[x, 1]`` for pixels in [-1, 1]).
    """
    row_clip = math.sqrt(d1) if row_clip is None else check_positive("row_clip", row_clip,
                                                                     allow_inf=True)
    X_test = check_array("X_test", X_test)
    y_test = check_labels("y_test", y_test, data.n_classes, n_rows=X_test.shape[0])
    z_cov, z_grad = resolve_noise(n_rounds, clip_norm, target_epsilon, target_delta,
                                  noise_multiplier, covariance_share, accountant)
    if z_cov and math.isinf(row_clip):
        raise ValueError("A private run needs a finite row_clip; got row_clip=inf.")
    root = check_seed(seed)
    init_seq, noise_root, cov_root = root.spawn(3)
    return CovarianceRun(row_clip, X_test, y_test, z_cov, z_grad, init_seq, noise_root,
                         cov_root, data)


def run_fedfc(model: LinearSoftmax, data: ClientData, *, X_test: np.ndarray,
              y_test: np.ndarray, n_rounds: int = 70, learning_rate: float = 0.5,
              gamma: float = 1.0, row_clip: float | None = None, covariance_share: float = 0.2,
              clip_norm: float = 10.0, target_epsilon: float | None = None,
              target_delta: float = 1e-5, noise_multiplier: float | None = None,
              accountant: str = "pld",
                 seed: SeedLike = None,
              progress: bool = False) -> BaselineResult:
    """Run DP-FedFC (see the module docstring for the mechanism and its accounting).

    Parameters
    ----------
    model : LinearSoftmax
        The linear head (the preconditioner acts on its feature side).
    data : ClientData
        Client-contiguous training data.
    X_test, y_test : ndarray
        Evaluation data (accuracy after every round).
    n_rounds : int
        Rounds ``T`` (gradient releases).
    learning_rate, gamma : float
        Server step ``eta`` and ridge ``gamma`` of the preconditioner.
    row_clip : float or None
        ``C_x`` for the rows of ``[x, 1]`` (``None``: ``sqrt(d + 1)``; ``inf`` only
        non-private).
    covariance_share : float in (0, 1)
        Share of the budget (``mu^2``) spent on the covariance release.
    clip_norm, target_epsilon, target_delta, noise_multiplier, accountant
        Gradient clipping and privacy (``noise_multiplier`` = overall GDP scale).
    seed : None, int, SeedSequence or Generator
        Root of all randomness; ``None`` (default) is fresh OS entropy, a fixed seed is for
        reproducible research only (see :func:`dpprecond._validation.check_seed`).
    progress : bool
        tqdm bar over rounds.
    """
    if not isinstance(model, LinearSoftmax):
        raise TypeError(f"DP-FedFC preconditions a linear head; expected LinearSoftmax, got "
                        f"{type(model).__name__}.")
    n_rounds = check_int("n_rounds", n_rounds, low=1)
    lr = check_positive("learning_rate", learning_rate)
    gamma = check_positive("gamma", gamma)
    d1 = model.n_features + 1
    run = setup_covariance_run(data, d1, n_rounds=n_rounds, row_clip=row_clip, X_test=X_test,
                               y_test=y_test, clip_norm=clip_norm,
                               target_epsilon=target_epsilon, target_delta=target_delta,
                               noise_multiplier=noise_multiplier,
                               covariance_share=covariance_share, accountant=accountant,
                               seed=seed)
    row_clip, z_cov, z_grad = run.row_clip, run.z_cov, run.z_grad
    K = data.n_clients
    start = time.perf_counter()
    mean_C = np.zeros((d1, d1))
    for C_i in run.second_moments():
        mean_C += C_i / K
    w, V = psd_part(mean_C)
    P = (V / (w + gamma)) @ V.T
    logger.info("DP-FedFC: K=%d, T=%d, z_cov=%.4g, z_grad=%.4g, covariance %.2f s", K,
                n_rounds, z_cov, z_grad, time.perf_counter() - start)
    k = model.n_classes

    def step(U: np.ndarray) -> np.ndarray:
        G = U.mean(axis=0).reshape(d1, k)
        return (-lr * (P @ G)).ravel()

    params, history, events = run.gradient_rounds(
        model, step, n_rounds=n_rounds, clip_norm=clip_norm, target_delta=target_delta,
        accountant=accountant, progress=progress)
    return BaselineResult(params, history, z_grad, history[-1]["epsilon"], float(target_delta),
                          {"method": "fedfc", "n_rounds": n_rounds, "learning_rate": lr,
                           "gamma": gamma, "row_clip": row_clip,
                           "covariance_share": covariance_share, "z_cov": z_cov,
                           "clip_norm": clip_norm, "target_epsilon": target_epsilon,
                           "accountant": accountant}, events=events)
