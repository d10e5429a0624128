"""The gradient methods: one message per client per round, then a server transform.

DP-FedGD, the three DP-FedSOFIM forms, DP-FedAdam and DP-FedYogi share the client half
(the config's client mechanism, :class:`~dpprecond.fl.tasks.GradientTask`) and the release
schedule (one ``round_event`` per round); they differ in the optax-style server transform
(:mod:`dpprecond.fl.server`) applied to the weighted aggregate of the messages.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from dpprecond.fl import server as server_mod
from dpprecond.fl.accounting import Schedule
from dpprecond.fl.config import FLConfig
from dpprecond.fl.methods.base import Method, NoisyPreconditionerWarning, RunSpec
from dpprecond.fl.partition import client_weights
from dpprecond.fl.tasks import ClientTask, GradientTask

__all__ = ["PAPER_FORM_WARNING", "GradientMethod", "adaptive_factory", "fedgd",
           "sofim_factory"]


class GradientMethod(Method):
    """One private message per client per round (``config.mechanism``), aggregated with the
    config's weights over the repliers, then an optax-style transform.

    ``noise_warning``: a message to warn with (:class:`NoisyPreconditionerWarning`) when
    the run adds noise. ``noise_aware``: a builder ``s2 -> transform`` for a transform that
    uses the public per-coordinate variance ``s2`` of the noise in the aggregate
    (:func:`dpprecond.fl.server.aggregate_noise_variance`), computed at every update from
    the noise multiplier, the clip norm, the repliers' sizes and weights (all public), so
    it costs no privacy. The states of both transforms have the same structure.
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

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, **self.options}

    def schedule(self, config: FLConfig) -> Schedule:
        return Schedule.rounds(config)

    # -- client half

    def round_task(self, run: RunSpec) -> ClientTask:
        cfg = run.config
        return GradientTask(float(cfg.clip_norm), float(run.multipliers["z"]), cfg.mechanism,
                            float(cfg.sampling_rate), int(cfg.local_steps),
                            float(cfg.local_lr)).validated()

    def reports_sizes(self, config: FLConfig) -> bool:
        return config.validated().weighting == "size" or self.noise_aware is not None

    # -- server half

    def transform_for(self, noise_variance: float) -> server_mod.GradientTransformation:
        """The server transform for an aggregate whose noise has variance
        ``noise_variance`` per coordinate (the plain transform unless noise-aware)."""
        if self.noise_aware is None:
            return self.transform
        return self.noise_aware(noise_variance)

    def aggregate_noise_variance(self, config: FLConfig, z: float, sizes: np.ndarray,
                                 weights: np.ndarray) -> float:
        """``s2`` of the aggregate ``sum_i w_i u_i`` under ``config``'s mechanism."""
        return server_mod.aggregate_noise_variance(
            z, config.clip_norm, sizes, weights, mechanism=config.mechanism,
            sampling_rate=config.sampling_rate, local_steps=config.local_steps)

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        if self.noise_warning and run.multipliers.get("z", 0.0) > 0:
            warnings.warn(self.noise_warning, NoisyPreconditionerWarning, stacklevel=3)
        return self.transform.init(params)

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        weighting = run.config.weighting
        assert weighting is not None, "a run's config is validated (weighting resolved)"
        w = client_weights(sizes, weighting)
        if "aggregate" in replies:  # client-level: the trusted aggregator's noisy mean
            G = replies["aggregate"][0]
        else:
            G = w @ replies["message"]
        transform = self.transform
        if self.noise_aware is not None:  # the repliers set the aggregate's noise
            transform = self.transform_for(self.aggregate_noise_variance(
                run.config, float(run.multipliers.get("z", 0.0)), sizes, w))
        return transform.update(G, state, params)


def fedgd(learning_rate: float = 0.1, momentum: float = 0.0,
          weight_decay: float = 0.0) -> Method:
    """DP-FedGD: SGD (optionally with momentum) on the aggregate."""
    return GradientMethod(server_mod.sgd(learning_rate, momentum, weight_decay), "fedgd",
                          dict(learning_rate=learning_rate, momentum=momentum,
                               weight_decay=weight_decay))


PAPER_FORM_WARNING = (
    "method 'sofim' is the paper's form: its preconditioner is built from a momentum that "
    "contains the current noisy gradient, so under DP noise the expected step moves uphill "
    "from round 2 on (docs/fl_results.md, 'Why the paper's form fails under noise'). It is "
    "kept for comparison; the default method learns under noise (docs/fl.md).")


def sofim_factory(name: str, precondition: Literal["gradient", "momentum"],
                  lagged: bool) -> Callable[..., Method]:
    """The factory of one DP-FedSOFIM form (:func:`dpprecond.fl.server.sofim`)."""
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


def adaptive_factory(name: Literal["adam", "yogi"]) -> Callable[..., Method]:
    """The factory of server Adam or Yogi (DP-FedAdam, DP-FedYogi)."""
    build = server_mod.adam if name == "adam" else server_mod.yogi

    def factory(learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.99,
                eps: float = 1e-3, weight_decay: float = 0.0) -> Method:
        opts = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                    weight_decay=weight_decay)
        return GradientMethod(build(**opts), name, opts)

    factory.__name__ = name
    return factory
