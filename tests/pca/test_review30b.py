"""Review 30b: the secure fit over a network (pca/remote_secure.py) against its server.

The server writes the ``secure-release`` requests by hand (the JSON a transport carries);
the client (:func:`client_secure_message`) must bound what its message carries whatever
it is asked: the attacks tests/pca/test_review28.py lists for the local-trust path, on
the secure path. Then: the fit's event and releases equal the in-process secure fit's
for the configurations the merge's tests leave out, and rows at extreme magnitudes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger
from dpprecond.noise import keyed_stream
from dpprecond.pca import fit_private_pca
from dpprecond.pca.remote import ClientState
from dpprecond.pca.remote_secure import (
    client_secure_message,
    plan_to_request,
)
from dpprecond.secagg.sums import SumPlan, client_message, plan_sum
from tests.pca.test_remote_secure import BOUNDS, FIT, _federation, data  # noqa: F401
from tests.pca.test_review28 import heavy_tailed_rows

D = 6
K = 3
SQRT2 = math.sqrt(2.0)
N_ROWS = 200  # the federation's rows (the plans' n)


def centred(x: np.ndarray, m: int) -> np.ndarray:
    """``x`` modulo ``m`` in ``[-m/2, m/2)``."""
    return np.mod(x + m // 2, m) - m // 2


def _rows(n: int = 40, seed: int = 0) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, D))
    return X / np.linalg.norm(X, axis=1, keepdims=True) * 0.9


def _gram(shape: tuple[int, ...] = (D, D)) -> dict:
    return {"op": "pass", "shape": list(shape), "kind": "gram", "args": [], "mean": None,
            "row_scaled": False, "row_sq": False}


def _node(op: str, shape: tuple[int, ...], *args: Any) -> dict:
    return {"op": op, "shape": list(shape), "args": list(args)}


def _plan(dim: int, sensitivity: float, z: float = 3.0, **changes: Any) -> SumPlan:
    """An honest plan for a release of bound ``sensitivity`` (times a margin above the
    client's rounding factor)."""
    kw = {"n_rows": N_ROWS, "n_clients": K, "min_clients": K, **changes}
    return plan_sum(dim, sensitivity * (1.0 + 1e-5), z, **kw)


def _ask(value: dict, plan: SumPlan | dict, arrays: list | None = None, *,
         symmetric: bool = False, state: ClientState | None = None, floor: float = 0.0,
         X: np.ndarray | None = None, **changes: Any) -> np.ndarray:
    request = {"kind": "secure-release", "fit": "attack", "row_norm": 1.0, "secure": False,
               "d": D, "pending": [], "stream": 2, "symmetric": symmetric, "value": value,
               "plan": plan_to_request(plan) if isinstance(plan, SumPlan) else plan,
               **changes}
    message, _ = client_secure_message(
        request, arrays or [], _rows() if X is None else X, client_id=0, n_clients=K,
        state=state if state is not None else ClientState(), noise_seed=1,
        min_noise_multiplier=floor)
    return message


# -- 1. what a client's message may carry --------------------------------------------------


def test_a_scaled_expression_needs_a_plan_for_its_scaled_sensitivity() -> None:
    value = _node("mul", (D, D), _gram(), 1000.0)
    with pytest.raises(ValueError, match="noise would not cover"):
        _ask(value, _plan(D * D, SQRT2))  # the unscaled Gram's bound
    _ask(value, _plan(D * D, 1000.0 * SQRT2))  # control: the scaled bound is accepted
    value = _node("rmatmul", (D, D), {"array": 0}, _gram())
    with pytest.raises(ValueError, match="noise would not cover"):
        _ask(value, _plan(D * D, SQRT2), [10.0 * np.eye(D)])


def test_repeated_columns_count_in_the_bound() -> None:
    """``S @ [e1 e1 e1 e1]``: four copies of one column, norm ``2 ||S e1||``."""
    A = np.zeros((D, 4))
    A[0, :] = 1.0
    value = _node("matmul", (D, 4), _gram(), {"array": 0})
    with pytest.raises(ValueError, match="noise would not cover"):
        _ask(value, _plan(4 * D, SQRT2), [A])
    _ask(value, _plan(4 * D, 2.0 * SQRT2), [A])


@pytest.mark.parametrize("attack", ["broadcast", "declared-shape", "nan-map", "extra-arg",
                                    "wrong-d", "overflow", "secure-mode", "stream"])
def test_malformed_requests_are_refused(attack: str) -> None:
    plan = _plan(D * D, SQRT2)
    value: dict = _gram()
    arrays: list = []
    changes: dict = {}
    if attack == "broadcast":  # a (D, 1) node added to a (D, D) one would broadcast
        value = _node("add", (D, D), _gram(), _node("matmul", (D, 1), _gram(),
                                                    {"array": 0}))
        arrays = [np.ones((D, 1))]
    elif attack == "declared-shape":
        value, plan = _gram((D * D,)), _plan(D * D, SQRT2)
    elif attack == "nan-map":
        value, arrays = _node("matmul", (D, D), _gram(), {"array": 0}), [np.full((D, D),
                                                                                   np.nan)]
    elif attack == "extra-arg":  # rescaled_gram's extra positional argument is its scale
        value = {**_gram(), "kind": "rescaled_gram", "args": [0.5, {"array": 0}]}
        arrays = [np.full(40, 1e6)]
    elif attack == "wrong-d":
        changes = {"d": D + 1}
    elif attack == "overflow":  # 1e200 * S over 40 rows: beyond the part limit
        # (no plan covers it: a plan's integers n gamma Delta stay below 2^52)
        value = _node("mul", (D, D), _node("mul", (D, D), _gram(), 1e100), 1e100)
    elif attack == "secure-mode":
        changes = {"secure": True}
    else:
        changes = {"stream": -1}
    with pytest.raises((ValueError, TypeError)):
        _ask(value, plan, arrays, **changes)


@pytest.mark.parametrize("kind", ["rescaled_gram", "clipped_step"])
def test_whether_a_pass_runs_does_not_depend_on_the_rows(kind: str) -> None:
    """``row_sq=True`` on a block function that takes no squared norms: before, the
    client's fast path called it with ``sq=`` (a TypeError) on rows that need no
    prescaling, and answered for rows that all do (entries near 1e200): its refusal, seen
    by the server, told which. It is refused by name, whatever the rows."""
    args: list = [0.5] if kind == "rescaled_gram" else [{"array": 0}, 0.5]
    shape = (D, D) if kind == "rescaled_gram" else (D, 2)
    value = {**_gram(shape), "kind": kind, "args": args, "row_scaled": True,
             "row_sq": True}
    arrays = [] if kind == "rescaled_gram" else [np.ones((D, 2))]
    plan = _plan(int(np.prod(shape)), 10.0)
    for X in (_rows(), _rows() * 1e200):
        with pytest.raises(ValueError, match="takes no squared norms"):
            _ask(value, plan, arrays, X=X)
    _ask({**value, "row_sq": False}, plan, arrays)  # control: the client's own flags


@pytest.mark.parametrize(("field", "bad"), [
    ("noise_multiplier", float("nan")), ("noise_multiplier", float("inf")),
    ("noise_multiplier", 0.0), ("noise_multiplier", -3.0), ("sensitivity", float("nan")),
    ("min_clients", K + 1), ("min_clients", 0), ("bits", True), ("n_rows", 0),
    ("n_clients", K - 1), ("dim", D * D - 1), ("scale", 2.0**30)])
def test_a_plan_the_client_does_not_derive_is_refused(field: str, bad: Any) -> None:
    fields = {**plan_to_request(_plan(D * D, SQRT2)), field: bad}
    with pytest.raises(ValueError):
        _ask(_gram(), fields)


def test_a_plan_for_fewer_rows_than_the_client_holds_is_refused() -> None:
    """``n`` sets the client's rounding factor (``2 gamma_m n``): a plan for 1 row would
    have the client bound its 40-row part with a 40 times smaller factor (and shrink the
    modulus)."""
    with pytest.raises(ValueError, match="n_rows=1: this client alone holds 40 rows"):
        _ask(_gram(), _plan(D * D, SQRT2, n_rows=1))
    _ask(_gram(), _plan(D * D, SQRT2, n_rows=40))  # control: its own rows only


def test_a_symmetric_release_of_a_value_that_is_not_symmetric_sends_its_upper_triangle(
        ) -> None:
    """``S diag(a)`` released as symmetric: the message is the upper triangle's (its
    lower triangle, where ``out - out.T`` would be noiseless, is never sent)."""
    a = np.arange(1.0, D + 1)
    value = _node("matmul", (D, D), _gram(), {"array": 0})
    plan = _plan(D * (D + 1) // 2, SQRT2 * float(a.max()))
    got = _ask(value, plan, [np.diag(a)], symmetric=True)
    X = _rows()
    part = (X.T @ X) @ np.diag(a)
    want = client_message(part[np.triu_indices(D)], plan, keyed_stream(1, 2, 0))
    # the part differs from the client's block sums by rounding only: the stochastic
    # rounding moves at most the coordinates whose fraction sits at the uniform
    assert np.mean(got == want) > 0.9 and np.abs(centred(got - want, plan.modulus)).max() <= 1
    with pytest.raises(ValueError, match="noise would not cover"):  # the full bound needed
        _ask(value, _plan(D * (D + 1) // 2, SQRT2), [np.diag(a)], symmetric=True)


def test_a_replayed_release_draws_fresh_noise_and_counts_against_the_floor() -> None:
    """A seeded client asked the same release twice: the two messages' difference carries
    the two shares' noise (nothing cancels), and the fit's floor counts both."""
    Q = np.linalg.qr(np.random.default_rng(3).standard_normal((D, D)))[0]
    A = np.hstack([Q] * 20) / math.sqrt(20)  # norm 1: 120 coordinates
    value = _node("matmul", (D, 120), _gram(), {"array": 0})
    plan = _plan(D * 120, SQRT2, z=3.0)
    state = ClientState()
    m1 = _ask(value, plan, [A], state=state)
    m2 = _ask(value, plan, [A], state=state)
    diff = centred(m1 - m2, plan.modulus).astype(np.float64)
    # each share is Sk(lam, lam): variance 2 lam; the difference of two: 4 lam
    assert np.var(diff) > 0.5 * 4.0 * plan.share_parameter
    assert state.precision == pytest.approx(2.0 / 9.0)
    floor = 3.0 / math.sqrt(2.0) * (1.0 - 1e-6)  # the fit may hold two releases at z = 3
    state = ClientState()
    _ask(value, plan, [A], state=state, floor=floor)
    _ask(value, plan, [A], state=state, floor=floor)
    with pytest.raises(ValueError, match="min-noise-multiplier"):
        _ask(value, plan, [A], state=state, floor=floor)


def test_a_seeded_client_refuses_a_second_fit() -> None:
    state = ClientState()
    _ask(_gram(), _plan(D * D, SQRT2), state=state)
    with pytest.raises(ValueError, match="same noise"):
        _ask(_gram(), _plan(D * D, SQRT2), state=state, fit="another")


# -- 2. the event and the releases equal the in-process secure fit's ------------------------


@pytest.mark.parametrize(("method", "options"), [
    ("power", {"power_init": "private"}), ("power", {"center": "private"}),
    ("analyze_gauss", {"center": "private"}), ("auto", {"branch": "analyze_gauss"}),
    ("auto", {"center": np.full(10, 0.01)}), ("analyze_gauss", {"noise_multiplier": 3.0})])
def test_more_configurations_equal_the_in_process_secure_fit(
        data: np.ndarray, method: str, options: dict) -> None:  # noqa: F811
    fit = {**FIT, **options}
    if "noise_multiplier" in options:
        fit["target_epsilon"] = None
    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5,
                          trust="secure-aggregation", **fit)
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    got = fit_private_pca(_federation(data), 2, method=method, trust="secure-aggregation",
                          ledger=ledger, **fit)
    assert np.array_equal(got.components, ref.components)
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    assert ledger.events == [ref.dp_event]
    assert got.info["secure_aggregation"] == ref.info["secure_aggregation"]


# -- 3. rows at extreme magnitudes ---------------------------------------------------------


def test_rows_at_extreme_magnitudes_are_clipped_as_in_process(data: np.ndarray) -> None:  # noqa: F811
    X = data.copy()
    X[3] *= 1e8
    X[800] = 1e300  # its norm overflows float64; clipped to norm 1 all the same
    X[1600] = X[1600] / np.linalg.norm(X[1600])  # exactly at the bound
    ref = fit_private_pca(X, 2, method="analyze_gauss", clients=BOUNDS, seed=5,
                          trust="secure-aggregation", **FIT)
    got = fit_private_pca(_federation(X), 2, method="analyze_gauss",
                          trust="secure-aggregation", **FIT)
    assert np.all(np.isfinite(got.components))
    assert np.array_equal(got.components, ref.components)


def test_a_nan_row_is_refused_without_its_position(data: np.ndarray) -> None:  # noqa: F811
    X = data.copy()
    X[1234, 3] = np.nan
    with pytest.raises(ValueError, match="positions are not sent") as info:
        fit_private_pca(_federation(X), 2, method="analyze_gauss",
                        trust="secure-aggregation", **FIT)
    assert "1234" not in str(info.value)


def test_auto_takes_the_rescaled_branch_under_secure_aggregation_too() -> None:
    """tests/pca/test_review28.py's heavy-tailed rows far below their bound: auto's
    rescaled diagnostic and completion (two more Gram sums) over a network equal the
    in-process secure fit's, event included."""
    k = 2
    G, bounds = heavy_tailed_rows()
    fit = {**FIT, "trust": "secure-aggregation"}
    ref = fit_private_pca(G, k, method="auto", clients=bounds, seed=5, **fit)
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    got = fit_private_pca(_federation(G, bounds=bounds), k, method="auto", ledger=ledger,
                          **fit)
    assert ref.info["branch"] == got.info["branch"] == "analyze_gauss_rescaled"
    assert np.array_equal(got.components, ref.components)
    assert got.dp_event == ref.dp_event and ledger.events == [ref.dp_event]
    assert got.info["secure_aggregation"] == ref.info["secure_aggregation"]
