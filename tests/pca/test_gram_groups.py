"""The Gram pass's grouped accumulation and the deferred first pass (dpprecond.pca.rows).

The Gram pass sums the terms of ``gram_group(block_rows)`` consecutive blocks in one BLAS
accumulator (``dsyrk`` with ``beta = 1``) and adds the groups one by one; the rounding
bound that inflates every noise std counts that chain. ``make_rows`` defers the first pass
(the NaN check, the clipping count, the kept norms) to the first pass a method makes: the
Gram pass scans each block just before its product.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.clipping import gamma
from dpprecond.pca import fit_private_pca
from dpprecond.pca import rows as rows_mod
from dpprecond.pca.rows import (
    ClippedRows,
    GramSum,
    gram_group,
    make_rows,
    rounding_slack_bound,
)


def _data(rng: np.random.Generator, n: int = 3000, d: int = 12) -> np.ndarray:
    """Rows mostly below the bound 2.5, a tenth of them above it (clipped blocks and raw
    blocks both occur with 64-row blocks)."""
    X = rng.standard_normal((n, d)) * 0.3
    X[rng.random(n) < 0.01] *= 40.0
    return X


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> int:
    """Groups of 4 blocks of 64 rows, so that a few thousand rows make many groups."""
    monkeypatch.setattr(rows_mod, "GRAM_GROUP_ROWS", 256)
    return 4


BLOCK = dict(block_bytes=8 * 12 * 64)  # 64 rows of 12 features per block


def test_group_size_follows_the_rows_cap() -> None:
    assert gram_group(2674) == 2**16 // 2674
    assert gram_group(2**17) == 1  # a block above the cap is a group of its own
    assert gram_group(1) == 2**16


def test_deferred_scan_gives_the_eager_gram_bit_for_bit(small_groups: int) -> None:
    X = _data(np.random.default_rng(0))
    eager = ClippedRows.from_data(X, 2.5, **BLOCK)
    deferred = ClippedRows.from_data(X, 2.5, defer_scan=True, **BLOCK)
    assert gram_group(eager.block_rows) == small_groups
    G = deferred.gram()
    assert np.array_equal(G, eager.gram())
    assert np.array_equal(G, G.T)
    # what the first pass learns is the same, learnt during the Gram pass
    assert deferred.n_clipped == eager.n_clipped > 0
    assert np.array_equal(deferred._unclipped_blocks, eager._unclipped_blocks)
    assert not deferred._unclipped_blocks.all() and deferred._unclipped_blocks.any()
    assert np.array_equal(deferred._sq, eager._sq)
    M = np.random.default_rng(1).standard_normal((12, 3))
    assert np.array_equal(deferred.times(M), eager.times(M))


@pytest.mark.parametrize("scale", [1.0, 1e8, 1e300])
def test_grouped_gram_is_within_the_counted_rounding_of_the_exact_sum(
        small_groups: int, scale: float) -> None:
    """Against the sum of the computed rows' outer products in extended precision: the
    Frobenius error stays within ``gamma_m n`` (``rounding_slack() / 2``, rows of norm at
    most 1), at every magnitude (``1e300`` rows with a bound of ``2.5e300`` take the clipped
    path: no raw product could hold them)."""
    X = _data(np.random.default_rng(2)) * scale
    rows = make_rows(X, 2.5 * scale, block_bytes=BLOCK["block_bytes"])
    G = rows.gram()
    assert np.all(np.isfinite(G))
    A = rows.materialize().astype(np.longdouble)
    exact = A.T @ A
    err = float(np.sqrt(np.sum((G.astype(np.longdouble) - exact) ** 2)))
    assert err <= rows.rounding_slack() / 2, (err, rows.rounding_slack() / 2)


def test_rounding_slack_counts_the_group_chain(small_groups: int) -> None:
    n, d = 3000, 12
    rows = ClippedRows.from_data(_data(np.random.default_rng(3)), 2.5, **BLOCK)
    n_blocks = n // rows.block_rows + 1
    group_chain = small_groups * rows.block_rows + math.ceil(n_blocks / small_groups)
    assert group_chain > rows.block_rows + n_blocks  # the group is the longer chain here
    assert rows.rounding_slack() == pytest.approx(2 * gamma(group_chain + d + 4) * n)
    # without groups the chain is the blocks' one, as before
    assert rounding_slack_bound(n, d, 64, n_blocks) == rounding_slack_bound(
        n, d, 64, n_blocks, group=1) == 2 * gamma(64 + n_blocks + d + 4) * n
    # the larger chain wins when the blocks outnumber a group's rows
    assert rounding_slack_bound(10**6, d, 64, 10**6 // 64 + 1, group=4) == pytest.approx(
        2 * gamma(64 + 10**6 // 64 + 1 + d + 4) * 10**6)


def test_gram_sum_adds_only_full_groups_then_the_rest() -> None:
    rng = np.random.default_rng(4)
    blocks = [rng.standard_normal((5, 3)) for _ in range(7)]
    acc = GramSum(3, group=3)
    for B in blocks:
        acc.add(B)
    exact = sum(B.T @ B for B in blocks)
    assert np.allclose(acc.upper(), np.triu(exact), rtol=0, atol=1e-12)
    assert np.array_equal(acc.upper(), np.triu(acc.upper()))  # one triangle
    other = GramSum(3, group=2)
    for B in (np.asfortranarray(blocks[0]), blocks[1][::2], blocks[2].astype(np.float32)):
        other.add(B)  # any layout and dtype is taken
    exact = sum(B.T.astype(np.float64) @ B.astype(np.float64)
                for B in (blocks[0], blocks[1][::2], blocks[2].astype(np.float32)))
    assert np.allclose(other.upper(), np.triu(exact), atol=1e-12)


@pytest.mark.parametrize("pass_name", ["gram", "times", "column_sum", "n_clipped",
                                       "centered"])
def test_deferred_scan_refuses_nan_in_the_last_block_before_any_result(
        small_groups: int, pass_name: str) -> None:
    X = _data(np.random.default_rng(5))
    X[-1, 7] = np.nan
    rows = ClippedRows.from_data(X, 2.5, defer_scan=True, **BLOCK)
    calls = {"gram": rows.gram, "times": lambda: rows.times(np.ones((12, 2))),
             "column_sum": rows.column_sum, "n_clipped": lambda: rows.n_clipped,
             "centered": lambda: rows.centered(np.zeros(12))}
    with pytest.raises(ValueError, match=r"NaN or infinite entries \(first at index "
                                         r"\(2999, 7\)\)"):
        calls[pass_name]()


@pytest.mark.parametrize("method", ["auto", "analyze_gauss"])
def test_fit_refuses_an_infinity_in_the_last_row(method: str) -> None:
    X = _data(np.random.default_rng(6))
    X[-1, 0] = np.inf
    with pytest.raises(ValueError, match=r"first at index \(2999, 0\)"):
        fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-6, row_norm=2.5,
                        method=method, seed=0)
