"""The client half shared by DP-FedFC and DP-FedNew: a one-off second moment, then gradients.

Every client releases, once, ``C_i = (sum_{x in D_i} x^ x^^T + E_i) / |D_i|`` with
``x^ = clip_{C_x}([x, 1])`` (:class:`~dpprecond.fl.tasks.SecondMomentTask`, sensitivity
``sqrt(2) C_x^2``, multiplier ``z_cov``), then every round the paper's noisy clipped mean
gradient (multiplier ``z_grad``). The budget split: the covariance gets the share
``covariance_share`` of the GDP precision ``mu^2``
(:class:`~dpprecond.fl.accounting.Schedule`), one scale calibrated by dp_accounting on the
composed events. With an explicit ``noise_multiplier`` the config's value is the overall
scale ``c`` (the run is ``1/c``-GDP).

Choices (named options): ``row_clip`` ``C_x`` (``None``: ``sqrt(d + 1)``, the largest norm
of fixed-standardized pixel features in ``[-1, 1]^d``); ``covariance_share`` 0.2; uniform
client weights. Noise streams: the covariance of client ``i`` from ``stream(setup_root, 0,
i)``, the gradients of round ``t`` from ``stream(noise_root, t, i)``. The server halves are
:mod:`~dpprecond.fl.methods.fedfc` and :mod:`~dpprecond.fl.methods.fednew`.

Under ``trust="secure-aggregation"`` (:mod:`dpprecond.secagg.fl`) the clients' moments
are one secure sum and the gradients one per round; the server halves then receive the
aggregate as a single client: one ``"moment"`` row (the size-weighted second moment) and
one ``"message"`` row per round, client list ``[0]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpprecond._validation import check_fraction, check_positive
from dpprecond.fl.accounting import Schedule
from dpprecond.fl.config import FLConfig
from dpprecond.fl.methods.base import Method, RunSpec, full_batch_only
from dpprecond.fl.models import FLModel, LinearSoftmax
from dpprecond.fl.tasks import ClientTask, GradientTask, SecondMomentTask

__all__ = ["CovarianceMethod"]


class CovarianceMethod(Method):
    """A method whose clients release one feature second moment, then gradients.

    Subclasses define the server half from the released moments (module docstring).
    """

    def __init__(self, *, learning_rate: float, row_clip: float | None = None,
                 covariance_share: float = 0.2) -> None:
        self.learning_rate = check_positive("learning_rate", learning_rate)
        self.row_clip = None if row_clip is None else check_positive("row_clip", row_clip,
                                                                     allow_inf=True)
        self.covariance_share = check_fraction("covariance_share", covariance_share,
                                               low_open=True)

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, "learning_rate": self.learning_rate,
                "row_clip": self.row_clip, "covariance_share": self.covariance_share}

    def check(self, config: FLConfig, model: FLModel) -> None:
        if not isinstance(model, LinearSoftmax):
            raise TypeError(f"{self.name} preconditions a linear head; expected "
                            f"LinearSoftmax, got {type(model).__name__}.")
        full_batch_only("DP-FedFC/DP-FedNew", config)
        if config.private and self.row_clip is not None and math.isinf(self.row_clip):
            raise ValueError("A private run needs a finite row_clip; got row_clip=inf.")

    def schedule(self, config: FLConfig) -> Schedule:
        return Schedule("covariance", int(config.n_rounds), share=self.covariance_share)

    def noise_multiplier(self, multipliers: Any) -> float:
        return float(multipliers["z_grad"])

    def feature_clip(self, n_features: int) -> float:
        """The row clip ``C_x`` of the covariance release (``row_clip`` or ``sqrt(d + 1)``)."""
        return math.sqrt(n_features + 1) if self.row_clip is None else self.row_clip

    def setup_from_moments(self, moments: list[np.ndarray]) -> np.ndarray:
        """The server's one-off state from the released second moments (post-processing)."""
        raise NotImplementedError

    def setup_from_replies(self, setup: Mapping[str, np.ndarray] | None) -> np.ndarray:
        """:meth:`setup_from_moments` of the setup round's replies; a setup round in which
        no client released its moment is an error (nothing to build the server from)."""
        if not setup or len(setup["moment"]) == 0:
            raise RuntimeError("No client released its second moment in the setup round; "
                               "the preconditioner cannot be built.")
        return self.setup_from_moments(list(setup["moment"]))

    def setup_task(self, run: RunSpec) -> ClientTask | None:
        n_features: int = run.model.n_features  # type: ignore[attr-defined]
        return SecondMomentTask(float(self.feature_clip(n_features)),
                                float(run.multipliers["z_cov"])).validated()

    def round_task(self, run: RunSpec) -> ClientTask:
        return GradientTask(float(run.config.clip_norm),
                            float(run.multipliers["z_grad"])).validated()
