"""Adversarial review of federated PCA over a network (pca/remote.py, client_answer).

A server is the adversary here: it writes the requests by hand (the JSON a transport
carries), and the client must bound what it releases whatever it is asked.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger, gaussian_precision
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import auto, fit_private_pca
from dpprecond.pca.remote import (
    ClientMissingError,
    ClientState,
    RemoteFederation,
    _evaluate_value,
    client_answer,
)
from dpprecond.pca.rows import ClippedRows

D = 4


def _rows(n: int = 50, seed: int = 0) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, D))
    return X / np.linalg.norm(X, axis=1, keepdims=True) * 0.9


def _pass(kind: str, shape: tuple[int, ...], args: list | None = None,
          mean: Any = None) -> dict:
    return {"op": "pass", "shape": list(shape), "kind": kind, "args": args or [],
            "mean": mean, "row_scaled": False, "row_sq": False}


def _draw_spec(i: int, shape: tuple[int, ...], std: float, kind: str = "gaussian") -> dict:
    return {"id": i, "stream": 2, "kind": kind, "shape": list(shape), "std": std,
            "draws": "square"}


def _ask(value: dict, noise: dict, pending: list, arrays: list | None = None, *,
         X: np.ndarray | None = None, state: ClientState | None = None,
         floor: float = 0.0) -> np.ndarray:
    request = {"kind": "release", "fit": "attack", "row_norm": 1.0, "secure": False,
               "pending": pending, "value": value, "noise": noise, "std": 1.0}
    return client_answer(request, arrays or [], _rows() if X is None else X, client_id=0,
                         state=state if state is not None else ClientState(),
                         noise_seed=1, min_noise_multiplier=floor)


def _draw(i: int, shape: tuple[int, ...]) -> dict:
    return {"op": "draw", "shape": list(shape), "id": i}


# -- 1. privacy of what a client releases ------------------------------------------------


def test_a_symmetric_draw_cannot_hide_a_value_that_is_not_symmetric() -> None:
    """S @ diag(a) + W with W symmetric: out - out.T = S (diag(a) - ...) exactly, no noise."""
    a = np.arange(1.0, D + 1)
    value = {"op": "matmul", "shape": [D, D], "args": [_pass("gram", (D, D)), {"array": 0}]}
    out = _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1.0, "symmetric")],
               [np.diag(a)])
    # The release must be a function of its upper triangle (the part whose noise is
    # i.i.d.): otherwise the lower triangle minus the upper is a noiseless statistic.
    np.testing.assert_array_equal(out, out.T)


def test_noise_of_another_shape_is_refused_not_broadcast() -> None:
    """A (1, d) draw broadcast over the rows of a (d, d) value: row differences noiseless."""
    value = _pass("gram", (D, D))
    noise = {"op": "add", "shape": [D, D], "args": [
        {"op": "mul", "shape": [D, D], "args": [_draw(0, (D, D)), 1e-9]}, _draw(1, (1, D))]}
    with pytest.raises(ValueError, match="shape"):
        _ask(value, noise, [_draw_spec(0, (D, D), 1.0), _draw_spec(1, (1, D), 1.0)])


def test_a_value_of_another_shape_is_refused_not_broadcast() -> None:
    """0 * gram + column_sum: the column sum repeated d times at sensitivity 2 (not 2 sqrt d)."""
    value = {"op": "add", "shape": [D, D], "args": [
        {"op": "mul", "shape": [D, D], "args": [_pass("gram", (D, D)), 0.0]},
        _pass("column_sum", (D,))]}
    with pytest.raises(ValueError, match="shape"):
        _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1.0)], floor=1.0)


def test_a_negative_radius_does_not_make_the_sensitivity_negative() -> None:
    """gram + clipped_step(radius=-1e6): the client's bound is sqrt2 - 2e6 < 0."""
    XB = np.eye(D)
    value = {"op": "add", "shape": [D, D], "args": [
        _pass("gram", (D, D)), _pass("clipped_step", (D, D), [{"array": 0}, -1e6])]}
    with pytest.raises(ValueError):
        _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1e-3)], [XB], floor=1.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_public_array_is_refused(bad: float) -> None:
    """A NaN in a map makes the bound NaN, and ``std < floor * nan`` is False."""
    A = np.diag([1e6] * (D - 1) + [bad])
    value = {"op": "matmul", "shape": [D, D], "args": [_pass("gram", (D, D)), {"array": 0}]}
    with pytest.raises(ValueError):
        _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1.0)], [A], floor=1.0)


@pytest.mark.parametrize("c", [math.nan, math.inf])
def test_a_non_finite_scalar_is_refused(c: float) -> None:
    value = {"op": "mul", "shape": [D, D], "args": [_pass("gram", (D, D)), c]}
    with pytest.raises(ValueError):
        _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1.0)], floor=1.0)


def test_huge_public_arrays_cannot_make_the_part_non_finite_by_the_data() -> None:
    """Probe with X of 1e300 entries: whether a row overflows to NaN is data-dependent and
    a NaN part (a refusal, or NaN sent) is released without noise. Refused up front."""
    X = np.full((D, 1), 1e300)
    B = np.ones((1, 1))
    edges = np.array([0.5, 1.0])
    value = _pass("probe", (6,), [{"array": 0}, {"array": 1}, 1.0, {"array": 2}])
    with pytest.raises(ValueError):
        _ask(value, _draw(0, (6,)), [_draw_spec(0, (6,), 1.0)], [X, B, edges])


def test_a_server_cannot_pass_the_rows_scale_to_a_block_function() -> None:
    """clipped_step(XB, R, scale): a 4th positional argument is the rows' factors, so one
    row (by position) would weigh 1e6 times the others at the bound 2R."""
    scale = np.ones(50)
    scale[7] = 1e6
    value = _pass("clipped_step", (D, D), [{"array": 0}, 1.0, {"array": 1}])
    with pytest.raises(ValueError, match="arguments"):
        _ask(value, _draw(0, (D, D)), [_draw_spec(0, (D, D), 2.0)], [np.eye(D), scale],
             floor=1.0)


def test_min_noise_multiplier_bounds_the_whole_fit_not_each_release() -> None:
    """Ten releases of the Gram matrix, each at 1.5 Z: each passes a per-release floor, and
    together they are one Gaussian mechanism of multiplier 1.5 Z / sqrt(10) < Z."""
    Z = 2.0
    state = ClientState()
    std = 1.5 * Z * math.sqrt(2.0)
    refused = 0
    for i in range(10):
        try:
            _ask(_pass("gram", (D, D)), _draw(i, (D, D)), [_draw_spec(i, (D, D), std,
                                                                    "symmetric")],
                 state=state, floor=Z)
        except ValueError as exc:
            assert "min-noise-multiplier" in str(exc)
            refused += 1
    assert refused == 10 - 2  # 1 / (1.5 Z)^2 twice is 0.89 / Z^2; a third exceeds 1 / Z^2


def test_an_honest_fit_meets_its_own_noise_multiplier_at_every_client(data: np.ndarray
                                                                       ) -> None:
    """With Z the fit's own multiplier, no honest release is refused (centered auto)."""
    ref = fit_private_pca(data, 2, method="auto", clients=BOUNDS, seed=5, center="private",
                          **FIT)
    z = gaussian_precision(ref.dp_event) ** -0.5  # the fit: one Gaussian mechanism
    got = fit_private_pca(_federation(data, floor=z * (1 - 1e-9)), 2, method="auto",
                          center="private", **FIT)
    assert got.epsilon == ref.epsilon
    with pytest.raises(ValueError, match="min-noise-multiplier"):
        fit_private_pca(_federation(data, floor=z * 1.01), 2, method="auto",
                        center="private", **FIT)


def test_a_block_pass_has_its_functions_own_shape() -> None:
    """A probe declared of shape (3, 6): its (6,) block terms broadcast into 3 copies, the
    sensitivity 2 sqrt 3 at a claimed 2."""
    value = _pass("probe", (3, 6), [{"array": 0}, {"array": 1}, 0.1, {"array": 2}])
    with pytest.raises(ValueError, match="shape"):
        _ask(value, _draw(0, (3, 6)), [_draw_spec(0, (3, 6), 1.0)],
             [Q, np.eye(2), np.array([0.5, 2.0])])


@pytest.mark.parametrize("row_norm", [math.nan, math.inf, 0.0, -1.0])
def test_a_bad_row_norm_is_refused(row_norm: float) -> None:
    request = {"kind": "release", "fit": "attack", "row_norm": row_norm, "secure": False,
               "pending": [_draw_spec(0, (D, D), 1.0)], "value": _pass("gram", (D, D)),
               "noise": _draw(0, (D, D)), "std": 1.0}
    with pytest.raises(ValueError, match="row_norm"):
        client_answer(request, [], _rows(), client_id=0, state=ClientState(), noise_seed=1)


def test_whether_a_part_overflows_never_depends_on_the_rows() -> None:
    """(gram @ 1e100 I) * 1e100 * 1e100: finite for small rows, inf for rows near the
    bound; a refusal only for the latter would tell the server which. Refused for both."""
    big = {"op": "mul", "shape": [D, D], "args": [{"op": "mul", "shape": [D, D], "args": [
        {"op": "matmul", "shape": [D, D], "args": [_pass("gram", (D, D)), {"array": 0}]},
        1e100]}, 1e100]}
    for scale in (1e-3, 1.0):
        with pytest.raises(ValueError, match="bound"):
            _ask(big, _draw(0, (D, D)), [_draw_spec(0, (D, D), 1.0)], [1e100 * np.eye(D)],
                 X=_rows() * scale)


def test_a_tiny_std_is_refused_by_the_floor_not_an_overflow() -> None:
    with pytest.raises(ValueError, match="min-noise-multiplier"):
        _ask(_pass("gram", (D, D)), _draw(0, (D, D)), [_draw_spec(0, (D, D), 1e-160)],
             floor=1.0)


def test_a_seeded_client_answers_one_fit_only() -> None:
    """Seeded streams do not depend on the fit: fits "a" and "b" at stds 1 and 2 drew the
    same normals, and 2 r_a - r_b was the exact Gram matrix."""
    X, state = _rows(), ClientState()
    for fit, std in (("a", 1.0), ("b", 2.0)):
        request = {"kind": "release", "fit": fit, "row_norm": 1.0, "secure": False, "d": D,
                   "pending": [_draw_spec(0, (D, D), std)], "value": _pass("gram", (D, D)),
                   "noise": _draw(0, (D, D)), "std": std}
        if fit == "b":
            with pytest.raises(ValueError, match="same noise"):
                client_answer(request, [], X, client_id=0, state=state, noise_seed=7)
        else:
            client_answer(request, [], X, client_id=0, state=state, noise_seed=7)
    fresh = ClientState()  # unseeded: every request draws fresh entropy, fits may follow
    for fit in ("a", "b"):
        client_answer({**request, "fit": fit}, [], X, client_id=0, state=fresh)


# Worst-case neighbours: the client's bound covers the change of its part ---------------

def _neighbours(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    X = _rows(40, seed=3)
    X2 = X.copy()
    X2[7] = row
    return X, X2


def _part(node: dict, arrays: list, X: np.ndarray) -> tuple[np.ndarray, float]:
    base = ClippedRows.from_data(X, 1.0)

    def rows_of(mean: Any) -> ClippedRows:
        return base if mean is None else base.centered(np.asarray(mean))

    return _evaluate_value(node, arrays, rows_of, {})


REPLACEMENTS = [np.full(D, 0.5), -np.ones(D) * 1e8 / 2, np.array([1e300, -1e300, 0.0, 1e300]),
                np.zeros(D)]
RNG = np.random.default_rng(11)
Q = np.linalg.qr(RNG.standard_normal((D, 2)))[0]
NODES = [
    ("gram", _pass("gram", (D, D)), []),
    ("mean", {"op": "div", "shape": [D], "args": [_pass("column_sum", (D,)), 40.0]}, []),
    ("centered gram far away", _pass("gram", (D, D), mean={"array": 0}), [np.full(D, 1e8)]),
    ("centered gram", {"op": "sub", "shape": [D, D], "args": [
        _pass("gram", (D, D), mean={"array": 0}),
        {"op": "T", "shape": [D, D], "args": [_pass("gram", (D, D))]}]}, [np.full(D, 0.3)]),
    ("S Q", {"op": "matmul", "shape": [D, 2], "args": [_pass("gram", (D, D)),
                                                       {"array": 0}]}, [3.0 * Q]),
    ("Q^T S Q", {"op": "rmatmul", "shape": [2, 2], "args": [{"array": 0}, {
        "op": "matmul", "shape": [D, 2], "args": [_pass("gram", (D, D)), {"array": 1}]}]},
     [Q.T * 2.0, Q * 5.0]),
    ("probe", _pass("probe", (6,), [{"array": 0}, {"array": 1}, 0.1, {"array": 2}]),
     [Q, np.eye(2) * 7.0, np.array([0.5, 2.0])]),
    ("rescaled gram", _pass("rescaled_gram", (D, D), [1e-3]), []),
    ("clipped step", _pass("clipped_step", (D, 2), [{"array": 0}, 0.25]), [Q * 100.0]),
    ("clipped step, big radius", {"op": "rmul", "shape": [D, 2], "args": [-3.0, _pass(
        "clipped_step", (D, 2), [{"array": 0}, 1e8])]}, [Q * 1e8]),
]


@pytest.mark.parametrize("row", REPLACEMENTS, ids=["half", "1e8", "1e300", "zero"])
@pytest.mark.parametrize(("name", "node", "arrays"), NODES, ids=[n[0] for n in NODES])
def test_the_clients_bound_covers_a_worst_case_neighbour(name: str, node: dict, arrays: list,
                                                         row: np.ndarray) -> None:
    X, X2 = _neighbours(row)
    (a, sens), (b, _) = _part(node, arrays, X), _part(node, arrays, X2)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    assert np.linalg.norm(np.asarray(a) - np.asarray(b)) <= sens * (1 + 1e-9)


# -- 2. equality with the in-process local fit -------------------------------------------

BOUNDS = np.array([0, 700, 1500, 1501, 3000])
FIT = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(3000, 10, 2, 20.0, seed=4)


def _federation(data: np.ndarray, seed: int | None = 5, drop_after: int | None = None,
                sent: list | None = None, parts: list | None = None,
                floor: float = 0.0) -> RemoteFederation:
    parts = parts if parts is not None else [data[lo:hi] for lo, hi in pairwise(BOUNDS)]
    states = [ClientState() for _ in parts]
    count = {"release": 0}

    def transport(request: dict, arrays: list) -> list[np.ndarray]:
        if sent is not None:
            sent.append(request["kind"])
        if drop_after == -1 and request["kind"] == "slack":
            raise ClientMissingError("gone", clients=[2], reasons={2: "gone"}, kind="slack")
        if request["kind"] == "release":
            if drop_after is not None and count["release"] >= drop_after:
                raise ClientMissingError("gone", clients=[2], reasons={2: "gone"},
                                         kind="release")
            count["release"] += 1
        return [client_answer(request, arrays, X, client_id=i, state=states[i],
                              noise_seed=seed, min_noise_multiplier=floor)
                for i, X in enumerate(parts)]

    return RemoteFederation(transport, [len(p) for p in parts], data.shape[1], fit_id="t")


@pytest.mark.parametrize(("method", "options"), [
    ("auto", {}), ("auto", {"branch": "analyze_gauss"}),
    ("auto", {"branch": "iterate", "center": "private"}),
    ("power", {"center": "private"}), ("analyze_gauss", {"center": "private"}),
    ("analyze_gauss", {"center": np.full(10, 0.01)}),
    ("auto", {"noise_multiplier": 3.0, "target_epsilon": None}),
])
def test_remote_fit_is_the_local_fit(data: np.ndarray, method: str, options: dict) -> None:
    settings = {**FIT, **options}
    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5, **settings)
    got = fit_private_pca(_federation(data), 2, method=method, **settings)
    np.testing.assert_allclose(got.components, ref.components, atol=1e-12)
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    assert got.info.get("branch") == ref.info.get("branch")


def heavy_tailed_rows() -> tuple[np.ndarray, np.ndarray]:
    """200,000 heavy-tailed rows (Student t, 3 degrees of freedom, a spike of 10 in 2 of
    20 dimensions) divided by the largest row norm, so most lie far below their bound;
    and 4 clients' bounds (one of a single row)."""
    n, d, k = 200000, 20, 2
    rng = np.random.default_rng(5)
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    G = rng.standard_normal((n, d))
    G += (math.sqrt(10.0) - 1) * (G @ V) @ V.T
    G /= np.sqrt(rng.chisquare(3, n) / 3)[:, None]
    G /= np.linalg.norm(G, axis=1).max()
    return G, np.array([0, 50000, 120000, 120001, n])


def test_auto_takes_the_rescaled_branch_over_a_network() -> None:
    """Heavy-tailed rows far below their bound (tests/pca/test_auto.py's): M1 hides the
    top k and auto completes Analyze Gauss at the rows' scale, over a network too."""
    G, bounds = heavy_tailed_rows()
    ref = fit_private_pca(G, 2, method="auto", clients=bounds, seed=5, **FIT)
    fed = _federation(G, parts=[G[lo:hi] for lo, hi in pairwise(bounds)])
    got = fit_private_pca(fed, 2, method="auto", **FIT)
    assert ref.info["branch"] == got.info["branch"] == "analyze_gauss_rescaled"
    np.testing.assert_allclose(got.components, ref.components, atol=1e-12)
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon


# -- 3. controls and bad input: a named error before any release ------------------------


@pytest.mark.parametrize(("settings", "error"), [
    ({"target_epsilon": 0.0}, ValueError), ({"target_epsilon": -1.0}, ValueError),
    ({"target_delta": 0.0}, ValueError), ({"target_delta": 1.0}, ValueError),
    ({"no_such_option": 1}, (ValueError, TypeError)),
    ({"ledger": PrivacyLedger(1e-6, max_epsilon=0.1)}, PrivacyBudgetExceededError),
])
def test_bad_settings_send_nothing(data: np.ndarray, settings: dict, error: Any) -> None:
    sent: list = []
    with pytest.raises(error):
        fit_private_pca(_federation(data, sent=sent), 2, method="auto", **{**FIT, **settings})
    assert sent == []


@pytest.mark.parametrize("bad", ["nan", "inf", "wide"])
def test_a_bad_client_releases_nothing(data: np.ndarray, bad: str) -> None:
    parts = [data[lo:hi].copy() for lo, hi in pairwise(BOUNDS)]
    if bad == "wide":
        parts[1] = np.hstack([parts[1], parts[1][:, :1]])
    else:
        parts[1][3, 2] = float(bad)
    sent: list = []
    fed = _federation(data, sent=sent, parts=parts)
    with pytest.raises(ValueError):
        fit_private_pca(fed, 2, method="analyze_gauss", **FIT)
    assert fed.releases_asked == 0 and "release" not in sent


def test_a_nan_at_a_client_is_refused_without_its_position() -> None:
    X = _rows()
    X[17, 2] = math.nan
    request = {"kind": "slack", "fit": "e", "row_norm": 1.0, "secure": False,
               "pending": [], "n": 50}
    with pytest.raises(ValueError, match="NaN") as err:
        client_answer(request, [], X, client_id=0, state=ClientState())
    assert "17" not in str(err.value) and err.value.__cause__ is None


def test_an_empty_client_is_refused_by_the_client() -> None:
    request = {"kind": "slack", "fit": "e", "row_norm": 1.0, "secure": False,
               "pending": [], "n": 10}
    with pytest.raises(ValueError, match="row"):
        client_answer(request, [], np.zeros((0, D)), client_id=0, state=ClientState())


# -- 4. a client missing mid-fit ---------------------------------------------------------


def test_a_client_missing_mid_fit_charges_the_ledger(data: np.ndarray) -> None:
    ledger = PrivacyLedger(1e-6)
    with pytest.raises(ClientMissingError, match="spent") as err:
        fit_private_pca(_federation(data, drop_after=2), 2, method="power",
                        ledger=ledger, **FIT)
    assert ledger.n_releases == 1  # the fit's planned event (it bounds what was released)
    assert err.value.releases_made == 2


def test_a_client_missing_before_any_release_charges_nothing(data: np.ndarray) -> None:
    ledger = PrivacyLedger(1e-6)
    with pytest.raises(ClientMissingError, match=r"[Nn]othing was released"):
        fit_private_pca(_federation(data, drop_after=-1), 2, method="analyze_gauss",
                        ledger=ledger, **FIT)
    assert ledger.n_releases == 0
    # the first release asked for may have reached the server: it is spent
    with pytest.raises(ClientMissingError, match=r"1 release\(s\) were asked.*0 answered"):
        fit_private_pca(_federation(data, drop_after=0), 2, method="analyze_gauss",
                        ledger=ledger, **FIT)
    assert ledger.n_releases == 1


def test_auto_block_functions_are_the_listed_ones() -> None:
    assert auto._block_probe is not None  # the module the client imports from
