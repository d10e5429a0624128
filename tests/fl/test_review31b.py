"""Review 31b: adaptive clipping under secure aggregation, adversarially.

A run whose first counted plan cannot exist (its initial clip) is refused before the caller's
ledger is charged; a clip that the geometric update drives out of the range of exact plans
(huge: the plan's scale stops at 1 and the modulus grows with the clip; tiny: the scale
overflows) is not taken, so the run does not fail mid-way; SecAgg+'s fixed quantization
range (the plan's bits at ``C_0`` plus one, at most 30) does not cover the plans of clips
near ``C_0`` at the Fashion-MNIST shape, nor those of clips far above it (fixed: each round
applies the largest clip within an octave below ``C_t`` whose plan fits ``2^30``).
"""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger
from dpprecond.fl import FLConfig
from dpprecond.fl.adaptive_clip import AdaptiveClip
from dpprecond.fl.data import ClientData
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.adaptive import SecureClip
from dpprecond.secagg.fl import FIT_BITS, simulate_secure

BOUNDS = np.array([0, 10, 20, 30, 40])


def _data() -> ClientData:
    rng = np.random.default_rng(3)
    return ClientData(rng.standard_normal((40, 5)) * 0.3, rng.integers(0, 3, 40), BOUNDS, 3)


def test_a_run_whose_first_counted_plan_cannot_exist_is_refused_before_any_charge():
    """initial_clip = 1e12 on 40 records: the Skellam shares would exceed numpy's Poisson
    sampler (a public fact of the settings); the caller's ledger must stay empty (it was
    charged one round before the plan was formed)."""
    data = _data()
    config = FLConfig(n_rounds=3, clip_norm=1.0, target_epsilon=2.0, weighting="size",
                      trust="secure-aggregation",
                      adaptive_clip=AdaptiveClip(initial_clip=1e12))
    ledger = PrivacyLedger(1e-5)
    with pytest.raises(ValueError, match="Skellam shares"):
        simulate_secure(LinearSoftmax(5, 3), data, make_method("fedgd"), config,
                        X_test=data.X, y_test=data.y, seed=0, ledger=ledger)
    assert ledger.n_releases == 0 and ledger.epsilon == 0.0


@pytest.mark.parametrize(("fraction", "rounds"), [(0.0, 40), (1.0, 800)])
def test_the_clip_never_leaves_the_range_of_exact_plans(fraction: float, rounds: int):
    """Released fractions 0 (every record above the clip; noise makes it reachable) at
    learning rate 2 grow the clip by e per round: after ~21 rounds its plan needs Skellam
    shares beyond numpy's sampler; fractions 1 shrink it by 1/e: after ~690 rounds its
    scale overflows. Every clip the update returns has a plan (it used to raise
    ``ValueError`` at the next round, after earlier rounds were charged)."""
    clip = SecureClip(AdaptiveClip(learning_rate=2.0), LinearSoftmax(5, 3), 1.0, 3.8,
                      n_rows=40, n_clients=4, min_clients=4, max_client_rows=40)
    for _ in range(rounds):
        clip.update(fraction)
        plan, weight = clip.plan()
        assert plan.bits <= 62 and weight > 0
    assert (clip.clip > 1e6) if fraction == 0.0 else (clip.clip < 1e-200)
    assert len(clip.norms) == rounds


@pytest.mark.parametrize(("shape", "n_rows", "n_clients", "clip_t"), [
    ((784, 10), 60_000, 100, 1.1),    # Fashion-MNIST: C_0's plan coarsened to 30 bits
    ((2, 2), 100, 10, 1e4),           # a small model: the scale stops at 1 above ~1,700
])
def test_secaggplus_quantization_range_covers_the_plans_of_the_clips_the_run_reaches(
        shape: tuple[int, int], n_rows: int, n_clients: int, clip_t: float):
    """Every round applies a clip whose plan fits SecAgg+'s ``2^FIT_BITS`` (the run's
    quantization range): the largest of ``C_t 2^(-j/16)`` that does, within an octave
    below ``C_t`` (review31b: a clip 10% above ``C_0`` at the Fashion-MNIST shape needed 35
    bits, and the fixed range of ``C_0``'s bits plus one stopped the run at round 2)."""
    from dpprecond.secagg.adaptive import FIT_GRID

    clip = SecureClip(AdaptiveClip(), LinearSoftmax(*shape), 1.0, 1.0, n_rows=n_rows,
                      n_clients=n_clients, min_clients=n_clients, max_client_rows=n_rows)
    for c in np.geomspace(clip_t / 2, clip_t * 2, 41):
        clip.clip = float(c)
        applied = clip.applied()
        assert c / 2 <= applied <= c
        assert any(applied == c * 2.0 ** (-j / FIT_GRID) for j in range(FIT_GRID + 1))
        assert clip.plan()[0].bits <= FIT_BITS
    if shape == (784, 10):  # where the fit is partial, some clips are lowered
        lowered = 0
        for c in np.geomspace(0.5, 2.0, 41):
            clip.clip = float(c)
            lowered += clip.applied() < c
        assert 0 < lowered < 41


def test_a_lowered_clip_records_the_applied_clip_and_moves_the_target():
    """Where the round applies a clip below the target (the Fashion-MNIST shape), the
    history records the applied clip, and the update moves the target itself (moving from
    the applied clip would drag the target down every round)."""
    from dpprecond.fl.adaptive_clip import geometric_update

    clip = SecureClip(AdaptiveClip(), LinearSoftmax(784, 10), 1.0, 1.0, n_rows=60_000,
                      n_clients=100, min_clients=100, max_client_rows=60_000)
    for c in np.geomspace(0.5, 2.0, 41):
        clip.clip = float(c)
        if clip.applied() < c:
            break
    else:  # pragma: no cover - the shape's partial fit is pinned above
        raise AssertionError("no lowered clip in [0.5, 2]")
    target, applied = clip.clip, clip.applied()
    clip.update(0.3)
    assert clip.norms[-1] == applied
    assert clip.clip == geometric_update(target, 0.3, 0.5, 0.2)
