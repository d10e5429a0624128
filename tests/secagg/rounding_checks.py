"""Checks shared by the secure-sum tests."""

from __future__ import annotations

import numpy as np

from dpprecond.secagg.sums import SumPlan, round_shared


def assert_rounded_parts_within_plan(p1: np.ndarray, p2: np.ndarray, plan: SumPlan,
                                     seed: int, draws: int = 200) -> None:
    """Two neighbours' parts, scaled by the plan's ``gamma`` (exact: a power of two) and
    rounded with the same uniforms, differ by an integer vector within the plan's ``D2``
    (L2) and ``D1`` (L1), for ``draws`` draws of the uniforms."""
    y1, y2 = p1 * plan.scale, p2 * plan.scale
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        u = rng.random(plan.dim)
        w = round_shared(y2, u) - round_shared(y1, u)
        assert np.linalg.norm(w) <= plan.l2_sensitivity
        assert np.abs(w).sum() <= plan.l1_sensitivity
