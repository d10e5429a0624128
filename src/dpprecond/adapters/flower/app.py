"""Ready-made ``server_app`` and ``client_app`` configured by Flower's run config.

These are the components of the example app (``examples/flower-app/pyproject.toml``)::

    [tool.flwr.app.components]
    serverapp = "dpprecond.adapters.flower.app:server_app"
    clientapp = "dpprecond.adapters.flower.app:client_app"

Run-config keys (``[tool.flwr.app.config]``; ``""`` means unset). Server: ``algorithm``
(a method of :mod:`dpprecond.fl.methods`: ``fedgd``, ``sofim``, ``sofim-momentum``,
``sofim-lagged``, ``adam``, ``yogi``, ``fedavg``, ``fedprox``, ``scaffold``, ``fedfc``,
``fednew``) and its
options in the table ``[tool.flwr.app.config.method-options]`` (flattened by Flower to
``method-options.<name>``, dashes for underscores; ``""`` keeps the method's default, and
an option the algorithm does not have is an error), ``n-clients``, ``n-rounds``,
``clip-norm``, ``target-epsilon`` or ``noise-multiplier`` (exactly one), ``target-delta``,
``max-epsilon`` (refuse a plan above it), ``mechanism``, ``sampling-rate``,
``local-steps``, ``local-lr`` (the Poisson mechanism of the gradient methods, and the
client-level one under ``trust = "secure-aggregation"``; client-level ``fedavg`` and
``fedprox`` take theirs from ``method-options`` and leave ``local-steps`` at 1),
``weighting``,
``adaptive-clip`` (``true``: adaptive clipping at its defaults, the median from
``clip-norm``, :class:`~dpprecond.fl.config.AdaptiveClip`; ``false``: a fixed clip; ``""``:
:class:`~dpprecond.fl.config.FLConfig`'s default), ``accountant``, ``secure``
(secure-mode noise at the clients), ``round-timeout``,
``connect-timeout``, ``min-replies`` (:func:`check_min_replies`: at most the federation's
size, and under secure aggregation at most ``min-clients``), ``evaluate`` (server-side
accuracy on the dataset's
public test split), ``output-dir`` (write ``result.json`` and ``params.npy`` there). Data:
``data`` (a dataset name, or ``"node-file"`` for each client's own file), ``data-path``,
``features``, ``partition``, ``alpha``, ``partition-seed``, ``n-features`` and
``n-classes`` (for ``"node-file"``). Noise: ``noise-seed`` (testing only, and honoured only
by SuperNodes whose node config has ``allow-seeded-noise=true``; see
:mod:`dpprecond.adapters.flower.client_app`).

``n-clients = 0`` means the federation's size: the ``num-partitions`` the SuperNodes were
given (in a simulation, Flower's ``num-supernodes``), asked of one connected node before
the first round; every other node must report the same.

The whole run config is checked by :func:`check_run_config` before any data is loaded,
any node is waited for or any message is sent; a bad key or value raises
:class:`RunConfigError` naming it (with the closest valid name). Before ``flwr run``,
``python -m dpprecond.adapters.flower.app APP_DIR [--run-config "..."]`` runs the same
check on the app's ``pyproject.toml`` with the overrides, without starting anything, and
exits non-zero on an error (``flwr run`` itself exits 0 when a run fails).
"""

from __future__ import annotations

import difflib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpprecond._files import atomic_write
from dpprecond._validation import check_choice, check_int, check_positive, check_target_delta
from dpprecond.accounting import DEFAULT_ACCOUNTANT, PrivacyLedger
from dpprecond.adapters.flower.client_app import ClientInfo, LocalData
from dpprecond.adapters.flower.data import NodeFileData, PartitionedDataset
from dpprecond.adapters.flower.protocol import KEYS
from dpprecond.adapters.flower.records import read_int
from dpprecond.adapters.flower.secagg import (
    SecAggDPStrategy,
    check_num_shares,
    check_secagg_plus_method,
    make_dual_client_app,
    run_secagg,
)
from dpprecond.adapters.flower.strategy import DPFedStrategy
from dpprecond.fl.adaptive_clip import with_adaptive_clip
from dpprecond.fl.config import AdaptiveClip, FLConfig
from dpprecond.fl.engine import FLResult
from dpprecond.fl.methods import (
    METHODS,
    LocalStepsMethod,
    Method,
    make_method,
    method_options,
)
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import check_secure_aggregation

__all__ = ["OPTIONS_TABLE", "RUN_CONFIG_KEYS", "RunConfigError", "check_app",
           "check_run_config", "check_secure_federation", "client_app",
           "config_from_run_config", "federation_size",
           "load_client_data", "method_from_run_config", "read_app_run_config",
           "run_from_run_config",
           "run_secagg", "save_result", "secagg_strategy_from_run_config", "server_app",
           "strategy_from_run_config"]

#: The run-config table of the method's options (``method-options.<name>``).
OPTIONS_TABLE = "method-options"

#: Every run-config key the app reads (besides ``method-options.*``); any other key is an
#: error naming it (a typo such as ``max-epsilon`` spelt ``max_epsilon``, or a control the
#: Flower app does not have, such as ``trust``, must not be silently ignored).
RUN_CONFIG_KEYS = (
    "algorithm", "n-clients", "n-rounds", "clip-norm", "target-epsilon", "noise-multiplier",
    "target-delta", "max-epsilon", "mechanism", "sampling-rate", "local-steps", "local-lr",
    "weighting", "adaptive-clip", "accountant", "secure", "round-timeout", "connect-timeout",
    "min-replies", "evaluate", "output-dir", "data", "data-path", "features", "partition", "alpha",
    "partition-seed", "n-features", "n-classes", "noise-seed", "trust", "min-clients",
    "secagg-num-shares")


class RunConfigError(ValueError):
    """A run config the app cannot run; the message names the key, the value and the fix."""


def _suggest(value: Any, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_keys(run_config: dict[str, Any]) -> None:
    for key in run_config:
        if key in RUN_CONFIG_KEYS or key.startswith(OPTIONS_TABLE + "."):
            continue
        raise RunConfigError(f"Unknown run config key {key!r}{_suggest(key, RUN_CONFIG_KEYS)}: "
                             f"the dpprecond Flower app reads {sorted(RUN_CONFIG_KEYS)} and "
                             "method-options.*.")


def _check_algorithm(run_config: dict[str, Any]) -> None:
    name = run_config.get("algorithm", "sofim")
    if name not in METHODS:
        raise RunConfigError(f"Unknown run config algorithm={name!r}"
                             f"{_suggest(name, list(METHODS))}; expected one of "
                             f"{list(METHODS)}.")


def check_min_replies(min_replies: int, n_clients: int | None,
                      min_clients: int | None = None) -> None:
    """Refuse a ``min-replies`` that no round can meet, or that secure aggregation would
    not honour.

    Under ``trust="local"`` a round with fewer than ``min-replies`` valid replies leaves
    the model unchanged, so ``min-replies > n-clients`` would train nothing. Under
    ``trust="secure-aggregation"`` the floor of a round is ``min-clients`` (a sum of fewer
    shares is never unmasked; ``0``: all ``n-clients``), so every released round has at
    least ``min-clients`` replies: ``min-replies`` is honoured when it is at most
    ``min-clients`` and refused otherwise (``min_clients`` is ``None`` under local trust;
    ``n_clients`` is ``None`` while the federation's size is not known).
    """
    if n_clients is not None and min_replies > n_clients:
        raise ValueError(f"Run config min-replies={min_replies} exceeds the federation's "
                         f"{n_clients} clients: no round could update the model; set "
                         f"min-replies <= {n_clients}.")
    if min_clients:  # secure aggregation with an explicit floor (0: all the clients)
        if min_replies > min_clients:
            raise ValueError(f"Run config min-replies={min_replies} exceeds "
                             f"min-clients={min_clients}: under trust='secure-aggregation' "
                             f"a round is released from as few as min-clients shares, so "
                             f"min-replies is not met; set min-clients >= {min_replies} "
                             "(its noise plan then needs that many survivors) or lower "
                             "min-replies.")


def check_secure_federation(n_clients: int | None, min_clients: int) -> None:
    """Under ``trust="secure-aggregation"``: refuse a federation SecAgg+ does not run, by
    its run-config keys: ``n-clients = 1`` (SecAgg+ masks each message with its
    neighbours') and ``min-clients`` above ``n-clients`` (no round could hold that many
    shares). ``n_clients`` is ``None`` while the federation's size is not known."""
    if n_clients is None:
        return
    if n_clients < 2:
        raise ValueError(f"Run config n-clients={n_clients} under "
                         "trust='secure-aggregation': SecAgg+ masks each client's message "
                         "with its neighbours', so it needs at least 2 clients; set "
                         "n-clients >= 2 (or 0: the federation's size), or trust='local'.")
    if min_clients > n_clients:
        raise ValueError(f"Run config min-clients={min_clients} exceeds n-clients="
                         f"{n_clients}: no round could hold that many shares; set "
                         f"min-clients <= {n_clients} (0: all the clients).")


def check_run_config(run_config: dict[str, Any]) -> None:
    """Check every key and value of a run config; load nothing, contact nobody.

    Raises :class:`RunConfigError` (a ``ValueError``) naming the first bad key or value:
    an unknown key or algorithm (with the closest valid name), a method option the
    algorithm does not have, privacy and training settings :class:`FLConfig` refuses, and
    the app's own settings (federation size, timeouts, data, flags, seed).
    """
    rc = dict(run_config)
    _check_keys(rc)
    _check_algorithm(rc)
    try:
        method = method_from_run_config(rc)
        _check_local_step_keys(rc, method)  # before the config's own check names them
        config = config_from_run_config(rc)
        check_int("n-clients", rc.get("n-clients", 0), low=0)
        if rc.get("data", "digits") == "node-file":
            check_int("n-features", rc.get("n-features"), low=1)
            check_int("n-classes", rc.get("n-classes"), low=2)
        else:
            PartitionedDataset.from_run_config(rc)
        if config.trust == "local":  # what the strategy's method refuses (the app's model
            # class; the checks read its type and the settings, not its sizes)
            with_adaptive_clip(method, config).check(config, LinearSoftmax(1, 2))
            if config.mechanism == "client-level":  # as the strategy refuses it, earlier
                raise ValueError("mechanism='client-level' with trust='local' needs a "
                                 "trusted aggregator to add the noise, which the Flower "
                                 "app does not have; set trust='secure-aggregation' (the "
                                 "clients add shares of the noise on SecAgg+) or use the "
                                 "in-process engine.")
        _bool(rc, "evaluate", True)
        _bool(rc, "secure", False)
        _positive(rc, "round-timeout", 600.0)
        _positive(rc, "connect-timeout", 120.0)
        min_replies = _int(rc, "min-replies", 1, low=1)
        max_eps = _optional_float(rc, "max-epsilon")
        if max_eps is not None:
            check_positive("max-epsilon", max_eps)
        seed = _noise_seed(rc)
        min_clients = check_int("min-clients", rc.get("min-clients", 0), low=0)
        num_shares = check_int("secagg-num-shares", rc.get("secagg-num-shares", 0), low=0)
        n_clients = check_int("n-clients", rc.get("n-clients", 0), low=0)
        check_min_replies(min_replies, n_clients or None,
                          min_clients if config.trust == "secure-aggregation" else None)
        if config.trust == "secure-aggregation":
            check_secure_federation(n_clients or None, min_clients)
            check_secure_aggregation(method_from_run_config(rc), config,
                                     _bool(rc, "secure", False))
            check_secagg_plus_method(method_from_run_config(rc), config)
            if num_shares:  # odd and >= 3; at most n-clients where the config gives it
                check_num_shares(num_shares, check_int("n-clients", rc.get("n-clients", 0),
                                                       low=0) or None,
                                 name="secagg-num-shares", every="0")
            if rc.get("data", "digits") == "node-file":
                raise ValueError("Run config trust='secure-aggregation' needs a named dataset "
                                 "(the modulus is sized for its number of records), not "
                                 "data='node-file'.")
        elif min_clients or num_shares:
            key, value = (("min-clients", min_clients) if min_clients
                          else ("secagg-num-shares", num_shares))
            raise ValueError(f"Run config {key}={value} applies to "
                             "trust='secure-aggregation' only; leave it 0.")
        if _bool(rc, "secure", False) and seed is not None:
            raise ValueError(f"Run config secure=true refuses seeds (got "
                             f"noise-seed={seed}); leave noise-seed empty.")
        del config
    except RunConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise RunConfigError(f"Invalid run config: {exc}") from exc


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


def _adaptive_clip(run_config: dict[str, Any], config: FLConfig) -> FLConfig:
    """``config`` with the run config's ``adaptive-clip`` (unset or ``""``: FLConfig's
    default stays)."""
    value = run_config.get("adaptive-clip", "")
    if value == "" or value is None:
        return config
    if not isinstance(value, bool):  # bool("false") is True: never guess
        raise TypeError(f"Expected run config adaptive-clip to be true (adaptive clipping "
                        f"from clip-norm towards the median norm), false (a fixed "
                        f"clip-norm) or empty (FLConfig's default), got {value!r}.")
    return replace(config, adaptive_clip=AdaptiveClip() if value else None)


def _check_local_step_keys(rc: dict[str, Any], method: Method) -> None:
    """A local-step method takes its local steps and step size from its own options: the
    mechanism's ``local-steps`` / ``local-lr`` with it are refused, naming the keys."""
    if not isinstance(method, LocalStepsMethod):
        return
    given = [(key, rc[key]) for key, default in (("local-steps", 1), ("local-lr", 0.1))
             if key in rc and rc[key] not in ("", None) and rc[key] != default]
    if given:
        keys = ", ".join(f"{key} = {value!r}" for key, value in given)
        fix = ", ".join(f"{OPTIONS_TABLE}.{key} = {value!r}" for key, value in given)
        raise ValueError(f"Run config {keys}: algorithm {method.name!r} sets its own local "
                         f"steps and step size, which the mechanism's keys do not reach. "
                         f"Leave local-steps at 1 and local-lr at 0.1 and set {fix}.")


def config_from_run_config(run_config: dict[str, Any]) -> FLConfig:
    """The :class:`~dpprecond.fl.simulator.FLConfig` described by a Flower run config."""
    eps = _optional_float(run_config, "target-epsilon")
    z = _optional_float(run_config, "noise-multiplier")
    if (eps is None) == (z is None):
        raise ValueError(f"Set exactly one of run config target-epsilon and noise-multiplier, "
                         f"got target-epsilon={run_config.get('target-epsilon', '')!r} and "
                         f"noise-multiplier={run_config.get('noise-multiplier', '')!r}.")
    check_target_delta("target-delta", run_config.get("target-delta", 1e-5))
    return _adaptive_clip(run_config, FLConfig(
        n_rounds=run_config.get("n-rounds", 20), clip_norm=run_config.get("clip-norm", 10.0),
        target_epsilon=eps, noise_multiplier=z,
        target_delta=run_config.get("target-delta", 1e-5),
        mechanism=run_config.get("mechanism", "full-batch"),
        sampling_rate=run_config.get("sampling-rate", 1.0),
        local_steps=run_config.get("local-steps", 1),
        local_lr=run_config.get("local-lr", 0.1),
        weighting=run_config.get("weighting") or None,  # unset or "": FLConfig's default
        accountant=run_config.get("accountant", DEFAULT_ACCOUNTANT),
        trust=run_config.get("trust", "local"))).validated()


def load_client_data(info: ClientInfo) -> LocalData:
    """A client's model and examples: its part of ``data``, or its node's own file."""
    if info.run_config.get("data", "digits") == "node-file":
        return NodeFileData()(info)
    return PartitionedDataset.from_run_config(dict(info.run_config))(info)


_load = load_client_data


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


def strategy_from_run_config(context: Context, *,
                             n_clients: int | None = None) -> DPFedStrategy:
    """Build the run's :class:`DPFedStrategy` from ``context.run_config``.

    ``n_clients`` overrides the run config's ``n-clients`` (which must then be set, not
    ``0``; :func:`run_from_run_config` asks the federation for its size).
    """
    rc = dict(context.run_config)
    check_run_config(rc)
    if rc.get("trust", "local") != "local":
        raise RunConfigError("Run config trust='secure-aggregation' runs on Flower's SecAgg+: "
                             "build its strategy with secagg_strategy_from_run_config (or "
                             "run run_from_run_config).")
    if n_clients is None:
        n_clients = check_int("n-clients", rc.get("n-clients", 0), low=0)
        if n_clients == 0:
            raise RunConfigError("Run config n-clients=0 means the federation's size, which "
                                 "only the Grid knows: pass n_clients (federation_size(grid, "
                                 "timeout)), or use run_from_run_config.")
    n_clients = check_int("n_clients", n_clients, low=1)
    try:  # the federation's size is known now
        check_min_replies(_int(rc, "min-replies", 1, low=1), n_clients)
    except ValueError as exc:
        raise RunConfigError(f"Invalid run config: {exc}") from exc
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
    return DPFedStrategy(model, method, config, n_clients,
                         X_test=X_test, y_test=y_test, seed=seed,
                         ledger=ledger, secure=_bool(rc, "secure", False),
                         connect_timeout=_positive(rc, "connect-timeout", 120.0),
                         min_replies=_int(rc, "min-replies", 1, low=1))


def save_result(result: FLResult, context: Context) -> None:
    """Write ``result.json`` and ``params.npy`` to the run config's ``output-dir`` (if set)."""
    out = str(context.run_config.get("output-dir", ""))
    if not out:
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    result.config.update(algorithm=context.run_config.get("algorithm", "sofim"))
    result.save_json(path / "result.json")  # strict JSON, atomic (docs/outputs.md)
    atomic_write(path / "params.npy", lambda fh: np.save(fh, result.params))
    logger.info("wrote %s and %s", path / "result.json", path / "params.npy")


def federation_size(grid: Grid, timeout: float) -> int:
    """The ``num-partitions`` of the first connected SuperNode (one ``query`` message).

    Waits up to ``timeout`` seconds for a node. The strategy then registers every node
    and refuses one that reports another size.
    """
    timeout = check_positive("timeout", timeout)
    deadline = time.monotonic() + timeout
    while not (nodes := sorted(grid.get_node_ids())):
        if time.monotonic() >= deadline:
            raise RuntimeError(f"No SuperNode connected within {timeout:g} s; start the "
                               "SuperNodes, or set n-clients in the run config.")
        time.sleep(0.2)
    content = RecordDict({KEYS.config: ConfigRecord({"request": "client-id"})})
    message = Message(content, dst_node_id=nodes[0], message_type=MessageType.QUERY)
    for reply in grid.send_and_receive([message], timeout=timeout):
        if reply.has_error():
            raise RuntimeError(f"SuperNode {nodes[0]} did not say its num-partitions: "
                               f"{reply.error.reason}")
        return read_int(reply.content[KEYS.metrics], KEYS.n_clients, "registration")
    raise RuntimeError(f"SuperNode {nodes[0]} did not answer within {timeout:g} s.")


def secagg_strategy_from_run_config(context: Context, *, n_clients: int) -> SecAggDPStrategy:
    """The :class:`~dpprecond.adapters.flower.secagg.SecAggDPStrategy` of a run config with
    ``trust = "secure-aggregation"`` (``min-clients = 0`` and ``secagg-num-shares = 0``: all
    ``n_clients``)."""
    rc = dict(context.run_config)
    check_run_config(rc)
    config = config_from_run_config(rc)
    if config.trust != "secure-aggregation":
        raise RunConfigError(f"secagg_strategy_from_run_config needs run config "
                             f"trust='secure-aggregation', got trust={config.trust!r}.")
    ds = PartitionedDataset.from_run_config(rc).dataset()
    check_target_delta("target-delta", config.target_delta, ds.X_train.shape[0])
    X_test = y_test = None
    if _bool(rc, "evaluate", True):
        X_test, y_test = ds.X_test, ds.y_test
    min_clients = check_int("min-clients", rc.get("min-clients", 0), low=0) or None
    try:  # the federation's size is known now (n-clients = 0 asks the SuperNodes)
        check_secure_federation(n_clients, min_clients or 0)
        check_min_replies(_int(rc, "min-replies", 1, low=1), n_clients, min_clients)
    except ValueError as exc:
        raise RunConfigError(f"Invalid run config: {exc}") from exc
    num_shares = check_int("secagg-num-shares", rc.get("secagg-num-shares", 0), low=0) or None
    max_eps = _optional_float(rc, "max-epsilon")
    ledger = None if max_eps is None else PrivacyLedger(config.target_delta, max_eps,
                                                        accountant="rdp")
    return SecAggDPStrategy(LinearSoftmax(ds.n_features, ds.n_classes),
                            method_from_run_config(rc), config, n_clients,
                            ds.X_train.shape[0], X_test=X_test, y_test=y_test,
                            seed=_noise_seed(rc), min_clients=min_clients, ledger=ledger,
                            num_shares=num_shares, secure=_bool(rc, "secure", False))


def run_from_run_config(grid: Grid, context: Context) -> FLResult:
    """The whole run: check the run config, size the federation, train, save.

    The check comes first (:func:`check_run_config`): a bad run config fails before any
    data is loaded or any message is sent. Server-side test accuracy is reported as
    Flower's ServerApp-side evaluate metrics.
    """
    rc = dict(context.run_config)
    check_run_config(rc)
    n_clients = check_int("n-clients", rc.get("n-clients", 0), low=0) or federation_size(
        grid, _positive(rc, "connect-timeout", 120.0))
    timeout = _positive(rc, "round-timeout", 600.0)
    if rc.get("trust", "local") == "secure-aggregation":
        result = run_secagg(grid, context, secagg_strategy_from_run_config(
            context, n_clients=n_clients), timeout)
    else:
        result = strategy_from_run_config(context, n_clients=n_clients).run(grid,
                                                                          timeout=timeout)
    logger.info("finished: %d rounds, epsilon=%.4g at delta=%g", len(result.history),
                result.epsilon, result.delta)
    save_result(result, context)
    return result


def read_app_run_config(app_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """An app's run config: its ``pyproject.toml`` table plus ``--run-config`` overrides.

    The overrides are parsed by Flower's own parser, as ``flwr run`` parses them; nothing
    is checked (raises ``FileNotFoundError`` without a ``pyproject.toml``).
    """
    import tomllib

    from flwr.common.config import flatten_dict, parse_config_args

    path = Path(app_dir) / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(f"No pyproject.toml in {str(app_dir)!r}: pass the Flower app's "
                                "directory (for example examples/flower-app).")
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    run_config = flatten_dict(table.get("tool", {}).get("flwr", {}).get("app", {})
                              .get("config", {}))
    run_config.update(parse_config_args(list(overrides)))
    return run_config


def check_app(app_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Check an app's run config (``pyproject.toml`` plus ``--run-config`` overrides).

    Returns the fused run config (:func:`read_app_run_config`); raises
    :class:`RunConfigError` (or ``FileNotFoundError``).
    """
    run_config = read_app_run_config(app_dir, overrides)
    check_run_config(run_config)
    return run_config


def preflight_main(check: Callable[[str, Sequence[str]], Any], module: str, what: str,
                   argv: Sequence[str] | None = None) -> int:
    """The pre-flight command of an app: ``python -m MODULE APP_DIR [--run-config ...]``.

    ``check(app_dir, overrides)`` raises :class:`RunConfigError` (or ``FileNotFoundError``)
    on a bad run config; the command then prints it and exits 2, else 0.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=f"Check a dpprecond {what} app's run config before `flwr run`.")
    parser.add_argument("app_dir")
    parser.add_argument("--run-config", "-c", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        check(args.app_dir, args.run_config)
    except (RunConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run config of {args.app_dir} is valid")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpprecond.adapters.flower.app APP_DIR [--run-config "k=v ..."]...``."""
    return preflight_main(check_app, "dpprecond.adapters.flower.app", "Flower", argv)


#: ServerApp configured by the run config (``flwr run``): :func:`run_from_run_config`.
server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    run_from_run_config(grid, context)


#: ClientApp: data from the run config (``data``) or the node's own file (``node-file``);
#: noise from fresh OS entropy unless the node consented to the run config's ``noise-seed``.
client_app = make_dual_client_app(load_client_data)


if __name__ == "__main__":
    raise SystemExit(main())
