"""DP-FedNew: one ADMM iteration of a federated Newton step per round.

After Elgabli et al. 2022, DP version after Krouka, Koskela and Kulkarni (PoPETs 2025).
Client half: :class:`~dpprecond.fl.methods.covariance.CovarianceMethod` (one noisy second
moment per client, then gradients). Server half: each client's Newton solver
``(H_i + (alpha + rho) I)^{-1}`` with ``H_i = hessian_scale PSD(C_i) (x) I_k``
(``hessian_scale = 1/2`` bounds the softmax cross-entropy Hessian, a majorization Newton
step), computed once from the released moments; then every round one ADMM iteration,
warm-started (:func:`dpprecond.fl.server.fednew_server`).

Dropout: a client whose moment did not arrive has no solver and is left out of the
consensus for the whole run (:meth:`FedNew.eligible` never asks it); in a round the ADMM
iteration runs over the repliers, whose duals move while the others' stay put.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpprecond._validation import check_positive
from dpprecond.fl import server as server_mod
from dpprecond.fl.methods.base import Method, RunSpec
from dpprecond.fl.methods.covariance import CovarianceMethod

__all__ = ["FedNew", "fednew"]


class FedNew(CovarianceMethod):
    """DP-FedNew (module docstring): ADMM penalty ``rho``, ridge ``alpha``, Hessian bound
    ``hessian_scale``."""

    name = "fednew"

    def __init__(self, *, learning_rate: float = 1.0, rho: float = 1.0, alpha: float = 0.0,
                 hessian_scale: float = 0.5, row_clip: float | None = None,
                 covariance_share: float = 0.2) -> None:
        super().__init__(learning_rate=learning_rate, row_clip=row_clip,
                         covariance_share=covariance_share)
        self.rho = check_positive("rho", rho)
        self.alpha = check_positive("alpha", alpha, allow_zero=True)
        self.hessian_scale = check_positive("hessian_scale", hessian_scale)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "rho": self.rho, "alpha": self.alpha,
                "hessian_scale": self.hessian_scale}

    def setup_from_moments(self, moments: list[np.ndarray]) -> np.ndarray:
        """The per-client solvers (K, d + 1, d + 1) from the released ``C_i``."""
        return server_mod.fednew_solvers(moments, hessian_scale=self.hessian_scale,
                                         alpha=self.alpha, rho=self.rho)

    def server_transform(self, setup: np.ndarray,
                         n_classes: int) -> server_mod.GradientTransformation:
        """One ADMM iteration over the clients of ``setup``'s rows."""
        return server_mod.fednew_server(setup, rho=self.rho, learning_rate=self.learning_rate,
                                        n_classes=n_classes)

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        solvers = self.setup_from_replies(setup)
        n_classes: int = run.model.n_classes  # type: ignore[attr-defined]
        members = np.asarray(sorted(clients), dtype=np.int64)
        return (solvers, self.server_transform(solvers, n_classes).init(params), members)

    def eligible(self, clients: Sequence[int], state: Any) -> list[int]:
        members = set(state[2].tolist())
        return [c for c in sorted(clients) if c in members]

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        solvers, inner, members = state
        n_classes: int = run.model.n_classes  # type: ignore[attr-defined]
        U = replies["message"]
        if list(clients) == members.tolist():
            update, inner = self.server_transform(solvers, n_classes).update(U, inner, params)
            return update, (solvers, inner, members)
        # Some members missing: one ADMM iteration over the repliers (rows of their solvers
        # and duals), the others' duals unchanged.
        index = {c: r for r, c in enumerate(members.tolist())}
        rows = [index[c] for c in clients]
        sub = self.server_transform(solvers[rows], n_classes)
        update, new = sub.update(U, server_mod.FedNewState(inner.duals[rows], inner.consensus),
                                 params)
        duals = inner.duals.copy()
        duals[rows] = new.duals
        return update, (solvers, server_mod.FedNewState(duals, new.consensus), members)


def fednew(learning_rate: float = 1.0, rho: float = 1.0, alpha: float = 0.0,
           hessian_scale: float = 0.5, row_clip: float | None = None,
           covariance_share: float = 0.2) -> Method:
    """DP-FedNew (:class:`FedNew`)."""
    return FedNew(learning_rate=learning_rate, rho=rho, alpha=alpha,
                  hessian_scale=hessian_scale, row_clip=row_clip,
                  covariance_share=covariance_share)
