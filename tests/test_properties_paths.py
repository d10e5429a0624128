"""Property-based tests (hypothesis) of the paths issue 17 found unwalked.

The same contract as ``tests/test_properties.py``: every input ends in a
``ValueError``/``TypeError`` whose message names the offending parameter (or a
:class:`~dpprecond.PrivacyBudgetExceededError` when a ledger cannot afford the plan, with
nothing recorded), or in a correct result. Covered here:

- federated PCA (``fit_private_pca(clients=, trust=)``): client bounds at and beyond their
  edges (single-row clients, empty, unsorted, not from 0 to n), both trust models and bad
  ones, every method; a correct fit spends exactly what the central fit spends, and under
  secure aggregation releases what the central fit releases for the same seed;
- dask and memory-mapped inputs: shapes, dtypes, chunkings, NaN/inf and extremes; each
  gives exactly the numpy input's result (or its named error) for the same seed;
- the pipeline (``run_pipeline``): features, budgets, shares, methods, trust, clients,
  secure mode, seeds and capped ledgers; the reported total is the ledger's, what
  dp_accounting computes independently for its events, and never above the target;
- the Flower app's run config: values of every key, typos and unknown keys; a valid config
  builds the strategy it describes.

Derandomized, without shrinking, counted per test so that the file runs in well under a
minute.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpprecond import LargeDeltaWarning, PrivacyBudgetExceededError
from dpprecond.accounting import (
    NoiseFloorWarning,
    PrivacyLedger,
    epsilon_of,
    gaussian_precision,
)
from dpprecond.pca import fit_private_pca
from tests.test_properties import (
    EXTREMES,
    METHODS,
    _settings,
    accounted_epsilon,
    check_result,
)

FEDERATED = ("auto", "analyze_gauss", "fixed", "power", "exact")


def named_error(fn: Any, names: list[str]) -> Any:
    """``fn()``, or None if it raised ValueError/TypeError naming one of ``names``."""
    try:
        with warnings.catch_warnings():  # a large delta or epsilon warns; not the point here
            warnings.simplefilter("ignore", LargeDeltaWarning)
            warnings.simplefilter("ignore", NoiseFloorWarning)
            return fn()
    except (ValueError, TypeError) as exc:
        assert any(n in str(exc) for n in names), f"error does not name {names}: {exc}"
        return None


# --------------------------------------------------------------------------------------
# Federated PCA
# --------------------------------------------------------------------------------------


@st.composite
def client_bounds(draw: Any, n: int) -> tuple[Any, bool]:
    """Client bounds for ``n`` rows and whether they are valid."""
    kind = draw(st.sampled_from(["valid", "single"]) if draw(st.integers(0, 3)) != 3 else
                st.sampled_from(["empty", "unsorted", "no-zero", "short", "float", "2-D", "one"]))
    if kind in ("valid", "single"):
        k = draw(st.integers(1, min(n, 6)))
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=k - 1, max_size=k - 1))
                      ) if n > 1 else []
        if kind == "single" and n > 1:
            cuts = sorted({*cuts, n - 1})  # the last client holds one row
        return [0, *cuts, n], True
    bad = {"empty": [0, 0, n], "unsorted": [0, n, max(n - 1, 1), n], "no-zero": [1, n],
           "short": [0, max(n - 1, 1)], "float": [0.0, float(n)], "2-D": [[0, n]],
           "one": [n]}[kind]
    return bad, False


@st.composite
def federated_calls(draw: Any) -> dict[str, Any]:
    d = draw(st.integers(1, 4))
    n = draw(st.integers(max(3, d), 40))
    X = np.random.default_rng(draw(st.integers(0, 3))).standard_normal((n, d))
    X *= draw(st.sampled_from([1.0, 1e-150, 1e150]))
    bounds, valid = draw(client_bounds(n))
    method = draw(st.sampled_from(FEDERATED) if draw(st.integers(0, 5)) != 5
                  else st.just("select"))
    trust = draw(st.sampled_from(["local", "secure-aggregation", "local"])
                 if draw(st.integers(0, 4)) != 4 else st.sampled_from(["none", None, 1]))
    return {"X": X, "bounds": bounds, "valid_bounds": valid, "method": method,
            "trust": trust, "k": draw(st.integers(1, d)),
            "epsilon": draw(st.sampled_from([0.5, 1.0, 4.0])),
            "row_norm": float(np.abs(X).max() * math.sqrt(d) * draw(
                st.sampled_from([0.5, 1.0, 2.0]))) or 1.0,
            "seed": draw(st.integers(0, 5))}


@_settings(80)
@given(p=federated_calls())
def test_federated_pca(p: dict[str, Any]) -> None:
    bad = []
    if not p["valid_bounds"]:
        bad.append("client bounds")
    if p["trust"] not in ("local", "secure-aggregation"):
        bad.append("trust")
    if p["method"] not in FEDERATED:
        bad.append("cannot run federated")
    elif p["method"] == "exact" and p["trust"] == "secure-aggregation":
        bad.append("private mechanism")  # secure sums carry noise; exact is local only
    kw = {"method": p["method"], "target_epsilon": p["epsilon"], "target_delta": 1e-5,
          "row_norm": p["row_norm"], "seed": p["seed"]}
    res = named_error(lambda: fit_private_pca(p["X"], p["k"], clients=p["bounds"],
                                              trust=p["trust"], **kw),
                      bad or ["never"])
    if bad:
        event("invalid, named error")
        assert res is None, f"accepted invalid {bad}"
        return
    assert res is not None
    event(f"valid, {p['trust']}")
    check_result(res, p["X"], p["k"], p["method"], p["epsilon"], 1e-5, p["row_norm"])
    if p["trust"] == "secure-aggregation":
        # every release a secure sum: the Skellam plan, calibrated in RDP to the target
        from dpprecond.pca.api import planned_event

        planned = planned_event(p["method"], target_epsilon=p["epsilon"], target_delta=1e-5,
                                trust="secure-aggregation")
        assert res.dp_event == planned and res.info["secure_aggregation"]["n_sums"] >= 1
        assert res.epsilon == epsilon_of(planned, 1e-5, "rdp") <= p["epsilon"]
        return
    central = fit_private_pca(p["X"], p["k"], **kw)
    if p["method"] == "auto":  # its branch, hence the releases it lists, follows the noise
        # drawn (K client noises or one), so the events may differ; both are one Gaussian of
        # the plan's precision (found on main too: rng(0) 28 x 2, bounds [0, 8, 27, 28], k=1)
        assert gaussian_precision(res.dp_event) == pytest.approx(
            gaussian_precision(central.dp_event), rel=1e-12)
        assert res.epsilon == pytest.approx(central.epsilon, rel=1e-9)
        return
    assert res.epsilon == central.epsilon and res.dp_event == central.dp_event


# --------------------------------------------------------------------------------------
# Dask and memory-mapped inputs
# --------------------------------------------------------------------------------------

DTYPES = [np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_]


@st.composite
def lazy_inputs(draw: Any) -> tuple[np.ndarray, int]:
    n = draw(st.integers(1, 50))
    d = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from(DTYPES))
    if dtype in (np.float64, np.float32):
        values = st.one_of(st.floats(-10, 10, width=32), st.sampled_from(
            [*EXTREMES, math.nan, math.inf, -math.inf] if dtype == np.float64
            else [0.0, 1.0, -1.0, 3e38, math.nan, math.inf]))
        X = draw(hnp.arrays(dtype, (n, d), elements=values))
    elif dtype == np.bool_:
        X = draw(hnp.arrays(dtype, (n, d)))
    else:
        X = draw(hnp.arrays(dtype, (n, d), elements=st.integers(0, 100)))
    return X, draw(st.integers(1, max(1, n)))


def _same(a: Any, b: Any) -> None:
    """Two outcomes of the same fit: both named errors with the same message, or equal."""
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    np.testing.assert_allclose(a.components, b.components, rtol=0, atol=1e-9)
    assert a.epsilon == b.epsilon and a.dp_event == b.dp_event


def _outcome(fn: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LargeDeltaWarning)
            return fn()
    except (ValueError, TypeError) as exc:
        assert "X" in str(exc) or "n_samples" in str(exc) or "n_components" in str(exc), exc
        return str(exc)


@_settings(60)
@given(data=lazy_inputs(), method=st.sampled_from([m for m in METHODS if m != "select"]),
       seed=st.integers(0, 3))
def test_dask_and_memmap_inputs_give_the_numpy_result(data: tuple, method: str,
                                                      seed: int) -> None:
    """A dask array (any chunking) and a memory-mapped ``.npy`` are read lazily, block by
    block, yet give exactly the in-memory result, or its named error (NaN at the same
    position, ``n < d``)."""
    da = pytest.importorskip("dask.array")
    X, chunk = data
    kw = {"method": method, "target_epsilon": 1.0, "target_delta": 1e-5, "row_norm": 4.0,
          "seed": seed}
    k = 1
    reference = _outcome(lambda: fit_private_pca(X, k, **kw))
    event("numpy: named error" if isinstance(reference, str) else "numpy: result")
    _same(_outcome(lambda: fit_private_pca(da.from_array(X, chunks=(chunk, X.shape[1])),
                                           k, **kw)), reference)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "X.npy"
        np.save(path, X)
        _same(_outcome(lambda: fit_private_pca(np.load(path, mmap_mode="r"), k, **kw)),
              reference)


# --------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------

_rng = np.random.default_rng(7)
_C = _rng.standard_normal((3, 5)) * 2
_Y = _rng.integers(0, 3, 140)
_X = _C[_Y] + _rng.standard_normal((140, 5))
PX, PY, PXT, PYT = _X[:100], _Y[:100], _X[100:], _Y[100:]


#: Per parameter of run_pipeline: valid values, invalid ones, and the names an error may use.
PIPELINE: dict[str, tuple[list[Any], list[Any], list[str]]] = {
    "features": (["pca:2", "pca:5", "random:4", "pixels"], ["pca:0", "svd:2", "pca:6"],
                 ["features", "n_components"]),
    "target_epsilon": ([1.0, 4.0, None], [0.0, -1.0], ["epsilon"]),
    "target_delta": ([1e-5, 1e-3], [0.5, 0.0], ["target_delta"]),
    "pca_share": ([0.2, 0.5], [0.0, 1.0], ["pca_share"]),
    "pca_method": (["auto", "analyze_gauss", "fixed"], ["select"], ["pca_method"]),
    "trust": (["local", "secure-aggregation"], ["nobody"], ["trust"]),
    "algorithm": (["fedgd", "sofim-lagged", "adam"], ["sofiim"], ["method", "algorithm"]),
    "n_clients": ([1, 3, 7], [0, 101], ["n_clients"]),
    "row_norm": ([6.0, 1e-3], [-1.0], ["row_norm"]),
}


@st.composite
def pipeline_calls(draw: Any) -> tuple[dict[str, Any], list[str], str]:
    """Keyword arguments, the names an error may use (empty: valid) and the ledger kind."""
    broken = draw(st.sets(st.sampled_from(sorted(PIPELINE)), max_size=1)) \
        if draw(st.booleans()) else set()
    p: dict[str, Any] = {"n_rounds": draw(st.integers(1, 2)), "clip_norm": 1.0}
    bad: list[str] = []
    for name, (good, wrong, names) in PIPELINE.items():
        p[name] = draw(st.sampled_from(wrong if name in broken else good))
        if name in broken:
            bad.extend(names)
    p["secure"] = draw(st.booleans())
    p["seed"] = draw(st.sampled_from([None, 0, 3]))
    if p["secure"] and p["seed"] is not None:
        bad.append("refuses seeds")
    if p["trust"] == "secure-aggregation" and p["target_epsilon"] is None:
        bad.append("trust='secure-aggregation'")  # the Skellam rounds are private
    private = p["target_epsilon"] is not None and p["target_epsilon"] > 0
    ledger = draw(st.sampled_from(["none", "none", "low", "high"])) if private else "none"
    return p, bad, ledger


@_settings(50)
@given(call=pipeline_calls())
def test_run_pipeline(call: tuple[dict[str, Any], list[str], str]) -> None:
    from dpprecond.pipeline import run_pipeline

    p, bad, kind = call
    ledger = None if kind == "none" else PrivacyLedger(
        1e-5 if not 0 < p["target_delta"] <= 0.01 else p["target_delta"],
        max_epsilon=p["target_epsilon"] / 2 if kind == "low" else p["target_epsilon"])
    try:
        res = named_error(lambda: run_pipeline(PX, PY, PXT, PYT, 3, ledger=ledger, **p),
                          bad or ["never"])
    except PrivacyBudgetExceededError as exc:
        assert kind == "low" and "max_epsilon" in str(exc), exc
        assert ledger is not None and ledger.n_releases == 0  # the whole plan, first
        event("capped ledger refused the whole plan")
        return
    if bad:
        event("invalid, named error")
        assert res is None, f"accepted invalid {bad}"
        return
    assert res is not None and kind != "low"
    event(f"valid {p['features'].split(':')[0]}{' secure' if p['secure'] else ''}")
    assert np.all(np.isfinite(res.fl.params))
    if p["target_epsilon"] is None:
        assert math.isinf(res.epsilon)
        return
    assert res.ledger is not None
    if ledger is not None:
        assert res.ledger is ledger
    assert res.epsilon == pytest.approx(res.ledger.epsilon, rel=1e-12)
    assert res.epsilon <= p["target_epsilon"] * (1 + 1e-6)
    true = accounted_epsilon(res.ledger.event, res.ledger.delta)
    assert res.epsilon >= true * (1 - 1e-9) - 1e-12
    if p["features"].startswith("pca"):
        k = int(p["features"].split(":")[1])
        V = res.components  # the released components, as rows
        assert V is not None and V.shape == (k, 5)
        np.testing.assert_allclose(V @ V.T, np.eye(k), atol=1e-8)
        assert res.pca_epsilon is not None and res.pca_epsilon < res.epsilon


# --------------------------------------------------------------------------------------
# The Flower app's run config
# --------------------------------------------------------------------------------------

#: Per key: valid values and invalid ones (typed as a pyproject.toml gives them).
RUN_CONFIG: dict[str, tuple[list[Any], list[Any]]] = {
    "algorithm": (["fedgd", "sofim-lagged", "scaffold"], ["sofiim", 3, ""]),
    "n-rounds": ([1, 3], [0, -1, 2.5, "x", True]),
    "clip-norm": ([1.0, 10.0], [0.0, -1.0, "x", math.inf]),
    "target-delta": ([1e-5, 1e-3], [0.0, 0.5, 1.0, "x"]),
    "max-epsilon": (["", 5.0], [0.0, -1.0, "x", True]),
    "mechanism": (["full-batch"], ["client-level", "nope"]),
    "weighting": (["uniform", "size"], ["equal"]),
    "accountant": (["pld", "rdp"], ["exact"]),
    "secure": ([True, False], ["yes", "false", 1, 0]),
    "noise-seed": (["", 0, 5], [-1, "x", 1.5]),
    "min-replies": ([1, 2], [0, 1.5, "x"]),
    "connect-timeout": ([1.0, 60.0], [0.0, -1.0, "x"]),
    "evaluate": ([True, False], ["no", 1]),
    "partition": (["iid", "dirichlet"], ["round-robin"]),
    "partition-seed": ([0, 3], [-1, "x"]),
}
TYPOS = ["max_epsilon", "target-epsilons", "trust", "seed", "secure-noise", "n-round"]


@st.composite
def run_configs(draw: Any) -> tuple[dict[str, Any], list[str]]:
    rc: dict[str, Any] = {"n-clients": 3, "data": "digits", "noise-multiplier": "",
                          "target-epsilon": 1.0}
    bad: list[str] = []
    for key in draw(st.sets(st.sampled_from(sorted(RUN_CONFIG)), max_size=4)):
        good, wrong = RUN_CONFIG[key]
        if draw(st.integers(0, 3)) == 0:
            rc[key] = draw(st.sampled_from(wrong))
            bad.append(key)
        else:
            rc[key] = draw(st.sampled_from(good))
    if draw(st.integers(0, 5)) == 0:
        typo = draw(st.sampled_from(TYPOS))
        rc[typo] = 1
        bad.append(typo)
    if rc.get("secure") is True and rc.get("noise-seed", "") != "" \
            and "noise-seed" not in bad and "secure" not in bad:
        bad.append("refuses seeds")
    if rc.get("algorithm") == "scaffold" and rc.get("mechanism") == "full-batch":
        pass  # scaffold runs its own local steps on the full-batch mechanism
    return rc, bad


@_settings(60)
@given(call=run_configs())
def test_flower_run_config(call: tuple[dict[str, Any], list[str]]) -> None:
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from dpprecond.adapters.flower.app import strategy_from_run_config

    rc, bad = call
    names = [form for key in bad for form in (key, key.replace("-", "_"))] or ["never"]
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    try:
        strategy = named_error(lambda: strategy_from_run_config(ctx), names)
    except PrivacyBudgetExceededError:  # pragma: no cover - a cap is checked at start()
        raise
    if bad:
        event("invalid, named error")
        assert strategy is None, f"accepted invalid {bad}: {rc}"
        return
    assert strategy is not None
    event("valid config")
    cfg = strategy.config
    assert cfg.n_rounds == rc.get("n-rounds", 20) and cfg.target_epsilon == 1.0
    assert cfg.target_delta == rc.get("target-delta", 1e-5)
    assert strategy.server_.secure is rc.get("secure", False)
    cap = rc.get("max-epsilon", "")
    assert (strategy.server_.caller_ledger is None) == (cap == "")
