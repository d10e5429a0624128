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
                bounds: np.ndarray = BOUNDS, secure: bool = False,
                requests: list | None = None,
                fit_bits: int | float | None = None) -> RemoteFederation:
    """``data`` split at ``bounds``, every release summed here from the messages of the
    first ``answering`` clients (default all); ``secure``: every client's own secure mode.
    ``log`` gets every secure release's request and plan, ``requests`` every request;
    ``fit_bits``: the modulus cap the secure transport declares."""
    parts = [data[lo:hi] for lo, hi in pairwise(bounds)]
    states = [ClientState() for _ in parts]
    K = len(parts)
    answering = K if answering is None else answering

    def transport(request: dict, arrays: list) -> list[np.ndarray]:
        if requests is not None:
            requests.append(request)
        if request["kind"] == "secure-public":
            return [client_public_draw(request, X, n_clients=K, state=states[i],
                                       noise_seed=seed, secure=secure)
                    for i, X in enumerate(parts)]
        return [client_answer(request, arrays, X, client_id=i, state=states[i],
                              noise_seed=seed, secure=secure) for i, X in enumerate(parts)]

    def secure_sum(request: dict, arrays: list, plan) -> tuple[np.ndarray, int]:
        messages = [client_secure_message(request, arrays, X, client_id=i, n_clients=K,
                                          state=states[i], noise_seed=seed,
                                          min_noise_multiplier=floor, secure=secure)[0]
                    for i, X in enumerate(parts[:answering])]
        if log is not None:
            log.append((request, plan))
        if requests is not None:
            requests.append(request)
        return aggregate(messages, plan), len(messages)

    if fit_bits is not None:
        secure_sum.fit_bits = fit_bits  # type: ignore[attr-defined]
    return RemoteFederation(transport, [p.shape[0] for p in parts], data.shape[1],
                            fit_id="t", secure_transport=secure_sum)


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


@pytest.mark.parametrize("method", ["analyze_gauss", "power"])
def test_secure_mode_on_a_remote_secure_federation_draws_from_the_csprng(
        data: np.ndarray, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """secure=True over a network (unseeded clients): every request says so, every
    client's message of every sum (rounding and Skellam share) and every public draw
    comes from a SecureGenerator; the plan's event and epsilon are the non-secure fit's,
    the result records secure mode, and two fits differ."""
    from tests.spies import public_draw_sources, share_sources

    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5,
                          trust="secure-aggregation", **FIT)
    plain = fit_private_pca(_federation(data, seed=None), 2, method=method,
                            trust="secure-aggregation", **FIT)
    shares, public = share_sources(monkeypatch), public_draw_sources(monkeypatch)
    log: list = []
    a = fit_private_pca(_federation(data, seed=None, requests=log), 2, method=method,
                        trust="secure-aggregation", secure=True, **FIT)
    sums = a.info["secure_aggregation"]
    n_public = sum(r["kind"] == "secure-public" for r in log)
    assert shares == ["SecureGenerator"] * (K * sums["n_sums"]) and sums["n_sums"] >= 1
    assert public == ["SecureGenerator"] * (K * n_public)
    assert n_public == (method == "power")  # the power method's public random start
    assert log and all(r["secure"] is True for r in log)
    assert a.dp_event == ref.dp_event == plain.dp_event
    assert a.epsilon == ref.epsilon == plain.epsilon
    assert sums["secure"] is True and plain.info["secure_aggregation"]["secure"] is False
    assert {k: v for k, v in sums.items() if k != "secure"} == {
        k: v for k, v in ref.info["secure_aggregation"].items() if k != "secure"}
    b = fit_private_pca(_federation(data, seed=None), 2, method=method,
                        trust="secure-aggregation", secure=True, **FIT)
    assert not np.array_equal(a.components, b.components)
    np.testing.assert_allclose(a.components @ a.components.T, np.eye(2), atol=1e-8)


def test_a_client_in_secure_mode_draws_its_share_from_the_csprng_whatever_is_asked(
        data: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's own secure=True turns secure mode on for a request without it (its
    share and its public draws from a SecureGenerator); the fit, not asked for secure
    mode, does not claim it. Without either: numpy generators."""
    from tests.spies import public_draw_sources, share_sources

    shares, public = share_sources(monkeypatch), public_draw_sources(monkeypatch)
    got = fit_private_pca(_federation(data, seed=None, secure=True), 2, method="power",
                          trust="secure-aggregation", **FIT)
    n_sums = got.info["secure_aggregation"]["n_sums"]
    assert shares == ["SecureGenerator"] * (K * n_sums) and public == ["SecureGenerator"] * K
    assert got.info["secure_aggregation"]["secure"] is False  # the server did not ask
    shares.clear()
    public.clear()
    fit_private_pca(_federation(data, seed=None), 2, method="power",
                    trust="secure-aggregation", **FIT)
    assert shares == ["Generator"] * (K * n_sums) and public == ["Generator"] * K


def test_a_seeded_client_refuses_a_secure_request(data: np.ndarray) -> None:
    """A seeded client refuses secure mode (asked by the server, or its own) by name, on
    every kind of request, before it draws anything; the fit stops before any release."""
    log: list = []
    fit_private_pca(_federation(data, log=log), 2, method="analyze_gauss",
                    trust="secure-aggregation", **FIT)
    release = log[0][0]  # the Gram sum: no arrays
    log.clear()
    fit_private_pca(_federation(data, requests=log), 2, method="power",
                    trust="secure-aggregation", **FIT)
    public = next(r for r in log if r["kind"] == "secure-public")
    X = data[:700]
    for secure_req, own in ((True, False), (False, True)):
        state = ClientState()
        with pytest.raises(ValueError, match=r"refuses seeds.*noise_seed=5"):
            client_secure_message({**release, "secure": secure_req}, [], X, client_id=0,
                                  n_clients=K, state=state, noise_seed=5, secure=own)
        assert state.released == [] and state.streams == {}
        with pytest.raises(ValueError, match=r"refuses seeds.*noise_seed=5"):
            client_public_draw({**public, "secure": secure_req}, X, n_clients=K,
                               state=state, noise_seed=5, secure=own)
        assert state.streams == {}
    client_secure_message(release, [], X, client_id=0, n_clients=K, state=ClientState(),
                          noise_seed=5)  # control: the same request without secure mode
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    log.clear()
    with pytest.raises(ValueError, match="Secure mode refuses seeds"):
        fit_private_pca(_federation(data, requests=log), 2, method="analyze_gauss",
                        trust="secure-aggregation", secure=True, ledger=ledger, **FIT)
    assert [r["kind"] for r in log] == ["slack"] and ledger.events == []  # no release


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
