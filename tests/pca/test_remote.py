"""Federated PCA over a network without Flower: an in-process transport (pca/remote.py)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from dpprecond.data.synthetic import spiked_covariance
from dpprecond.noise import gaussian, symmetric_gaussian
from dpprecond.pca import fit_private_pca
from dpprecond.pca.remote import (
    ClientMissingError,
    ClientState,
    DeferredNoise,
    RemoteFederation,
    client_answer,
)

BOUNDS = np.array([0, 700, 1500, 1501, 3000])
FIT = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(3000, 10, 2, 20.0, seed=4)


def _federation(data: np.ndarray, seed: int | None = 5, drop: int | None = None,
                sent: list | None = None) -> RemoteFederation:
    parts = [data[lo:hi] for lo, hi in pairwise(BOUNDS)]
    states = [ClientState() for _ in parts]

    def transport(request: dict, arrays: list) -> list[np.ndarray]:
        if sent is not None:
            sent.append(request["kind"])
        if drop is not None and request["kind"] == "release":
            raise ClientMissingError("gone", clients=[drop], reasons={drop: "gone"})
        return [client_answer(request, arrays, X, client_id=i, state=states[i],
                              noise_seed=seed) for i, X in enumerate(parts)]

    return RemoteFederation(transport, [p.shape[0] for p in parts], data.shape[1],
                            fit_id="t")


@pytest.mark.parametrize(("method", "options"), [
    ("analyze_gauss", {}), ("power", {}), ("auto", {"branch": "iterate"}),
    ("auto", {"center": "private"})])
def test_remote_fit_is_the_local_fit(data: np.ndarray, method: str, options: dict) -> None:
    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5, **FIT, **options)
    got = fit_private_pca(_federation(data), 2, method=method, **FIT, **options)
    np.testing.assert_allclose(got.components, ref.components, atol=1e-12)
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon


@pytest.mark.parametrize(("settings", "match"), [
    ({"method": "fixed"}, "does not run over a network"),
    ({"seed": 1}, "clients draw the noise"),
    ({"diagnostics": True}, "diagnostics"),
    ({"trust": "secure-aggregation"}, "in-process simulation"),
    ({"clients": BOUNDS}, "leave clients=None"),
    ({"add_noise": False}, "private only"),
])
def test_remote_refusals_come_before_any_request(data: np.ndarray, settings: dict,
                                                 match: str) -> None:
    sent: list = []
    with pytest.raises(ValueError, match=match):
        fit_private_pca(_federation(data, sent=sent), 2, **{**FIT, **settings})
    assert sent == []


def test_a_missing_client_is_an_error(data: np.ndarray) -> None:
    with pytest.raises(ClientMissingError, match="gone"):
        fit_private_pca(_federation(data, drop=2), 2, method="analyze_gauss", **FIT)


def test_the_noise_of_a_deferred_source_is_drawn_by_the_clients(data: np.ndarray) -> None:
    (_, init, _) = _federation(data).noise_sources()
    assert isinstance(gaussian((3,), 1.0, init), DeferredNoise)
    W = symmetric_gaussian(4, 1.0, init)
    assert isinstance(W, DeferredNoise) and W.shape == (4, 4)
    assert isinstance(W + 0.0 * np.zeros((4, 4)), DeferredNoise)  # zero noise: no-op
    with pytest.raises(TypeError, match="computed by the clients"):
        np.asarray(W)


def test_a_malformed_part_is_an_error(data: np.ndarray) -> None:
    fed = _federation(data)
    inner = fed._session.transport

    def tamper(request: dict, arrays: list) -> list[np.ndarray]:
        parts = inner(request, arrays)
        if request["kind"] == "release":
            parts[1] = parts[1][:-1]
        return parts

    fed._session.transport = tamper
    with pytest.raises(ClientMissingError, match=r"client\(s\) \[1\] sent.*expected finite "
                       r"values of shape \(10, 10\)"):
        fit_private_pca(fed, 2, method="analyze_gauss", **FIT)
