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
    with pytest.raises(ValueError, match="only dpprecond's own state classes"):
        save_checkpoint(bad, {"x": __import__("collections").namedtuple("T", "a")(1)})
        load_checkpoint(bad)
