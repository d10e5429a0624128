"""Review 31b: adaptive clipping on Flower's SecAgg+ at the Fashion-MNIST shape.

The strategy fixes SecAgg+'s quantization range at the plan's bits at ``C_0`` plus one, at
most 30. At p = 7,850, N = 60,000 the plan at ``C_0`` is coarsened to exactly 30 bits,
so there is no spare bit, and a clip 10% above ``C_0`` (one round whose released fraction
is 0: every record above the clip) has no coarsened plan within 2^-6 that fits: it falls
back to the 35-bit plan and the next round was refused mid-run (fixed: the round applies
the largest clip within an octave below whose plan fits).
"""

from __future__ import annotations

import pytest
from flwr.common import ndarrays_to_parameters

from dpprecond.adapters.flower.secagg import SecAggDPStrategy
from dpprecond.fl import FLConfig
from dpprecond.fl.models import LinearSoftmax
from tests.adapters.test_flower_secagg import _Everyone


def test_fashion_mnist_shape_runs_a_second_round_after_the_clip_grew_ten_percent():
    config = FLConfig(n_rounds=3, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation")  # adaptive_clip="auto": on here
    strategy = SecAggDPStrategy(LinearSoftmax(784, 10), "fedgd", config, 100, 60_000)
    assert strategy.clip_ is not None and strategy.quantization_range == 2**30
    params = ndarrays_to_parameters([strategy._params])
    assert len(strategy.configure_fit(1, params, _Everyone(100))) == 100
    strategy.clip_.update(0.0)  # round 1's released fraction: 0 (post-processing)
    assert strategy.clip_.clip == pytest.approx(1.105, rel=1e-3)
    [(_, fit), *_] = strategy.configure_fit(2, params, _Everyone(100))
    applied = fit.config["plan-clip-norm"]
    assert applied == strategy.clip_.applied() and 1.105 / 2 <= applied <= 1.106
    assert fit.config["plan-bits"] <= 30 and strategy.ledger.n_releases == 2
