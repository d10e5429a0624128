"""Crash-safe federated runs: kill -9 a real process mid-run, resume, same final model."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.checkpoint import load_checkpoint, save_checkpoint
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition

from .conftest import make_problem

ROUNDS, EVERY, KILL_AFTER = 12, 3, 7

SCRIPT = """
import os, signal, sys
import numpy as np
sys.path.insert(0, {tests!r})
from fl.conftest import make_problem
from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition
X, y, Xt, yt = make_problem(n=300)
parts = make_partition(y, 5, "dirichlet", 0.5, np.random.default_rng(1))
data = ClientData.from_partition(X, y, parts, 3)

def die(rec):
    if rec["round"] == {kill}:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: a real crash

seed = None if {seed!r} is None else {seed!r}
simulate(LinearSoftmax(6, 3), data, make_method({method!r}),
         FLConfig(n_rounds={rounds}, target_epsilon=2.0), X_test=Xt, y_test=yt, seed=seed,
         checkpoint={ckpt!r}, checkpoint_every={every}, callback=die)
"""


def _data() -> tuple[ClientData, np.ndarray, np.ndarray]:
    X, y, Xt, yt = make_problem(n=300)
    parts = make_partition(y, 5, "dirichlet", 0.5, np.random.default_rng(1))
    return ClientData.from_partition(X, y, parts, 3), Xt, yt


def _run(method: str, seed, ckpt: Path | None = None):
    data, Xt, yt = _data()
    return simulate(LinearSoftmax(6, 3), data, make_method(method),
                    FLConfig(n_rounds=ROUNDS, target_epsilon=2.0), X_test=Xt, y_test=yt,
                    seed=seed, checkpoint=ckpt, checkpoint_every=EVERY)


def _crash(tmp_path: Path, method: str, seed) -> Path:
    ckpt = tmp_path / "run.ckpt.npz"
    code = textwrap.dedent(SCRIPT).format(tests=str(Path(__file__).parents[1]), kill=KILL_AFTER,
                                          seed=seed, method=method, rounds=ROUNDS,
                                          ckpt=str(ckpt), every=EVERY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr  # killed by SIGKILL
    assert ckpt.exists()
    state = load_checkpoint(ckpt)
    assert state["round"] == (KILL_AFTER // EVERY) * EVERY  # the last checkpoint before death
    return ckpt


@pytest.mark.parametrize("method", ["sofim-lagged", "scaffold", "fednew"])
def test_killed_run_resumes_to_the_same_model(tmp_path: Path, method: str) -> None:
    reference = _run(method, seed=11)
    ckpt = _crash(tmp_path, method, seed=11)
    resumed = _run(method, seed=11, ckpt=ckpt)
    np.testing.assert_array_equal(resumed.params, reference.params)
    def strip(history: list[dict]) -> list[dict]:  # wall times differ
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert strip(resumed.history) == strip(reference.history)
    assert resumed.events == reference.events and resumed.epsilon == reference.epsilon
    assert not ckpt.exists()  # the noise seed does not outlive the run


def test_unseeded_run_resumes_with_its_own_entropy(tmp_path: Path) -> None:
    ckpt = _crash(tmp_path, "fedgd", seed=None)
    saved = load_checkpoint(ckpt)
    root = np.random.SeedSequence(saved["entropy"], spawn_key=tuple(saved["spawn_key"]))
    resumed = _run("fedgd", seed=None, ckpt=ckpt)
    reference = _run("fedgd", seed=root)
    np.testing.assert_array_equal(resumed.params, reference.params)


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    ckpt = _crash(tmp_path, "fedgd", seed=3)
    data, Xt, yt = _data()
    with pytest.raises(ValueError, match="belongs to another run"):
        simulate(LinearSoftmax(6, 3), data, make_method("fedgd", learning_rate=0.5),
                 FLConfig(n_rounds=ROUNDS, target_epsilon=2.0), X_test=Xt, y_test=yt,
                 seed=3, checkpoint=ckpt, checkpoint_every=EVERY)
    with pytest.raises(ValueError, match="another seed"):
        _run("fedgd", seed=4, ckpt=ckpt)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable dpprecond checkpoint"):
        load_checkpoint(bad)
    with pytest.raises(TypeError, match="only the state classes"):
        save_checkpoint(bad, {"x": __import__("collections").namedtuple("T", "a")(1)})


# -- issue 17, hole 4: a checkpoint is data (an explicit allowlist of state classes) -------


def _crafted(path: Path, tree: object, fmt: int = 1) -> Path:
    import json

    np.savez(path, a0=np.zeros(21), __meta__=np.array(json.dumps({"format": fmt,
                                                                 "tree": tree})))
    return path


def _payload(state: object) -> dict:
    return {"__dict__": {"fingerprint": "x", "entropy": 1, "spawn_key": [], "round": 1,
                         "params": {"__array__": "a0"}, "state": state, "history": [],
                         "events": []}}


@pytest.mark.parametrize("name", ["dpprecond.cli:main", "os:system", "builtins:eval",
                                  "dpprecond.fl.server:GradientTransformation",
                                  "dpprecond.pca.rows:BlockScan"])
def test_a_crafted_checkpoint_cannot_call_anything(tmp_path: Path, name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint naming ``dpprecond.cli:main`` with ``["pca", "--help"]`` ran the CLI."""
    import dpprecond.cli

    called: list[object] = []
    monkeypatch.setattr(dpprecond.cli, "main", lambda *a: called.append(a))
    bad = _crafted(tmp_path / "bad.npz",
                   _payload({"__namedtuple__": name, "fields": ["pca", "--help"]}))
    with pytest.raises(ValueError, match="not an allowed checkpoint state class"):
        load_checkpoint(bad)
    assert called == []


@pytest.mark.parametrize(("state", "message"), [
    ({"__namedtuple__": "SofimState", "fields": [1]}, "SofimState has"),
    ({"__namedtuple__": "EmptyState", "fields": "abc"}, "fields"),
    ({"__import__": "os"}, "Unknown node"),
    ({"__array__": "missing"}, "missing"),
    ({"__event__": {"gaussian": "abc"}}, "abc"),
])
def test_a_malformed_checkpoint_is_a_clear_error(tmp_path: Path, state: object,
                                                 message: str) -> None:
    bad = _crafted(tmp_path / "bad.npz", _payload(state))
    with pytest.raises(ValueError, match="not a readable dpprecond checkpoint") as err:
        load_checkpoint(bad)
    assert message in str(err.value)


def test_a_checkpoint_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    wrong_round = _payload({"__tuple__": []})
    wrong_round["__dict__"]["round"] = "1"
    for tree, fmt in ((_payload({"__tuple__": []}), 3), ([1, 2], 1), ({"__dict__": {}}, 1),
                      (wrong_round, 2)):
        _crafted(bad, tree, fmt)
        with pytest.raises(ValueError, match="not a readable dpprecond checkpoint"):
            load_checkpoint(bad)


def test_every_methods_state_is_allowlisted(tmp_path: Path) -> None:
    """Each method's state (what simulate checkpoints) round-trips through the allowlist."""
    from dpprecond.fl.methods import METHODS

    data, Xt, yt = _data()
    for name in METHODS:
        ckpt = tmp_path / f"{name}.npz"
        states: list[dict] = []

        def keep(rec, ckpt=ckpt, states=states) -> None:
            if rec["round"] == 2:
                states.append(load_checkpoint(ckpt))

        simulate(LinearSoftmax(6, 3), data, make_method(name),
                 FLConfig(n_rounds=3, target_epsilon=2.0), X_test=Xt, y_test=yt, seed=5,
                 checkpoint=ckpt, checkpoint_every=1, callback=keep)
        assert states and states[0]["round"] == 1, name


class _Stop(Exception):
    pass


def _interrupted(tmp_path: Path) -> Path:
    """A real checkpoint of round 2 of a run stopped in round 3 (checkpoints every round)."""
    ckpt = tmp_path / "run.npz"

    def stop(rec) -> None:
        if rec["round"] == 3:
            raise _Stop

    data, Xt, yt = _data()
    with pytest.raises(_Stop):
        simulate(LinearSoftmax(6, 3), data, make_method("fedgd"),
                 FLConfig(n_rounds=ROUNDS, target_epsilon=2.0), X_test=Xt, y_test=yt,
                 seed=3, checkpoint=ckpt, checkpoint_every=1, callback=stop)
    return ckpt


@pytest.mark.parametrize(("change", "message"), [
    ({"round": 0}, "round"), ({"round": ROUNDS}, "round"), ({"history": []}, "history"),
    ({"params": np.zeros(5)}, "params"), ({"params": np.full(21, np.nan)}, "params"),
])
def test_simulate_refuses_a_tampered_checkpoint_of_its_own_run(tmp_path: Path, change: dict,
                                                              message: str) -> None:
    """The fingerprint matches (same run), but the state does not fit the run."""
    ckpt = _interrupted(tmp_path)
    state = load_checkpoint(ckpt)
    assert state["round"] == 2
    save_checkpoint(ckpt, {**state, **change})
    with pytest.raises(ValueError, match=f"checkpoint {ckpt}.*{message}"):
        _run("fedgd", seed=3, ckpt=ckpt)
    assert ckpt.exists()  # nothing deleted: the user decides
