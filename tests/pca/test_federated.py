"""Federated private PCA: client parts sum to the central passes; the two trust models."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca, sin_theta
from dpprecond.pca.federated import FederatedRows, LocalNoise
from dpprecond.pca.metrics import top_right_singular_vectors
from dpprecond.pca.rows import ClippedRows

BOUNDS = np.array([0, 700, 1500, 1501, 4000])  # uneven clients, one with a single row


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    A = spiked_covariance(4000, 12, 2, 20.0, seed=2)
    A[10] *= 5.0  # a row above the bound: clipped by its client like centrally
    return A


def test_client_passes_sum_to_the_central_passes(data: np.ndarray) -> None:
    fed = FederatedRows.from_data(data, BOUNDS, 1.0, block_bytes=8 * 12 * 256)
    cen = ClippedRows.from_data(data, 1.0)
    np.testing.assert_allclose(fed.gram(), cen.gram(), rtol=1e-12, atol=1e-12)
    M = np.random.default_rng(0).standard_normal((12, 3))
    np.testing.assert_allclose(fed.times(M), cen.times(M), rtol=1e-12, atol=1e-13)
    D = np.random.default_rng(1).standard_normal((4000, 2))
    np.testing.assert_allclose(fed.t_times(D), cen.t_times(D), rtol=1e-12, atol=1e-11)
    idx = np.array([0, 699, 700, 1500, 3999])
    np.testing.assert_array_equal(fed.rows(idx), cen.rows(idx))
    np.testing.assert_allclose(fed.norms, cen.norms, rtol=1e-15)
    assert fed.n_clipped == cen.n_clipped == 1
    mu = cen.column_sum() / 4000
    np.testing.assert_allclose(fed.centered(mu).gram(), cen.centered(mu).gram(), atol=1e-11)


@pytest.mark.parametrize(("method", "options"), [
    ("analyze_gauss", {}), ("fixed", {}), ("power", {}),
    ("auto", {"branch": "analyze_gauss"}), ("auto", {"branch": "iterate"})])
def test_secure_aggregation_records_its_skellam_plan(data: np.ndarray, method: str,
                                                     options: dict) -> None:
    """Every release is a secure sum: the fit records the plan of Skellam events
    (``planned_event(..., trust=...)``), its epsilon (RDP) meets the target, and the
    sums were made (their moduli and wrap-around bound are public)."""
    from dp_accounting import dp_event

    from dpprecond.accounting import epsilon_of
    from dpprecond.pca.api import planned_event

    kw = dict(method=method, target_epsilon=1.0, target_delta=1e-6, **options)
    fed = fit_private_pca(data, 2, clients=BOUNDS, trust="secure-aggregation", seed=7,
                          row_norm=1.0, **kw)
    assert fed.dp_event == planned_event(trust="secure-aggregation", **kw)
    def leaves(e: dp_event.DpEvent) -> list[dp_event.DpEvent]:
        if isinstance(e, dp_event.ComposedDpEvent):
            return [x for sub in e.events for x in leaves(sub)]
        return leaves(e.event) if isinstance(e, dp_event.SelfComposedDpEvent) else [e]

    assert all(isinstance(e, dp_event.ZCDpEvent) for e in leaves(fed.dp_event))
    assert fed.epsilon == epsilon_of(fed.dp_event, 1e-6, "rdp")
    assert 1.0 * (1 - 1e-3) <= fed.epsilon <= 1.0
    sums = fed.info["secure_aggregation"]
    assert fed.info["accountant"] == "rdp" and sums["n_sums"] >= 1
    assert sums["wrap_probability"] <= 1e-12 * sums["n_sums"]
    assert sums["rounding_inflation"] <= 2.0**-10


def test_local_noise_is_one_draw_per_client() -> None:
    streams = np.random.default_rng(0).spawn(4)
    noise = LocalNoise(streams).standard_normal(100_000)
    assert noise.var() == pytest.approx(4.0, rel=6 * math.sqrt(2 / 100_000))
    # it is exactly the sum of the clients' own draws
    again = sum(s.standard_normal(3) for s in np.random.default_rng(0).spawn(4))
    np.testing.assert_array_equal(LocalNoise(np.random.default_rng(0).spawn(4))
                                  .standard_normal(3), again)


@pytest.mark.parametrize("method", ["analyze_gauss", "auto"])
def test_local_trust_spends_the_same_epsilon_with_more_noise(data: np.ndarray,
                                                             method: str) -> None:
    V = top_right_singular_vectors(ClippedRows.from_data(data, 1.0).materialize(), 2)
    errs = {}
    for trust in ("local", "secure-aggregation"):
        fits = [fit_private_pca(data, 2, method=method, target_epsilon=0.5,
                                target_delta=1e-6, row_norm=1.0, seed=s, clients=BOUNDS,
                                trust=trust) for s in range(6)]
        assert all(f.epsilon <= 0.5 for f in fits)
        assert all(f.epsilon == pytest.approx(0.5, rel=1e-4) for f in fits)
        errs[trust] = np.median([sin_theta(f.basis, V) for f in fits])
    assert errs["local"] > errs["secure-aggregation"]  # sqrt(4) = 2x the noise


def test_noise_off_gives_the_exact_subspace_and_select_is_refused(data: np.ndarray) -> None:
    V = top_right_singular_vectors(ClippedRows.from_data(data, 1.0).materialize(), 2)
    res = fit_private_pca(data, 2, method="fixed", target_epsilon=1.0, target_delta=1e-6,
                          row_norm=1.0, clients=BOUNDS, add_noise=False, clip_radius=np.inf,
                          n_iter=30, seed=0)
    assert sin_theta(res.basis, V) < 1e-6
    with pytest.raises(ValueError, match="cannot run federated"):
        fit_private_pca(data, 2, method="select", target_epsilon=1.0, target_delta=1e-6,
                        row_norm=1.0, clients=BOUNDS)
    with pytest.raises(ValueError, match="client bounds"):
        fit_private_pca(data, 2, method="analyze_gauss", target_epsilon=1.0,
                        target_delta=1e-6, row_norm=1.0, clients=[0, 10, 10, 4000])
    with pytest.raises(ValueError, match="trust"):
        fit_private_pca(data, 2, method="analyze_gauss", target_epsilon=1.0,
                        target_delta=1e-6, row_norm=1.0, clients=BOUNDS, trust="none")


# -- issue 17, hole 8: every statement of the trust models is true -------------------------


def _trust_texts() -> dict[str, str]:
    """Every place that states what the trust models guarantee (whitespace normalized)."""
    import argparse
    from pathlib import Path

    import dpprecond.pca.federated as federated
    import dpprecond.pipeline as pipeline
    from dpprecond.cli import fl as cli_fl

    parser = argparse.ArgumentParser()
    cli_fl.register(parser.add_subparsers())
    fl_parser = parser._subparsers._group_actions[0].choices["fl"]  # type: ignore[union-attr]
    trust_help = next(a.help for a in fl_parser._actions if "--trust" in a.option_strings)
    docs = Path(__file__).resolve().parents[2] / "docs" / "pca.md"
    section = docs.read_text().split("## Federated PCA", 1)[1].split("\n## ", 1)[0]
    texts = {"fit_private_pca": fit_private_pca.__doc__, "pca.federated": federated.__doc__,
             "dpprecond.pipeline": pipeline.__doc__, "dpprecond fl --trust": trust_help,
             "docs/pca.md": section}
    return {name: " ".join(str(t).split()) for name, t in texts.items()}


def test_every_statement_of_the_trust_models_is_true() -> None:
    """``fit_private_pca``'s docstring said that under secure aggregation each client's
    release meets the target: each share has std / sqrt(K), only the sum does."""
    for name, text in _trust_texts().items():
        assert "each client's release meets the target" not in text, name
        # local: a client's own message meets the target; secure aggregation: only the sum
        assert "on its own" in text, name
        assert "only the sum" in text, name
        assert "sqrt(K)" in text, name
    # ... and those statements hold: a client's share alone is a Gaussian mechanism with
    # multiplier z / sqrt(K), far above the target; its own local message has z itself
    from dpprecond.accounting import calibrate_noise, epsilon_of, gaussian

    z = calibrate_noise(gaussian, 1.0, 1e-6, "pld")
    K = BOUNDS.size - 1
    assert epsilon_of(gaussian(z / math.sqrt(K)), 1e-6, "pld") > 1.9
    assert epsilon_of(gaussian(z), 1e-6, "pld") <= 1.0
    streams = np.random.default_rng(0).spawn(K)
    draws = LocalNoise(streams).standard_normal(200_000)  # each client adds std 1
    with pytest.raises(ValueError, match="trust='secure-aggregation' applies to federated"):
        fit_private_pca(np.eye(3), 1, method="analyze_gauss", target_epsilon=1.0,
                        target_delta=1e-6, row_norm=1.0, trust="secure-aggregation")
    assert draws.var() == pytest.approx(K, rel=6 * math.sqrt(2 / 200_000))
