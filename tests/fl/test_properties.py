"""Property-based tests (hypothesis) of the public federated APIs.

``run_federated`` and ``simulate`` end every input in a ``ValueError``/``TypeError`` whose
message names the offending parameter, or in a correct, finite run: finite parameters,
finite losses, accuracies in [0, 1], a non-decreasing epsilon that is never below what
``dp_accounting`` computes for the run (exact for compositions of Gaussians) and never
above ``target_epsilon``. Records with entries up to 1.8e308 give finite messages and
models (privacy hole 2). Inputs cover data shapes and dtypes, NaN/inf, labels out of range,
client counts at their edges (including empty clients), the privacy level (both, neither,
0, limits), clip norms, deltas, seeds and server optimizers.

Examples are derandomized and counted per test so that the file runs in a few seconds;
known failures are pinned as strict xfails at the end.
"""

from __future__ import annotations

import itertools
import math
import numbers
import warnings
from typing import Any

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpprecond.fl import (
    METHODS,
    ClientData,
    FLConfig,
    LinearSoftmax,
    method_options,
    run_federated,
    sgd,
    simulate,
)
from dpprecond.fl.client import full_batch_messages, round_generators

ALGORITHMS = sorted(METHODS)
#: Methods that define their own releases on top of the full-batch client mechanism.
OWN_RELEASES = ("fedavg", "scaffold", "fedfc", "fednew", "fedprox")
#: Of those, the ones that also have a client-level form (mechanism="client-level").
CLIENT_LEVEL_FORMS = ("fedavg", "fedprox")


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


MAX = 1.7976931348623157e308
HUGE = [1e150, 1e155, -1e155, 1e200, 1e300, -1e300, 1e308, MAX, -MAX]
EXTREMES = [0.0, -0.0, 5e-324, 1e-308, 1e-155, 1.0, -1.0, *HUGE]
X_TEST = np.random.default_rng(0).normal(size=(12, 3))
Y_TEST = np.arange(12) % 3

#: Failures found by these properties and not fixed yet (fragment of the message -> finding);
#: each has a strict-xfail repro at the end of the file.
KNOWN_FAILURES = {
}
KNOWN = object()
#: Known failure: a harmless overflow RuntimeWarning of LinearSoftmax.shifted_logits for
#: records of extreme entries (an error under the project's warning filter; the value is
#: discarded). Repro at the end, with the one of clip_factors for a huge clip_norm.
IGNORE_KNOWN_WARNING = "ignore:overflow encountered in subtract:RuntimeWarning"


def run_or_named_error(fn: Any, names: list[str]) -> Any:
    """``fn()``; None after a ValueError/TypeError naming one of ``names``; KNOWN."""
    try:
        return fn()
    except (ValueError, TypeError, OverflowError) as exc:
        msg = str(exc)
        for fragment, finding in KNOWN_FAILURES.items():
            if fragment in msg:
                event(f"known failure: {finding}")
                return KNOWN
        if isinstance(exc, OverflowError):
            raise
        assert any(name in msg for name in names), f"error does not name {names}: {msg!r}"
        return None


def exact_epsilon(noise_multiplier: float, n_rounds: int, delta: float) -> float:
    """T Gaussian releases with multiplier z are one Gaussian with z / sqrt(T) (exact)."""
    if noise_multiplier == 0:
        return math.inf
    return float(dp_accounting.get_epsilon_gaussian(noise_multiplier / math.sqrt(n_rounds),
                                                    delta))


def check_run(res: Any, n_params: int, n_rounds: int, target_epsilon: Any,
              target_delta: float, clip_norm: float = 1.0) -> bool:
    """A correct, finite run (see the module docstring); False for a known failure."""
    assert res.params.shape == (n_params,)
    finite = np.all(np.isfinite(res.params)) and all(
        math.isfinite(h["test_loss"]) and math.isfinite(h["update_norm"]) for h in res.history)
    assert finite, "non-finite model or history"
    assert len(res.history) == n_rounds
    eps = [h["epsilon"] for h in res.history]
    for h in res.history:
        assert 0.0 <= h["test_accuracy"] <= 1.0
        assert math.isfinite(h["test_loss"]) and math.isfinite(h["update_norm"])
    assert all(b >= a for a, b in itertools.pairwise(eps))
    z = res.noise_multiplier
    if z == 0:
        assert res.epsilon == math.inf
    else:
        assert res.epsilon >= exact_epsilon(z, n_rounds, target_delta) * (1 - 1e-6) - 1e-12
        if target_epsilon is not None:
            assert res.epsilon <= float(target_epsilon) * (1 + 1e-9)
    return True


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


# --------------------------------------------------------------------------------------
# run_federated: parameters at and beyond their limits
# --------------------------------------------------------------------------------------

#: (valid values, invalid values, names an error may use)
DOMAINS: dict[str, tuple[list[Any], list[Any], list[str]]] = {
    "n_rounds": ([1, 2, 3, np.int64(2)], [0, -1, 1.5, True, None], ["n_rounds"]),
    "clip_norm": ([1e-300, 1e-3, 1.0, 10.0, 1e300, MAX],
                  [0, -1.0, math.nan, math.inf, None, "1"], ["clip_norm"]),
    "target_delta": ([1e-300, 1e-12, 1e-5, 1e-3, 0.01],
                     [0, 1, 1.0, math.nan, -1e-5, None, 0.0100001, 0.1, 0.5],
                     ["target_delta"]),
    "privacy": ([("target_epsilon", 0.5), ("target_epsilon", 1.0), ("target_epsilon", 8.0),
                 ("noise_multiplier", 0.0), ("noise_multiplier", 0.7),
                 ("noise_multiplier", 5.0), ("noise_multiplier", 1e300)],
                [("both", 1.0), ("neither", None), ("target_epsilon", 0.0),
                 ("target_epsilon", -1.0), ("target_epsilon", math.inf),
                 ("target_epsilon", math.nan), ("noise_multiplier", -1.0),
                 ("noise_multiplier", math.inf), ("noise_multiplier", math.nan)],
                ["target_epsilon", "noise_multiplier"]),
    "n_clients": ([1, 2, 3], [0, -1, 13, 1.5, True], ["n_clients"]),
    "algorithm": (ALGORITHMS, ["sgd", "", None], ["algorithm", "method"]),
    "partition": (["iid", "dirichlet"], ["random", None], ["partition"]),
    "alpha": ([1e-3, 0.5, 100.0], [0.0, -1.0, math.nan, math.inf], ["alpha"]),
    "seed": ([0, 7, 2**40], [-1, "a", 1.5, True], ["seed"]),
    "learning_rate": ([None, 1e-3, 0.1, 10.0], [0.0, -1.0, math.nan, math.inf, "x"],
                      ["learning_rate"]),
}


@st.composite
def federated_calls(draw: Any) -> tuple[dict[str, Any], list[str]]:
    """Keyword values for one call and the names of the parameters drawn invalid."""
    broken = draw(st.sets(st.sampled_from(sorted(DOMAINS)), max_size=2))
    p = {name: draw(st.sampled_from(DOMAINS[name][1 if name in broken else 0]), label=name)
         for name in sorted(DOMAINS)}
    invalid = set(broken)
    if p["partition"] != "dirichlet":
        invalid.discard("alpha")  # alpha is only used (and checked) by the Dirichlet split
    if p["algorithm"] in METHODS and "learning_rate" not in method_options(p["algorithm"]) \
            and p["learning_rate"] is not None:
        invalid.add("learning_rate")  # local-steps methods: the server step is global_lr
    if "privacy" not in invalid and p["privacy"] == ("noise_multiplier", 0.0) \
            and "clip_norm" in invalid and p["clip_norm"] == math.inf:
        invalid.discard("clip_norm")  # no clipping is allowed in a non-private run
    return p, sorted(invalid)


def _config(p: dict[str, Any]) -> FLConfig:
    kind, value = p["privacy"]
    level = {"both": {"target_epsilon": value, "noise_multiplier": value},
             "neither": {}, "target_epsilon": {"target_epsilon": value},
             "noise_multiplier": {"noise_multiplier": value}}[kind]
    return FLConfig(n_rounds=p["n_rounds"], clip_norm=p["clip_norm"],
                    target_delta=p["target_delta"], **level)


@pytest.mark.filterwarnings(IGNORE_KNOWN_WARNING)
@_settings(150)
@given(call=federated_calls())
def test_run_federated_parameters(call: tuple[dict[str, Any], list[str]]) -> None:
    p, invalid = call
    X = np.random.default_rng(1).normal(size=(12, 3))
    y = np.arange(12) % 3
    names = [n for name in invalid for n in DOMAINS[name][2]] or ["target_epsilon",
                                                                 "target_delta"]
    scales = [p["clip_norm"], p["privacy"][1]]
    huge = any(_is_real(v) and math.isfinite(v) and v >= 1e40 for v in scales)
    if huge:  # a noise std 2 z C or a clip_norm beyond 1e100 is refused, naming it
        names = [*names, "clip_norm", "noise std"]
    with warnings.catch_warnings():
        res = run_or_named_error(
            lambda: run_federated(X, y, X_TEST, Y_TEST, 3, algorithm=p["algorithm"],
                                  n_clients=p["n_clients"], partition=p["partition"],
                                  alpha=p["alpha"], config=_config(p),
                                  learning_rate=p["learning_rate"], seed=p["seed"]), names)
    if res is KNOWN:
        return
    if invalid:
        event("invalid parameter, named error")
        assert res is None, f"accepted invalid {invalid}"
        return
    if res is None and huge:
        event("valid but overflowing scale (2 z C > 1e100 or clip_norm > 1e100), named error")
        return
    assert res is not None, "valid call refused"
    kind, value = p["privacy"]
    if check_run(res, 4 * 3, int(p["n_rounds"]), value if kind == "target_epsilon" else None,
                 float(p["target_delta"]), float(p["clip_norm"])):
        event("valid, correct run")


# --------------------------------------------------------------------------------------
# run_federated: data shapes, dtypes, labels, extremes
# --------------------------------------------------------------------------------------


@st.composite
def federated_data(draw: Any) -> tuple[np.ndarray, Any, int, int, str]:
    """(X_train, y_train, n_classes, n_clients, what is wrong or '')."""
    n = draw(st.integers(0, 10))
    d = draw(st.sampled_from([3, 3, 3, 0, 1, 2]))  # the test data has 3 features
    dtype = draw(st.sampled_from(["float64", "float64", "float32", "int64", "uint8", "bool"]))
    elements = {"float64": st.one_of(st.floats(), st.sampled_from(EXTREMES)),
                "float32": st.floats(width=32)}.get(dtype)
    X = draw(hnp.arrays(np.dtype(dtype), (n, d), elements=elements))
    n_classes = draw(st.sampled_from([3, 3, 3, 3, 2, 1, 0, True, 2.5]))
    label_kind = draw(st.sampled_from(["ok"] * 6 + ["high", "negative", "float", "length",
                                                    "2-D"]))
    k = n_classes if _is_int(n_classes) and n_classes >= 1 else 2
    y: Any = np.arange(n) % k
    if label_kind == "high" and n:
        y[-1] = k
    elif label_kind == "negative" and n:
        y[0] = -1
    elif label_kind == "float" and n:
        y = y + 0.5
    elif label_kind == "length":
        y = np.arange(n + 1) % k
    elif label_kind == "2-D":
        y = y.reshape(-1, 1)
    n_clients = draw(st.sampled_from([1, 1, 2, n, n + 1]))
    wrong = []
    if n == 0 or d == 0 or not np.all(np.isfinite(X.astype(np.float64))):
        wrong.append("X_train")
    if d != 3 and "X_train" not in wrong:
        wrong.append("X_test")  # the test data has 3 features
    if not (_is_int(n_classes) and n_classes >= 2):
        wrong.append("n_classes")
    if label_kind != "ok" and n > 0:
        wrong.append("y_train")
    if label_kind in ("length", "2-D"):
        wrong.append("y_train")
    if not 1 <= n_clients <= n:
        wrong.append("n_clients")
    if _is_int(n_classes) and n_classes == 2:
        wrong.append("y_test")  # the test labels go up to 2
    return X, y, n_classes, n_clients, ",".join(sorted(set(wrong)))


@pytest.mark.filterwarnings(IGNORE_KNOWN_WARNING)
@_settings(150)
@given(data=federated_data(), algorithm=st.sampled_from(ALGORITHMS))
def test_run_federated_data(data: tuple, algorithm: str) -> None:
    """Empty, non-finite, wrongly shaped or labelled data is a named error; huge finite
    records give a finite model."""
    X, y, n_classes, n_clients, wrong = data
    names = wrong.split(",") if wrong else ["target_epsilon"]
    res = run_or_named_error(
        lambda: run_federated(X, y, X_TEST, Y_TEST, n_classes, algorithm=algorithm,
                              n_clients=n_clients,
                              config=FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=1.0),
                              seed=0), names)
    if res is KNOWN:
        return
    if wrong:
        event(f"invalid {wrong}, named error")
        assert res is None, f"accepted invalid {wrong}"
        return
    big = np.abs(X.astype(np.float64)).max(initial=0.0) >= 1e150
    event("valid, correct run" + (" (an entry >= 1e150)" if big else ""))
    assert res is not None
    check_run(res, 4 * n_classes, 2, 1.0, 1e-5)


# --------------------------------------------------------------------------------------
# Hostile records: finite messages and models for every mechanism (privacy hole 2)
# --------------------------------------------------------------------------------------


@st.composite
def hostile_records(draw: Any) -> tuple[np.ndarray, np.ndarray]:
    """12 ordinary records (3 features, 3 classes) with some entries set to huge values."""
    X = np.random.default_rng(draw(st.integers(0, 3))).normal(size=(12, 3))
    cells = draw(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 2)), min_size=1,
                          max_size=6))
    for i, j in cells:
        X[i, j] = draw(st.sampled_from(HUGE))
    return X, np.arange(12) % 3


@pytest.mark.filterwarnings(IGNORE_KNOWN_WARNING)
@pytest.mark.parametrize("mechanism", ["full-batch", "poisson", "client-level"])
@_settings(25)
@given(records=hostile_records(), algorithm=st.sampled_from(ALGORITHMS),
       clip_norm=st.sampled_from([1e-3, 1.0, 1e3]))
def test_hostile_records_give_finite_messages_and_models(records: tuple, mechanism: str,
                                                         algorithm: str,
                                                         clip_norm: float) -> None:
    X, y = records
    model = LinearSoftmax(3, 3)
    bounds = np.array([0, 4, 8, 12])
    U = full_batch_messages(model, model.init_params(np.random.default_rng(0)), X, y, bounds,
                            clip_norm, 1.0, round_generators(np.random.SeedSequence(0), 0, 3))
    assert np.all(np.isfinite(U))
    extra = {"sampling_rate": 0.5} if mechanism == "poisson" else {}
    config = FLConfig(n_rounds=2, clip_norm=clip_norm, noise_multiplier=1.0,
                      mechanism=mechanism, **extra)
    own_releases = algorithm in OWN_RELEASES and mechanism != "full-batch" and not (
        algorithm in CLIENT_LEVEL_FORMS and mechanism == "client-level")
    res = run_or_named_error(
        lambda: run_federated(X, y, X_TEST, Y_TEST, 3, algorithm=algorithm, n_clients=3,
                              config=config, seed=1), ["mechanism"])
    if own_releases:  # these define their releases (full-batch, or their client-level form)
        event("method needs the full-batch mechanism, named error")
        assert res is None
        return
    event(f"finite run ({mechanism})")
    assert res is not None
    check_run(res, model.n_params, 2, None, 1e-5) if mechanism != "poisson" else None
    assert np.all(np.isfinite(res.params))


# --------------------------------------------------------------------------------------
# simulate with client data built directly
# --------------------------------------------------------------------------------------


@pytest.mark.filterwarnings(IGNORE_KNOWN_WARNING)
@_settings(60)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       records=hostile_records(),
       seed=st.one_of(st.integers(0, 10), st.builds(np.random.SeedSequence, st.integers(0, 10))))
def test_simulate_with_valid_client_data(sizes: list[int], records: tuple, seed: Any) -> None:
    """Any non-empty clients with valid labels: a finite run (messages of huge records too)."""
    X, y = records
    n = sum(sizes)
    X, y = X[:n], y[:n]
    data = ClientData(X, y, np.r_[0, np.cumsum(sizes)], 3)
    res = simulate(LinearSoftmax(3, 3), data, sgd(0.1),
                   FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=2.0),
                   X_test=X_TEST, y_test=Y_TEST, seed=seed)
    check_run(res, 12, 2, 2.0, 1e-5)


def test_empty_client_in_a_partition_is_a_named_error() -> None:
    X, y = X_TEST, Y_TEST
    with pytest.raises(ValueError, match="Client 1 has no data"):
        ClientData.from_partition(X, y, [np.arange(12), np.array([], dtype=int)], 3)


# --------------------------------------------------------------------------------------
# Known failures (minimal repros, strict xfails)
# --------------------------------------------------------------------------------------

X4 = np.array([[3.0, 0.0], [1.0, 1.0], [-1.0, 0.5], [0.0, -1.0]])
Y4 = np.array([0, 1, 0, 1])


def test_known_simulate_refuses_an_empty_client() -> None:
    """Found by these properties (an empty client released inf/NaN messages)."""
    with pytest.raises(ValueError, match="Client 0 has no data"):
        ClientData(X4, Y4, np.array([0, 0, 4]), 2)


@pytest.mark.parametrize("labels", [np.array([0, 1, 0, 5]), np.array([0.5, 1, 0, 1])])
def test_client_data_refuses_bad_labels(labels: np.ndarray) -> None:
    """Found by these properties (a raw IndexError in simulate); fixed in 7637dfd."""
    with pytest.raises(ValueError, match="y"):
        data = ClientData(X4, labels, np.array([0, 4]), 2)
        simulate(LinearSoftmax(2, 2), data, sgd(0.1),
                 FLConfig(n_rounds=1, clip_norm=1.0, noise_multiplier=1.0),
                 X_test=X4, y_test=Y4, seed=0)


def test_known_huge_noise_multiplier_is_accounted() -> None:
    """Found by these properties (OverflowError in the accountant for z >= 1.4e154): the
    accounting of a huge multiplier is finite, and a run whose noise would overflow the
    arithmetic is refused with an error naming the multiplier."""
    from dpprecond.accounting import epsilon_of, gaussian

    assert epsilon_of(gaussian(1e300), 1e-5, "pld") < 1e-100
    with pytest.raises(ValueError, match="noise multiplier"):
        run_federated(X_TEST, Y_TEST, X_TEST, Y_TEST, 3, algorithm="fedgd", n_clients=2,
                      config=FLConfig(n_rounds=1, clip_norm=1.0, noise_multiplier=1e300),
                      seed=0)


def test_known_huge_noise_std_gives_a_finite_model_or_an_error() -> None:
    try:
        res = run_federated(X_TEST, Y_TEST, X_TEST, Y_TEST, 3, algorithm="sofim", n_clients=2,
                            config=FLConfig(n_rounds=2, clip_norm=1e300,
                                            noise_multiplier=1.0), seed=0)
    except ValueError as exc:
        assert "clip_norm" in str(exc) or "noise_multiplier" in str(exc)
    else:
        assert np.all(np.isfinite(res.params))


def test_known_evaluate_does_not_hide_a_nan_model() -> None:
    loss, _ = LinearSoftmax(3, 3).evaluate(np.full(12, np.nan), X_TEST, Y_TEST)
    assert math.isnan(loss)


def test_known_zero_feature_training_data_names_x_train() -> None:
    with pytest.raises(ValueError, match="X_train"):
        run_federated(np.zeros((4, 0)), Y4, np.zeros((4, 0)), Y4, 2, n_clients=1,
                      config=FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=1.0), seed=0)


def test_large_delta_calibrates() -> None:
    """Found by these properties ('math domain error'); fixed in 0723564. A delta of 0.5 is
    now refused by FLConfig (issue 17, hole 6); the calibration itself still handles it."""
    from dpprecond.fl.accounting import Schedule, calibrate

    with pytest.raises(ValueError, match="target_delta"):
        run_federated(X_TEST, Y_TEST, X_TEST, Y_TEST, 3, algorithm="fedgd", n_clients=2,
                      config=FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=1.0,
                                      target_delta=0.5), seed=0)
    assert calibrate(Schedule("rounds", 1), 1.0, 0.5) > 0
    res = run_federated(X_TEST, Y_TEST, X_TEST, Y_TEST, 3, algorithm="fedgd", n_clients=2,
                        config=FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=1.0,
                                        target_delta=0.01), seed=0)
    assert res.epsilon <= 1.0


def test_known_no_overflow_warning_for_a_record_of_extreme_entries() -> None:
    X = np.array([[MAX, -MAX, 0.0]])
    res = simulate(LinearSoftmax(3, 3), ClientData(X, np.array([0]), np.array([0, 1]), 3),
                   sgd(0.1), FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=2.0),
                   X_test=X_TEST, y_test=Y_TEST, seed=0)
    assert np.all(np.isfinite(res.params))


def test_known_no_overflow_warning_for_a_huge_clip_norm() -> None:
    from dpprecond.fl.models import clip_factors

    np.testing.assert_array_equal(clip_factors(np.array([1e-10, 1.0]), 1e300), [1.0, 1.0])
