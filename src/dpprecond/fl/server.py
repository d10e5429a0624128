"""Server optimizers as small composable ``(init, update)`` transforms (the optax idea).

A :class:`GradientTransformation` is a pair of pure functions: ``init(params) -> state`` and
``update(grads, state, params) -> (updates, new_state)``; the server applies
``params + updates``. States are small NamedTuples; :func:`chain` composes transforms left to
right. Everything here acts on one flat parameter vector and costs O(p) time and memory per
round: in particular the DP-FedSOFIM preconditioner ``(m m^T + rho I)^{-1}`` is applied by the
Sherman-Morrison formula and never formed.

The server only post-processes the clients' already-private messages, so no transform here
has any privacy cost.

Ready-made optimizers: :func:`sgd` (DP-FedGD), :func:`sofim` (DP-FedSOFIM), :func:`adam`
(DP-FedAdam) and :func:`yogi` (DP-FedYogi). They act on the aggregate of the clients'
messages. The baselines' server steps act on the per-client messages instead:
:func:`scaffold_server` (DP-SCAFFOLD, DP-FedAvg), :func:`preconditioned_server` (DP-FedFC,
with :func:`fedfc_preconditioner`) and :func:`fednew_server` (DP-FedNew, with
:func:`fednew_solvers`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np

from dpprecond._validation import check_choice, check_fraction, check_int, check_positive

__all__ = [
    "GradientTransformation",
    "adam",
    "add_decayed_weights",
    "chain",
    "fedfc_preconditioner",
    "fednew_server",
    "fednew_solvers",
    "make_optimizer",
    "preconditioned_server",
    "psd_part",
    "scaffold_server",
    "scale",
    "scale_by_adam",
    "scale_by_sofim",
    "scale_by_yogi",
    "sgd",
    "sherman_morrison_apply",
    "sofim",
    "trace",
    "yogi",
]

State = Any


class GradientTransformation(NamedTuple):
    """``init(params) -> state``; ``update(grads, state, params) -> (updates, state)``."""

    init: Callable[[np.ndarray], State]
    update: Callable[[np.ndarray, State, np.ndarray], tuple[np.ndarray, State]]


class EmptyState(NamedTuple):
    """State of a stateless transform."""


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply ``transforms`` in order; the state is the tuple of their states."""

    def init(params: np.ndarray) -> tuple[State, ...]:
        return tuple(t.init(params) for t in transforms)

    def update(grads: np.ndarray, state: tuple[State, ...],
               params: np.ndarray) -> tuple[np.ndarray, tuple[State, ...]]:
        new_states = []
        for t, s in zip(transforms, state, strict=True):
            grads, s = t.update(grads, s, params)
            new_states.append(s)
        return grads, tuple(new_states)

    return GradientTransformation(init, update)


def scale(factor: float) -> GradientTransformation:
    """Multiply by a constant (``scale(-lr)`` turns a direction into a descent step)."""

    def update(grads: np.ndarray, state: EmptyState,
               params: np.ndarray) -> tuple[np.ndarray, EmptyState]:
        return factor * grads, state

    return GradientTransformation(lambda params: EmptyState(), update)


def add_decayed_weights(weight_decay: float) -> GradientTransformation:
    """Add ``weight_decay * params`` (decoupled weight decay when placed before the step)."""
    wd = check_positive("weight_decay", weight_decay, allow_zero=True)

    def update(grads: np.ndarray, state: EmptyState,
               params: np.ndarray) -> tuple[np.ndarray, EmptyState]:
        return (grads + wd * params if wd else grads), state

    return GradientTransformation(lambda params: EmptyState(), update)


class TraceState(NamedTuple):
    """Heavy-ball momentum buffer."""

    trace: np.ndarray


def trace(momentum: float) -> GradientTransformation:
    """Heavy-ball momentum ``m <- momentum * m + g``; outputs ``m``."""
    mu = check_fraction("momentum", momentum)

    def update(grads: np.ndarray, state: TraceState,
               params: np.ndarray) -> tuple[np.ndarray, TraceState]:
        m = mu * state.trace + grads
        return m, TraceState(m)

    return GradientTransformation(lambda params: TraceState(np.zeros_like(params)), update)


def sherman_morrison_apply(m: np.ndarray, v: np.ndarray, rho: float) -> np.ndarray:
    """``(m m^T + rho I)^{-1} v = (v - m (m.v) / (rho + ||m||^2)) / rho`` in O(p)."""
    return (v - m * (float(m @ v) / (rho + float(m @ m)))) / rho


class SofimState(NamedTuple):
    """Round counter and the EMA ``M_t`` of the aggregated gradients."""

    count: int  # type: ignore[assignment]  # shadows tuple.count, as in optax
    momentum: np.ndarray


def scale_by_sofim(beta: float = 0.9, rho: float = 0.5,
                   precondition: Literal["gradient", "momentum"] = "gradient",
                   bias_correction: bool = True,
                   warmup_rounds: int = 0,
                   lagged: bool = False) -> GradientTransformation:
    """The DP-FedSOFIM direction: a rank-one regularized Fisher preconditioner.

    ``M_t = beta M_{t-1} + (1 - beta) G_t`` (``M_0 = 0``), ``M_hat = M_t / (1 - beta^t)`` if
    ``bias_correction``, ``H = (M_hat M_hat^T + rho I)^{-1}`` applied by Sherman-Morrison.
    Direction ``H G_t`` (``precondition="gradient"``, the paper) or
    ``H M_hat = M_hat / (rho + ||M_hat||^2)`` (``"momentum"``, the authors' code). During
    the first ``warmup_rounds`` rounds the direction is ``M_hat`` itself.

    Parameters
    ----------
    beta : float in [0, 1)
        EMA coefficient of the gradient momentum.
    rho : float > 0
        Ridge of the regularized Fisher matrix.
    precondition : {"gradient", "momentum"}
        Which vector the preconditioner multiplies.
    bias_correction : bool
        Divide ``M_t`` by ``1 - beta^t`` (Adam-style).
    warmup_rounds : int >= 0
        Rounds that use the bias-corrected momentum without preconditioning.
    lagged : bool, default=False
        (choice, beyond the paper) Only for ``precondition="gradient"``: build ``H`` from the
        previous momentum ``M_hat_{t-1}`` (``H = I / rho`` in round 1) instead of ``M_hat_t``.
        ``M_hat_t`` contains the current noisy ``G_t``, which correlates ``H`` with the noise
        it multiplies; in our noisy runs this drives the paper's form up the loss (see
        docs/fl_results.md). The lagged form removes that correlation.
    """
    beta = check_fraction("beta", beta)
    rho = check_positive("rho", rho)
    check_choice("precondition", precondition, ("gradient", "momentum"))
    if lagged and precondition != "gradient":
        raise ValueError("lagged=True applies to precondition='gradient' only.")
    warmup_rounds = check_int("warmup_rounds", warmup_rounds, low=0)

    def init(params: np.ndarray) -> SofimState:
        return SofimState(0, np.zeros_like(params))

    def update(grads: np.ndarray, state: SofimState,
               params: np.ndarray) -> tuple[np.ndarray, SofimState]:
        t = state.count + 1
        m = beta * state.momentum + (1.0 - beta) * grads
        m_hat = m / (1.0 - beta**t) if bias_correction else m
        if t <= warmup_rounds:
            direction = m_hat
        elif precondition == "gradient" and lagged:
            prev = state.momentum
            if bias_correction and t > 1:
                prev = prev / (1.0 - beta ** (t - 1))
            direction = sherman_morrison_apply(prev, grads, rho)
        elif precondition == "gradient":
            direction = sherman_morrison_apply(m_hat, grads, rho)
        else:
            direction = m_hat / (rho + float(m_hat @ m_hat))
        return direction, SofimState(t, m)

    return GradientTransformation(init, update)


class AdamState(NamedTuple):
    """Round counter, first and second moments."""

    count: int  # type: ignore[assignment]  # shadows tuple.count, as in optax
    mu: np.ndarray
    nu: np.ndarray


def _check_betas(b1: float, b2: float, eps: float) -> tuple[float, float, float]:
    return (check_fraction("b1", b1), check_fraction("b2", b2),
            check_positive("eps", eps))


def scale_by_adam(b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> GradientTransformation:
    """Adam's direction with bias correction (server Adam of Reddi et al., 2021)."""
    b1, b2, eps = _check_betas(b1, b2, eps)

    def init(params: np.ndarray) -> AdamState:
        return AdamState(0, np.zeros_like(params), np.zeros_like(params))

    def update(grads: np.ndarray, state: AdamState,
               params: np.ndarray) -> tuple[np.ndarray, AdamState]:
        t = state.count + 1
        mu = b1 * state.mu + (1 - b1) * grads
        nu = b2 * state.nu + (1 - b2) * grads * grads
        direction = (mu / (1 - b1**t)) / (np.sqrt(nu / (1 - b2**t)) + eps)
        return direction, AdamState(t, mu, nu)

    return GradientTransformation(init, update)


def scale_by_yogi(b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
                  initial_accumulator: float = 1e-6) -> GradientTransformation:
    """Yogi's direction: ``v <- v - (1 - b2) sign(v - g^2) g^2`` (Zaheer et al., 2018)."""
    b1, b2, eps = _check_betas(b1, b2, eps)
    v0 = check_positive("initial_accumulator", initial_accumulator, allow_zero=True)

    def init(params: np.ndarray) -> AdamState:
        return AdamState(0, np.zeros_like(params), np.full_like(params, v0))

    def update(grads: np.ndarray, state: AdamState,
               params: np.ndarray) -> tuple[np.ndarray, AdamState]:
        t = state.count + 1
        g2 = grads * grads
        mu = b1 * state.mu + (1 - b1) * grads
        nu = state.nu - (1 - b2) * np.sign(state.nu - g2) * g2
        return mu / (np.sqrt(nu) + eps), AdamState(t, mu, nu)

    return GradientTransformation(init, update)


def _step(learning_rate: float, weight_decay: float) -> list[GradientTransformation]:
    lr = check_positive("learning_rate", learning_rate)
    wd = check_positive("weight_decay", weight_decay, allow_zero=True)
    tail = [add_decayed_weights(wd)] if wd else []
    return [*tail, scale(-lr)]


def sgd(learning_rate: float = 0.1, momentum: float = 0.0,
        weight_decay: float = 0.0) -> GradientTransformation:
    """Server SGD ``theta <- theta - lr (G + wd theta)``: DP-FedGD (optionally heavy-ball)."""
    head = [trace(momentum)] if momentum else []
    return chain(*head, *_step(learning_rate, weight_decay))


def sofim(learning_rate: float = 0.1, beta: float = 0.9, rho: float = 0.5,
          precondition: Literal["gradient", "momentum"] = "gradient",
          bias_correction: bool = True, warmup_rounds: int = 0,
          weight_decay: float = 0.0, lagged: bool = False) -> GradientTransformation:
    """DP-FedSOFIM: ``theta <- theta - lr (d_t + wd theta)`` with ``d_t`` of
    :func:`scale_by_sofim`. Defaults are the published v2 settings (lr 0.1, beta 0.9,
    rho 0.5, bias correction on, no warm-up)."""
    return chain(scale_by_sofim(beta, rho, precondition, bias_correction, warmup_rounds,
                                lagged),
                 *_step(learning_rate, weight_decay))


def adam(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
         weight_decay: float = 0.0) -> GradientTransformation:
    """Server Adam (DP-FedAdam) with decoupled weight decay."""
    return chain(scale_by_adam(b1, b2, eps), *_step(learning_rate, weight_decay))


def yogi(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
         weight_decay: float = 0.0) -> GradientTransformation:
    """Server Yogi (DP-FedYogi) with decoupled weight decay."""
    return chain(scale_by_yogi(b1, b2, eps), *_step(learning_rate, weight_decay))


ALGORITHMS: tuple[str, ...] = ("fedgd", "sofim", "sofim-momentum", "sofim-lagged", "adam",
                               "yogi")


def make_optimizer(algorithm: str, learning_rate: float | None = None,
                   **kwargs: Any) -> GradientTransformation:
    """Build a server optimizer by name: ``"fedgd"``, ``"sofim"`` (gradient form),
    ``"sofim-momentum"`` (the authors' form), ``"sofim-lagged"`` (gradient form with the
    previous momentum, our option), ``"adam"`` or ``"yogi"``.

    ``learning_rate=None`` uses the optimizer's default; ``kwargs`` go to the factory.
    """
    check_choice("algorithm", algorithm, ALGORITHMS)
    lr: dict[str, Any] = {} if learning_rate is None else {"learning_rate": learning_rate}
    if algorithm == "fedgd":
        return sgd(**lr, **kwargs)
    if algorithm == "sofim":
        return sofim(**lr, precondition="gradient", **kwargs)
    if algorithm == "sofim-momentum":
        return sofim(**lr, precondition="momentum", **kwargs)
    if algorithm == "sofim-lagged":
        return sofim(**lr, precondition="gradient", lagged=True, **kwargs)
    if algorithm == "adam":
        return adam(**lr, **kwargs)
    return yogi(**lr, **kwargs)


# -- server steps of the baselines (on per-client messages) ------------------------------


class ScaffoldState(NamedTuple):
    """The server's control variate ``c`` of DP-SCAFFOLD (zeros, unused, for DP-FedAvg)."""

    control: np.ndarray


def scaffold_server(global_lr: float = 1.0,
                    control_variates: bool = True) -> GradientTransformation:
    """DP-SCAFFOLD's server step (``control_variates=False``: DP-FedAvg's).

    Input: the pair ``(delta_y, delta_c)`` of per-client arrays (K, p): each client's model
    change after its local steps and the change of its control variate (``None`` without
    control variates). ``theta <- theta + global_lr mean_i delta_y_i`` and
    ``c <- c + mean_i delta_c_i``. Post-processing of the clients' releases.
    """
    glr = check_positive("global_lr", global_lr)

    def init(params: np.ndarray) -> ScaffoldState:
        return ScaffoldState(np.zeros_like(params))

    def update(messages: Any, state: ScaffoldState,
               params: np.ndarray) -> tuple[np.ndarray, ScaffoldState]:
        delta_y, delta_c = messages
        control = state.control
        if control_variates and delta_c is not None:
            control = control + delta_c.mean(axis=0)
        return glr * delta_y.mean(axis=0), ScaffoldState(control)

    return GradientTransformation(init, update)


def psd_part(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (clipped at 0) and eigenvectors of a symmetric matrix."""
    w, V = np.linalg.eigh((S + S.T) / 2.0)
    return np.maximum(w, 0.0), V


def fedfc_preconditioner(second_moments: list[np.ndarray], gamma: float) -> np.ndarray:
    """``P = (PSD(mean_i C_i) + gamma I)^{-1}`` from the clients' released ``C_i``.

    ``PSD`` clips negative eigenvalues (of the noise) to 0; post-processing.
    """
    gamma = check_positive("gamma", gamma)
    mean_C = np.zeros_like(second_moments[0])
    for C_i in second_moments:
        mean_C += C_i / len(second_moments)
    w, V = psd_part(mean_C)
    return (V / (w + gamma)) @ V.T


def preconditioned_server(P: np.ndarray, learning_rate: float,
                          n_classes: int) -> GradientTransformation:
    """DP-FedFC's server step: ``W <- W - lr P mean_i U_i`` on the linear head's feature side.

    Input: the per-client messages ``U`` (K, (d + 1) k) of a linear softmax head, whose
    parameters reshape to ``(d + 1, k)``; ``P`` is (d + 1, d + 1). Stateless.
    """
    lr = check_positive("learning_rate", learning_rate)
    d1 = P.shape[0]

    def update(U: np.ndarray, state: EmptyState,
               params: np.ndarray) -> tuple[np.ndarray, EmptyState]:
        G = U.mean(axis=0).reshape(d1, n_classes)
        return (-lr * (P @ G)).ravel(), state

    return GradientTransformation(lambda params: EmptyState(), update)


def fednew_solvers(second_moments: list[np.ndarray], *, hessian_scale: float, alpha: float,
                   rho: float) -> np.ndarray:
    """Each client's ``(H_i + (alpha + rho) I)^{-1}`` with ``H_i = hessian_scale PSD(C_i)``.

    Shape (K, d + 1, d + 1), on the feature side of the linear head (the Hessian bound is
    ``H_i (x) I_k``). Post-processing of the released ``C_i``.
    """
    solvers = np.empty((len(second_moments), *second_moments[0].shape))
    for i, C_i in enumerate(second_moments):
        w, V = psd_part(C_i)
        solvers[i] = (V / (hessian_scale * w + alpha + rho)) @ V.T
    return solvers


class FedNewState(NamedTuple):
    """Per-client ADMM duals ``lambda_i`` (K, d + 1, k) and the consensus ``y`` (d + 1, k)."""

    duals: np.ndarray
    consensus: np.ndarray


def fednew_server(solvers: np.ndarray, *, rho: float, learning_rate: float,
                  n_classes: int) -> GradientTransformation:
    """DP-FedNew: one ADMM iteration of the federated Newton system per round.

    Input: the per-client noisy gradients ``U`` (K, (d + 1) k).
    ``y_i = solver_i (U_i - lambda_i + rho y)``, ``y = mean_i y_i``,
    ``lambda_i <- lambda_i + rho (y_i - y)``, update ``-learning_rate y``
    (see :mod:`dpprecond.fl.methods` for the method and its choices). In a deployment the
    ``y_i`` and ``lambda_i`` live on the clients; every one of them is a function of the
    client's releases and of server broadcasts, so this is post-processing.
    """
    rho = check_positive("rho", rho)
    lr = check_positive("learning_rate", learning_rate)
    K, d1 = solvers.shape[0], solvers.shape[1]

    def init(params: np.ndarray) -> FedNewState:
        return FedNewState(np.zeros((K, d1, n_classes)), np.zeros((d1, n_classes)))

    def update(U: np.ndarray, state: FedNewState,
               params: np.ndarray) -> tuple[np.ndarray, FedNewState]:
        Y = np.matmul(solvers, U.reshape(K, d1, n_classes) - state.duals
                      + rho * state.consensus)
        consensus = Y.mean(axis=0)
        duals = state.duals + rho * (Y - consensus)
        return (-lr * consensus).ravel(), FedNewState(duals, consensus)

    return GradientTransformation(init, update)
