"""Checkpoints of secure-aggregation runs (secagg/fl.py ``Resume``): a run stopped mid-way
resumes to the uninterrupted run's model, history and events, for the fixed and the
adaptive clip and client-level DP, and for the covariance methods (their setup sum kept
in the server state, not released again); a checkpoint of another run is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger
from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.checkpoint import load_checkpoint
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition

from .conftest import make_problem

ROUNDS, EVERY, STOP_AFTER = 9, 2, 5


class Stop(Exception):
    pass


def _data() -> tuple[ClientData, np.ndarray, np.ndarray]:
    X, y, Xt, yt = make_problem(n=300)
    parts = make_partition(y, 5, "dirichlet", 0.5, np.random.default_rng(1))
    return ClientData.from_partition(X, y, parts, 3), Xt, yt


def _run(method: str, config: FLConfig, seed, ckpt: Path | None = None, *,
         stop: bool = False, ledger: PrivacyLedger | None = None, **kwargs):
    data, Xt, yt = _data()

    def halt(record: dict) -> None:
        if stop and record["round"] == STOP_AFTER:
            raise Stop

    return simulate(LinearSoftmax(6, 3), data, make_method(method), config, X_test=Xt,
                    y_test=yt, seed=seed, checkpoint=ckpt, checkpoint_every=EVERY,
                    callback=halt, ledger=ledger, **kwargs)


def _strip(history: list[dict]) -> list[dict]:  # wall times differ
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


CONFIGS = {
    "adaptive clip (the default)": ("sofim-lagged", {}),
    "fixed clip, adam": ("adam", {"adaptive_clip": None}),
    "client-level, local steps": ("fedgd", {"mechanism": "client-level", "local_steps": 2,
                                            "clip_norm": 1.0}),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_stopped_secure_run_resumes_to_the_same_model(tmp_path: Path, case: str) -> None:
    method, settings = CONFIGS[case]
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust="secure-aggregation",
                      **settings)
    reference = _run(method, config, seed=11)
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run(method, config, seed=11, ckpt=ckpt, stop=True)
    saved = load_checkpoint(ckpt)
    assert saved["round"] == (STOP_AFTER // EVERY) * EVERY  # the last one before the stop
    assert len(saved["events"]) == saved["round"]  # one secure sum a round
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    resumed = _run(method, config, seed=11, ckpt=ckpt, ledger=ledger)
    np.testing.assert_array_equal(resumed.params, reference.params)
    assert _strip(resumed.history) == _strip(reference.history)
    assert resumed.events == reference.events and resumed.epsilon == reference.epsilon
    assert ledger.events == reference.events  # the resumed rounds recorded again
    assert resumed.config.get("clip_norms") == reference.config.get("clip_norms")
    assert not ckpt.exists()  # the noise seed does not outlive the run


def test_a_checkpoint_of_another_secure_run_is_refused(tmp_path: Path) -> None:
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust="secure-aggregation")
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run("sofim-lagged", config, seed=3, ckpt=ckpt, stop=True)
    data, Xt, yt = _data()
    from dpprecond.secagg.fl import simulate_secure

    with pytest.raises(ValueError, match="belongs to another run"):  # min_clients differs
        simulate_secure(LinearSoftmax(6, 3), data, make_method("sofim-lagged"), config,
                        X_test=Xt, y_test=yt, seed=3, min_clients=4, checkpoint=ckpt)
    with pytest.raises(ValueError, match="another seed"):
        _run("sofim-lagged", config, seed=4, ckpt=ckpt)
    local = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0)  # the local run is another run
    with pytest.raises(ValueError, match="belongs to another run"):
        _run("sofim-lagged", local, seed=3, ckpt=ckpt)
    assert ckpt.exists()  # a refusal deletes nothing


@pytest.mark.parametrize("method", ["fedfc", "fednew"])
def test_a_stopped_covariance_run_resumes_without_a_second_setup_sum(
        tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-FedFC / DP-FedNew: the checkpoint keeps the server half's state, which holds the
    setup sum's result, so the resumed run computes and releases no second setup sum, and
    ends at the uninterrupted run's model, history and events (setup event first)."""
    import dpprecond.secagg.fl as secagg_fl

    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust="secure-aggregation")
    reference = _run(method, config, seed=7)
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run(method, config, seed=7, ckpt=ckpt, stop=True)
    saved = load_checkpoint(ckpt)
    assert saved["round"] == (STOP_AFTER // EVERY) * EVERY
    assert len(saved["events"]) == saved["round"] + 1  # the setup sum, then a sum a round
    assert saved["events"] == reference.events[:saved["round"] + 1]
    setups: list[int] = []
    real = secagg_fl.secure_moment_sum
    monkeypatch.setattr(secagg_fl, "secure_moment_sum",
                        lambda *a, **k: setups.append(1) or real(*a, **k))
    ledger = PrivacyLedger(1e-5, accountant="rdp")
    resumed = _run(method, config, seed=7, ckpt=ckpt, ledger=ledger)
    assert setups == []  # the setup sum is not recomputed, so not released again
    np.testing.assert_array_equal(resumed.params, reference.params)
    assert _strip(resumed.history) == _strip(reference.history)
    assert resumed.events == reference.events and resumed.epsilon == reference.epsilon
    assert ledger.events == reference.events  # setup and done rounds recorded again
    assert not ckpt.exists()
    fresh = _run(method, config, seed=7)  # a run without the checkpoint does run a setup
    assert setups == [1] and fresh.epsilon == reference.epsilon


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
@pytest.mark.parametrize("method", ["sofim-lagged", "fedfc"])
def test_secure_mode_resumes_with_fresh_noise_and_charges_the_lost_rounds_again(
        tmp_path: Path, trust: str, method: str) -> None:
    """Secure mode's noise comes from the OS CSPRNG: a resumed run continues (its first
    rounds' model and events kept), with noise nobody can regenerate, so the rounds the
    stopped run may have released after its last checkpoint are released twice. Their
    events are charged again: the checkpoint records ``pending = min(every, T - round)``
    and the resumed run's events (and the caller's ledger) hold them once more."""
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust=trust)
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run(method, config, seed=None, ckpt=ckpt, stop=True, secure=True)
    saved = load_checkpoint(ckpt)
    done = saved["round"]
    assert saved["pending"] == min(EVERY, ROUNDS - done) == EVERY
    ledger = PrivacyLedger(1e-5, accountant="rdp" if trust != "local" else "pld")
    resumed = _run(method, config, seed=None, ckpt=ckpt, secure=True, ledger=ledger)
    assert _strip(resumed.history[:done]) == _strip(saved["history"])
    plain = _run(method, config, seed=None, secure=True)  # an uninterrupted secure run
    # what the events are per round (one sum; local trust with adaptive clipping: the
    # count and the message), from the plain run
    setup = len(plain.events) - ROUNDS * (len(plain.events) // ROUNDS)
    per_round = (len(plain.events) - setup) // ROUNDS
    assert len(resumed.events) == len(plain.events) + EVERY * per_round
    assert resumed.events[:len(saved["events"])] == saved["events"]
    assert ledger.events == resumed.events
    assert resumed.epsilon > plain.epsilon  # the target, exceeded by the lost rounds
    assert len(resumed.history) == ROUNDS and not ckpt.exists()


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
@pytest.mark.parametrize("method", ["sofim-lagged", "fedfc"])
def test_a_secure_run_that_stops_again_before_its_next_checkpoint_is_charged_each_time(
        tmp_path: Path, trust: str, method: str) -> None:
    """Stopped at round 5 three times (the checkpoint of round 4 each time), then run to
    the end: every stop re-releases rounds 5.. with fresh noise, so every resume charges
    the pending rounds again, and the charge is written back to the checkpoint before
    anything is released (a resume that only charged in memory would charge the second
    and third stops' rounds once in all)."""
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust=trust)
    ckpt = tmp_path / "run.ckpt.npz"
    for _ in range(3):
        with pytest.raises(Stop):
            _run(method, config, seed=None, ckpt=ckpt, stop=True, secure=True)
    saved = load_checkpoint(ckpt)
    resumed = _run(method, config, seed=None, ckpt=ckpt, secure=True)
    plain = _run(method, config, seed=None, secure=True)
    per_round = (len(plain.events) - (len(plain.events) % ROUNDS)) // ROUNDS
    assert saved["round"] == 4 and saved["pending"] == EVERY
    # three resumes, each charging EVERY rounds again
    assert len(resumed.events) == len(plain.events) + 3 * EVERY * per_round
    assert resumed.epsilon > plain.epsilon


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
def test_a_resumed_secure_run_checks_the_ledger_before_charging_the_lost_rounds(
        tmp_path: Path, trust: str) -> None:
    """A ledger whose cap admits the plan but not the plan plus the lost rounds refuses
    the resume before any charge or round (nothing is released to be thrown away)."""
    from dpprecond.accounting import PrivacyBudgetExceededError

    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust=trust)
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run("sofim-lagged", config, seed=None, ckpt=ckpt, stop=True, secure=True)
    before = load_checkpoint(ckpt)
    accountant = "rdp" if trust != "local" else "pld"
    ledger = PrivacyLedger(1e-5, accountant=accountant, max_epsilon=2.0 * (1 + 1e-6))
    rounds: list[int] = []
    data, Xt, yt = _data()
    with pytest.raises(PrivacyBudgetExceededError):
        simulate(LinearSoftmax(6, 3), data, make_method("sofim-lagged"), config, X_test=Xt,
                 y_test=yt, seed=None, checkpoint=ckpt, checkpoint_every=EVERY,
                 ledger=ledger, secure=True, callback=lambda r: rounds.append(r["round"]))
    assert rounds == [] and ledger.events == []
    assert load_checkpoint(ckpt)["events"] == before["events"]  # nothing charged to it


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
def test_a_run_that_is_not_secure_records_no_pending_rounds(tmp_path: Path,
                                                             trust: str) -> None:
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust=trust)
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run("sofim-lagged", config, seed=None, ckpt=ckpt, stop=True)
    assert load_checkpoint(ckpt)["pending"] == 0


@pytest.mark.parametrize("trust", ["secure-aggregation", "local"])
def test_secure_and_seeded_checkpoints_never_resume_each_other(tmp_path: Path,
                                                               trust: str) -> None:
    """A seeded run's noise can be regenerated from the seed in its checkpoint: a secure
    run refuses to continue it (and a seeded or unseeded plain run refuses a secure
    run's checkpoint), by the fingerprint."""
    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust=trust)
    seeded, secure = tmp_path / "seeded.npz", tmp_path / "secure.npz"
    with pytest.raises(Stop):
        _run("fedfc", config, seed=5, ckpt=seeded, stop=True)
    with pytest.raises(ValueError, match="belongs to another run"):
        _run("fedfc", config, seed=None, ckpt=seeded, secure=True)
    with pytest.raises(Stop):
        _run("fedfc", config, seed=None, ckpt=secure, stop=True, secure=True)
    with pytest.raises(ValueError, match="belongs to another run"):
        _run("fedfc", config, seed=None, ckpt=secure)
    assert seeded.exists() and secure.exists()  # a refusal deletes nothing


def test_a_malformed_pending_count_is_refused(tmp_path: Path) -> None:
    from dpprecond.fl.checkpoint import save_checkpoint

    config = FLConfig(n_rounds=ROUNDS, target_epsilon=2.0, trust="secure-aggregation")
    ckpt = tmp_path / "run.ckpt.npz"
    with pytest.raises(Stop):
        _run("sofim-lagged", config, seed=None, ckpt=ckpt, stop=True, secure=True)
    good = load_checkpoint(ckpt)
    for bad in (-1, True, 1.5):
        payload = {**good, "pending": bad}
        save_checkpoint(ckpt, payload)
        with pytest.raises(ValueError, match="'pending' must be an integer >= 0"):
            load_checkpoint(ckpt)


def test_the_secure_sums_events_round_trip_and_malformed_ones_are_refused() -> None:
    from dp_accounting import dp_event

    from dpprecond.accounting import event_from_dict, event_to_dict

    event = dp_event.ZCDpEvent(0.0114493977434457, 0.00572469887172287)
    assert event_from_dict(event_to_dict(event)) == event
    nested = dp_event.SelfComposedDpEvent(event, 3)
    assert event_from_dict(event_to_dict(nested)) == nested
    for bad in ([-1.0, 0.0], [0.1, float("nan")], [float("inf"), 0.0]):
        with pytest.raises(ValueError, match="Not a serialized ZCDpEvent"):
            event_from_dict({"zcdp": bad})
