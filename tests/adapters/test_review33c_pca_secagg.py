"""Review 33c: Flower's SecAgg+ PCA path under its 2^30 cap (pca_secagg.py, secure_plan).

A fixed clip radius of any size is a public option; auto's steps then have sensitivity
``2 R`` above ``sqrt(m) / I``, where the plan's scale used to stop at 1 with ``gamma
Delta`` above the worst case the pre-check bounds: the pre-check passed, and the step
needed more than 2^30, refused by the transport after the ledger was charged.
"""

from __future__ import annotations

import numpy as np

from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.pca import SplitRows, fit_pca_on_flower, make_pca_client_app
from dpprecond.pca import fit_private_pca
from dpprecond.secagg.fl import FIT_BITS
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)
from tests.adapters.test_flower_pca_secagg import SEED, Grid


def test_a_huge_clip_radius_runs_on_secaggplus_as_the_capped_in_process_fit() -> None:
    n, d, k = 3000, 10, 2
    X = np.random.default_rng(0).standard_normal((n, d))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    bounds = np.linspace(0, n, 4).astype(np.int64)
    fit = {"target_epsilon": 1.0, "target_delta": 1e-5, "row_norm": 1.0,
           "trust": "secure-aggregation", "method": "auto", "branch": "iterate",
           "clip_radius": 1e7}
    free = fit_private_pca(X, k, clients=bounds, seed=SEED, **fit)
    assert max(free.info["secure_aggregation"]["modulus_bits"]) > FIT_BITS  # the steps
    ref = fit_private_pca(X, k, clients=bounds, seed=SEED, max_modulus_bits=FIT_BITS, **fit)
    assert max(ref.info["secure_aggregation"]["modulus_bits"]) <= FIT_BITS
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    grid = Grid(make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED))
    got = fit_pca_on_flower(grid, k, ledger=ledger, **fit)
    assert np.array_equal(got.components, ref.components)
    assert got.dp_event == ref.dp_event and ledger.events == [ref.dp_event]
