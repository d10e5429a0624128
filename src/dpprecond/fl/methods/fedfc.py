"""DP-FedFC: the server preconditions with the clients' released feature second moments.

Client half: :class:`~dpprecond.fl.methods.covariance.CovarianceMethod` (one noisy second
moment per client, then gradients). Server half: ``P = (PSD(mean_i C_i) + gamma I)^{-1}``
from the moments that arrived, and ``W <- W - lr P G_t`` on the linear head's feature side
(for a linear softmax head the Fisher is ``E[x~ x~^T] (x) Sigma``; ``P`` inverts its
feature factor), with ``G_t`` the mean of the repliers' messages. Every client takes part
in the gradient rounds, whether or not its moment arrived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpprecond._validation import check_positive
from dpprecond.fl import server as server_mod
from dpprecond.fl.methods.base import Method, RunSpec
from dpprecond.fl.methods.covariance import CovarianceMethod

__all__ = ["FedFC", "fedfc"]


class FedFC(CovarianceMethod):
    """DP-FedFC (module docstring); ``gamma`` is the ridge of ``P``."""

    name = "fedfc"

    def __init__(self, *, learning_rate: float = 0.5, gamma: float = 1.0,
                 row_clip: float | None = None, covariance_share: float = 0.2) -> None:
        super().__init__(learning_rate=learning_rate, row_clip=row_clip,
                         covariance_share=covariance_share)
        self.gamma = check_positive("gamma", gamma)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "gamma": self.gamma}

    def setup_from_moments(self, moments: list[np.ndarray]) -> np.ndarray:
        """``P`` (d + 1, d + 1) from the released ``C_i`` (post-processing)."""
        return server_mod.fedfc_preconditioner(moments, self.gamma)

    def server_transform(self, setup: np.ndarray,
                         n_classes: int) -> server_mod.GradientTransformation:
        """The step ``W <- W - lr P mean_i U_i`` for ``P = setup``."""
        return server_mod.preconditioned_server(setup, self.learning_rate, n_classes)

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        P = self.setup_from_replies(setup)
        n_classes: int = run.model.n_classes  # type: ignore[attr-defined]
        return (P, self.server_transform(P, n_classes).init(params))

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        P, inner = state
        n_classes: int = run.model.n_classes  # type: ignore[attr-defined]
        update, inner = self.server_transform(P, n_classes).update(replies["message"], inner,
                                                                   params)
        return update, (P, inner)


def fedfc(learning_rate: float = 0.5, gamma: float = 1.0, row_clip: float | None = None,
          covariance_share: float = 0.2) -> Method:
    """DP-FedFC (:class:`FedFC`)."""
    return FedFC(learning_rate=learning_rate, gamma=gamma, row_clip=row_clip,
                 covariance_share=covariance_share)
