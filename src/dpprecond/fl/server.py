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
:func:`fednew_solvers`). The noise-aware SOFIM option (``sofim(..., noise_variance=...)``)
uses the public variance of the DP noise in the aggregate, from
:func:`aggregate_noise_variance`, to build the preconditioner from the signal in the
momentum rather than from its noise (see :func:`scale_by_sofim`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np

from dpprecond._validation import (
    check_array,
    check_choice,
    check_fraction,
    check_int,
    check_positive,
)
from dpprecond.fl.config import MECHANISMS, Mechanism

__all__ = [
    "GradientTransformation",
    "adam",
    "add_decayed_weights",
    "aggregate_noise_variance",
    "chain",
    "fedfc_preconditioner",
    "fednew_server",
    "fednew_solvers",
    "momentum_noise_variance",
    "preconditioned_server",
    "psd_part",
    "scaffold_server",
    "scale",
    "scale_by_adam",
    "scale_by_sofim",
    "scale_by_yogi",
    "sgd",
    "sherman_morrison_apply",
    "shrunk_sherman_morrison_apply",
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


def aggregate_noise_variance(noise_multiplier: float, clip_norm: float, sizes: Any,
                             weights: Any = None, *,
                             mechanism: Mechanism = "full-batch",
                             sampling_rate: float = 1.0, local_steps: int = 1) -> float:
    """Per-coordinate variance ``s^2`` of the DP noise in the aggregate ``G = sum_i w_i u_i``.

    The noise every client adds is independent Gaussian noise of a known scale, so the noise
    in the server's aggregate is ``N(0, s^2 I_p)`` with (see :mod:`dpprecond.fl.client`)

    - ``"full-batch"`` (the paper; record-level, replace-one): client ``i`` sends
      ``u_i = (sum_x clip_C(g(x)) + N(0, (2 z C)^2 I)) / |D_i|``, so
      ``s^2 = sum_i w_i^2 (2 z C / |D_i|)^2``;
    - ``"poisson"`` (record-level, add/remove-one): ``local_steps = L`` noisy steps with
      noise ``N(0, (z C)^2 I)`` each, normalised by the expected batch ``q |D_i|`` and
      averaged, so ``s^2 = sum_i w_i^2 (z C / (q |D_i|))^2 / L``;
    - ``"client-level"``: one draw ``N(0, (2 z C)^2 I)`` added to the sum of the clipped
      client updates, divided by ``K``: ``s^2 = (2 z C / K)^2`` (uniform weights only).

    Privacy: ``s^2`` is a function of public quantities only (``z``, calibrated from
    ``(epsilon, delta, T)`` before training; ``C``; the weights; the client sizes), so using
    it on the server costs nothing. The sizes are public under the replace-one adjacency
    of the full-batch mechanism: replacing one record never changes ``|D_i|``, so every
    pair of neighbouring data sets has the same sizes. (The Poisson mechanism's
    add/remove-one adjacency does change ``|D_i|`` by one; there, as in the simulator, which
    normalises by ``q |D_i|``, the sizes are treated as public.)

    Parameters
    ----------
    noise_multiplier : float >= 0
        The run's ``z`` (e.g. ``dpprecond.fl.accounting.resolve_noise_multiplier(config)``);
        0 gives 0.
    clip_norm : float > 0
        Clipping norm ``C`` (may be ``inf`` only when ``noise_multiplier == 0``).
    sizes : array of shape (K,)
        Client data set sizes ``|D_i|`` (> 0).
    weights : array of shape (K,), optional
        Aggregation weights ``w_i >= 0``; default uniform ``1/K`` (the simulator's default).
    mechanism : {"full-batch", "poisson", "client-level"}
        The client mechanism.
    sampling_rate, local_steps
        ``q`` and ``L`` of the ``"poisson"`` mechanism (1 otherwise).

    Returns
    -------
    float
        ``s^2``, the variance of every coordinate of the aggregate's noise.
    """
    z = check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    C = check_positive("clip_norm", clip_norm, allow_inf=True)
    check_choice("mechanism", mechanism, MECHANISMS)
    q = check_fraction("sampling_rate", sampling_rate, low_open=True, high_open=False)
    L = check_int("local_steps", local_steps, low=1)
    if mechanism != "poisson" and q != 1.0:
        raise ValueError(f"sampling_rate={sampling_rate!r} needs mechanism='poisson' "
                         f"(got mechanism={mechanism!r}); use sampling_rate=1.")
    if mechanism == "full-batch" and L != 1:
        raise ValueError(f"local_steps={local_steps!r} needs mechanism='poisson' or "
                         "'client-level'; the full-batch mechanism sends one step per round.")
    sizes_arr = check_array("sizes", sizes, ndim=1)
    if (sizes_arr <= 0).any():
        raise ValueError(f"Expected every client size > 0, got sizes with minimum "
                         f"{sizes_arr.min()!r}.")
    K = sizes_arr.shape[0]
    if weights is None:
        w = np.full(K, 1.0 / K)
    else:
        w = check_array("weights", weights, ndim=1)
        if w.shape[0] != K:
            raise ValueError(f"Expected one weight per client ({K}), got {w.shape[0]} "
                             "weights.")
        if (w < 0).any():
            raise ValueError(f"Expected weights >= 0, got a weight of {w.min()!r}.")
    if z == 0.0:
        return 0.0
    if math.isinf(C):
        raise ValueError("clip_norm=inf with noise_multiplier > 0 is infinite noise; a "
                         "private run needs a finite clip_norm.")
    if mechanism == "client-level":
        if weights is not None and not np.allclose(w, 1.0 / K, rtol=1e-12, atol=0.0):
            raise ValueError("Client-level DP aggregates with uniform weights 1/K; got "
                             "non-uniform weights (leave weights=None).")
        std = np.array([2.0 * z * C / K])
    elif mechanism == "full-batch":
        std = w * (2.0 * z * C / sizes_arr)
    else:
        std = w * (z * C / (q * sizes_arr)) / math.sqrt(L)
    with np.errstate(over="ignore"):
        s2 = float(np.sum(np.square(std)))
    if not math.isfinite(s2):
        raise ValueError(f"The noise variance overflows float64 (noise_multiplier={z!r}, "
                         f"clip_norm={C!r}); such noise leaves no signal to learn from.")
    return s2


def momentum_noise_variance(noise_variance: float, beta: float, rounds: int,
                            bias_correction: bool = True) -> float:
    """Per-coordinate variance of the noise in SOFIM's momentum after ``rounds`` rounds.

    With ``G_k = g_k + n_k``, ``n_k ~ N(0, s^2 I)`` independent across rounds and
    ``M_t = (1 - beta) sum_{k<=t} beta^(t-k) G_k``, the noise of ``M_t`` has variance
    ``s^2 (1 - beta)^2 sum_{j<t} beta^(2j) = s^2 (1 - beta) (1 - beta^(2t)) / (1 + beta)``
    per coordinate; the bias-corrected ``M_t / (1 - beta^t)`` has
    ``s^2 (1 - beta) (1 + beta^t) / ((1 + beta) (1 - beta^t))``, which is ``s^2`` at
    ``t = 1`` and falls to ``s^2 (1 - beta) / (1 + beta)`` (``s^2 / 19`` at beta 0.9).
    ``rounds = 0`` (the empty momentum) gives 0.
    """
    s2 = check_positive("noise_variance", noise_variance, allow_zero=True)
    b = check_fraction("beta", beta)
    t = check_int("rounds", rounds, low=0)
    if t == 0 or s2 == 0.0:
        return 0.0
    if b == 0.0:
        return s2
    bt = b**t
    one_minus_bt = -math.expm1(t * math.log(b))  # 1 - beta^t without cancellation
    ratio = (1.0 - b) / (1.0 + b)
    if bias_correction:
        return s2 * ratio * (1.0 + bt) / one_minus_bt
    return s2 * ratio * one_minus_bt * (1.0 + bt)


def _pow2_split(x: np.ndarray) -> tuple[int, np.ndarray]:
    """``x = xt * 2^e`` with ``max|xt|`` in ``[0.5, 1)`` (exact); ``(0, x)`` for ``x == 0``."""
    top = float(np.max(np.abs(x))) if x.size else 0.0
    if top == 0.0:
        return 0, x
    e = math.frexp(top)[1]
    return e, np.ldexp(x, -e)


def _ldexp(x: float, e: int) -> float:
    """``x * 2^e`` that saturates to ``inf``/0 instead of raising."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(x, e))


def _shrinkage(nu2: float, e: int, noise_energy: float) -> float:
    """``kappa = (1 - noise_energy / ||m||^2)_+`` for ``||m||^2 = nu2 * 4^e``."""
    if noise_energy == 0.0:
        return 1.0
    return max(0.0, 1.0 - _ldexp(noise_energy / nu2, -2 * e))


def shrunk_sherman_morrison_apply(m: np.ndarray, v: np.ndarray, rho: float,
                                  noise_energy: float = 0.0, bias: float = 0.0) -> np.ndarray:
    """``(m_s m_s^T + rho I)^{-1} v`` for the shrunk ``m_s = kappa m``, in O(p).

    ``kappa = (1 - noise_energy / ||m||^2)_+``, where ``noise_energy = E||noise in m||^2``
    (``p v`` for isotropic noise of variance ``v``), and the inner product ``m_s . v`` is
    replaced by ``kappa (m . v - bias)``, ``bias`` being the known expectation of
    ``m . v`` that comes from noise shared by ``m`` and ``v``. With
    ``noise_energy = bias = 0`` this is :func:`sherman_morrison_apply`. Computed on
    power-of-two rescaled copies of ``m`` and ``v``, so no finite input overflows in
    ``||m||^2`` or ``m . v``.
    """
    rho = check_positive("rho", rho)
    if not m.any():
        return v / rho
    em, mt = _pow2_split(m)
    nu2 = float(mt @ mt)  # in [0.25, p]
    kappa = _shrinkage(nu2, em, noise_energy)
    if kappa == 0.0:
        return v / rho
    # (rho + kappa^2 ||m||^2) / (kappa^2 4^em), infinite when the rank-one term is negligible
    denom = _ldexp(rho / (kappa * kappa), -2 * em) + nu2
    if not math.isfinite(denom):
        return v / rho
    ev, vt = _pow2_split(v)
    out = np.ldexp(vt - mt * (float(mt @ vt) / denom), ev)
    if bias:
        out = out + mt * _ldexp(bias / denom, -em)
    return out / rho


def _shrunk_momentum_direction(m_hat: np.ndarray, rho: float,
                               noise_energy: float) -> np.ndarray:
    """``(m_s m_s^T + rho I)^{-1} m_hat = m_hat / (rho + kappa^2 ||m_hat||^2)`` in O(p)."""
    if not m_hat.any():
        return np.zeros_like(m_hat)
    e, mt = _pow2_split(m_hat)
    nu2 = float(mt @ mt)
    kappa = _shrinkage(nu2, e, noise_energy)
    # m_hat / (rho + kappa^2 nu2 4^e) = mt / (rho 2^-e + kappa^2 nu2 2^e)
    return mt / (_ldexp(rho, -e) + _ldexp(kappa * kappa * nu2, e))


class SofimState(NamedTuple):
    """Round counter and the EMA ``M_t`` of the aggregated gradients."""

    count: int  # type: ignore[assignment]  # shadows tuple.count, as in optax
    momentum: np.ndarray


def scale_by_sofim(beta: float = 0.9, rho: float = 0.5,
                   precondition: Literal["gradient", "momentum"] = "gradient",
                   bias_correction: bool = True,
                   warmup_rounds: int = 0,
                   lagged: bool = False,
                   noise_variance: float = 0.0) -> GradientTransformation:
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
    noise_variance : float >= 0, default=0
        (choice, beyond the paper) Noise-aware SOFIM: the per-coordinate variance ``s^2``
        of the DP noise in every aggregate ``G_t`` (public: :func:`aggregate_noise_variance`
        computes it from ``z``, ``C``, the client sizes and weights). When positive, ``H``
        is built from the James-Stein-shrunk momentum ``kappa M_hat`` and, for the paper's
        form, the known noise correlation is removed (derivation below). ``0`` (default)
        is the transform without the option, bit for bit.

    Notes
    -----
    Derivation of the noise-aware option. Write ``G_t = g_t + n_t`` with
    ``n_t ~ N(0, s^2 I_p)``, independent across rounds and of everything before round
    ``t`` (each client draws fresh Gaussian noise). The momentum is then
    ``M_hat_t = m_t + N_t``, ``m_t`` the same average of the signals ``g_k`` and ``N_t``
    Gaussian with per-coordinate variance ``v_t`` (:func:`momentum_noise_variance`:
    ``s^2`` at ``t = 1``, then ``s^2 (1 - beta) / (1 + beta)``). Hence
    ``E ||M_hat_t||^2 = ||m_t||^2 + p v_t``: the noise adds energy ``p v_t`` to the
    rank-one term, along a direction ``u = M_hat / ||M_hat||`` whose squared cosine with
    ``m_t`` is only about ``||m_t||^2 / (||m_t||^2 + p v_t)``.

    The preconditioner we want is that of the signal, ``(m m^T + rho I)^{-1}``. The
    rank-one matrix ``a u u^T`` closest to ``m m^T`` in Frobenius norm has
    ``a = (u . m)^2``; with ``||m||^2 ~ ||M_hat||^2 - p v`` (unbiased) and
    ``u . m ~ ||m||^2 / ||M_hat||``, ``a ~ kappa^2 ||M_hat||^2`` with
    ``kappa = (1 - p v / ||M_hat||^2)_+``: the rank-one term is ``m_s m_s^T`` with
    ``m_s = kappa M_hat``, the positive-part James-Stein shrinkage of the momentum
    (``p`` in place of ``p - 2``). The directions become ``H(m_s) x``:

    - lagged gradient form: ``x = G_t``, ``m_s`` from ``M_hat_{t-1}`` (with
      ``v_{t-1}``), which is independent of ``n_t``;
    - the paper's gradient form: ``x = G_t`` and ``M_hat_t`` contains ``w_t n_t``
      (``w_t = (1 - beta) / (1 - beta^t)``, or ``1 - beta`` without bias correction), so
      ``E[M_hat_t . G_t] = m~ . g_t + w_t p s^2``. That known term is what turns the
      paper's step uphill under noise (docs/fl_results.md); it is subtracted from the
      inner product of the Sherman-Morrison formula;
    - momentum form: ``H(m_s) M_hat = M_hat / (rho + kappa^2 ||M_hat||^2)``. Without the
      option the noise energy sits in the denominator and the step shrinks to
      ``lr / (rho + p v)`` under noise; with it the step size depends on the signal only.

    With ``s^2 = 0``, ``kappa = 1`` and there is no correction. When the momentum is pure
    noise, ``kappa = 0`` about half the time and ``O(sqrt(2 / p))`` otherwise, so
    ``H ~ I / rho``: no random direction is deflated. ``rho`` and ``beta`` keep their
    meaning (ridge of the signal's Fisher, EMA coefficient). The isotropic part
    ``v_t I`` of ``E[M_hat M_hat^T]`` is not added to ``rho``: that would precondition
    the noise's second moment rather than the signal's, and only rescale the step by
    ``rho / (rho + v_t)``, which the learning rate absorbs. Approximations: ``m_t``
    depends on earlier noise through the iterates, which the estimates ignore, and
    ``||M_hat||^2 - p v`` has standard deviation about
    ``sqrt(2 p) v + 2 ||m|| sqrt(v)``. Everything is O(p) in time and memory.
    """
    beta = check_fraction("beta", beta)
    rho = check_positive("rho", rho)
    check_choice("precondition", precondition, ("gradient", "momentum"))
    if lagged and precondition != "gradient":
        raise ValueError("lagged=True applies to precondition='gradient' only.")
    warmup_rounds = check_int("warmup_rounds", warmup_rounds, low=0)
    s2 = check_positive("noise_variance", noise_variance, allow_zero=True)

    def noise_aware(grads: np.ndarray, state: SofimState, m_hat: np.ndarray,
                    t: int) -> np.ndarray:
        p = grads.size
        if precondition == "momentum":
            v = momentum_noise_variance(s2, beta, t, bias_correction)
            return _shrunk_momentum_direction(m_hat, rho, p * v)
        if lagged:
            prev = state.momentum
            if bias_correction and t > 1:
                prev = prev / (1.0 - beta ** (t - 1))
            v = momentum_noise_variance(s2, beta, t - 1, bias_correction)
            return shrunk_sherman_morrison_apply(prev, grads, rho, p * v)
        v = momentum_noise_variance(s2, beta, t, bias_correction)
        w = (1.0 - beta) / (1.0 - beta**t) if bias_correction else 1.0 - beta
        return shrunk_sherman_morrison_apply(m_hat, grads, rho, p * v, w * p * s2)

    def init(params: np.ndarray) -> SofimState:
        return SofimState(0, np.zeros_like(params))

    def update(grads: np.ndarray, state: SofimState,
               params: np.ndarray) -> tuple[np.ndarray, SofimState]:
        t = state.count + 1
        m = beta * state.momentum + (1.0 - beta) * grads
        m_hat = m / (1.0 - beta**t) if bias_correction else m
        if t <= warmup_rounds:
            direction = m_hat
        elif s2 > 0.0:
            direction = noise_aware(grads, state, m_hat, t)
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
          weight_decay: float = 0.0, lagged: bool = False,
          noise_variance: float = 0.0) -> GradientTransformation:
    """DP-FedSOFIM: ``theta <- theta - lr (d_t + wd theta)`` with ``d_t`` of
    :func:`scale_by_sofim`. Defaults are the published v2 settings (lr 0.1, beta 0.9,
    rho 0.5, bias correction on, no warm-up). ``noise_variance > 0`` (from
    :func:`aggregate_noise_variance`) turns on the noise-aware preconditioner."""
    return chain(scale_by_sofim(beta, rho, precondition, bias_correction, warmup_rounds,
                                lagged, noise_variance),
                 *_step(learning_rate, weight_decay))


def adam(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
         weight_decay: float = 0.0) -> GradientTransformation:
    """Server Adam (DP-FedAdam) with decoupled weight decay."""
    return chain(scale_by_adam(b1, b2, eps), *_step(learning_rate, weight_decay))


def yogi(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
         weight_decay: float = 0.0) -> GradientTransformation:
    """Server Yogi (DP-FedYogi) with decoupled weight decay."""
    return chain(scale_by_yogi(b1, b2, eps), *_step(learning_rate, weight_decay))


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
