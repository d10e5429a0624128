"""The Dask adapter: the same numbers as the in-memory rows, on threads and on a cluster.

Dask is a hard requirement here (CI installs ``.[all]``, which includes the ``dask``
extra): a missing dask fails these tests instead of skipping them.

Tolerances. The two paths compute the same per-row terms with the same functions and add
them in a different order (a loop over blocks against a tree over chunks). A float64 sum
of ``n`` terms is within ``gamma_m`` times the sum of their absolute values of the exact
sum (Higham), ``m`` the longest chain of additions, here at most ``n + d + 4``; for
``A^T A`` with rows of norm <= 1 that sum is at most ``n`` per entry, so the two Gram
matrices differ by at most ``eta = 2 gamma_{n+d+4} n`` per entry (``~9e-8`` for
``n = 20000``; observed ``~1e-13``). The noise of both runs is the same draw, scaled by
``1 + rounding_slack`` which differs only through the number of blocks (``~1e-11``
relatively). The components are the top-k eigenvectors of ``M = S + W``: by Davis-Kahan
they move by at most ``2 sqrt(2k) ||dM||_2 / gap(M)`` with ``gap(M) >= gap(S) - 2 e_w``
(``e_w`` the noise bound of :func:`dpprecond.pca.core.noise_bound`, ``beta = 1e-6``).
That bound (``~2e-9`` here) is the tolerance of ``exact`` and ``analyze_gauss``. ``fixed``
and ``select`` add up to ``t_max`` smooth steps (QR, ``H^{-1/2}`` with a floor, the
continuous clipping of ``y_i``) on well-separated data (``||S|| / gap(S) < 1.1``); they
get 1000 times that bound (``~2e-6``), still four orders of magnitude below what a
per-column clipping does to the result (:func:`test_column_chunks_are_merged_into_whole_rows`).
"""

from __future__ import annotations

import importlib
import math
import pickle
import sys
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest

from dpprecond.adapters.dask import DaskRows, NpyRows, from_npy, whole_rows
from dpprecond.clipping import gamma
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.api import check_pca_input
from dpprecond.pca.core import noise_bound
from dpprecond.pca.rows import ClippedRows, make_rows, scale_rows

N, D, K = 20000, 10, 2
ROW_NORM = 0.6  # about 5% of the rows are clipped (the heavy ones and a few others)
CHUNKS = (1700, 4)  # uneven rows (last chunk 1300) and split columns (4 + 4 + 2)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    X = spiked_covariance(N, D, K, 20.0, seed=3)
    heavy = np.random.default_rng(5).random(N) < 0.05
    X[heavy] *= 3.0
    return X


def _eta(n: int, d: int, centered: bool) -> float:
    """Bound on ``||S_dask - S_memory||_F`` from the summation order (module docstring).

    With a private mean, the column sums differ by at most ``2 gamma n`` per entry, the mean
    by ``2 gamma`` (norm ``2 gamma sqrt(d)``), every centered row by as much (clipping to
    the ball is 1-Lipschitz), and ``S`` by ``2 n`` times that.
    """
    g = gamma(n + d + 4)
    eta = d * 2.0 * g * n
    return eta + (4.0 * g * math.sqrt(d) * n if centered else 0.0)


def _tolerance(X: np.ndarray, Xd: da.Array, result, centered: bool) -> float:
    """Davis-Kahan bound on the components' change (module docstring)."""
    n, d = X.shape
    mem, lazy = make_rows(X, ROW_NORM), make_rows(Xd, ROW_NORM)
    w = np.linalg.eigvalsh(mem.gram())[::-1]
    z0 = result.info["noise_multipliers"].get("z0", 0.0)
    e_w = noise_bound(z0 * math.sqrt(2.0) * (1.0 + mem.rounding_slack()), d, 1e-6)
    dM = _eta(n, d, centered) + abs(lazy.rounding_slack() - mem.rounding_slack()) * e_w
    gap = w[K - 1] - w[K] - 2.0 * e_w
    assert gap > 0
    return 2.0 * math.sqrt(2.0 * K) * dM / gap


# -- the passes ----------------------------------------------------------------------------


@pytest.mark.parametrize("row_norm", [ROW_NORM, 1e3, 1e-300, 1e300])
def test_every_pass_matches_the_in_memory_rows(data: np.ndarray, row_norm: float) -> None:
    """Sums within the summation-order bound, per-row passes to a few ulp; counts equal.

    ``row_norm = 1e3`` clips no row (every chunk takes the raw Gram path), ``1e-300``
    clips every row, ``1e300`` scales every row below the raw range.
    """
    X = data.copy()
    X[3] *= 1e300  # a huge finite row and a tiny one, in different chunks
    X[5000] *= 1e-300
    mem = ClippedRows.from_data(X, row_norm)
    lazy = DaskRows.from_data(da.from_array(X, chunks=CHUNKS), row_norm)
    assert lazy.X.numblocks == (12, 1)
    assert (lazy.n_clipped, lazy.shape) == (mem.n_clipped, mem.shape)
    n, d = X.shape
    sum_tol = 2.0 * gamma(n + d + 4) * n  # per entry, terms of size <= 1
    rng = np.random.default_rng(0)
    M = rng.standard_normal((d, 3))
    Dm = rng.standard_normal((n, 3))
    idx = np.sort(rng.choice(n, 50, replace=False))
    for rows_m, rows_d in [(mem, lazy), (mem.centered(np.full(d, 0.05)),
                                         lazy.centered(np.full(d, 0.05)))]:
        assert rows_d.n_clipped_centered == rows_m.n_clipped_centered
        np.testing.assert_allclose(rows_d.gram(), rows_m.gram(), rtol=0, atol=sum_tol)
        np.testing.assert_allclose(rows_d.t_times(Dm), rows_m.t_times(Dm), rtol=0,
                                   atol=sum_tol * np.abs(Dm).max())
        ulp = 8 * gamma(d + 2)  # a row's norm or product of d terms, another order at most
        np.testing.assert_allclose(rows_d.norms, rows_m.norms, rtol=ulp, atol=0)
        np.testing.assert_allclose(rows_d.times(M), rows_m.times(M), rtol=0,
                                   atol=ulp * np.abs(M).sum(axis=0).max())
        np.testing.assert_allclose(rows_d.rows(idx), rows_m.rows(idx), rtol=0, atol=ulp)
        assert rows_d.rows(np.array([], dtype=np.int64)).shape == (0, d)
    np.testing.assert_allclose(lazy.column_sum(), mem.column_sum(), rtol=0, atol=sum_tol)
    assert mem.rounding_slack() <= lazy.rounding_slack() < mem.rounding_slack() * (1 + 1e-4)


def test_column_chunks_are_merged_into_whole_rows(data: np.ndarray) -> None:
    """Clipping a row needs the whole row: column chunks are merged before any pass.

    Clipping each column chunk on its own (what a blockwise map over the raw chunks
    would do) changes ``A^T A`` by more than 1% here; the adapter's Gram matrix is the
    in-memory one to the summation-order bound.
    """
    Xd = da.from_array(data, chunks=CHUNKS)
    assert Xd.numblocks[1] == 3 and whole_rows(Xd).numblocks[1] == 1
    right = ClippedRows.from_data(data, ROW_NORM).gram()
    pieces = np.hstack([scale_rows(data[:, c:c + 4], ROW_NORM) for c in range(0, D, 4)])
    wrong = pieces.T @ pieces
    assert np.linalg.norm(wrong - right) > 1e-2 * np.linalg.norm(right)
    lazy = DaskRows.from_data(Xd, ROW_NORM).gram()
    np.testing.assert_allclose(lazy, right, rtol=0, atol=2.0 * gamma(N + D + 4) * N)


@pytest.mark.parametrize("method", ["exact", "analyze_gauss", "fixed", "select", "auto",
                                    "auto-iterate"])
@pytest.mark.parametrize("center", [None, "private"])
def test_same_seed_same_result_as_in_memory(data: np.ndarray, method: str,
                                            center: str | None) -> None:
    """All noise is drawn on the driver from the same streams: only summation order differs."""
    Xd = da.from_array(data, chunks=CHUNKS)
    eps = None if method == "exact" else 1.0
    kw: dict[str, Any] = {"n_iter": 3} if method == "fixed" else {}
    if method == "auto-iterate":  # auto's own passes (probe, clipped steps) on the chunks
        method, kw = "auto", {"branch": "iterate"}
    ref = fit_private_pca(data, K, method=method, target_epsilon=eps, target_delta=1e-6,
                          row_norm=ROW_NORM, center=center, seed=3, **kw)
    res = fit_private_pca(Xd, K, method=method, target_epsilon=eps, target_delta=1e-6,
                          row_norm=ROW_NORM, center=center, seed=3, **kw)
    tol = _tolerance(data, Xd, ref, center is not None)
    if method in ("fixed", "select") or kw.get("branch") == "iterate":
        tol *= 1e3
    np.testing.assert_allclose(res.components, ref.components, rtol=0, atol=tol)
    assert res.epsilon == ref.epsilon and res.info.keys() == ref.info.keys()
    if center is not None:
        np.testing.assert_allclose(res.mean, ref.mean, rtol=0, atol=4 * gamma(N) * ROW_NORM)
    if method == "select":
        assert res.info["n_iter"] == ref.info["n_iter"]
        assert res.info["clip_radius"] == ref.info["clip_radius"]


def test_the_estimator_accepts_a_dask_array(data: np.ndarray) -> None:
    from dpprecond import PrivatePCA

    kw = {"n_components": K, "target_epsilon": 1.0, "target_delta": 1e-6,
          "row_norm": ROW_NORM, "method": "analyze_gauss", "random_state": 1}
    ref = PrivatePCA(**kw).fit(data)
    est = PrivatePCA(**kw).fit(da.from_array(data, chunks=(5000, D)))
    np.testing.assert_allclose(est.components_, ref.components_, rtol=0, atol=1e-8)
    assert est.n_features_in_ == D


# -- the first pass and validation ---------------------------------------------------------


def test_the_first_nan_in_row_order_is_reported(data: np.ndarray) -> None:
    X = data.copy()
    X[15000, 7] = np.inf  # a later chunk
    X[9000, 2] = np.nan  # the first one in row order, in an earlier chunk
    msg = r"NaN or infinite entries \(first at index \(9000, 2\)\)"
    with pytest.raises(ValueError, match=msg):
        fit_private_pca(da.from_array(X, chunks=CHUNKS), 2, method="exact",
                        target_epsilon=None, target_delta=1e-6, row_norm=1.0)
    with pytest.raises(ValueError, match=msg):
        fit_private_pca(X, 2, method="exact", target_epsilon=None, target_delta=1e-6,
                        row_norm=1.0)


def _never(block: np.ndarray) -> np.ndarray:
    raise AssertionError("the validation computed a chunk")


def test_validation_is_lazy_and_names_the_problem() -> None:
    X = da.zeros((100, 5), chunks=(10, 5)).map_blocks(_never, dtype=np.float64)
    assert check_pca_input(X, 2)[1] == 2  # checked without computing anything
    kw = {"target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": 1.0}
    with pytest.raises(ValueError, match="2-D"):
        fit_private_pca(da.zeros(10, chunks=5), 1, **kw)
    with pytest.raises(ValueError, match="n >= d"):
        fit_private_pca(da.zeros((3, 5), chunks=3), 1, **kw)
    with pytest.raises(ValueError, match="Complex"):
        fit_private_pca(da.zeros((10, 2), dtype=complex, chunks=5), 1, **kw)
    with pytest.raises(TypeError, match="numeric"):
        fit_private_pca(da.from_array(np.array([["a", "b"]] * 4)), 1, **kw)
    unknown = da.from_array(np.ones((10, 2)), chunks=5)
    unknown = unknown[unknown[:, 0] > 0]
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        fit_private_pca(unknown, 1, **kw)
    masked = da.ma.masked_array(da.ones((10, 2), chunks=5), mask=da.zeros((10, 2), chunks=5))
    with pytest.raises(TypeError, match="masked"):
        fit_private_pca(masked, 1, **kw)
    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        DaskRows.from_data(np.ones((10, 2)), 1.0)


def test_a_npy_file_as_a_dask_array(tmp_path, data: np.ndarray) -> None:
    """A float32 ``.npy`` read by the tasks: through ``da.from_array`` of a memory map, and
    through :func:`from_npy`, whose graph holds the path and not the data (what a
    distributed worker receives)."""
    path = tmp_path / "x.npy"
    np.save(path, data.astype(np.float32))
    mm = np.load(path, mmap_mode="r")
    kw = {"target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": ROW_NORM, "seed": 2,
          "method": "analyze_gauss"}
    ref = fit_private_pca(np.array(mm), K, **kw)
    lazy = from_npy(path, block_rows=4096)
    assert lazy.chunks[0][:2] == (4096, 4096) and lazy.dtype == np.float32
    assert len(pickle.dumps(lazy.__dask_graph__())) < 20_000 < mm.nbytes
    for Xd in (da.from_array(mm, chunks=(4096, D)), lazy):
        res = fit_private_pca(Xd, K, **kw)
        np.testing.assert_allclose(res.components, ref.components, rtol=0,
                                   atol=_tolerance(np.array(mm), Xd, ref, False))
    with pytest.raises(ValueError, match="block_rows"):
        from_npy(path, block_rows=0)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float32, ">f8", np.int16])
def test_npy_rows_reads_any_selection(tmp_path, order: str, dtype: Any) -> None:
    """Whole row ranges of a C-order file are read directly; anything else via a map."""
    X = np.asarray(np.random.default_rng(0).standard_normal((1000, 7)) * 100, dtype=dtype,
                   order=order)
    path = tmp_path / "x.npy"
    np.save(path, X)
    src = NpyRows(path)
    assert (src._row_range((slice(5, 17), slice(None))) is not None) == (order == "C")
    for key in [(slice(5, 17), slice(None)), (slice(5, 17), slice(2, 4)),
                (slice(None, None, 3), slice(None)), (slice(900, 2000), slice(0, 7)),
                (slice(50, 10), slice(None))]:
        got = src[key]
        assert got.dtype == X.dtype
        np.testing.assert_array_equal(got, X[key])
    np.testing.assert_array_equal(from_npy(path, block_rows=300).compute(), X)


# -- packaging -----------------------------------------------------------------------------


def _pickling_get(dsk, keys, **kwargs):
    """A scheduler that sends every graph through plain pickle first, as to a remote worker."""
    return dask.get(pickle.loads(pickle.dumps(dsk)), keys, **kwargs)


def test_every_task_pickles_by_reference(data: np.ndarray) -> None:
    """What a worker in another process receives: plain ``pickle`` (no closures, no lambdas;
    the per-chunk functions are imported by name on the worker). The two fits make every
    pass: the private mean, centering, the Gram matrix, the norms, then ``times`` and
    ``t_times`` (most rows are candidates for clipping at the default radius) or ``rows``
    (a few candidates at ``clip_radius=0.02``)."""
    Xd = da.from_array(data, chunks=CHUNKS)
    kw = {"target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": ROW_NORM, "seed": 6,
          "center": "private", "method": "fixed", "n_iter": 3}
    for radius in (None, 0.02):
        ref = fit_private_pca(data, K, clip_radius=radius, **kw)
        with dask.config.set(scheduler=_pickling_get):
            res = fit_private_pca(Xd, K, clip_radius=radius, **kw)
        np.testing.assert_allclose(res.components, ref.components, rtol=0,
                                   atol=1e3 * _tolerance(data, Xd, ref, True))
    kw.update(method="auto", branch="iterate")  # auto's block_sum passes
    del kw["n_iter"]
    ref = fit_private_pca(data, K, **kw)
    with dask.config.set(scheduler=_pickling_get):
        res = fit_private_pca(Xd, K, **kw)
    np.testing.assert_allclose(res.components, ref.components, rtol=0,
                               atol=1e3 * _tolerance(data, Xd, ref, True))


def test_importing_dpprecond_does_not_import_dask() -> None:
    import subprocess

    code = ("import sys, numpy as np, dpprecond, dpprecond.pca\n"
            "from dpprecond.pca import fit_private_pca\n"
            "fit_private_pca(np.eye(4), 1, method='exact', target_epsilon=None, "
            "target_delta=1e-6, row_norm=1.0)\n"
            "assert 'dask' not in sys.modules, sorted(m for m in sys.modules if 'dask' in m)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_dask_names_the_extra(monkeypatch) -> None:
    for name in [m for m in sys.modules if m.startswith("dpprecond.adapters.dask")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "dask", None)
    monkeypatch.setitem(sys.modules, "dask.array", None)
    with pytest.raises(ImportError, match=r"pip install 'dpprecond\[dask\]'"):
        importlib.import_module("dpprecond.adapters.dask")


def test_a_dask_array_imports_and_registers_the_adapter() -> None:
    """pca never imports the adapter: a fresh interpreter's first dask array imports it
    (which registers DaskRows with pca.rows) and gets DaskRows."""
    import subprocess

    code = ("import sys, dask.array as da, numpy as np\n"
            "from dpprecond.pca.rows import _ROW_ADAPTERS, make_rows\n"
            "assert 'dpprecond.adapters.dask' not in sys.modules and not _ROW_ADAPTERS\n"
            "rows = make_rows(da.from_array(np.eye(4), chunks=2), 1.0)\n"
            "assert type(rows).__name__ == 'DaskRows', type(rows)\n"
            "assert 'dpprecond.adapters.dask' in sys.modules and 'dask' in _ROW_ADAPTERS\n"
            "assert type(make_rows(np.eye(4), 1.0)).__name__ == 'ClippedRows'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_dask_array_without_the_adapter_names_the_fix(monkeypatch) -> None:
    from dpprecond.pca import rows as rows_mod

    monkeypatch.delitem(rows_mod._ROW_ADAPTERS, "dask", raising=False)
    monkeypatch.setitem(rows_mod._PROVIDERS, "dask", rows_mod._Provider(
        rows_mod.is_dask_array, "dpprecond.adapters.no_such_adapter",
        "pip install 'dpprecond[dask]'"))
    with pytest.raises(ImportError, match=r"X is a dask array.*pip install 'dpprecond\[dask\]'"):
        rows_mod.make_rows(da.from_array(np.eye(4), chunks=2), 1.0)


# -- a dask.distributed cluster ------------------------------------------------------------


def test_runs_unchanged_on_a_distributed_cluster(data: np.ndarray) -> None:
    """A LocalCluster with 2 workers (in-process: starts in ~0.1 s; the tasks' pickling is
    checked by :func:`test_every_task_pickles_by_reference`, and a 2-process cluster is run by
    ``benchmarks/pca_dask_large.py --cluster processes``)."""
    from distributed import Client, LocalCluster, get_task_stream

    Xd = da.from_array(data, chunks=CHUNKS)
    kw = {"target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": ROW_NORM, "seed": 4}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        assert len(workers) == 2
        with get_task_stream(client) as stream:
            results = {m: fit_private_pca(Xd, K, method=m, **kw)
                       for m in ("analyze_gauss", "fixed")}
            results["auto"] = fit_private_pca(Xd, K, method="auto", branch="iterate", **kw)
    assert {t["worker"] for t in stream.data} == set(workers)  # both workers ran tasks
    for method, res in results.items():
        extra = {"branch": "iterate"} if method == "auto" else {}
        ref = fit_private_pca(data, K, method=method, **kw, **extra)
        tol = _tolerance(data, Xd, ref, False) * (1.0 if method == "analyze_gauss" else 1e3)
        np.testing.assert_allclose(res.components, ref.components, rtol=0, atol=tol)
