"""PrivatePCA follows scikit-learn conventions.

``parametrize_with_checks`` runs all of scikit-learn's estimator checks except
``check_array_api_input``, which needs ``SCIPY_ARRAY_API=1`` and array-api-compat: the
estimator computes in NumPy float64 on purpose (its noise is calibrated there).
"""

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import SkipTestWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

from dpprecond import PrivatePCA
from dpprecond.pca import sin_theta

SKIPPED_CHECKS = {"check_array_api_input"}


def _filtered(decorator):
    names, params = decorator.args
    def check_name(p):
        check = p.values[1] if hasattr(p, "values") else p[1]
        return getattr(check, "func", check).__name__

    keep = [p for p in params if check_name(p) not in SKIPPED_CHECKS]
    return pytest.mark.parametrize(names, keep, **decorator.kwargs)


@_filtered(parametrize_with_checks([
    PrivatePCA(1, target_epsilon=1.0, target_delta=1e-5, row_norm=10.0),
    PrivatePCA(1, target_epsilon=1.0, target_delta=1e-5, row_norm=10.0, method="fixed",
               options={"clip_radius": 0.5}),
    PrivatePCA(1, target_epsilon=1.0, target_delta=1e-5, row_norm=10.0, method="analyze_gauss"),
]))
@pytest.mark.filterwarnings("ignore::dpprecond.pca.estimator.PrivateModelSelectionWarning")
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_fit_attributes_transform_and_clone(spiked):
    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, random_state=0,
                     method="select", options={"mean_trials": 3.0})
    Z = est.fit_transform(spiked)
    assert est.components_.shape == (2, 10)
    assert np.allclose(est.components_ @ est.components_.T, np.eye(2), atol=1e-10)
    assert Z.shape == (spiked.shape[0], 2)
    assert np.allclose(Z, est.transform(spiked))
    assert 0.99 * 1.0 <= est.epsilon_ <= 1.0
    assert est.delta_ == 1e-6
    assert est.n_features_in_ == 10 and est.diagnostics_ is None
    assert est.info_["n_iter"] in {0, 1, 2, 4, 8, 16, 32, 64}
    assert est.info_["clip_radius"] > 0 and not est.info_["early_exit"]
    assert est.explained_variance_.shape == (2,)
    back = est.inverse_transform(Z)
    assert back.shape == spiked.shape
    assert np.allclose(est.transform(back), Z, atol=1e-10)  # projection is idempotent
    twin = clone(est)
    assert twin.get_params() == est.get_params()
    assert not hasattr(twin, "components_")
    assert np.array_equal(twin.fit(spiked).components_, est.components_)


def test_centering_modes(spiked):
    mu = spiked.mean(axis=0)
    public = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                        method="analyze_gauss",
                        center=mu, random_state=0).fit(spiked)
    assert np.allclose(public.mean_, mu)
    private = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                         method="analyze_gauss",
                         center="private", random_state=0).fit(spiked)
    assert not np.allclose(private.mean_, mu)
    assert np.linalg.norm(private.mean_ - mu) < 0.05
    assert 0.99 <= private.epsilon_ <= 1.0
    none = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                      method="analyze_gauss",
                      random_state=0).fit(spiked)
    assert np.array_equal(none.mean_, np.zeros(10))


def test_exact_method_matches_uncentered_svd(gap_matrix):
    est = PrivatePCA(3, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                     method="exact").fit(gap_matrix)
    _, _, Vt = np.linalg.svd(gap_matrix, full_matrices=False)
    # the top three singular values are equal: compare subspaces
    assert sin_theta(est.components_.T, Vt[:3].T) < 1e-8
    assert est.epsilon_ == np.inf


def test_a_fitted_estimator_holds_only_public_values(spiked):
    """No private diagnostic is stored or pickled unless asked for, with a warning."""
    import pickle
    import warnings

    from dpprecond.pca.api import PrivateDiagnosticsWarning

    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, random_state=0,
                     method="select").fit(spiked)
    state = pickle.loads(pickle.dumps(est)).__dict__
    private_keys = {"n_clipped", "n_trials", "n_clipped_last_iteration", "fit_seconds",
                    "n_clipped_centered"}
    assert state["diagnostics_"] is None
    assert not private_keys & set(state["info_"])
    assert not any(k.startswith("n_clipped") for k in state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        diag = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                          random_state=0, method="select", diagnostics=True).fit(spiked)
    assert any(issubclass(w.category, PrivateDiagnosticsWarning) for w in caught)
    assert {"n_clipped", "n_trials", "fit_seconds"} <= set(diag.diagnostics_)


def test_a_shared_ledger_composes_fits_and_refuses_the_excess(spiked):
    from dpprecond import PrivacyBudgetExceededError
    from dpprecond.accounting import PrivacyLedger

    ledger = PrivacyLedger(1e-6, max_epsilon=1.2)
    PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, method="analyze_gauss",
               ledger=ledger).fit(spiked)
    assert ledger.epsilon == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(PrivacyBudgetExceededError, match=r"max_epsilon=1\.2"):
        PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                   method="analyze_gauss", ledger=ledger).fit(spiked)
    assert ledger.n_releases == 1  # the refused fit released nothing


def test_check_estimator_passes_with_the_defaults():
    """scikit-learn's own check_estimator on the default estimator (n_components=2 by
    default). The array-API check skips itself without SCIPY_ARRAY_API (module docstring)."""
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkipTestWarning)
        check_estimator(PrivatePCA(target_epsilon=1.0, target_delta=1e-5, row_norm=10.0))


def test_feature_names_set_output_and_explained_variance_ratio(spiked):
    est = PrivatePCA(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, random_state=0)
    assert est.n_components == 2  # a public default
    Z = est.fit_transform(spiked)
    assert Z.shape == (spiked.shape[0], 2)
    assert list(est.get_feature_names_out()) == ["privatepca0", "privatepca1"]
    # post-processing of the released matrix: ratios in [0, 1], summing to at most 1, and
    # the top two of this strong two-dimensional spike carry most of the variance
    r = est.explained_variance_ratio_
    assert r.shape == (2,) and np.all(r >= 0) and r.sum() <= 1 + 1e-12
    assert r.sum() > 0.5
    assert est.n_samples_ == spiked.shape[0]
    # set_output: the default container round-trips; pandas, where installed, names columns
    assert est.set_output(transform="default") is est
    assert isinstance(est.transform(spiked), np.ndarray)
    try:
        import pandas  # noqa: F401
    except ImportError:
        return
    df = est.set_output(transform="pandas").transform(spiked)
    assert list(df.columns) == ["privatepca0", "privatepca1"]


def test_float32_in_float32_out(spiked):
    X32 = spiked.astype(np.float32)
    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, random_state=0)
    Z = est.fit_transform(X32)
    assert Z.dtype == np.float32 and est.components_.dtype == np.float32
    assert est.mean_.dtype == np.float32 and est.explained_variance_.dtype == np.float32
    assert est.inverse_transform(Z).dtype == np.float32
    ref = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                     random_state=0).fit(spiked)
    assert ref.transform(spiked).dtype == np.float64
    # float32 widens exactly: the fit is the float64 one, rounded
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-6)


def test_one_orientation_of_components(spiked):
    from dpprecond.pca import fit_private_pca

    res = fit_private_pca(spiked, 2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                          seed=0)
    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                     random_state=0).fit(spiked)
    assert res.components.shape == est.components_.shape == (2, spiked.shape[1])
    np.testing.assert_array_equal(res.components, est.components_)
    np.testing.assert_array_equal(res.basis, res.components.T)


def test_dask_input_gives_lazy_output(spiked):
    da = pytest.importorskip("dask.array")
    X = da.from_array(spiked, chunks=(5000, spiked.shape[1]))
    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, random_state=0)
    Z = est.fit_transform(X)
    assert isinstance(Z, da.Array)  # lazy, as dask-ml returns
    np.testing.assert_allclose(Z.compute(), est.transform(spiked), atol=1e-12)
    assert isinstance(est.transform(X.astype(np.float32)), da.Array)
    assert est.transform(X.astype(np.float32)).dtype == np.float32
    assert isinstance(est.inverse_transform(Z), da.Array)
    with pytest.raises(ValueError, match="features"):
        est.transform(X[:, :3])


# -- issue 17, hole 5: sklearn.clone shares the ledger; a search says what it spends ---------


def test_clone_shares_the_ledger_by_reference() -> None:
    import copy

    from dpprecond.accounting import PrivacyLedger
    from dpprecond.pca.estimator import PrivateModelSelectionWarning

    ledger = PrivacyLedger(1e-6, max_epsilon=3.0)
    est = PrivatePCA(1, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, ledger=ledger)
    with pytest.warns(PrivateModelSelectionWarning, match="spends its target_epsilon"):
        twin = clone(est)
    assert twin.ledger is ledger
    assert copy.deepcopy(ledger) is ledger and copy.copy(ledger) is ledger


def test_grid_search_spends_the_shared_ledger_and_warns(spiked) -> None:
    """GridSearchCV ran 10 fits at epsilon 1 and the ledger still showed 0."""
    from sklearn.model_selection import GridSearchCV

    from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger
    from dpprecond.pca.estimator import PrivateModelSelectionWarning

    X = spiked[:2000]
    ledger = PrivacyLedger(1e-6, max_epsilon=3.0)
    est = PrivatePCA(2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, ledger=ledger)

    def score(fitted, X_val, y=None) -> float:
        return -float(np.linalg.norm(X_val - fitted.inverse_transform(fitted.transform(X_val))))

    search = GridSearchCV(est, {"method": ["auto", "analyze_gauss"]}, cv=5, scoring=score,
                          error_score="raise")
    with pytest.warns(PrivateModelSelectionWarning, match="itself a release"), \
            pytest.raises(PrivacyBudgetExceededError, match="max_epsilon=3"):
        search.fit(X)
    # every fit of a clone was recorded until the cap refused the next one
    assert ledger.n_releases >= 3 and ledger.epsilon <= 3.0 * (1 + 1e-6)


def test_a_pickled_ledger_is_a_detached_copy_that_refuses_to_record() -> None:
    """A worker process of GridSearchCV(n_jobs=2) gets an unpickled copy: what it recorded
    never reached the original. The copy refuses to record until attached explicitly."""
    import pickle

    from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger, gaussian

    ledger = PrivacyLedger(1e-6, max_epsilon=3.0)
    ledger.spend(gaussian(5.0))
    copy = pickle.loads(pickle.dumps(ledger))
    assert copy.epsilon == ledger.epsilon and copy.n_releases == 1
    with pytest.raises(PrivacyBudgetExceededError, match="copy"):
        copy.spend(gaussian(5.0))
    with pytest.raises(PrivacyBudgetExceededError, match="copy"):
        copy.check(gaussian(5.0))
    assert copy.n_releases == 1 and ledger.n_releases == 1
    copy.attach()
    copy.spend(gaussian(5.0))
    assert copy.n_releases == 2
