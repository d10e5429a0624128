"""Review 30b: federated PCA on Flower's SecAgg+ (adapters/flower/pca_secagg.py).

- The modulus pre-check (``check_modulus``) must cover every release the fit makes, not
  only the Gram sum at the plan's multiplier: ``auto``'s probe is released at ``z /
  sqrt(probe_share)`` (10 z by default) and the power method's products have ``d k``
  coordinates (more than the Gram's ``d (d + 1) / 2`` for ``k > (d + 1) / 2``). A fit one
  of whose sums SecAgg+ cannot carry must be refused before the ledger is charged and
  before any share, as the module docstring says.
- Worst-case PCA messages (every entry at ``-q/2`` or ``q/2 - 1``, ``q = 2^30``) through
  the PCA transport's SecAgg+ run with a dropout: the survivors' sum, exactly.
- ``min_clients < K`` without a dropout: the deployment's releases are the in-process
  fit's, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import dpprecond.adapters.flower.pca_secagg as pca_secagg
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.pca import (
    SecureAggregationUnavailableError,
    SplitRows,
    fit_pca_on_flower,
    make_pca_client_app,
)
from dpprecond.adapters.flower.pca_secagg import SecAggPlusPCATransport, check_modulus
from dpprecond.pca import fit_private_pca
from dpprecond.secagg.fl import FIT_BITS
from dpprecond.secagg.sums import SumPlan
from tests.adapters.test_flower_pca_secagg import (  # noqa: F401
    FIT,
    SEED,
    Grid,
    _task_identity,
    digits,
)


def _unit_rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, d))
    return 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)


CASES = [
    # auto's probe at 10 z: z = 350 gives the probe's default-scale plan Skellam shares
    # above the 2^50 cap on a share's mean (z = 1000, used before that cap, has no plan in
    # process either): no release could start, so no coarser scale is tried
    ("auto", 300, 20, 2, {"noise_multiplier": 350.0, "target_epsilon": None}),
    # power with k = d: products of d^2 coordinates; 31 bits at 2^-10 and n = 3,000 (it
    # runs coarsened: test below), 34 bits even at 2^-3 with 256 times the rows
    ("power", 3000 * 256, 100, 100, {"target_epsilon": 2.0}),
]


@pytest.mark.parametrize(("method", "n", "d", "k", "budget"), CASES)
def test_a_fit_whose_sums_secaggplus_cannot_carry_is_refused_before_any_charge(
        method, n, d, k, budget) -> None:
    X = np.broadcast_to(0.9 / np.sqrt(d), (n, d))  # the refusal needs only n and d
    bounds = np.linspace(0, n, 4).astype(np.int64)
    fit = {"target_delta": 1e-5, "row_norm": 1.0, "trust": "secure-aggregation", **budget}
    budget_kw = {key: val for key, val in fit.items() if key not in ("row_norm", "trust")}
    with pytest.raises(SecureAggregationUnavailableError, match=r"2\^30"):
        check_modulus(d, n, 3, None, method=method, n_components=k, options={}, **budget_kw)
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    grid = Grid(make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED))
    with pytest.raises(SecureAggregationUnavailableError, match=r"2\^30"):
        fit_pca_on_flower(grid, k, method=method, ledger=ledger, **fit)
    assert "train" not in grid.types  # no share was sent
    assert ledger.events == []  # and nothing charged: nothing was released


def test_a_fit_beyond_2_30_at_the_default_scale_runs_coarsened_as_in_process() -> None:
    """power with k = d = 100 over 3,000 rows: its products need 31 bits at the 2^-10
    rounding scale; on SecAgg+ the fit coarsens them to 30 (inflation bound 2^-9) and is
    the in-process fit with max_modulus_bits=30, bit for bit; the uncapped in-process fit
    takes 31 bits."""
    n, d, k = 3000, 100, 100
    X = _unit_rows(n, d)
    bounds = np.linspace(0, n, 4).astype(np.int64)
    fit = {"target_delta": 1e-5, "row_norm": 1.0, "trust": "secure-aggregation",
           "target_epsilon": 2.0, "method": "power", "n_iter": 2}
    free = fit_private_pca(X, k, clients=bounds, seed=SEED, **fit)
    assert max(free.info["secure_aggregation"]["modulus_bits"]) == 31
    ref = fit_private_pca(X, k, clients=bounds, seed=SEED, max_modulus_bits=FIT_BITS, **fit)
    sums = ref.info["secure_aggregation"]
    assert max(sums["modulus_bits"]) == FIT_BITS
    assert sums["max_modulus_bits"] == FIT_BITS and sums["accounted_inflation"] == 2.0**-9
    assert ref.dp_event != free.dp_event and abs(ref.epsilon - 2.0) < 1e-3
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    grid = Grid(make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED))
    got = fit_pca_on_flower(grid, k, ledger=ledger, **fit)
    assert np.array_equal(got.components, ref.components)  # integer sums: bit for bit
    assert got.dp_event == ref.dp_event and ledger.events == [ref.dp_event]
    assert {key: val for key, val in got.info["secure_aggregation"].items()
            if not key.endswith("_per_release")} == sums


def test_the_precheck_accepts_the_fits_secaggplus_runs(digits) -> None:  # noqa: F811
    """The digits fits of the merge's tests (up to 29 bits) pass the pre-check at the
    default scale."""
    X, bounds = digits
    for method, options in [("auto", {}), ("auto", {"branch": "iterate"}), ("power", {}),
                            ("analyze_gauss", {"center": "private"})]:
        budget = {key: FIT[key] for key in ("target_epsilon", "target_delta")}
        center = options.get("center")
        opts = {key: val for key, val in options.items() if key != "center"}
        assert check_modulus(X.shape[1], bounds[-1], 3, None, method=method, n_components=4,
                             center=center, options=opts, **budget) == 2.0**-10


def test_a_federation_beyond_the_exact_recovery_is_refused() -> None:
    """The FL strategy refuses K above MAX_SECAGG_CLIENTS (the float read-back of SecAgg+'s
    sum, the same ``recovered_sum`` the PCA strategy uses, is exact up to it): so does
    PCA's pre-check."""
    from dpprecond.adapters.flower.secagg import MAX_SECAGG_CLIENTS

    budget = {"target_epsilon": 2.0, "target_delta": 1e-5}
    n = MAX_SECAGG_CLIENTS + 1
    check_modulus(4, n, MAX_SECAGG_CLIENTS, None, method="analyze_gauss", n_components=2,
                  **budget)  # control: at the cap, within 2^30
    with pytest.raises(ValueError, match=f"n_clients={MAX_SECAGG_CLIENTS + 1}"):
        check_modulus(4, n, MAX_SECAGG_CLIENTS + 1, None, method="analyze_gauss",
                      n_components=2, **budget)


def test_worst_case_messages_decode_exactly_with_a_dropout(monkeypatch) -> None:
    """Four clients, min_clients = 2, q = 2^30, every entry of every message at -q/2 or
    q/2 - 1: the PCA transport returns the three survivors' sum modulo q and 3 shares
    (the fourth drops in the masked-vector stage); with every client, all four."""
    K4, dim = 4, 64
    plan = SumPlan(dim=dim, sensitivity=1.0, noise_multiplier=1.0, scale=1024.0,
                   n_rows=400, n_clients=K4, min_clients=2, bits=FIT_BITS)
    q = plan.modulus
    rng = np.random.default_rng(7)
    messages = [np.where(rng.random(dim) < 0.5, q // 2, q // 2 - 1).astype(np.int64)
                for _ in range(K4)]  # q/2 is -q/2 centred

    def worst(request, arrays, X, *, client_id, state, **kwargs):  # type: ignore[no-untyped-def]
        return messages[client_id], plan

    monkeypatch.setattr(pca_secagg, "client_secure_message", worst)
    X = _unit_rows(400, 5)
    bounds = np.linspace(0, 400, K4 + 1).astype(np.int64)
    for dropout in (True, False):
        def fails(client: int, msg, dropout: bool = dropout) -> bool:  # type: ignore[no-untyped-def]
            return dropout and client == 3 and "fitins.config" in msg.content.config_records

        grid = Grid(make_pca_client_app(SplitRows(X, bounds)), n_nodes=K4, fails=fails)
        nodes = sorted(grid.nodes, key=lambda node: grid.client_of[node])
        total, shares = SecAggPlusPCATransport(grid, nodes, 60.0)(
            {"kind": "secure-release"}, [], plan)
        survivors = K4 - 1 if dropout else K4
        assert shares == survivors
        want = np.mod(np.sum(messages[:survivors], axis=0), q)
        assert np.array_equal(total, want)


def test_min_clients_below_k_without_a_dropout_is_the_in_process_fit(digits) -> None:  # noqa: F811
    X, bounds = digits
    ref = fit_private_pca(X, 4, method="auto", seed=SEED, clients=bounds, min_clients=2,
                          **FIT)
    got = fit_pca_on_flower(Grid(make_pca_client_app(SplitRows(X, bounds),
                                                     noise_seed=SEED)),
                            4, method="auto", min_clients=2, **FIT)
    assert np.array_equal(got.components, ref.components)
    assert got.dp_event == ref.dp_event
    sums = got.info["secure_aggregation"]
    assert sums["min_clients"] == 2 and sums["shares_per_release"] == [3] * sums["n_sums"]


def test_too_many_components_are_refused_by_name_not_as_a_modulus(digits) -> None:  # noqa: F811
    X, bounds = digits
    with pytest.raises(ValueError, match="n_components") as info:
        fit_pca_on_flower(Grid(make_pca_client_app(SplitRows(X, bounds), noise_seed=SEED)),
                          10**5, method="power", **FIT)
    assert not isinstance(info.value, SecureAggregationUnavailableError)
