"""Secure-aggregation PCA over a network without Flower: an in-process secure transport
(each client's message from pca/remote_secure.py, summed here modulo 2^bits)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.remote import ClientMissingError, ClientState, RemoteFederation, client_answer
from dpprecond.pca.remote_secure import (
    client_public_draw,
    client_secure_message,
    plan_from_request,
    plan_to_request,
)
from dpprecond.secagg.skellam import InsufficientNoiseError, aggregate
from dpprecond.secagg.sums import plan_sum

BOUNDS = np.array([0, 700, 1500, 1501, 3000])
K = len(BOUNDS) - 1
FIT = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(3000, 10, 2, 20.0, seed=4)


def _federation(data: np.ndarray, seed: int | None = 5, *, answering: int | None = None,
                floor: float = 0.0, log: list | None = None,
                bounds: np.ndarray = BOUNDS) -> RemoteFederation:
    """``data`` split at ``bounds``, every release summed here from the messages of the
    first ``answering`` clients (default all)."""
    parts = [data[lo:hi] for lo, hi in pairwise(bounds)]
    states = [ClientState() for _ in parts]
    K = len(parts)
    answering = K if answering is None else answering

    def transport(request: dict, arrays: list) -> list[np.ndarray]:
        if request["kind"] == "secure-public":
            return [client_public_draw(request, X, n_clients=K, state=states[i],
                                       noise_seed=seed) for i, X in enumerate(parts)]
        return [client_answer(request, arrays, X, client_id=i, state=states[i],
                              noise_seed=seed) for i, X in enumerate(parts)]

    def secure(request: dict, arrays: list, plan) -> tuple[np.ndarray, int]:
        messages = [client_secure_message(request, arrays, X, client_id=i, n_clients=K,
                                          state=states[i], noise_seed=seed,
                                          min_noise_multiplier=floor)[0]
                    for i, X in enumerate(parts[:answering])]
        if log is not None:
            log.append((request, plan))
        return aggregate(messages, plan), len(messages)

    return RemoteFederation(transport, [p.shape[0] for p in parts], data.shape[1],
                            fit_id="t", secure_transport=secure)


@pytest.mark.parametrize(("method", "options"), [
    ("analyze_gauss", {}), ("power", {}), ("auto", {}), ("auto", {"branch": "iterate"}),
    ("auto", {"center": "private"})])
def test_remote_secure_fit_is_the_in_process_secure_fit_bit_for_bit(
        data: np.ndarray, method: str, options: dict) -> None:
    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5,
                          trust="secure-aggregation", **FIT, **options)
    got = fit_private_pca(_federation(data), 2, method=method, trust="secure-aggregation",
                          **FIT, **options)
    assert np.array_equal(got.components, ref.components)  # integer sums: exact
    assert got.dp_event == ref.dp_event and got.epsilon == ref.epsilon
    assert got.info["secure_aggregation"] == ref.info["secure_aggregation"]
    assert got.info["trust"] == "secure-aggregation"
    other = fit_private_pca(_federation(data, seed=6), 2, method=method,
                            trust="secure-aggregation", **FIT, **options)
    assert np.abs(other.components - ref.components).max() > 1e-6


def test_secure_mode_on_a_remote_secure_federation_is_refused_by_name(data) -> None:
    """The remote clients draw their shares from numpy generators: secure=True is refused
    before any request (in process it runs: tests/pca/test_federated_secagg.py)."""
    log: list = []
    with pytest.raises(ValueError, match=r"secure=True is not available.*remote federation"):
        fit_private_pca(_federation(data, log=log), 2, method="analyze_gauss",
                        trust="secure-aggregation", secure=True, **FIT)
    assert log == []


def test_the_plan_is_charged_before_the_first_share_and_fewer_shares_are_refused(
        data: np.ndarray) -> None:
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    with pytest.raises(InsufficientNoiseError, match=r"min_clients=4.*already spent"):
        fit_private_pca(_federation(data, answering=3), 2, method="analyze_gauss",
                        trust="secure-aggregation", ledger=ledger, **FIT)
    ref = fit_private_pca(data, 2, method="analyze_gauss", clients=BOUNDS, seed=5,
                          trust="secure-aggregation", **FIT)
    assert ledger.events == [ref.dp_event]  # charged once, before any share
    # with min_clients=3 the three shares carry the noise: released
    got = fit_private_pca(_federation(data, answering=3), 2, method="analyze_gauss",
                          trust="secure-aggregation", min_clients=3, **FIT)
    assert got.info["secure_aggregation"]["min_clients"] == 3


def test_a_client_refuses_a_weaker_plan(data: np.ndarray) -> None:
    log: list = []
    fit_private_pca(_federation(data, log=log), 2, method="analyze_gauss",
                    trust="secure-aggregation", **FIT)
    request, plan = log[0]
    X = data[:700]

    def ask(**changes) -> None:
        fields = {**plan_to_request(plan), **changes.pop("plan", {})}
        req = {**request, "plan": fields, **changes}
        client_secure_message(req, [], X, client_id=0, n_clients=K, state=ClientState(),
                              noise_seed=5)

    ask()  # the logged request is accepted as is
    with pytest.raises(ValueError, match="scale"):
        ask(plan={"scale": plan.scale / 2})
    with pytest.raises(ValueError, match="bits"):
        ask(plan={"bits": plan.bits - 1})
    weak = plan_sum(plan.dim, plan.sensitivity / 2, plan.noise_multiplier,
                    n_rows=plan.n_rows, n_clients=K, min_clients=K)  # consistent, too small
    with pytest.raises(ValueError, match="noise would not cover"):
        ask(plan=plan_to_request(weak))
    with pytest.raises(ValueError, match="num-partitions=4"):
        ask(plan={"n_clients": 5})
    with pytest.raises(ValueError, match="dim="):
        ask(plan={"dim": plan.dim - 1})
    with pytest.raises(ValueError, match="dim="):
        ask(symmetric=False)
    with pytest.raises(ValueError, match="stream"):
        ask(stream=3)
    with pytest.raises(ValueError, match="min-noise-multiplier"):
        client_secure_message(request, [], X, client_id=0, n_clients=K,
                              state=ClientState(), min_noise_multiplier=1e3)
    assert plan_from_request(plan_to_request(plan), K) == plan
    public = {"kind": "secure-public", "fit": "t", "d": X.shape[1], "stream": 1}
    assert client_public_draw({**public, "draw_shape": [10, 2]}, X, n_clients=K,
                              state=ClientState(), noise_seed=5).shape == (10, 2)
    with pytest.raises(ValueError, match="at most 2 dimensions"):
        client_public_draw({**public, "draw_shape": [10**4, 10**4]}, X, n_clients=K,
                           state=ClientState())


def test_a_missing_client_states_the_privacy_spent(data: np.ndarray) -> None:
    fed = _federation(data)
    calls = []

    def failing(request, arrays, plan):
        calls.append(plan)
        raise ClientMissingError("client 2 gave no share", clients=[2], reasons={2: "gone"})

    fed._session.secure_transport = failing
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    with pytest.raises(ClientMissingError, match=r"already spent.*charged to the ledger"):
        fit_private_pca(fed, 2, method="analyze_gauss", trust="secure-aggregation",
                        ledger=ledger, **FIT)
    assert len(calls) == 1 and len(ledger.events) == 1


def test_local_federation_refuses_secure_aggregation_by_name(data: np.ndarray) -> None:
    fed = _federation(data)
    fed._session.secure_transport = None
    with pytest.raises(ValueError, match="sums securely"):
        fit_private_pca(fed, 2, trust="secure-aggregation", **FIT)
    with pytest.raises(ValueError, match="does not run over a network"):
        fit_private_pca(_federation(data), 2, method="fixed", trust="secure-aggregation",
                        **FIT)
