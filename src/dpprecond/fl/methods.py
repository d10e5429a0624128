"""Every named federated algorithm as a configuration of the one round engine.

A method is three things (the engine, :mod:`dpprecond.fl.engine`, runs all of them the
same way):

1. its **release schedule** (:class:`dpprecond.fl.accounting.Schedule`): what one client
   releases over a run, as a function of one noise scale, from which the noise is
   calibrated and every release is recorded in the ledger;
2. its **client mechanism** (:mod:`dpprecond.fl.client`): the private messages of one round,
   plus any one-off release before the first round;
3. its **server transform** (:mod:`dpprecond.fl.server`), an ``(init, update)`` pair that
   post-processes the messages.

=================  ========================================  ==============================
name               client releases (per client)              server transform
=================  ========================================  ==============================
fedgd              config.mechanism, 1 per round             SGD on the aggregate
sofim              "                                         SOFIM, the paper's form
sofim-momentum     "                                         SOFIM, the authors' code form
sofim-lagged       "                                         SOFIM, our lagged form
adam, yogi         "                                         server Adam / Yogi
fedavg             L noisy full-batch local steps per round  mean model change
scaffold           same, corrected by control variates       mean change + control variate
fedfc              one covariance, then 1 gradient per round  P (mean C + gamma I)^-1 step
fednew             one covariance, then 1 gradient per round  one ADMM Newton iteration
=================  ========================================  ==============================

:func:`make_method` builds one by name with its options (each factory's keyword arguments;
:func:`method_options` lists them with their defaults, which the experiment schema uses to
check a config at load time).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dpprecond._validation import check_choice, check_fraction, check_int, check_positive
from dpprecond.fl import client as client_mod
from dpprecond.fl import server as server_mod
from dpprecond.fl.accounting import Schedule, round_event
from dpprecond.fl.config import FLConfig
from dpprecond.fl.models import FLModel, LinearSoftmax

__all__ = [
    "METHODS",
    "CovarianceMethod",
    "GradientMethod",
    "LocalStepsMethod",
    "Method",
    "NoisyPreconditionerWarning",
    "RunContext",
    "make_method",
    "method_options",
]


@dataclass
class RunContext:
    """What a method sees of a run: model, data, settings, noise and the release hook.

    ``release(event, count)`` records releases in the run's ledger; ``multipliers`` holds
    the calibrated noise multipliers (``z``; or ``z_cov`` and ``z_grad``); ``noise_root``
    and ``setup_root`` are the seed sequences of the per-(round, client) streams. ``X`` is
    the array the gradient passes read (``data.X``, or its float32 copy with
    ``config.precision="float32"``); ``x_sq_norms`` are its squared row norms in float64.
    """

    model: FLModel
    data: Any
    config: FLConfig
    multipliers: dict[str, float]
    noise_root: np.random.SeedSequence
    setup_root: np.random.SeedSequence
    release: Callable[..., None]
    x_sq_norms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    weights: np.ndarray = field(default_factory=lambda: np.zeros(0))
    X: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


class Method:
    """A named algorithm: release schedule, client mechanism and server transform."""

    name: str = "method"

    def schedule(self, config: FLConfig) -> Schedule:
        """What one client releases over the run (for calibration and the ledger)."""
        raise NotImplementedError

    def check(self, config: FLConfig, model: FLModel) -> None:
        """Refuse settings the method cannot run with (``ValueError``/``TypeError``)."""

    def start(self, run: RunContext, params: np.ndarray) -> Any:
        """One-off releases and the initial state (server transform state included)."""
        raise NotImplementedError

    def round(self, run: RunContext, t: int, params: np.ndarray,
              state: Any) -> tuple[np.ndarray, Any]:
        """One round: the clients' private messages, then the server transform."""
        raise NotImplementedError

    def noise_multiplier(self, multipliers: dict[str, float]) -> float:
        """The per-round gradient release's noise multiplier (reported in results)."""
        return multipliers.get("z", multipliers.get("z_grad", 0.0))

    def describe(self) -> dict[str, Any]:
        """Name and options (JSON-ready), for results and checkpoints."""
        return {"method": self.name}


class NoisyPreconditionerWarning(UserWarning):
    """A method whose preconditioner is known to act on the noise runs with noise."""


class GradientMethod(Method):
    """One private message per client per round (``config.mechanism``), aggregated with the
    config's weights, then an optax-style transform (:mod:`dpprecond.fl.server`).

    ``noise_warning``: a message to warn with (:class:`NoisyPreconditionerWarning`) when
    the run adds noise. ``noise_aware``: a builder ``s2 -> transform`` for a transform that
    uses the public per-coordinate variance ``s2`` of the noise in the aggregate
    (:func:`dpprecond.fl.server.aggregate_noise_variance`); the engine builds it at the
    start of a run from the noise multiplier, the clip norm, the client sizes and the
    weights (all public), so it costs no privacy.
    """

    def __init__(self, transform: server_mod.GradientTransformation, name: str = "custom",
                 options: dict[str, Any] | None = None,
                 noise_warning: str | None = None,
                 noise_aware: Callable[[float], server_mod.GradientTransformation] | None
                 = None) -> None:
        self.transform = transform
        self.name = name
        self.options = dict(options or {})
        self.noise_warning = noise_warning
        self.noise_aware = noise_aware

    def transform_for(self, noise_variance: float) -> server_mod.GradientTransformation:
        """The server transform for a run whose aggregate carries noise of variance
        ``noise_variance`` per coordinate (the plain transform unless noise-aware). The
        states of both have the same structure."""
        if self.noise_aware is None:
            return self.transform
        return self.noise_aware(noise_variance)

    def aggregate_noise_variance(self, config: FLConfig, z: float, sizes: np.ndarray,
                                 weights: np.ndarray) -> float:
        """``s2`` of the aggregate ``sum_i w_i u_i`` under ``config``'s mechanism."""
        return server_mod.aggregate_noise_variance(
            z, config.clip_norm, sizes, weights, mechanism=config.mechanism,
            sampling_rate=config.sampling_rate, local_steps=config.local_steps)

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, **self.options}

    def schedule(self, config: FLConfig) -> Schedule:
        return Schedule.rounds(config)

    def start(self, run: RunContext, params: np.ndarray) -> Any:
        z = run.multipliers.get("z", 0.0)
        if self.noise_warning and z > 0:
            warnings.warn(self.noise_warning, NoisyPreconditionerWarning, stacklevel=2)
        if self.noise_aware is not None:  # every client replies: one s2 for the run
            self.transform = self.transform_for(self.aggregate_noise_variance(
                run.config, z, np.diff(run.data.bounds), run.weights))
        return self.transform.init(params)

    def round(self, run: RunContext, t: int, params: np.ndarray,
              state: Any) -> tuple[np.ndarray, Any]:
        cfg, data, z = run.config, run.data, run.multipliers["z"]
        K = data.n_clients
        rngs = client_mod.round_generators(run.noise_root, t, K + 1)
        if cfg.mechanism == "full-batch":
            U = client_mod.full_batch_messages(run.model, params, run.X, data.y, data.bounds,
                                               cfg.clip_norm, z, rngs[:K],
                                               x_sq_norms=run.x_sq_norms)
            G = run.weights @ U
        elif cfg.mechanism == "poisson":
            U = client_mod.poisson_local_messages(
                run.model, params, run.X, data.y, data.bounds, cfg.clip_norm, z, rngs[:K],
                sampling_rate=cfg.sampling_rate, local_steps=cfg.local_steps,
                local_lr=cfg.local_lr)
            G = run.weights @ U
        else:
            G = client_mod.client_level_aggregate(
                run.model, params, run.X, data.y, data.bounds, cfg.clip_norm, z, rngs[K],
                local_steps=cfg.local_steps, local_lr=cfg.local_lr)
        run.release(round_event(z, cfg.mechanism, sampling_rate=cfg.sampling_rate,
                                local_steps=cfg.local_steps))
        return self.transform.update(G, state, params)


def _full_batch_only(name: str, config: FLConfig) -> None:
    if config.mechanism != "full-batch":
        raise ValueError(f"{name} defines its own releases on top of the full-batch client "
                         f"mechanism; got mechanism={config.mechanism!r}. Use "
                         "mechanism='full-batch' and set the method's own options.")


class LocalStepsMethod(Method):
    """DP-FedAvg and DP-SCAFFOLD: ``local_steps`` noisy full-batch steps per round.

    Privacy unit: one record of one client, replace-one. Every local step is one Gaussian
    release (sensitivity ``2C`` of the clipped sum, noise multiplier ``z``), so a run is
    ``T * local_steps`` compositions, and ``z`` is calibrated for exactly that schedule (no
    doubled noise, unlike the authors' code). DP-SCAFFOLD (Karimireddy et al. 2020, with the
    DP client step of Noble et al. 2022) corrects each local step by ``c - c_i``:

        y_i <- y_i - eta_l (g~ - c_i + c)                      (local_steps times)
        c_i+ = c_i - c + (theta - y_i) / (local_steps eta_l)
        theta <- theta + eta_g mean_i (y_i - theta),  c <- c + mean_i (c_i+ - c_i)

    Everything a client sends and keeps is a function of its noisy ``g~`` and of server
    broadcasts: post-processing. The client states ``c_i`` are kept by the engine between
    rounds; ``c`` is the server transform's state (:func:`dpprecond.fl.server.scaffold_server`).
    """

    def __init__(self, name: str, *, local_steps: int = 5, local_lr: float = 0.1,
                 global_lr: float = 1.0) -> None:
        self.name = check_choice("method", name, ("fedavg", "scaffold"))
        self.local_steps = check_int("local_steps", local_steps, low=1)
        self.local_lr = check_positive("local_lr", local_lr)
        self.global_lr = check_positive("global_lr", global_lr)
        self.control_variates = name == "scaffold"
        self.server = server_mod.scaffold_server(self.global_lr, self.control_variates)

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, "local_steps": self.local_steps,
                "local_lr": self.local_lr, "global_lr": self.global_lr}

    def check(self, config: FLConfig, model: FLModel) -> None:
        _full_batch_only("DP-SCAFFOLD/DP-FedAvg", config)

    def schedule(self, config: FLConfig) -> Schedule:
        return Schedule("local-steps", int(config.n_rounds), steps=self.local_steps)

    def updated_controls(self, c_i: np.ndarray, c: np.ndarray,
                         delta_y: np.ndarray) -> np.ndarray:
        """The clients' new control variates ``c_i+ = c_i - c - delta_y / (L eta_l)``.

        Row-wise (one row per client), so a client computes its own row alone (the Flower
        adapter calls this on each client); post-processing of its releases and of ``c``.
        """
        return c_i - c - delta_y / (self.local_steps * self.local_lr)

    def start(self, run: RunContext, params: np.ndarray) -> Any:
        client_controls = np.zeros((run.data.n_clients, params.shape[0]))
        return (self.server.init(params), client_controls)

    def round(self, run: RunContext, t: int, params: np.ndarray,
              state: Any) -> tuple[np.ndarray, Any]:
        server_state, c_i = state
        c = server_state.control
        K, z = run.data.n_clients, run.multipliers["z"]
        correction = (c - c_i) if self.control_variates else None
        delta_y = client_mod.local_step_deltas(
            run.model, params, run.X, run.data.y, run.data.bounds, run.config.clip_norm,
            z, client_mod.round_generators(run.noise_root, t, K),
            local_steps=self.local_steps, local_lr=self.local_lr, correction=correction,
            x_sq_norms=run.x_sq_norms)
        for _ in range(self.local_steps):
            run.release(round_event(z))
        delta_c = None
        if self.control_variates:
            c_new = self.updated_controls(c_i, c, delta_y)
            delta_c = c_new - c_i
            c_i = c_new
        update, server_state = self.server.update((delta_y, delta_c),  # type: ignore[arg-type]
                                                  server_state, params)
        return update, (server_state, c_i)


class CovarianceMethod(Method):
    """DP-FedFC and DP-FedNew: a one-off private feature second moment, then gradients.

    Every client releases, once, ``C_i = (sum_{x in D_i} x^ x^^T + E_i) / |D_i|`` with
    ``x^ = clip_{C_x}([x, 1])`` (:func:`dpprecond.fl.client.second_moment_releases`,
    sensitivity ``sqrt(2) C_x^2``, multiplier ``z_cov``), then every round the paper's noisy
    clipped mean gradient (multiplier ``z_grad``). The budget split: the covariance gets the
    share ``covariance_share`` of the GDP precision ``mu^2`` (:class:`Schedule`), one scale
    calibrated by dp_accounting on the composed events.

    DP-FedFC: the server keeps ``P = (PSD(mean_i C_i) + gamma I)^{-1}`` and steps
    ``W <- W - lr P G_t`` on the linear head's feature side (for a linear softmax head the
    Fisher is ``E[x~ x~^T] (x) Sigma``; ``P`` inverts its feature factor).

    DP-FedNew (Elgabli et al. 2022; DP version after Krouka, Koskela and Kulkarni, PoPETs
    2025): one ADMM iteration per round of the Newton system, warm-started, with
    ``H_i = hessian_scale PSD(C_i) (x) I_k`` (``hessian_scale = 1/2`` bounds the softmax
    cross-entropy Hessian, a majorization Newton step), computed once.

    Choices (named options): ``row_clip`` ``C_x`` (``None``: ``sqrt(d + 1)``, the largest
    norm of fixed-standardized pixel features in ``[-1, 1]^d``); ``covariance_share`` 0.2;
    uniform client weights. Noise streams: the covariance of client ``i`` from
    ``stream(setup_root, 0, i)``, the gradients of round ``t`` from ``stream(noise_root, t,
    i)``. With an explicit ``noise_multiplier`` the config's value is the overall scale
    ``c`` (the run is ``1/c``-GDP).
    """

    def __init__(self, name: str, *, learning_rate: float | None = None,
                 gamma: float = 1.0, rho: float = 1.0, alpha: float = 0.0,
                 hessian_scale: float = 0.5, row_clip: float | None = None,
                 covariance_share: float = 0.2) -> None:
        self.name = check_choice("method", name, ("fedfc", "fednew"))
        default_lr = 0.5 if name == "fedfc" else 1.0
        self.learning_rate = check_positive(
            "learning_rate", default_lr if learning_rate is None else learning_rate)
        self.gamma = check_positive("gamma", gamma)
        self.rho = check_positive("rho", rho)
        self.alpha = check_positive("alpha", alpha, allow_zero=True)
        self.hessian_scale = check_positive("hessian_scale", hessian_scale)
        self.row_clip = None if row_clip is None else check_positive("row_clip", row_clip,
                                                                     allow_inf=True)
        self.covariance_share = check_fraction("covariance_share", covariance_share,
                                               low_open=True)

    def describe(self) -> dict[str, Any]:
        out = {"method": self.name, "learning_rate": self.learning_rate,
               "row_clip": self.row_clip, "covariance_share": self.covariance_share}
        if self.name == "fedfc":
            out["gamma"] = self.gamma
        else:
            out.update(rho=self.rho, alpha=self.alpha, hessian_scale=self.hessian_scale)
        return out

    def check(self, config: FLConfig, model: FLModel) -> None:
        if not isinstance(model, LinearSoftmax):
            raise TypeError(f"{self.name} preconditions a linear head; expected "
                            f"LinearSoftmax, got {type(model).__name__}.")
        _full_batch_only("DP-FedFC/DP-FedNew", config)
        if config.private and self.row_clip is not None and math.isinf(self.row_clip):
            raise ValueError("A private run needs a finite row_clip; got row_clip=inf.")

    def schedule(self, config: FLConfig) -> Schedule:
        return Schedule("covariance", int(config.n_rounds), share=self.covariance_share)

    def noise_multiplier(self, multipliers: dict[str, float]) -> float:
        return multipliers["z_grad"]

    def feature_clip(self, n_features: int) -> float:
        """The row clip ``C_x`` of the covariance release (``row_clip`` or ``sqrt(d + 1)``)."""
        return math.sqrt(n_features + 1) if self.row_clip is None else self.row_clip

    def setup_from_moments(self, moments: list[np.ndarray]) -> np.ndarray:
        """Post-process the released ``C_i`` (client order): DP-FedFC's ``P`` (d + 1, d + 1),
        DP-FedNew's per-client solvers (K, d + 1, d + 1)."""
        if self.name == "fedfc":
            return server_mod.fedfc_preconditioner(moments, self.gamma)
        return server_mod.fednew_solvers(moments, hessian_scale=self.hessian_scale,
                                         alpha=self.alpha, rho=self.rho)

    def start(self, run: RunContext, params: np.ndarray) -> Any:
        model: LinearSoftmax = run.model  # type: ignore[assignment]
        data = run.data
        z_cov = run.multipliers["z_cov"]
        moments = list(client_mod.second_moment_releases(
            data.X, data.bounds, self.feature_clip(model.n_features), z_cov,
            client_mod.round_generators(run.setup_root, 0, data.n_clients)))
        run.release(round_event(z_cov))
        setup = self.setup_from_moments(moments)
        return (setup, self.server_transform(setup, model.n_classes).init(params))

    def server_transform(self, setup: np.ndarray,
                         n_classes: int) -> server_mod.GradientTransformation:
        """The server transform built from the post-processed one-off releases
        (:meth:`setup_from_moments`); DP-FedNew's acts on the clients of ``setup``'s rows."""
        if self.name == "fedfc":
            return server_mod.preconditioned_server(setup, self.learning_rate, n_classes)
        return server_mod.fednew_server(setup, rho=self.rho, learning_rate=self.learning_rate,
                                        n_classes=n_classes)

    def round(self, run: RunContext, t: int, params: np.ndarray,
              state: Any) -> tuple[np.ndarray, Any]:
        data, z = run.data, run.multipliers["z_grad"]
        U = client_mod.full_batch_messages(
            run.model, params, run.X, data.y, data.bounds, run.config.clip_norm, z,
            client_mod.round_generators(run.noise_root, t, data.n_clients),
            x_sq_norms=run.x_sq_norms)
        run.release(round_event(z))
        setup, server_state = state
        update, server_state = self.server_transform(setup, run.data.n_classes).update(
            U, server_state, params)
        return update, (setup, server_state)


# -- the registry -------------------------------------------------------------------------


def _fedgd(learning_rate: float = 0.1, momentum: float = 0.0,
           weight_decay: float = 0.0) -> Method:
    return GradientMethod(server_mod.sgd(learning_rate, momentum, weight_decay), "fedgd",
                          dict(learning_rate=learning_rate, momentum=momentum,
                               weight_decay=weight_decay))


PAPER_FORM_WARNING = (
    "method 'sofim' is the paper's form: its preconditioner is built from a momentum that "
    "contains the current noisy gradient, so under DP noise the expected step moves uphill "
    "from round 2 on (docs/fl_results.md, 'Why the paper's form fails under noise'). It is "
    "kept for comparison; the default method learns under noise (docs/fl.md).")


def _sofim_factory(name: str, precondition: Literal["gradient", "momentum"],
                   lagged: bool) -> Callable[..., Method]:
    def factory(learning_rate: float = 0.1, beta: float = 0.9, rho: float = 0.5,
                bias_correction: bool = True, warmup_rounds: int = 0,
                weight_decay: float = 0.0, noise_aware: bool = False) -> Method:
        if not isinstance(noise_aware, bool):
            raise TypeError(f"Expected noise_aware to be a bool, got {noise_aware!r}.")
        opts: dict[str, Any] = dict(learning_rate=learning_rate, beta=beta, rho=rho,
                                    bias_correction=bias_correction,
                                    warmup_rounds=warmup_rounds, weight_decay=weight_decay,
                                    noise_aware=noise_aware)

        def build(noise_variance: float) -> server_mod.GradientTransformation:
            return server_mod.sofim(learning_rate, beta, rho, precondition, bias_correction,
                                    warmup_rounds, weight_decay, lagged, noise_variance)

        warn = PAPER_FORM_WARNING if name == "sofim" and not noise_aware else None
        return GradientMethod(build(0.0), name, opts, warn, build if noise_aware else None)

    factory.__name__ = name.replace("-", "_")
    return factory


def _adaptive_factory(name: str) -> Callable[..., Method]:
    build = server_mod.adam if name == "adam" else server_mod.yogi

    def factory(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99,
                eps: float = 1e-3, weight_decay: float = 0.0) -> Method:
        opts = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                    weight_decay=weight_decay)
        return GradientMethod(build(**opts), name, opts)

    factory.__name__ = name
    return factory


def _fedavg(local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0) -> Method:
    return LocalStepsMethod("fedavg", local_steps=local_steps, local_lr=local_lr,
                            global_lr=global_lr)


def _scaffold(local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0) -> Method:
    return LocalStepsMethod("scaffold", local_steps=local_steps, local_lr=local_lr,
                            global_lr=global_lr)


def _fedfc(learning_rate: float = 0.5, gamma: float = 1.0, row_clip: float | None = None,
           covariance_share: float = 0.2) -> Method:
    return CovarianceMethod("fedfc", learning_rate=learning_rate, gamma=gamma,
                            row_clip=row_clip, covariance_share=covariance_share)


def _fednew(learning_rate: float = 1.0, rho: float = 1.0, alpha: float = 0.0,
            hessian_scale: float = 0.5, row_clip: float | None = None,
            covariance_share: float = 0.2) -> Method:
    return CovarianceMethod("fednew", learning_rate=learning_rate, rho=rho, alpha=alpha,
                            hessian_scale=hessian_scale, row_clip=row_clip,
                            covariance_share=covariance_share)


#: name -> factory; each factory's keyword arguments are the method's options.
METHODS: dict[str, Callable[..., Method]] = {
    "fedgd": _fedgd,
    "sofim": _sofim_factory("sofim", "gradient", False),
    "sofim-momentum": _sofim_factory("sofim-momentum", "momentum", False),
    "sofim-lagged": _sofim_factory("sofim-lagged", "gradient", True),
    "adam": _adaptive_factory("adam"),
    "yogi": _adaptive_factory("yogi"),
    "fedavg": _fedavg,
    "scaffold": _scaffold,
    "fedfc": _fedfc,
    "fednew": _fednew,
}


def method_options(name: str) -> dict[str, inspect.Parameter]:
    """The options of method ``name`` (keyword name -> ``inspect.Parameter``)."""
    check_choice("method", name, list(METHODS))
    return dict(inspect.signature(METHODS[name]).parameters)


def make_method(name: str, learning_rate: float | None = None, **options: Any) -> Method:
    """Build a method by name (see the module docstring); ``learning_rate=None`` keeps the
    method's default. Unknown options raise ``TypeError`` naming them and the valid ones."""
    valid = method_options(name)
    if learning_rate is not None:
        options["learning_rate"] = learning_rate
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown} for method {name!r}; valid options: "
                        f"{sorted(valid)}.")
    return METHODS[name](**options)
