"""PrivatePCA follows scikit-learn conventions.

``parametrize_with_checks`` runs all of scikit-learn's estimator checks except
``check_array_api_input``, which needs ``SCIPY_ARRAY_API=1`` and array-api-compat: the
estimator computes in NumPy float64 on purpose (its noise is calibrated there).
"""

import numpy as np
import pytest
from sklearn.base import clone
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
