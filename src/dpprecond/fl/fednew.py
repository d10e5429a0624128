"""DP-FedNew: one ADMM iteration of a federated Newton step per round, private curvature.

FedNew (Elgabli et al., ICML 2022) finds the Newton direction ``y`` of
``(sum_i H_i) y = sum_i g_i`` by ADMM on the consensus problem
``min sum_i (1/2 y_i^T H_i y_i - g_i^T y_i + alpha/2 ||y_i||^2)`` s.t. ``y_i = y``, doing a
single ADMM iteration per round, warm-started from the previous round:

    client:  y_i^t = (H_i + (alpha + rho) I)^{-1} (g_i^t - lambda_i^{t-1} + rho y^{t-1})
    server:  y^t = mean_i y_i^t          (= mean_i (y_i^t + lambda_i^{t-1} / rho), since
                                          sum_i lambda_i stays 0 from lambda^0 = 0)
    client:  lambda_i^t = lambda_i^{t-1} + rho (y_i^t - y^t)
    server:  theta^{t+1} = theta^t - eta y^t

DP version (after Krouka, Koskela and Kulkarni, PoPETs 2025, who privatize the gradient and
use a privately released feature covariance as the curvature of a generalized linear
model). Choices where their description leaves details open (named parameters):

- Curvature: ``H_i = hessian_scale * C_i (x) I_k`` with ``C_i`` client ``i``'s *own* noisy
  feature second moment (released once exactly as in DP-FedFC,
  :func:`dpprecond.fl.fedfc.private_second_moments`, then clipped to its PSD part). For the
  softmax cross-entropy ``diag(s) - s s^T <= 1/2 I``, so ``hessian_scale = 0.5`` (default)
  makes ``H_i`` a fixed upper bound of the true Hessian (a majorization Newton step). It is
  computed once, not every round.
- Gradients: the paper's noisy clipped mean gradient
  (:func:`dpprecond.fl.client.full_batch_messages`, multiplier ``z_grad``) each round.
- Everything a client sends (``y_i``) and keeps (``lambda_i``) is a function of its two
  noisy releases and of server broadcasts: post-processing.

Privacy unit: one record of one client, replace-one. Releases per client: one covariance
(``Gaussian(z_cov)``, sensitivity ``sqrt(2) C_x^2`` of the upper triangle) and ``T``
gradients (``Gaussian(z_grad)``, sensitivity ``2C``), composed exactly by dp_accounting with
the budget split ``covariance_share`` (see
:func:`dpprecond.fl.baseline_common.covariance_split_noise`). Noise streams as in
:mod:`dpprecond.fl.fedfc`.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import (
    SeedLike,
    check_int,
    check_positive,
)
from dpprecond.fl.baseline_common import BaselineResult
from dpprecond.fl.fedfc import fedfc_events, psd_part, setup_covariance_run
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.simulator import ClientData

__all__ = ["fednew_events", "run_fednew"]

logger = logging.getLogger(__name__)


def fednew_events(z_cov: float, z_grad: float, n_rounds: int) -> list[dp_event.DpEvent]:
    """One client's releases in order: its covariance, then one gradient per round."""
    return fedfc_events(z_cov, z_grad, n_rounds)


def run_fednew(model: LinearSoftmax, data: ClientData, *, X_test: np.ndarray,
               y_test: np.ndarray, n_rounds: int = 70, learning_rate: float = 1.0,
               rho: float = 1.0, alpha: float = 0.0, hessian_scale: float = 0.5,
               row_clip: float | None = None, covariance_share: float = 0.2,
               clip_norm: float = 10.0, target_epsilon: float | None = None,
               target_delta: float = 1e-5, noise_multiplier: float | None = None,
               accountant: str = "pld",
                 seed: SeedLike = None,
               progress: bool = False) -> BaselineResult:
    """Run DP-FedNew (see the module docstring for the algorithm and its accounting).

    Parameters
    ----------
    model : LinearSoftmax
        The linear head.
    data : ClientData
        Client-contiguous training data.
    X_test, y_test : ndarray
        Evaluation data (accuracy after every round).
    n_rounds : int
        Rounds ``T``.
    learning_rate : float
        Server step ``eta`` on the ADMM direction.
    rho, alpha : float
        ADMM penalty (> 0) and the proximal ridge (>= 0).
    hessian_scale : float
        ``H_i = hessian_scale * C_i (x) I``.
    row_clip, covariance_share, clip_norm, target_epsilon, target_delta, noise_multiplier,
    accountant
        As in :func:`dpprecond.fl.fedfc.run_fedfc`.
    seed : None, int, SeedSequence or Generator
        Root of all randomness; ``None`` (default) is fresh OS entropy, a fixed seed is for
        reproducible research only (see :func:`dpprecond._validation.check_seed`).
    progress : bool
        tqdm bar over rounds.
    """
    if not isinstance(model, LinearSoftmax):
        raise TypeError(f"DP-FedNew uses the curvature of a linear head; expected "
                        f"LinearSoftmax, got {type(model).__name__}.")
    n_rounds = check_int("n_rounds", n_rounds, low=1)
    lr = check_positive("learning_rate", learning_rate)
    rho = check_positive("rho", rho)
    alpha = check_positive("alpha", alpha, allow_zero=True)
    h = check_positive("hessian_scale", hessian_scale)
    d1, k = model.n_features + 1, model.n_classes
    run = setup_covariance_run(data, d1, n_rounds=n_rounds, row_clip=row_clip, X_test=X_test,
                               y_test=y_test, clip_norm=clip_norm,
                               target_epsilon=target_epsilon, target_delta=target_delta,
                               noise_multiplier=noise_multiplier,
                               covariance_share=covariance_share, accountant=accountant,
                               seed=seed)
    row_clip, z_cov, z_grad = run.row_clip, run.z_cov, run.z_grad
    K = data.n_clients
    start = time.perf_counter()
    # Each client's (H_i + (alpha + rho) I)^{-1} on the feature side, (K, d1, d1).
    solvers = np.empty((K, d1, d1))
    for i, C_i in enumerate(run.second_moments()):
        w, V = psd_part(C_i)
        solvers[i] = (V / (h * w + alpha + rho)) @ V.T
    logger.info("DP-FedNew: K=%d, T=%d, z_cov=%.4g, z_grad=%.4g, curvature %.2f s", K,
                n_rounds, z_cov, z_grad, time.perf_counter() - start)
    lam = np.zeros((K, d1, k))
    y_bar = np.zeros((d1, k))

    def step(U: np.ndarray) -> np.ndarray:
        nonlocal lam, y_bar
        Y = np.matmul(solvers, U.reshape(K, d1, k) - lam + rho * y_bar)
        y_bar = Y.mean(axis=0)
        lam += rho * (Y - y_bar)
        return (-lr * y_bar).ravel()

    params, history, events = run.gradient_rounds(
        model, step, n_rounds=n_rounds, clip_norm=clip_norm, target_delta=target_delta,
        accountant=accountant, progress=progress)
    return BaselineResult(params, history, z_grad, history[-1]["epsilon"], float(target_delta),
                          {"method": "fednew", "n_rounds": n_rounds, "learning_rate": lr,
                           "rho": rho, "alpha": alpha, "hessian_scale": h,
                           "row_clip": row_clip, "covariance_share": covariance_share,
                           "z_cov": z_cov, "clip_norm": clip_norm,
                           "target_epsilon": target_epsilon, "accountant": accountant},
                     events=events)
