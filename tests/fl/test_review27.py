"""Review 27: adversarial checks of the count in the round's pass, the secure rounds and
the secure covariance setup (each test states the claim it checks)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, LinearSoftmax, simulate
from dpprecond.fl.client import kernel_rows, noise_inflation, record_counts, round_generators

F32_MAX = float(np.finfo(np.float32).max)


def _data(n: int = 240, d: int = 6, k: int = 3, K: int = 4,
          seed: int = 0) -> tuple[LinearSoftmax, ClientData, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = rng.integers(0, k, n)
    bounds = np.linspace(0, n, K + 1).astype(np.int64)
    model = LinearSoftmax(d, k)
    return model, ClientData(X, y, bounds, k), 0.3 * rng.standard_normal(model.n_params)


# -- float32 precision: a finite record beyond float32's range ------------------------------


def test_float32_rows_of_a_finite_record_beyond_float32_range_are_finite() -> None:
    """precision='float32' "rounds the records to float32 once (a per-record map)"; the
    kernel is overflow-safe for every finite record. A finite float64 record above
    float32's largest value must map to a finite float32 row (no overflow in the cast:
    an error under the suite's warning filters, inf rows otherwise)."""
    model, data, _ = _data()
    X = data.X.copy()
    X[5] = 1e300
    X[6, 0] = -1e39  # just beyond float32's range
    X_run, x_sq = kernel_rows(X, FLConfig(n_rounds=1, clip_norm=1.0, noise_multiplier=1.0,
                                          precision="float32"), model)
    assert np.isfinite(X_run).all() and np.isfinite(x_sq).all()


def test_float32_sums_of_neighbours_differ_by_the_sensitivity_with_a_huge_record() -> None:
    """Replace-one: a client's computed clipped sum with a record of 1e300 and with that
    record replaced by an ordinary one differ by at most 2C (1 + slack) under float32
    precision, as under float64 (a NaN sum, which the noise cannot hide, reveals the
    record)."""
    model, data, params = _data()
    C = 1.0
    config = FLConfig(n_rounds=1, clip_norm=C, noise_multiplier=1.0, precision="float32")
    huge = data.X.copy()
    huge[5] = 1e300
    sums = []
    for X in (data.X, huge):
        X_run, x_sq = kernel_rows(X, config, model)
        sums.append(model.clipped_grad_sums(params, X_run, data.y, data.bounds, C,
                                            x_sq_norms=x_sq))
    bound = 2.0 * C * noise_inflation(model, np.empty((0, 0), np.float32), data.bounds)
    assert np.linalg.norm(sums[1][0] - sums[0][0]) <= bound
    np.testing.assert_array_equal(sums[1][1:], sums[0][1:])


@pytest.mark.parametrize("trust", ["local", "secure-aggregation"])
def test_a_float32_run_with_a_huge_record_releases_finite_values(trust: str) -> None:
    """A whole run at precision='float32' with one finite record of 1e300: the local
    messages are finite (not NaN), and the secure rounds do not stop mid-run on the
    record (a ValueError raised by one record's value after the round was charged)."""
    model, data, _ = _data()
    X = data.X.copy()
    X[5] = 1e300
    data = ClientData(X, data.y, data.bounds, data.n_classes)
    config = FLConfig(n_rounds=2, clip_norm=1.0, noise_multiplier=1.0, precision="float32",
                      trust=trust, weighting="size")  # type: ignore[arg-type]
    res = simulate(model, data, "fedgd", config, X_test=X[:40], y_test=data.y[:40], seed=3)
    assert np.isfinite(res.params).all()


# -- float32 precision: the SecAgg+ deployment against the simulation ----------------------


def test_secagg_plus_refuses_float32_whose_parts_the_clients_would_not_compute() -> None:
    """"Simulation equals a SecAgg+ deployment": with precision='float32' the simulation's
    parts come from the float32 rows (kernel_rows) while a SecAggDPClient computes its part
    from its float64 rows (12 of 105 decoded coordinates differed, by up to 1.2e-4, on 3
    clients of 1,000 rows), so SecAgg+ refuses the setting by name, before any round."""
    pytest.importorskip("flwr")
    from dpprecond.adapters.flower.secagg import SecAggDPStrategy

    K, n = 3, 3000
    model, _, _ = _data(n=n, d=20, k=5, K=K)
    config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=4.0, weighting="size",
                      trust="secure-aggregation", precision="float32")
    with pytest.raises(ValueError, match="precision='float32'"):
        SecAggDPStrategy(model, "fedgd", config, K, n)
    SecAggDPStrategy(model, "fedgd", replace(config, precision="float64"), K, n)


# -- the count in the round's pass against record_counts ------------------------------------


def test_the_pass_counts_a_record_at_the_clip_as_record_counts_does_up_to_ties() -> None:
    """The fused count against record_counts at a clip equal to a record's per-example norm
    (per_example_grad_norms, what record_counts compares): the pass's norms come from the
    kernel's blocked logits, record_counts' from X W, and they can differ in the last bit
    (4 of the first 16 records here), so a record within rounding of the clip may be
    counted apart; no other record may. The count's sensitivity is 1 either way (each
    indicator depends on its record and the parameters only)."""
    rng = np.random.default_rng(0)
    n, d, k = 4000, 20, 10
    model = LinearSoftmax(d, k)
    params = rng.standard_normal(model.n_params)
    X = rng.standard_normal((n, d))
    y = rng.integers(0, k, n)
    bounds = np.array([0, n])
    norms = model.per_example_grad_norms(params, X, y)
    for j in range(40):
        _, counts = model.clipped_grad_sums_and_counts(params, X, y, bounds, norms[j])
        expected = record_counts(model, params, X, y, bounds, norms[j])[0]
        # the two norms of a record differ by rounding only (the kernel's blocked logits
        # against X W): only a record within rounding of the clip may be counted apart
        ties = int(np.count_nonzero(np.abs(norms - norms[j]) <= 1e-12 * norms[j]))
        assert abs(counts[0] - expected) <= ties, j
        assert abs(counts[0] - expected) <= 1


def test_a_task_subclass_that_overrides_its_release_is_not_bypassed() -> None:
    """release_round takes the one-pass count only for the model's own sums
    (counts_in_pass); the same holds for the tasks: a GradientTask or RecordCountTask
    subclass with its own release (a user's extra control) is called, not replaced by the
    fused pass."""
    from dpprecond.fl.adaptive_clip import count_root
    from dpprecond.fl.tasks import GradientTask, RecordCountTask, release_round

    calls: list[str] = []

    class MyGradient(GradientTask):
        def release(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append("gradient")
            return super().release(*args, **kwargs)

    class MyCount(RecordCountTask):
        def release(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append("count")
            return super().release(*args, **kwargs)

    model, data, params = _data()
    root = np.random.SeedSequence(4)
    K = data.n_clients
    for task, count in ((MyGradient(1.3, 0.8), RecordCountTask(1.3, 2.5)),
                        (GradientTask(1.3, 0.8), MyCount(1.3, 2.5))):
        calls.clear()
        release_round(task.validated(), count.validated(), model, params, data.X, data.y,
                      data.bounds, round_generators(root, 0, K),
                      round_generators(count_root(root), 0, K))
        assert calls, type(task).__name__ + " / " + type(count).__name__


@pytest.mark.parametrize("row_clip", [1e200, 1e-200])
def test_the_secure_setup_sum_refuses_an_extreme_row_clip_by_name(row_clip: float) -> None:
    """DP-FedFC under secure aggregation with a row clip whose square leaves float64
    (overflow, or underflow to a zero sensitivity): a ValueError naming row_clip (as the
    local second-moment release does), not an OverflowError or a 'sensitivity=0.0'."""
    from dpprecond.fl import make_method

    model, data, _ = _data()
    config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=2.0, weighting="size",
                      trust="secure-aggregation")
    with pytest.raises(ValueError, match="row_clip"):
        simulate(model, data, make_method("fedfc", 0.5, row_clip=row_clip), config,
                 X_test=data.X[:20], y_test=data.y[:20], seed=2)


def test_a_model_that_overrides_its_norms_gets_them_counted() -> None:
    """The count is record_counts' statistic, computed from model.per_example_grad_norms:
    a LinearSoftmax subclass with its own per-example norms (and the class's sums) must
    have its counts from those norms, not from the kernel's."""
    from dpprecond.fl.adaptive_clip import count_root
    from dpprecond.fl.tasks import GradientTask, RecordCountTask, release_round

    class Doubled(LinearSoftmax):
        def per_example_grad_norms(self, params, X, y):  # type: ignore[no-untyped-def]
            return 2.0 * super().per_example_grad_norms(params, X, y)

    _, data, params = _data()
    model = Doubled(data.X.shape[1], data.n_classes)
    root = np.random.SeedSequence(4)
    K = data.n_clients
    out = release_round(GradientTask(1.3, 0.8).validated(),
                        RecordCountTask(1.3, 0.0).validated(), model, params, data.X, data.y,
                        data.bounds, round_generators(root, 0, K),
                        round_generators(count_root(root), 0, K))
    want = record_counts(model, params, data.X, data.y, data.bounds, 1.3)
    np.testing.assert_array_equal(out.arrays["count"][:, 0], want)
