"""Ready-made ``server_app`` and ``client_app`` configured by Flower's run config.

These are the components of the example app (``examples/flower-app/pyproject.toml``)::

    [tool.flwr.app.components]
    serverapp = "dpprecond.adapters.flower.app:server_app"
    clientapp = "dpprecond.adapters.flower.app:client_app"

Run-config keys (``[tool.flwr.app.config]``; ``""`` means unset). Server: ``algorithm``
(a method of :mod:`dpprecond.fl.methods`: ``fedgd``, ``sofim``, ``sofim-momentum``,
``sofim-lagged``, ``adam``, ``yogi``, ``fedavg``, ``scaffold``, ``fedfc``, ``fednew``) and its
options in the table ``[tool.flwr.app.config.method-options]`` (flattened by Flower to
``method-options.<name>``, dashes for underscores; ``""`` keeps the method's default, and
an option the algorithm does not have is an error), ``n-clients``, ``n-rounds``,
``clip-norm``, ``target-epsilon`` or ``noise-multiplier`` (exactly one), ``target-delta``,
``max-epsilon`` (refuse a plan above it), ``mechanism``, ``sampling-rate``,
``local-steps``, ``local-lr`` (the Poisson mechanism of the gradient methods), ``weighting``,
``accountant``, ``secure`` (secure-mode noise at the clients), ``round-timeout``,
``connect-timeout``, ``min-replies``, ``evaluate`` (server-side accuracy on the dataset's
public test split), ``output-dir`` (write ``result.json`` and ``params.npy`` there). Data:
``data`` (a dataset name, or ``"node-file"`` for each client's own file), ``data-path``,
``features``, ``partition``, ``alpha``, ``partition-seed``, ``n-features`` and
``n-classes`` (for ``"node-file"``). Noise: ``noise-seed`` (testing only, and honoured only
by SuperNodes whose node config has ``allow-seeded-noise=true``; see
:mod:`dpprecond.adapters.flower.client_app`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context

from dpprecond._files import atomic_write
from dpprecond._validation import check_choice, check_int, check_positive, check_target_delta
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.client_app import ClientInfo, LocalData, make_client_app
from dpprecond.adapters.flower.data import NodeFileData, PartitionedDataset
from dpprecond.adapters.flower.server_app import make_server_app
from dpprecond.adapters.flower.strategy import DPFedStrategy
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import FLResult
from dpprecond.fl.methods import METHODS, Method, make_method, method_options
from dpprecond.fl.models import LinearSoftmax

__all__ = ["OPTIONS_TABLE", "RUN_CONFIG_KEYS", "check_run_config", "client_app",
           "config_from_run_config", "method_from_run_config", "server_app",
           "strategy_from_run_config"]

#: The run-config table of the method's options (``method-options.<name>``).
OPTIONS_TABLE = "method-options"

#: Every run-config key the app reads (besides ``method-options.*``); any other key is an
#: error naming it (a typo such as ``max-epsilon`` spelt ``max_epsilon``, or a control the
#: Flower app does not have, such as ``trust``, must not be silently ignored).
RUN_CONFIG_KEYS = (
    "algorithm", "n-clients", "n-rounds", "clip-norm", "target-epsilon", "noise-multiplier",
    "target-delta", "max-epsilon", "mechanism", "sampling-rate", "local-steps", "local-lr",
    "weighting", "accountant", "secure", "round-timeout", "connect-timeout", "min-replies",
    "evaluate", "output-dir", "data", "data-path", "features", "partition", "alpha",
    "partition-seed", "n-features", "n-classes", "noise-seed")


def check_run_config(run_config: dict[str, Any]) -> None:
    """Refuse a run-config key the app does not read (``ValueError`` naming it)."""
    import difflib

    for key in run_config:
        if key in RUN_CONFIG_KEYS or key.startswith(OPTIONS_TABLE + "."):
            continue
        close = difflib.get_close_matches(key, RUN_CONFIG_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"Unknown run config key {key!r}{hint}: the dpprecond Flower app "
                         f"reads {sorted(RUN_CONFIG_KEYS)} and method-options.*.")

logger = logging.getLogger(__name__)


def _optional_float(run_config: dict[str, Any], key: str) -> float | None:
    value = run_config.get(key, "")
    if value == "" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"Expected run config {key} to be a number or empty, got {value!r}.")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"Expected run config {key} to be a number or empty, got "
                         f"{value!r}.") from None


def _bool(run_config: dict[str, Any], key: str, default: bool) -> bool:
    value = run_config.get(key, default)
    if not isinstance(value, bool):  # bool("false") is True: never guess
        raise TypeError(f"Expected run config {key} to be true or false, got {value!r}.")
    return value


def _int(run_config: dict[str, Any], key: str, default: int, low: int) -> int:
    return check_int(key, run_config.get(key, default), low=low)


def _positive(run_config: dict[str, Any], key: str, default: float) -> float:
    return check_positive(key, run_config.get(key, default))


def _noise_seed(run_config: dict[str, Any]) -> int | None:
    value = run_config.get("noise-seed", "")
    return None if value in ("", None) else check_int("noise-seed", value, low=0)


def config_from_run_config(run_config: dict[str, Any]) -> FLConfig:
    """The :class:`~dpprecond.fl.simulator.FLConfig` described by a Flower run config."""
    eps = _optional_float(run_config, "target-epsilon")
    z = _optional_float(run_config, "noise-multiplier")
    if (eps is None) == (z is None):
        raise ValueError(f"Set exactly one of run config target-epsilon and noise-multiplier, "
                         f"got target-epsilon={run_config.get('target-epsilon', '')!r} and "
                         f"noise-multiplier={run_config.get('noise-multiplier', '')!r}.")
    check_target_delta("target-delta", run_config.get("target-delta", 1e-5))
    return FLConfig(
        n_rounds=run_config.get("n-rounds", 20), clip_norm=run_config.get("clip-norm", 10.0),
        target_epsilon=eps, noise_multiplier=z,
        target_delta=run_config.get("target-delta", 1e-5),
        mechanism=run_config.get("mechanism", "full-batch"),
        sampling_rate=run_config.get("sampling-rate", 1.0),
        local_steps=run_config.get("local-steps", 1),
        local_lr=run_config.get("local-lr", 0.1),
        weighting=run_config.get("weighting", "uniform"),
        accountant=run_config.get("accountant", "pld")).validated()


def _load(info: ClientInfo) -> LocalData:
    if info.run_config.get("data", "digits") == "node-file":
        return NodeFileData()(info)
    return PartitionedDataset.from_run_config(dict(info.run_config))(info)


def method_from_run_config(run_config: dict[str, Any]) -> Method:
    """``make_method(algorithm, **options)`` from ``algorithm`` and ``method-options.*``.

    Raises ``ValueError`` for an unknown option key (not an option of any method) and
    ``TypeError`` (from :func:`~dpprecond.fl.methods.make_method`) for a set option that
    the chosen algorithm does not have.
    """
    name = check_choice("algorithm", run_config.get("algorithm", "sofim"), list(METHODS))
    known = {k for m in METHODS for k in method_options(m)}
    prefix = OPTIONS_TABLE + "."
    options: dict[str, Any] = {}
    for key, value in run_config.items():
        if not key.startswith(prefix) or value == "" or value is None:
            continue
        option = key[len(prefix):].replace("-", "_")
        if option not in known:
            raise ValueError(f"Unknown run config key {key!r}: {option!r} is not an option of "
                             f"any method; known options: {sorted(known)}.")
        options[option] = value
    return make_method(name, **options)


def strategy_from_run_config(context: Context) -> DPFedStrategy:
    """Build the run's :class:`DPFedStrategy` from ``context.run_config``."""
    rc = dict(context.run_config)
    check_run_config(rc)
    config = config_from_run_config(rc)
    method = method_from_run_config(rc)
    X_test = y_test = None
    if rc.get("data", "digits") == "node-file":
        model = LinearSoftmax(check_int("n-features", rc.get("n-features")),
                              check_int("n-classes", rc.get("n-classes")))
    else:
        ds = PartitionedDataset.from_run_config(rc).dataset()
        model = LinearSoftmax(ds.n_features, ds.n_classes)
        if config.private:  # the federation's records are the dataset's training rows
            check_target_delta("target-delta", config.target_delta, ds.X_train.shape[0])
        if _bool(rc, "evaluate", True):
            X_test, y_test = ds.X_test, ds.y_test
    seed = _noise_seed(rc)
    max_eps = _optional_float(rc, "max-epsilon")
    if max_eps is not None:
        max_eps = check_positive("max-epsilon", max_eps)
    ledger = None if max_eps is None else PrivacyLedger(config.target_delta, max_eps)
    return DPFedStrategy(model, method, config, check_int("n-clients", rc.get("n-clients")),
                         X_test=X_test, y_test=y_test, seed=seed,
                         ledger=ledger, secure=_bool(rc, "secure", False),
                         connect_timeout=_positive(rc, "connect-timeout", 120.0),
                         min_replies=_int(rc, "min-replies", 1, low=1))


def _save(result: FLResult, context: Context) -> None:
    out = str(context.run_config.get("output-dir", ""))
    if not out:
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    result.config.update(algorithm=context.run_config.get("algorithm", "sofim"))
    result.save_json(path / "result.json")  # strict JSON, atomic (docs/outputs.md)
    atomic_write(path / "params.npy", lambda fh: np.save(fh, result.params))
    logger.info("wrote %s and %s", path / "result.json", path / "params.npy")


#: ServerApp configured by the run config (``flwr run``).
server_app = make_server_app(
    strategy_from_run_config,
    round_timeout=lambda ctx: _positive(dict(ctx.run_config), "round-timeout", 600.0),
    on_result=_save)

#: ClientApp: data from the run config (``data``) or the node's own file (``node-file``);
#: noise from fresh OS entropy unless the node consented to the run config's ``noise-seed``.
client_app = make_client_app(_load)
