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
broadcasts: post-processing. Each client keeps its ``c_i`` (the task's client state); ``c``
is the server transform's state (:func:`dpprecond.fl.server.scaffold_server`).

**Client-level forms** (``mechanism="client-level"``; privacy unit one client, replace-one,
which also covers any one record). The local steps are non-private (the record-level noise
at every step is gone), and each client's average gradient ``Delta_i = (theta - y_i) /
(local_steps eta_l)`` is clipped to ``C`` (:func:`dpprecond.fl.client.client_level_updates`,
with FedProx's proximal term in the steps). One sum per round is
released, ``G = (sum_i clip_C(Delta_i) + N(0, (2 z C)^2 I)) / K``: sensitivity ``2C``, event
``Gaussian(z)`` per round (the ``"rounds"`` schedule, ``T`` events), noise added by a trusted
aggregator (``trust="local"``, engine only) or as distributed Skellam shares under secure
aggregation (:mod:`dpprecond.secagg.fl`). The server step is DP-FedAvg's with the noisy ``G``
for the clipped mean model change: ``theta <- theta - eta_g L eta_l G``. This is DP-FedAvg
as McMahan et al. (2018) run it (and FedProx's local steps); ``fedavg`` here is ``fedgd``
with ``mechanism="client-level"``, ``local_steps = L``, ``local_lr = eta_l`` and server
step ``eta_g L eta_l`` (the same releases, tested).

DP-SCAFFOLD has no client-level form here (refused by name). Its clients would keep
exact control variates ``c_i+ = c_i - c + clip_C(Delta_i)`` while the server's ``c``
moves by the noisy aggregate, so ``c - mean_i c_i`` is the sum of every round's noise
(``T`` rounds: ``sqrt(T)`` times one round's), and the correction ``c - c_i`` adds it to
every later local step: digits, ``K = 100``, Dirichlet(0.3), ``L = 5``, eps 8, it ended at
0.44 against client-level DP-FedAvg's 0.80 (0.87 and 0.86 without noise). Updating a
client's ``c_i`` with its own noisy share instead would keep the means equal but put
each round's noise into the next round's sum with the opposite sign, so that two
consecutive releases would cancel it: not private. A private form was built and
measured, then left out: each client releases ``clip_C([Delta_i, a_i])`` (its model
change and its uncorrected average gradient ``a_i``, SCAFFOLD's new variate, clipped
jointly: one Gaussian per round, sensitivity ``2C``), keeps the second half as ``c_i``,
and the server *sets* ``c`` to the noisy mean of the second halves, so ``c`` and the
clients' mean differ by one round's noise only. That noise has norm about
``2 z C sqrt(p) / K`` (3.2 at ``z = 6.3``, ``p = 650``, ``K = 100``, against ``C = 1``)
and enters every local step through ``c - c_i``. Digits, ``K = 100``, Dirichlet(0.3),
``L = 5``, ``eta_l = 0.1``, ``C = 1``, ``T = 30``, seeds 0-2, trusted aggregator: 0.909
against client-level FedAvg's 0.914 without noise, 0.801 against 0.872 at eps 8 and
0.467 against 0.786 at eps 4. It loses everywhere measured, so ``scaffold`` stays
record-level only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpprecond._validation import check_int, check_positive
from dpprecond.fl import server as server_mod
from dpprecond.fl.accounting import Schedule
from dpprecond.fl.config import FLConfig
from dpprecond.fl.methods.base import Method, RunSpec
from dpprecond.fl.models import FLModel
from dpprecond.fl.tasks import LocalStepsTask

__all__ = ["LocalStepsMethod", "fedavg", "scaffold"]


#: ``FLConfig.local_lr``'s default: the value a local-step method needs it to keep.
_CONFIG_LOCAL_LR: float = FLConfig().local_lr


class LocalStepsMethod(Method):
    """Noisy local steps per round (module docstring): DP-FedAvg, or DP-SCAFFOLD with
    ``control_variates=True``; ``name`` labels the results.

    Dropout (a driver that loses replies): the server averages the repliers' ``delta_y``;
    a non-replier's ``delta_c`` is zero (its ``c_i`` does not change), so ``c`` stays the
    mean of all ``K`` clients' ``c_i``.
    """

    def __init__(self, name: str, *, local_steps: int = 5, local_lr: float = 0.1,
                 global_lr: float = 1.0, control_variates: bool = False,
                 proximal_mu: float = 0.0) -> None:
        if not isinstance(control_variates, bool):
            raise TypeError(f"Expected control_variates to be a bool, got "
                            f"{control_variates!r}.")
        self.name = name
        self.local_steps = check_int("local_steps", local_steps, low=1)
        self.local_lr = check_positive("local_lr", local_lr)
        self.global_lr = check_positive("global_lr", global_lr)
        self.control_variates = control_variates
        self.proximal_mu = check_positive("mu", proximal_mu, allow_zero=True)
        step = self.global_lr * self.local_steps * self.local_lr  # the client-level step
        if not np.isfinite(step):
            raise ValueError(f"global_lr * local_steps * local_lr overflows ({self.global_lr!r} "
                             f"* {self.local_steps} * {self.local_lr!r}): the server step "
                             "would make the model non-finite; use step sizes whose product "
                             "is finite (the defaults: 1.0, 5, 0.1).")
        self.server = server_mod.scaffold_server(self.global_lr, self.control_variates)

    def describe(self) -> dict[str, Any]:
        facts = {"method": self.name, "local_steps": self.local_steps,
                 "local_lr": self.local_lr, "global_lr": self.global_lr}
        if self.proximal_mu:  # FedProx's term (its class records it as "mu" too)
            facts["mu"] = self.proximal_mu
        return facts

    def check(self, config: FLConfig, model: FLModel) -> None:
        self.check_mechanism(config)

    def check_mechanism(self, config: FLConfig) -> None:
        """Refuse a mechanism the method has no form for (``ValueError`` naming it): the
        record-level local steps run at ``"full-batch"``, the client-level form (module
        docstring) at ``"client-level"`` without control variates."""
        if config.mechanism not in ("full-batch", "client-level"):
            raise ValueError(f"{self.name} defines its own releases: noisy full-batch local "
                             f"steps (mechanism='full-batch', record-level) or its "
                             f"client-level form (mechanism='client-level'); got mechanism="
                             f"{config.mechanism!r}. Use one of those and set the method's "
                             "own options.")
        if config.mechanism == "client-level":
            if self.control_variates:
                raise ValueError(
                    f"{self.name} has no client-level form: its clients keep exact control "
                    "variates while the server's c moves by the noisy aggregate, so c "
                    "drifts from the clients' mean by the sum of every round's noise, which "
                    "enters every later local step (dpprecond.fl.methods.local). Use fedavg "
                    "or fedprox with mechanism='client-level', or scaffold with "
                    "mechanism='full-batch' (record-level).")
            if config.local_steps != 1:
                raise ValueError(f"{self.name} sets its own local steps ({self.local_steps}, "
                                 f"the method's option); got config.local_steps="
                                 f"{config.local_steps}, which only the one-message gradient "
                                 "methods read. Leave config.local_steps at 1 and pass the "
                                 f"steps to the method (make_method({self.name!r}, "
                                 f"local_steps={config.local_steps}); CLI: --option "
                                 f"local_steps={config.local_steps}).")
        if config.local_lr != _CONFIG_LOCAL_LR:
            raise ValueError(f"{self.name} sets its own local step size ({self.local_lr:g}, "
                             f"the method's option); got config.local_lr={config.local_lr!r}, "
                             "which only the one-message gradient methods read. Leave "
                             f"config.local_lr at {_CONFIG_LOCAL_LR:g} and pass the step size "
                             f"to the method (make_method({self.name!r}, local_lr="
                             f"{config.local_lr!r}); CLI: --option local_lr={config.local_lr!r}).")

    def schedule(self, config: FLConfig) -> Schedule:
        if config.mechanism == "client-level":  # one clipped-update sum per round
            return Schedule.rounds(config)
        return Schedule("local-steps", int(config.n_rounds), steps=self.local_steps)

    def round_task(self, run: RunSpec) -> LocalStepsTask:
        return LocalStepsTask(float(run.config.clip_norm), float(run.multipliers["z"]),
                              local_steps=self.local_steps, local_lr=self.local_lr,
                              control_variates=self.control_variates,
                              proximal_mu=self.proximal_mu,
                              mechanism=run.config.mechanism).validated()

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        return self.server.init(params)

    def broadcast(self, state: Any) -> dict[str, np.ndarray]:
        return {"control": state.control} if self.control_variates else {}

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        if "aggregate" in replies:  # client-level: the noisy mean clipped update G
            delta_y = -(self.local_steps * self.local_lr) * replies["aggregate"]
            return self.server.update((delta_y, None), state, params)  # type: ignore[arg-type]
        delta_c = None
        if self.control_variates:  # a non-replier's c_i does not move: a zero row
            delta_c = np.zeros((run.n_clients, params.shape[0]))
            delta_c[list(clients)] = replies["delta-c"]
        return self.server.update((replies["delta-y"], delta_c),  # type: ignore[arg-type]
                                  state, params)


def fedavg(local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0) -> Method:
    """DP-FedAvg: the mean model change after noisy local steps."""
    return LocalStepsMethod("fedavg", local_steps=local_steps, local_lr=local_lr,
                            global_lr=global_lr)


def scaffold(local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0) -> Method:
    """DP-SCAFFOLD: DP-FedAvg's local steps corrected by control variates."""
    return LocalStepsMethod("scaffold", local_steps=local_steps, local_lr=local_lr,
                            global_lr=global_lr, control_variates=True)
