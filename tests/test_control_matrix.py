"""Every entry point x every privacy control: honoured, or refused with an error naming it.

The guard of issue 17. :data:`CONTROLS` and :data:`ENTRY_POINTS` are the one place that
lists both; :func:`test_cell` runs every cell of their product. The discovery tests make
the lists complete: every public callable of the package's public modules and every CLI
sub-command that takes a privacy parameter must be covered by a row (or be listed in
:data:`NOT_ENTRY_POINTS` with the reason it releases nothing), every privacy parameter of
a row must belong to a control (:data:`CONTROL_PARAMETERS`), every privacy key of the
Flower app's run config and of the experiment schema too, and the table of docs/privacy.md
must list exactly these rows and columns. A new entry point or control cannot be added
without its row or column.

Each cell is small and fast (a few hundred rows, a few rounds); what "honoured" means per
control is in :data:`CONTROLS`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpprecond.pca.api as pca_api
from dpprecond import LargeDeltaWarning, PrivacyBudgetExceededError
from dpprecond.accounting import PrivacyLedger, epsilon_of
from dpprecond.pca.federated import LocalNoise

#: The privacy controls: what each cell of its column checks.
CONTROLS: dict[str, str] = {
    "secure": "secure mode: every release (PCA and FL, client side included) is drawn from "
              "the CSPRNG and snapped (a spy on secure.is_secure sees only secure releases; "
              "without it, none), or the setting is refused naming `secure`",
    "secure_seed": "a seed given in secure mode is refused, naming the seed",
    "ledger": "a ledger / max_epsilon below the plan refuses it before any release (nothing "
              "recorded or written); a cap above it records the releases",
    "delta": "a delta above 0.01 is refused naming the parameter; above 1/n it warns "
             "(LargeDeltaWarning)",
    "trust": "federated PCA: trust='local' has every client add its own noise (LocalNoise), "
             "'secure-aggregation' secure sums of the clients' Skellam shares; elsewhere a "
             "trust setting is refused "
             "naming `trust`",
}

#: Privacy parameters of the Python entry points, and the control that covers each.
CONTROL_PARAMETERS: dict[str, str] = {
    "secure": "secure", "seed": "secure_seed", "random_state": "secure_seed",
    "noise_seed": "secure_seed", "ledger": "ledger", "max_epsilon": "ledger",
    "target_delta": "delta", "delta": "delta", "trust": "trust",
}
#: Privacy-looking parameters that are the privacy level itself (its domain is pinned by the
#: property tests), not a control.
LEVEL_PARAMETERS = {"target_epsilon", "noise_multiplier"}
PRIVACY_WORDS = ("secure", "seed", "random_state", "ledger", "epsilon", "delta", "trust",
                 "noise", "private", "privacy")

PCA_X = np.random.default_rng(0).standard_normal((240, 5))
BOUNDS = np.array([0, 80, 160, 240])
ROW_NORM = 5.0


def _fl_problem() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((3, 4)) * 2
    y = rng.integers(0, 3, 150)
    X = centers[y] + rng.standard_normal((150, 4))
    return X[:120], y[:120], X[120:], y[120:]


FL_X, FL_Y, FL_XT, FL_YT = _fl_problem()


class Cell:
    """What a cell gets: the release spy, a temporary folder, monkeypatch, capsys."""

    def __init__(self, spy: Any, tmp: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture, lab: Path) -> None:
        self.spy, self.tmp, self.monkeypatch, self.capsys, self.lab = (
            spy, tmp, monkeypatch, capsys, lab)

    def secure_and_not(self, run: Callable[[bool], Any]) -> None:
        """``run(True)`` releases only in secure mode, ``run(False)`` never."""
        self.spy.calls.clear()
        run(True)
        assert self.spy.all_secure, f"{len(self.spy.calls)} releases, not all secure"
        self.spy.calls.clear()
        run(False)
        assert self.spy.none_secure

    @contextlib.contextmanager
    def local_noise_count(self) -> Iterator[list[int]]:
        """Count the LocalNoise sources built (one per stream family of a local-trust fit)."""
        count = [0]

        class Counting(LocalNoise):
            def __init__(self, streams: Any) -> None:
                count[0] += 1
                super().__init__(streams)

        with self.monkeypatch.context() as m:
            m.setattr(pca_api, "LocalNoise", Counting)
            yield count

    def cli(self, argv: list[str]) -> tuple[int, str]:
        from dpprecond.cli import main

        self.capsys.readouterr()
        rc = main(argv)
        return rc, self.capsys.readouterr().err


def refused(exc: type[BaseException], *words: str) -> Any:
    """``pytest.raises(exc)`` whose message contains every word (the control it names)."""
    return pytest.raises(exc, match=".*".join(re.escape(w) for w in words))


def assert_cli_refused(rc_err: tuple[int, str], *words: str) -> None:
    rc, err = rc_err
    assert rc == 2, err
    for w in words:
        assert w in err, (w, err)


def warns_delta() -> Any:
    return pytest.warns(LargeDeltaWarning, match="1/n")


# ---------------------------------------------------------------------------------------
# The rows
# ---------------------------------------------------------------------------------------


class EntryPoint:
    """One row: ``covers`` names the public callables or CLI commands it stands for."""

    covers: tuple[str, ...] = ()


class ApiRow(EntryPoint):
    """A Python entry point: :meth:`run` makes its releases with the given keywords; the
    secure, seed and ledger cells are the same for all of them."""

    seed_name = "seed"
    #: A cap below the plan (target epsilon 1) and the releases a covering cap records.
    low_cap, releases = 0.5, 0

    def run(self, c: Cell, **kw: Any) -> Any:
        raise NotImplementedError

    def secure(self, c: Cell) -> None:
        c.secure_and_not(lambda s: self.run(c, secure=s))

    def secure_seed(self, c: Cell) -> None:
        with refused(ValueError, "refuses seeds", f"{self.seed_name}=1"):
            self.run(c, secure=True, **{self.seed_name: 1})

    def ledger(self, c: Cell) -> None:
        low = PrivacyLedger(1e-5, max_epsilon=self.low_cap)
        with refused(PrivacyBudgetExceededError, f"max_epsilon={self.low_cap:g}"):
            self.run(c, ledger=low)
        assert low.n_releases == 0  # the whole plan was refused before any release
        ok = PrivacyLedger(1e-5, max_epsilon=1.0)
        self.run(c, ledger=ok)
        assert ok.n_releases == self.releases if self.releases else ok.n_releases > 0
        assert ok.epsilon <= 1.0 * (1 + 1e-6)


class PrivatePCARow(ApiRow):
    covers = ("dpprecond.PrivatePCA", "dpprecond.pca.PrivatePCA")
    seed_name = "random_state"

    @staticmethod
    def est(**kw: Any) -> Any:
        from dpprecond import PrivatePCA

        return PrivatePCA(2, **{"target_epsilon": 1.0, "target_delta": 1e-5,
                                "row_norm": ROW_NORM, **kw})

    def run(self, c: Cell, **kw: Any) -> Any:
        return self.est(**kw).fit(PCA_X)

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target_delta=0.5"):
            self.run(c, target_delta=0.5)
        with warns_delta():
            self.run(c, target_delta=0.01)

    def trust(self, c: Cell) -> None:
        with refused(TypeError, "trust"):
            self.est(trust="secure-aggregation")


class FitPCARow(ApiRow):
    """``fit_private_pca`` on one kind of input; with clients unless said otherwise."""

    covers = ("dpprecond.pca.fit_private_pca",)
    clients: Any = BOUNDS

    def data(self, c: Cell) -> Any:
        return PCA_X

    def run(self, c: Cell, **kw: Any) -> Any:
        from dpprecond.pca import fit_private_pca

        kw = {"target_epsilon": 1.0, "target_delta": 1e-5, "row_norm": ROW_NORM,
              "clients": self.clients, **kw}
        return fit_private_pca(self.data(c), 2, **kw)

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target_delta=0.5"):
            self.run(c, target_delta=0.5)
        with pytest.warns(LargeDeltaWarning, match="1/240"):  # n: every client's rows
            self.run(c, target_delta=0.01)

    def trust(self, c: Cell) -> None:
        for bounds in (BOUNDS, None):
            self.clients = bounds
            if bounds is None:
                with refused(ValueError, "trust='secure-aggregation'", "federated"):
                    self.run(c, trust="secure-aggregation")
                continue
            with c.local_noise_count() as count:
                local = self.run(c, trust="local", seed=3)
            assert count[0] == 3 and local.info["trust"] == "local"
            with c.local_noise_count() as count:
                shared = self.run(c, trust="secure-aggregation", seed=3)
            assert count[0] == 0 and shared.info["trust"] == "secure-aggregation"
            assert shared.info["secure_aggregation"]["n_sums"] >= 1  # secure sums ran
            secure = self.run(c, trust="secure-aggregation", secure=True)  # the CSPRNG's
            assert secure.info["trust"] == "secure-aggregation" and np.isfinite(secure.epsilon)
        self.clients = type(self).clients


class FitPCAClientsRow(FitPCARow):
    pass


class FitPCADaskRow(FitPCARow):
    covers = ("dask arrays",)
    clients = None

    def data(self, c: Cell) -> Any:
        da = pytest.importorskip("dask.array")
        return da.from_array(PCA_X, chunks=(60, 5))


class FitPCAMemmapRow(FitPCARow):
    covers = ("memory-mapped arrays",)
    clients = None

    def data(self, c: Cell) -> Any:
        path = c.tmp / "X.npy"
        if not path.exists():
            np.save(path, PCA_X)
        return np.load(path, mmap_mode="r")


class RunFederatedRow(ApiRow):
    covers = ("dpprecond.fl.run_federated",)
    releases = 2 * 2  # per round: the message and adaptive clipping's count (the default)

    def run(self, c: Cell | None = None, *, target_delta: float = 1e-5, **kw: Any) -> Any:
        from dpprecond.fl import FLConfig, run_federated

        config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=1.0,
                          target_delta=target_delta)
        return run_federated(FL_X, FL_Y, FL_XT, FL_YT, 3, algorithm="fedgd", n_clients=3,
                             config=config, **kw)

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target_delta=0.5"):
            self.run(target_delta=0.5)
        with pytest.warns(LargeDeltaWarning, match="1/120"):  # every client's records
            self.run(target_delta=0.01)

    def trust(self, c: Cell) -> None:  # the training noise is always each client's own
        with refused(TypeError, "trust"):
            self.run(trust="secure-aggregation")


class SimulateRow(RunFederatedRow):
    covers = ("dpprecond.fl.simulate",)

    def run(self, c: Cell | None = None, *, target_delta: float = 1e-5, **kw: Any) -> Any:
        from dpprecond.fl import ClientData, FLConfig, simulate
        from dpprecond.fl.models import LinearSoftmax

        data = ClientData(FL_X, FL_Y, np.array([0, 40, 80, 120]), 3)
        config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=1.0,
                          target_delta=target_delta)
        return simulate(LinearSoftmax(4, 3), data, "fedgd", config, X_test=FL_XT,
                        y_test=FL_YT, **kw)


class TunePrivateRow(ApiRow):
    covers = ("dpprecond.fl.tune_private",)
    releases = 1  # the one repeat-and-select event of the whole selection

    def run(self, c: Cell | None = None, *, target_delta: float = 1e-5, **kw: Any) -> Any:
        from dpprecond.fl import Candidate, FLConfig, tune_private

        config = FLConfig(n_rounds=2, clip_norm=1.0, target_epsilon=1.0,
                          target_delta=target_delta)
        return tune_private(FL_X, FL_Y, FL_XT, FL_YT, 3, config=config, n_clients=3,
                            candidates=[Candidate("fedgd", 0.5)], mean_trials=1.5, **kw)

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target_delta=0.5"):
            self.run(target_delta=0.5)
        with pytest.warns(LargeDeltaWarning, match="1/120"):  # every client's records
            self.run(target_delta=0.01)

    def trust(self, c: Cell) -> None:  # every trial's noise is each client's own
        with refused(TypeError, "trust"):
            self.run(trust="secure-aggregation")


class RunPipelineRow(ApiRow):
    covers = ("dpprecond.pipeline.run_pipeline",)
    # 0.8: above the PCA stage's 0.415, below the whole; the PCA, then per round the message
    # and adaptive clipping's count (the default)
    low_cap, releases = 0.8, 1 + 2 * 2

    def run(self, c: Cell | None = None, **kw: Any) -> Any:
        from dpprecond.pipeline import run_pipeline

        kw = {"features": "pca:2", "target_epsilon": 1.0, "row_norm": ROW_NORM,
              "algorithm": "fedgd", "n_clients": 3, "n_rounds": 2, "clip_norm": 1.0, **kw}
        return run_pipeline(FL_X, FL_Y, FL_XT, FL_YT, 3, **kw)

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target_delta=0.5"):
            self.run(target_delta=0.5)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.run(target_delta=0.01)
        said = [w for w in seen if issubclass(w.category, LargeDeltaWarning)]
        assert len(said) == 1 and "1/120" in str(said[0].message)  # once for both stages

    def trust(self, c: Cell) -> None:  # the trust model of both stages
        with c.local_noise_count() as count:
            local = self.run(trust="local")
        assert count[0] == 3 and local.fl.config["trust"] == "local"
        with c.local_noise_count() as count:
            shared = self.run(trust="secure-aggregation")
        assert count[0] == 0  # the PCA's noise in shares; the training's Skellam rounds:
        assert shared.fl.config["trust"] == "secure-aggregation"
        assert shared.fl.config["weighting"] == "size"  # chosen for it
        assert shared.epsilon == epsilon_of(shared.ledger.event, 1e-5, "rdp") <= 1.0
        with refused(ValueError, "trust='secure-aggregation'", "weighting='size'"):
            self.run(trust="secure-aggregation", weighting="uniform")
        with refused(ValueError, "trust='secure-aggregation'", "private"):
            self.run(trust="secure-aggregation", target_epsilon=None)


class CliRow(EntryPoint):
    """A CLI command: :meth:`argv` builds its command line; secure and seed cells shared."""

    def argv(self, c: Cell, *extra: str) -> list[str]:
        raise NotImplementedError

    def secure(self, c: Cell) -> None:
        def run(s: bool) -> None:
            assert c.cli(self.argv(c, *(["--secure"] if s else [])))[0] == 0
        c.secure_and_not(run)

    def secure_seed(self, c: Cell) -> None:
        assert_cli_refused(c.cli(self.argv(c, "--secure", "--seed", "1")),
                           "--secure refuses --seed")


class CliPcaRow(CliRow):
    covers = ("pca",)

    def argv(self, c: Cell, *extra: str) -> list[str]:
        path = c.tmp / "m.npy"
        if not path.exists():
            np.save(path, PCA_X)
        return ["pca", "--data", str(path), "--row-norm", str(ROW_NORM), "-k", "2",
                "--method", "analyze_gauss", "--epsilon", "1", "--delta", "1e-5", *extra]

    def ledger(self, c: Cell) -> None:
        out = c.tmp / "r.json"
        assert_cli_refused(c.cli(self.argv(c, "--epsilon", "2", "--max-epsilon", "2.2",
                                           "--json", str(out))),
                           "--max-epsilon=2.2", "nothing was released")
        assert not out.exists()  # the table's whole plan (1 and 2: 2.30) was refused
        rc, _ = c.cli(self.argv(c, "--max-epsilon", "1"))
        assert rc == 0

    def delta(self, c: Cell) -> None:
        assert_cli_refused(c.cli(self.argv(c, "--delta", "0.5")), "--delta=0.5")
        with warns_delta():
            assert c.cli(self.argv(c, "--delta", "0.01"))[0] == 0

    def trust(self, c: Cell) -> None:  # federated PCA's trust model, with --clients
        assert_cli_refused(c.cli(self.argv(c, "--trust", "local")),
                           "--trust local applies to federated PCA only")
        for trust in ("local", "secure-aggregation"):
            out = c.tmp / f"{trust}.json"
            rc, _ = c.cli(self.argv(c, "--clients", "3", "--trust", trust, "--json", str(out)))
            assert rc == 0 and json.loads(out.read_text())["trust"] == trust
        out = c.tmp / "secure.json"  # secure mode: the Skellam shares from the CSPRNG
        rc, _ = c.cli(self.argv(c, "--clients", "3", "--trust", "secure-aggregation",
                                "--secure", "--json", str(out)))
        assert rc == 0 and json.loads(out.read_text())["trust"] == "secure-aggregation"


class CliFlRow(CliRow):
    """``dpprecond fl`` on a labelled file, with the features of :attr:`features`."""

    covers = ("fl",)
    features = "pixels"

    def argv(self, c: Cell, *extra: str) -> list[str]:
        return ["fl", "--data", str(c.lab), "--rounds", "2", "--clients", "3",
                "--features", self.features, "--row-norm", "3", "--algorithm", "fedgd",
                "--out", str(c.tmp / "o"), *extra]

    def ledger(self, c: Cell) -> None:
        hist = c.tmp / "o" / "history.json"
        assert_cli_refused(c.cli(self.argv(c, "--max-epsilon", "0.5")),
                           "--max-epsilon=0.5", "nothing was released")
        assert not hist.exists()
        assert c.cli(self.argv(c, "--max-epsilon", "1"))[0] == 0 and hist.exists()

    def delta(self, c: Cell) -> None:
        assert_cli_refused(c.cli(self.argv(c, "--delta", "0.5")), "--delta=0.5")
        with pytest.warns(LargeDeltaWarning, match="1/240"):  # the file's training rows
            assert c.cli(self.argv(c, "--delta", "0.01"))[0] == 0

    def trust(self, c: Cell) -> None:  # the trust model of the training
        hist = c.tmp / "o" / "history.json"
        assert c.cli(self.argv(c, "--trust", "local"))[0] == 0
        assert json.loads(hist.read_text())["config"]["trust"] == "local"
        assert c.cli(self.argv(c, "--trust", "secure-aggregation"))[0] == 0
        config = json.loads(hist.read_text())["config"]
        assert config["trust"] == "secure-aggregation" and config["weighting"] == "size"
        # secure mode: the clients' Skellam shares from the CSPRNG (tests/fl)
        assert c.cli(self.argv(c, "--trust", "secure-aggregation", "--secure"))[0] == 0
        assert_cli_refused(c.cli(self.argv(c, "--trust", "secure-aggregation", "--weighting",
                                           "uniform")), "--trust secure-aggregation",
                           "--weighting size")


class CliFlPcaRow(CliFlRow):
    covers = ("fl",)
    features = "pca:3"

    def trust(self, c: Cell) -> None:
        with c.local_noise_count() as count:
            assert c.cli(self.argv(c, "--trust", "local"))[0] == 0
        assert count[0] == 3
        with c.local_noise_count() as count:
            assert c.cli(self.argv(c, "--trust", "secure-aggregation"))[0] == 0
        assert count[0] == 0
        config = json.loads((c.tmp / "o" / "history.json").read_text())["config"]
        assert config["trust"] == "secure-aggregation"  # the training's Skellam rounds too


EXPERIMENT = """
name = "matrix"
output = "out"
[data]
name = "digits"
features = "{features}"
{data}
[federation]
clients = [3]
[privacy]
epsilons = [1]
clip_norm = 1.0
{privacy}
[protocol]
rounds = 2
[methods.fedgd]
algorithm = "fedgd"
[tuning]
epsilons = [1]
[tuning.grid.fedgd]
learning_rate = [0.5]
"""


class ExperimentRow(EntryPoint):
    """``dpprecond experiment run`` (and ``tune``, the same runner on a validation split).

    Experiments are seeded research sweeps (paired seeds): secure mode and a cap are not
    settings of the strict schema, so a file that asks for them is refused naming the key.
    """

    covers = ("experiment run",)
    action = "run"
    flags: tuple[str, ...] = ()

    def run(self, c: Cell, features: str = "pixels", data: str = "",
            privacy: str = "") -> tuple[int, str]:
        path = c.tmp / f"exp{len(list(c.tmp.glob('exp*.toml')))}.toml"
        path.write_text(EXPERIMENT.format(features=features, data=data, privacy=privacy))
        return c.cli(["experiment", self.action, str(path), "--no-progress", *self.flags])

    def secure(self, c: Cell) -> None:
        assert_cli_refused(self.run(c, privacy="secure = true"), "secure")

    def secure_seed(self, c: Cell) -> None:  # no secure mode: the seeds are the sweep's own
        assert_cli_refused(self.run(c, privacy="secure = true"), "secure")

    def ledger(self, c: Cell) -> None:
        assert_cli_refused(self.run(c, privacy="max_epsilon = 1.0"), "max_epsilon")

    def delta(self, c: Cell) -> None:
        assert_cli_refused(self.run(c, privacy="delta = 0.5"), "delta")
        with warns_delta():
            assert self.run(c, privacy="delta = 0.01")[0] == 0

    def trust(self, c: Cell) -> None:
        with c.local_noise_count() as count:
            assert self.run(c, features="pca:4", data='trust = "local"')[0] == 0
        assert count[0] >= 3
        with c.local_noise_count() as count:
            assert self.run(c, features="pca:4", data='trust = "secure-aggregation"')[0] == 0
        assert count[0] == 0


class ExperimentTuneRow(ExperimentRow):
    covers = ("experiment tune",)
    action = "tune"


class ExperimentTunePrivateRow(ExperimentTuneRow):
    """``experiment tune --private``: the same strict schema; its selection runs on fixed
    features only, so ``pca:K`` features (and their trust) are refused by name."""

    flags = ("--private",)

    def trust(self, c: Cell) -> None:
        for trust in ("local", "secure-aggregation"):
            with c.local_noise_count() as count:
                assert_cli_refused(self.run(c, features="pca:4", data=f'trust = "{trust}"'),
                                   "features = 'pca:4'", f"trust = '{trust}'")
            assert count[0] == 0


class FlowerAppRow(EntryPoint):
    """The Flower app's run config (``strategy_from_run_config``, the client side it asks)."""

    covers = ("dpprecond.adapters.flower.DPFedStrategy", "dpprecond.adapters.flower.ServerSide",
              "dpprecond.adapters.flower.client_rng", "dpprecond.adapters.flower.train_reply",
              "dpprecond.adapters.flower.make_client_app")

    @staticmethod
    def strategy(**rc: Any) -> Any:
        pytest.importorskip("flwr")
        from flwr.app import Context, RecordDict

        from dpprecond.adapters.flower.app import strategy_from_run_config

        rc = {"algorithm": "fedgd", "n-clients": 3, "n-rounds": 2, "clip-norm": 1.0,
              "target-epsilon": 1.0, "noise-multiplier": "", "data": "digits", **rc}
        return strategy_from_run_config(Context(run_id=1, node_id=0, node_config={},
                                                state=RecordDict(), run_config=rc))

    @staticmethod
    @contextlib.contextmanager
    def identity() -> Iterator[None]:
        """The process identity Flower's runtimes set before messages are built."""
        from flwr.supercore.task_identity import TaskIdentity

        saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        try:
            yield
        finally:
            TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved

    def answer(self, strategy: Any, noise_seed: int | None = None) -> Any:
        """Client 1's reply to round 1's request, through the app's own ClientApp code."""
        from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

        from dpprecond.adapters.flower.app import _load
        from dpprecond.adapters.flower.client_app import train_reply

        request = strategy.server_.round_request(1, 1)
        with self.identity():
            content = RecordDict({"config": ConfigRecord(request.to_config()),
                                  "params": ArrayRecord({"params": Array(
                                      strategy.initial_params())})})
            msg = Message(content, dst_node_id=101, message_type="train")
            ctx = Context(run_id=1, node_id=101,
                          node_config={"partition-id": 1, "num-partitions": 3},
                          state=RecordDict(), run_config={"data": "digits"})
            return train_reply(msg, ctx, _load, noise_seed=noise_seed)

    def secure(self, c: Cell) -> None:
        c.secure_and_not(lambda s: self.answer(self.strategy(secure=s)))

    def secure_seed(self, c: Cell) -> None:
        with refused(ValueError, "refuses seeds"):
            self.strategy(secure=True, **{"noise-seed": 1})
        with refused(ValueError, "refuses seeded noise", "noise_seed=1"):  # client side
            self.answer(self.strategy(secure=True), noise_seed=1)

    def ledger(self, c: Cell) -> None:
        from flwr.app import Array, ArrayRecord

        class Grid:  # counts what would be sent
            sent = 0

            def get_node_ids(self) -> list[int]:
                return [101]

            def send_and_receive(self, messages: Any, **kw: Any) -> list[Any]:
                Grid.sent += len(list(messages))
                return []

        strategy = self.strategy(**{"max-epsilon": 0.5})
        with refused(PrivacyBudgetExceededError, "max_epsilon=0.5"):
            strategy.start(Grid(), ArrayRecord({"params": Array(strategy.initial_params())}),
                           num_rounds=2)
        assert Grid.sent == 0 and strategy.server_.caller_ledger.n_releases == 0
        assert self.strategy(**{"max-epsilon": 1.0}).server_.check_plan() <= 1.0 + 1e-9

    def delta(self, c: Cell) -> None:
        with refused(ValueError, "target-delta=0.5"):
            self.strategy(**{"target-delta": 0.5})
        with pytest.warns(LargeDeltaWarning, match="1/1437"):  # digits' training rows
            self.strategy(**{"target-delta": 0.01})

    def trust(self, c: Cell) -> None:  # local: DPFedStrategy; secure-aggregation: SecAgg+
        assert self.strategy(trust="local").config.trust == "local"
        with refused(ValueError, "trust='secure-aggregation'", "weighting='size'"):
            self.strategy(trust="secure-aggregation", weighting="uniform")
        with refused(ValueError, "trust='secure-aggregation'", "SecAgg+"):
            self.strategy(trust="secure-aggregation")  # size weights: the default
        from flwr.app import Context, RecordDict

        from dpprecond.adapters.flower.app import secagg_strategy_from_run_config

        for secure in (True, False):  # secure mode asked of every SecAgg+ client
            rc = {"algorithm": "fedgd", "n-rounds": 2, "clip-norm": 1.0, "secure": secure,
                  "target-epsilon": 1.0, "noise-multiplier": "", "data": "digits",
                  "trust": "secure-aggregation"}
            sa = secagg_strategy_from_run_config(Context(
                run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc),
                n_clients=3)
            assert sa.secure is secure


class FlowerPCARow(EntryPoint):
    """Federated private PCA on Flower (``fit_pca_on_flower`` and its apps), on the
    in-process stand-in Grid of tests/adapters/test_flower_pca.py (the real ClientApp)."""

    covers = ("dpprecond.adapters.flower.fit_pca_on_flower",
              "dpprecond.adapters.flower.make_pca_server_app",
              "dpprecond.adapters.flower.make_pca_client_app",
              "dpprecond.adapters.flower.add_pca_handler")

    @staticmethod
    def grid(noise_seed: int | None = None) -> Any:
        pytest.importorskip("flwr")
        from dpprecond.adapters.flower.pca import SplitRows, make_pca_client_app
        from tests.adapters.test_flower_pca import PCAGrid

        app = make_pca_client_app(SplitRows(PCA_X, BOUNDS), noise_seed=noise_seed)
        return PCAGrid(app, n_nodes=len(BOUNDS) - 1)

    def run(self, grid: Any = None, **kw: Any) -> Any:
        from dpprecond.adapters.flower.pca import fit_pca_on_flower

        kw = {"target_epsilon": 1.0, "target_delta": 1e-5, "row_norm": ROW_NORM,
              "method": "analyze_gauss", **kw}
        with FlowerAppRow.identity():
            return fit_pca_on_flower(grid if grid is not None else self.grid(), 2, **kw)

    def secure(self, c: Cell) -> None:  # the clients' releases: CSPRNG draws, snapped
        c.secure_and_not(lambda s: self.run(secure=s))

    def secure_seed(self, c: Cell) -> None:
        with refused(ValueError, "seed=1"):
            self.run(secure=True, seed=1)
        from dpprecond.adapters.flower.pca import ClientMissingError

        with refused(ClientMissingError, "refuses seeds", "Nothing was released"):
            self.run(self.grid(noise_seed=1), secure=True)  # a seeded client, secure asked

    def ledger(self, c: Cell) -> None:
        grid = self.grid()
        low = PrivacyLedger(1e-5, max_epsilon=0.5)
        with refused(PrivacyBudgetExceededError, "max_epsilon=0.5"):
            self.run(grid, ledger=low)
        assert grid.sent == 0 and low.n_releases == 0
        ok = PrivacyLedger(1e-5, max_epsilon=1.0)
        self.run(ledger=ok)
        assert ok.n_releases == 1 and ok.epsilon <= 1.0 * (1 + 1e-6)

    def delta(self, c: Cell) -> None:
        grid = self.grid()
        with refused(ValueError, "target_delta=0.5"):
            self.run(grid, target_delta=0.5)
        assert grid.sent == 0
        with pytest.warns(LargeDeltaWarning, match="1/240"):  # n: every client's rows
            self.run(target_delta=0.01)

    def trust(self, c: Cell) -> None:
        assert self.run(trust="local").info["trust"] == "local"
        from dpprecond.adapters.flower.pca import SplitRows, make_pca_client_app
        from tests.adapters.test_flower_pca_secagg import Grid

        secagg = Grid(make_pca_client_app(SplitRows(PCA_X, BOUNDS)), n_nodes=len(BOUNDS) - 1)
        got = self.run(secagg, trust="secure-aggregation")  # one SecAgg+ sum per release
        assert got.info["trust"] == "secure-aggregation"
        assert max(got.info["secure_aggregation"]["modulus_bits"]) <= 30
        assert secagg.types["train"] == 4 * (len(BOUNDS) - 1)  # analyze_gauss: 1 release
        from tests.spies import share_sources

        kinds = share_sources(c.monkeypatch)  # secure mode: every share from the CSPRNG
        secagg = Grid(make_pca_client_app(SplitRows(PCA_X, BOUNDS)), n_nodes=len(BOUNDS) - 1)
        secure = self.run(secagg, trust="secure-aggregation", secure=True)
        assert secure.info["secure_aggregation"]["secure"] is True
        assert kinds == ["SecureGenerator"] * (len(BOUNDS) - 1)
        assert secure.epsilon == got.epsilon and secure.dp_event == got.dp_event


#: Every entry point, by row name (the order of docs/privacy.md's table).
ENTRY_POINTS: dict[str, EntryPoint] = {
    "PrivatePCA": PrivatePCARow(),
    "fit_private_pca (clients)": FitPCAClientsRow(),
    "fit_private_pca (dask array)": FitPCADaskRow(),
    "fit_private_pca (memory-mapped file)": FitPCAMemmapRow(),
    "run_federated": RunFederatedRow(),
    "simulate": SimulateRow(),
    "tune_private": TunePrivateRow(),
    "run_pipeline": RunPipelineRow(),
    "dpprecond pca": CliPcaRow(),
    "dpprecond fl": CliFlRow(),
    "dpprecond fl --features pca:K": CliFlPcaRow(),
    "dpprecond experiment run": ExperimentRow(),
    "dpprecond experiment tune": ExperimentTuneRow(),
    "dpprecond experiment tune --private": ExperimentTunePrivateRow(),
    "Flower app config": FlowerAppRow(),
    "Flower PCA": FlowerPCARow(),
}

#: Public callables and CLI commands with a privacy parameter that release nothing
#: themselves, with the reason (the discovery test needs each one classified).
NOT_ENTRY_POINTS: dict[str, str] = {
    "dpprecond.pca.PCAResult": "the result record of a fit",
    "dpprecond.fl.FLConfig": "the settings of a run; its checks are the run's cells",
    "dpprecond.fl.FLResult": "the result record of a run",
    "dpprecond.fl.TuningResult": "the result record of a private selection",
    "dpprecond.fl.make_partition": "a split of the data among clients (no release)",
    "dpprecond.fl.iid_partition": "a split of the data among clients (no release)",
    "dpprecond.fl.dirichlet_partition": "a split of the data among clients (no release)",
    "dpprecond.pipeline.PipelineResult": "the result record of a pipeline",
    "dpprecond.pipeline.split_budget": "arithmetic on a budget (no data)",
    "dpprecond.pipeline.split_noise": "arithmetic on a budget (no data)",
    "dpprecond.accounting.PrivacyLedger": "the ledger control itself",
    "dpprecond.accounting.calibrate_noise": "accounting arithmetic (no data)",
    "dpprecond.accounting.epsilon_of": "accounting arithmetic (no data)",
    "dpprecond.adapters.flower.PartitionedDataset": "a split of a public dataset's rows",
    "dpprecond.adapters.flower.RoundRequest": "a message of the protocol",
    "dpprecond.adapters.flower.simulator_seeds": "the engine's seed tree, for simulations",
    "demo": "the demo on public data (digits, synthetic), seeded so its numbers reproduce",
    "experiment report": "reads finished runs; releases nothing",
    "experiment compare": "reads finished runs; releases nothing",
}

#: The public API modules scanned by the discovery test (kernels in submodules are building
#: blocks of these entry points, not entry points).
PUBLIC_MODULES = ("dpprecond", "dpprecond.pca", "dpprecond.fl", "dpprecond.pipeline",
                  "dpprecond.accounting", "dpprecond.features", "dpprecond.data",
                  "dpprecond.experiments", "dpprecond.adapters.flower",
                  "dpprecond.adapters.dask")
#: CLI options that make a command an entry point.
CLI_PRIVACY_OPTIONS = {"--secure", "--seed", "--max-epsilon", "--delta", "--trust",
                       "--epsilon", "--noise-multiplier", "config"}


@pytest.fixture
def cell(release_spy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture, lab_file: Path) -> Cell:
    return Cell(release_spy, tmp_path, monkeypatch, capsys, lab_file)


@pytest.mark.parametrize("control", list(CONTROLS))
@pytest.mark.parametrize("row", list(ENTRY_POINTS))
def test_cell(row: str, control: str, cell: Cell) -> None:
    """Entry point ``row`` honours ``control`` or refuses it with an error naming it."""
    getattr(ENTRY_POINTS[row], control)(cell)


# ---------------------------------------------------------------------------------------
# Discovery: nothing public escapes the matrix
# ---------------------------------------------------------------------------------------


def test_every_row_has_every_column() -> None:
    for name, row in ENTRY_POINTS.items():
        missing = [c for c in CONTROLS if not callable(getattr(row, c, None))]
        assert not missing, f"row {name!r} has no cell for {missing}"


def _public_callables() -> dict[str, Any]:
    out = {}
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if callable(obj):
                out[f"{module_name}.{name}"] = obj
    return out


def _privacy_parameters(obj: Any) -> list[str]:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    return [p for p in params if any(w in p for w in PRIVACY_WORDS)]


def test_every_public_callable_with_a_privacy_parameter_has_a_row() -> None:
    covered = {name for row in ENTRY_POINTS.values() for name in row.covers}
    callables = _public_callables()
    # a re-export (``dpprecond.fit_private_pca`` is ``dpprecond.pca.fit_private_pca``) is
    # the same object: classified once, under any of its names
    classified = {id(obj) for name, obj in callables.items()
                  if name in covered or name in NOT_ENTRY_POINTS}
    unclassified = []
    for name, obj in callables.items():
        controls = [p for p in _privacy_parameters(obj) if p in CONTROL_PARAMETERS]
        if controls and id(obj) not in classified:
            unclassified.append(f"{name} ({', '.join(controls)})")
    assert not unclassified, ("public callables with a privacy control but no row in "
                              f"ENTRY_POINTS (or reason in NOT_ENTRY_POINTS): {unclassified}")


def test_every_privacy_parameter_of_an_entry_point_is_a_control() -> None:
    """A new privacy parameter (a new control) cannot appear without its column."""
    covered = {name for row in ENTRY_POINTS.values() for name in row.covers}
    callables = _public_callables()
    unknown = {}
    for name in covered & set(callables):
        extra = [p for p in _privacy_parameters(callables[name])
                 if p not in CONTROL_PARAMETERS and p not in LEVEL_PARAMETERS]
        if extra:
            unknown[name] = extra
    assert not unknown, f"privacy parameters that belong to no control: {unknown}"
    assert set(CONTROL_PARAMETERS.values()) == set(CONTROLS)


def _cli_commands() -> dict[str, set[str]]:
    """Every CLI command (sub-sub-commands spelt 'experiment run') -> its option strings."""
    from dpprecond.cli import build_parser

    out: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
        if prefix:
            opts = {o for a in parser._actions for o in a.option_strings}
            opts |= {a.dest for a in parser._actions if not a.option_strings}
            out[prefix] = opts

    walk(build_parser(), "")
    return out


def test_every_cli_command_with_a_privacy_option_has_a_row() -> None:
    covered = {name for row in ENTRY_POINTS.values() for name in row.covers}
    missing = [f"{cmd} ({sorted(opts & CLI_PRIVACY_OPTIONS)})"
               for cmd, opts in _cli_commands().items()
               if opts & CLI_PRIVACY_OPTIONS and cmd not in covered
               and cmd not in NOT_ENTRY_POINTS and "experiment" != cmd]
    assert not missing, f"CLI commands with privacy options but no row: {missing}"


def test_every_privacy_key_of_the_flower_config_and_the_experiment_schema_is_a_control() -> None:
    """The Flower app reads only the keys it lists (others are refused); each privacy key
    among them, and each privacy field of the experiment schema, belongs to a control."""
    keys = {"secure": "secure", "noise-seed": "secure_seed", "max-epsilon": "ledger",
            "target-delta": "delta", "delta": "delta", "trust": "trust"}
    level = {"target-epsilon", "noise-multiplier", "epsilons"}
    public = {"partition-seed": "the public split of a named dataset among the clients",
              "seeds": "an experiment's sweep seeds (experiments have no secure mode: the "
                       "secure key is refused, a cell of the matrix)"}
    try:
        from dpprecond.adapters.flower.app import RUN_CONFIG_KEYS
    except ImportError:
        RUN_CONFIG_KEYS = ()
    from dpprecond.experiments import schema

    fields = {name for model in (schema.DataTable, schema.PrivacyTable, schema.ProtocolTable,
                                 schema.FederationTable, schema.TuningTable,
                                 schema.ExperimentFile)
              for name, info in model.model_fields.items()
              if not (isinstance(info.annotation, type)  # a table, not a key
                      and issubclass(info.annotation, schema.BaseModel))}
    words = [w.replace("_", "-") for w in PRIVACY_WORDS]
    for key in {*RUN_CONFIG_KEYS, *fields}:
        k = key.replace("_", "-")
        if any(w in k for w in words) and k not in level and k not in public:
            assert k in keys, f"privacy key {key!r} belongs to no control"


def test_docs_table_lists_exactly_the_matrix() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text()
    section = text.split("## Every entry point, every control", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [h.strip().strip("`") for h in lines[0].strip("|").split("|")]
    assert header[1:] == list(CONTROLS)
    rows = [ln.strip("|").split("|")[0].strip().strip("`") for ln in lines[2:]]
    assert rows == list(ENTRY_POINTS)
