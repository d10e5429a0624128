"""Bad input gives a clear ValueError/TypeError naming the parameter and the value."""

import numpy as np
import pytest

from dpprecond import PrivatePCA
from dpprecond.pca import fit_private_pca

rng = np.random.default_rng(0)
X = rng.standard_normal((50, 6))
GOOD = {"n_components": 2, "target_epsilon": 1.0, "target_delta": 1e-6, "row_norm": 5.0}


def fit(**kw):
    args = {**GOOD, **kw}
    data = args.pop("X", X)
    k = args.pop("n_components")
    return fit_private_pca(data, k, **args)


@pytest.mark.parametrize(("kw", "exc", "match"), [
    ({"X": np.where(np.eye(50, 6) > 0, np.nan, X)}, ValueError, "NaN or infinite"),
    ({"X": np.where(np.eye(50, 6) > 0, np.inf, X)}, ValueError, "NaN or infinite"),
    ({"X": X[:, 0]}, ValueError, "2-D array.*shape \\(50,\\)"),
    ({"X": X[:4]}, ValueError, "n_samples = 4 < n_features = 6"),
    ({"n_components": 0}, ValueError, "n_components >= 1, got n_components=0"),
    ({"n_components": 7}, ValueError, "n_components=7 must be between 1 and n_features = 6"),
    ({"n_components": 2.5}, TypeError, "n_components"),
    ({"target_epsilon": 0.0}, ValueError, "target_epsilon > 0, got target_epsilon=0.0"),
    ({"target_epsilon": -1}, ValueError, "target_epsilon=-1"),
    ({"target_epsilon": None}, TypeError, "target_epsilon"),
    ({"target_delta": 0.0}, ValueError,
     "target_delta in the open interval \\(0, 1\\), got target_delta=0.0"),
    ({"target_delta": 1.0}, ValueError, "target_delta=1.0"),
    ({"row_norm": None}, ValueError, "row_norm is required"),
    ({"row_norm": 0.0}, ValueError, "row_norm > 0, got row_norm=0.0"),
    ({"row_norm": -2}, ValueError, "row_norm=-2"),
    ({"method": "svd"}, ValueError, "Unknown method='svd'"),
    ({"center": "mean"}, ValueError, "Unknown center='mean'"),
    ({"center": np.zeros(3)}, ValueError, "center.*shape \\(3,\\)"),
    ({"bogus": 1}, TypeError, "bogus"),
    ({"method": "select", "clip_radius": 0.1}, TypeError, "clip_radius"),
    ({"method": "fixed", "clip_radius": np.inf}, ValueError, "clip_radius"),
    ({"method": "fixed", "n_iter": -1}, ValueError, "n_iter >= 0, got n_iter=-1"),
    ({"method": "select", "mean_trials": 0.5}, ValueError, "mean_trials >= 1"),
    ({"init_share": 1.0, "method": "fixed"}, ValueError, "init_share"),
    ({"method": "select", "clip_grid": [0.1, -1]}, ValueError, "clip_grid"),
    ({"method": "select", "clip_grid": [0.1, np.inf]}, ValueError, "clip_grid.*finite"),
    ({"method": "select", "accountant": "pld"}, ValueError, "accountant='rdp'"),
    ({"seed": "seed"}, TypeError, "seed"),
])
def test_bad_input(kw, exc, match):
    with pytest.raises(exc, match=match):
        fit(**kw)


def test_missing_row_norm_keyword_is_an_error():
    with pytest.raises(TypeError, match="row_norm"):
        fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-6)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="row_norm"):
        PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="row_norm is required"):
        PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=None).fit(X)


def test_estimator_validates_at_fit_not_init():
    est = PrivatePCA(0, target_epsilon=-1.0, target_delta=2.0, row_norm=1.0)  # __init__ only stores
    with pytest.raises(ValueError, match="n_components"):
        est.fit(X)
    with pytest.raises(ValueError, match="epsilon"):
        PrivatePCA(2, target_epsilon=-1.0, target_delta=1e-6, row_norm=1.0).fit(X)
    with pytest.raises(TypeError, match=r"Unknown option\(s\) \['clip_radius'\]"):
        PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, method="select",
                   options={"clip_radius": 0.1}).fit(X)


def test_sparse_and_complex_refused():
    sparse = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match=r"[Ss]parse"):
        fit(X=sparse.csr_matrix(X))
    with pytest.raises(ValueError, match="Complex"):
        fit(X=X + 1j)
