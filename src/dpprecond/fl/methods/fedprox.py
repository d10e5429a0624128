"""DP-FedProx: DP-FedAvg's noisy local steps on the proximal local objective.

FedProx (Li et al., MLSys 2020) adds ``mu/2 ||y - theta||^2`` to every client's local
objective, which keeps heterogeneous clients' local models near the broadcast ``theta``:
each local step is ``y <- y - eta_l (g~ + mu (y - theta))`` with ``g~`` the paper's noisy
clipped mean gradient at ``y`` (:mod:`dpprecond.fl.local_steps`); the server averages the
model changes as DP-FedAvg does.

Privacy unit: one record of one client, replace-one. The proximal gradient is a function of
the client's own iterate (its earlier releases) and of the broadcast: post-processing. The
releases are exactly DP-FedAvg's, ``local_steps`` Gaussians (sensitivity ``2C``, noise
multiplier ``z``) per round, and ``z`` is calibrated for that schedule; ``mu = 0`` is
DP-FedAvg, bit for bit. With ``mechanism="client-level"`` the proximal steps are
non-private and the clipped update is released once per round (DP-FedAvg's client-level
form, :mod:`dpprecond.fl.methods.local`).
"""

from __future__ import annotations

from typing import Any

from dpprecond.fl.methods.base import Method
from dpprecond.fl.methods.local import LocalStepsMethod

__all__ = ["FedProx", "fedprox"]


class FedProx(LocalStepsMethod):
    """DP-FedProx (module docstring): DP-FedAvg with the proximal coefficient ``mu``."""

    def __init__(self, *, local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0,
                 mu: float = 0.01) -> None:
        super().__init__("fedprox", local_steps=local_steps, local_lr=local_lr,
                         global_lr=global_lr, proximal_mu=mu)
        self.mu = self.proximal_mu

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "mu": self.mu}


def fedprox(local_steps: int = 5, local_lr: float = 0.1, global_lr: float = 1.0,
            mu: float = 0.01) -> Method:
    """DP-FedProx (:class:`FedProx`)."""
    return FedProx(local_steps=local_steps, local_lr=local_lr, global_lr=global_lr, mu=mu)
