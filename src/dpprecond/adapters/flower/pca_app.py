"""Federated private PCA driven by Flower's run config: the ``examples/flower-pca-app`` parts.

Run-config keys (``[tool.flwr.app.config]``; ``""`` means unset): ``n-components``,
``method`` (``auto``, ``analyze_gauss``, ``power``: :data:`~dpprecond.pca.remote.
REMOTE_METHODS`), ``target-epsilon``, ``target-delta``, ``row-norm`` (required: a public
bound on the l2 norm of a client's rows, never derived from the data; rows are divided by
it and clipped to norm 1 on the client; the built-in image datasets have pixels in
``[0, 1]``, so ``sqrt(d)`` bounds them: 8 for digits' 64 pixels), ``center`` (``""``: no
centering, ``"private"``: a private mean, released too), ``secure`` (secure-mode noise at
the clients), ``max-epsilon`` (refuse a plan above it, before any message),
``n-clients`` (``0``: the federation's size, the SuperNodes' ``num-partitions``),
``connect-timeout``, ``round-timeout`` (seconds per pass; a client that misses it stops the
fit), ``output-dir`` (write ``result.json``, ``components.npy`` and, where released,
``explained_variance.npy`` and ``mean.npy``). Data: ``data`` (a dataset of
:mod:`dpprecond.data`), ``data-path``, ``partition``, ``alpha``, ``partition-seed``: client
``i`` of ``K`` holds the raw training rows (pixels in ``[0, 1]``) of part ``i`` of the split
the FL app uses (:meth:`~dpprecond.adapters.flower.data.PartitionedDataset.indices`).
Noise: ``noise-seed`` (testing only, honoured only by SuperNodes whose node config has
``allow-seeded-noise=true``, as for the FL app).

Trust: ``trust`` (``"local"``, the default: every client adds its full noise; or
``"secure-aggregation"``: every release one SecAgg+ masked sum, each client adding its
Skellam share; see :mod:`dpprecond.adapters.flower.pca` and
:mod:`dpprecond.adapters.flower.pca_secagg`) and ``min-clients`` (secure aggregation only:
the fewest shares a released sum holds, ``0`` for every client). Privacy unit: one row of
one client, replace-one adjacency, rows of norm at most ``row-norm`` after clipping; the
accounting is the fit's plan (its ``dp_event`` and epsilon at ``target-delta``: the
central Gaussian plan under local trust, the Skellam plan under secure aggregation).

:func:`check_pca_run_config` checks every key and value before anything starts (a bad one
raises :class:`~dpprecond.adapters.flower.app.RunConfigError` naming it, with the closest
valid name); ``python -m dpprecond.adapters.flower.pca_app APP_DIR [--run-config "..."]``
runs the same check on an app's ``pyproject.toml`` and exits 2 on an error.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dpprecond._files import atomic_write, json_ready, write_json
from dpprecond._validation import check_int, check_positive, check_target_delta
from dpprecond.accounting import PrivacyBudgetExceededError, PrivacyLedger
from dpprecond.adapters.flower.app import RunConfigError, preflight_main, read_app_run_config
from dpprecond.adapters.flower.client_app import ClientInfo
from dpprecond.adapters.flower.data import PartitionedDataset
from dpprecond.adapters.flower.pca import check_pca_config, fit_pca_on_flower, make_pca_client_app
from dpprecond.pca.api import PCAResult
from dpprecond.pca.federated import TRUST_MODELS
from dpprecond.pca.remote import REMOTE_METHODS

__all__ = ["PCA_RUN_CONFIG_KEYS", "PCARunSettings", "check_pca_app", "check_pca_run_config",
           "client_app", "load_pca_rows", "pca_settings_from_run_config",
           "run_pca_from_run_config", "save_pca_result", "server_app"]

logger = logging.getLogger(__name__)

#: Every run-config key the PCA app reads; any other key is an error naming it.
PCA_RUN_CONFIG_KEYS = (
    "n-components", "method", "target-epsilon", "target-delta", "row-norm", "center",
    "secure", "max-epsilon", "n-clients", "connect-timeout", "round-timeout", "output-dir",
    "data", "data-path", "partition", "alpha", "partition-seed", "noise-seed", "trust",
    "min-clients")

_CENTERS = {"": None, "private": "private"}


@dataclass(frozen=True)
class PCARunSettings:
    """A checked PCA run config (:func:`pca_settings_from_run_config`)."""

    n_components: int
    method: str
    target_epsilon: float
    target_delta: float
    row_norm: float
    center: str | None
    secure: bool
    max_epsilon: float | None
    n_clients: int | None
    connect_timeout: float
    round_timeout: float
    output_dir: str | None
    data: PartitionedDataset
    noise_seed: int | None
    trust: str = "local"
    min_clients: int | None = None

    def ledger(self) -> PrivacyLedger | None:
        """A fresh ledger capped at ``max-epsilon`` (``None`` when unset)."""
        if self.max_epsilon is None:
            return None
        return PrivacyLedger(self.target_delta, self.max_epsilon)

    def fit_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~dpprecond.adapters.flower.pca.fit_pca_on_flower`
        (with a fresh :meth:`ledger`)."""
        return dict(n_components=self.n_components, method=self.method,
                    target_epsilon=self.target_epsilon, target_delta=self.target_delta,
                    row_norm=self.row_norm, center=self.center, secure=self.secure,
                    ledger=self.ledger(), n_clients=self.n_clients,
                    connect_timeout=self.connect_timeout, timeout=self.round_timeout,
                    trust=self.trust, min_clients=self.min_clients)


def _suggest(value: Any, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _number(rc: dict[str, Any], key: str, default: Any, *, required: str = "") -> float:
    value = rc.get(key, default)
    if value == "" or value is None:
        raise ValueError(f"Run config {key} is required{required}; got {value!r}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected run config {key} to be a number, got {value!r}.")
    return check_positive(key, float(value))


def _optional_number(rc: dict[str, Any], key: str) -> float | None:
    return None if rc.get(key, "") in ("", None) else _number(rc, key, "")


def _flag(rc: dict[str, Any], key: str) -> bool:
    value = rc.get(key, False)
    if not isinstance(value, bool):  # bool("false") is True: never guess
        raise TypeError(f"Expected run config {key} to be true or false, got {value!r}.")
    return value


def pca_settings_from_run_config(run_config: dict[str, Any]) -> PCARunSettings:
    """Parse a PCA run config (absent keys take the example app's defaults).

    Raises ``ValueError``/``TypeError`` naming the key; the fit's own checks are
    :func:`check_pca_run_config`'s.
    """
    rc = dict(run_config)
    from dpprecond.data import DATASETS

    method = str(rc.get("method", "auto"))
    if method not in REMOTE_METHODS:
        raise ValueError(f"Run config method={method!r}{_suggest(method, REMOTE_METHODS)} does "
                         f"not run on Flower; expected one of {list(REMOTE_METHODS)}.")
    center = rc.get("center", "")
    if center not in _CENTERS:
        raise ValueError(f"Run config center={center!r}{_suggest(center, ['private'])}: "
                         "expected '' (no centering) or 'private' (a private mean, released "
                         "with the components).")
    data = str(rc.get("data", "digits"))
    if data not in DATASETS:
        raise ValueError(f"Run config data={data!r}{_suggest(data, sorted(DATASETS))}: "
                         f"expected one of {sorted(DATASETS)}.")
    seed = rc.get("noise-seed", "")
    noise_seed = None if seed in ("", None) else check_int("noise-seed", seed, low=0)
    secure = _flag(rc, "secure")
    if secure and noise_seed is not None:
        raise ValueError(f"Run config secure=true refuses seeds (got noise-seed={noise_seed}); "
                         "leave noise-seed empty.")
    output_dir = str(rc.get("output-dir", "")) or None
    trust = str(rc.get("trust", "local"))
    if trust not in TRUST_MODELS:
        raise ValueError(f"Run config trust={trust!r}{_suggest(trust, TRUST_MODELS)}: expected "
                         f"one of {list(TRUST_MODELS)}.")
    min_clients = check_int("min-clients", rc.get("min-clients", 0), low=0) or None
    return PCARunSettings(
        n_components=check_int("n-components", rc.get("n-components", 5), low=1),
        method=method,
        target_epsilon=_number(rc, "target-epsilon", 1.0),
        target_delta=check_target_delta("target-delta", _number(rc, "target-delta", 1e-6)),
        row_norm=_number(rc, "row-norm", "", required=(
            ": a public bound on the l2 norm of a client's rows, never derived from the data "
            "(pixels in [0, 1]: sqrt(d), 8.0 for digits)")),
        center=_CENTERS[center], secure=secure,
        max_epsilon=_optional_number(rc, "max-epsilon"),
        n_clients=check_int("n-clients", rc.get("n-clients", 0), low=0) or None,
        connect_timeout=_number(rc, "connect-timeout", 120.0),
        round_timeout=_number(rc, "round-timeout", 600.0),
        output_dir=output_dir,
        data=PartitionedDataset.from_run_config({**rc, "features": "pixels"}),
        noise_seed=noise_seed, trust=trust, min_clients=min_clients)


def check_pca_run_config(run_config: dict[str, Any]) -> PCARunSettings:
    """Check every key and value of a PCA run config; load nothing, contact nobody.

    Raises :class:`~dpprecond.adapters.flower.app.RunConfigError` (a ``ValueError``) naming
    the first bad key or value (an unknown key or method with the closest valid name, a
    missing ``row-norm``, a budget the fit refuses, a plan above ``max-epsilon``).
    """
    rc = dict(run_config)
    for key in rc:
        if key not in PCA_RUN_CONFIG_KEYS:
            raise RunConfigError(
                f"Unknown run config key {key!r}{_suggest(key, PCA_RUN_CONFIG_KEYS)}: the "
                f"dpprecond PCA app reads {sorted(PCA_RUN_CONFIG_KEYS)}.")
    try:
        settings = pca_settings_from_run_config(rc)
        kwargs = settings.fit_kwargs()
        check_pca_config(kwargs.pop("n_components"), **kwargs)
    except RunConfigError:
        raise
    except (ValueError, TypeError, PrivacyBudgetExceededError) as exc:
        raise RunConfigError(f"Invalid run config: {exc}") from exc
    return settings


def load_pca_rows(info: ClientInfo) -> np.ndarray:
    """A client's raw rows: its part of the run config's ``data`` (the FL app's split)."""
    rc = dict(info.run_config)
    return PartitionedDataset.from_run_config({**rc, "features": "pixels"}).raw_rows(info)


def _save_npy(array: np.ndarray, fh: IO[bytes]) -> None:
    np.save(fh, array)


def save_pca_result(result: PCAResult, settings: PCARunSettings) -> None:
    """Write ``result.json`` (strict JSON), ``components.npy`` and, where released,
    ``explained_variance.npy`` and ``mean.npy`` to ``output-dir`` (if set)."""
    if settings.output_dir is None:
        return
    path = Path(settings.output_dir)
    path.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {}
    for key, value in result.info.items():
        try:
            info[key] = json_ready(value)
        except TypeError:
            info[key] = repr(value)
    write_json(path / "result.json", {
        "method": result.method, "n_components": settings.n_components,
        "epsilon": result.epsilon, "delta": result.delta, "dp_event": repr(result.dp_event),
        "row_norm": settings.row_norm, "center": settings.center,
        "privacy_unit": "one row of one client (replace-one), rows of norm <= row_norm",
        "trust": settings.trust, "n_samples": result.n_samples,
        "components": result.components, "explained_variance": result.explained_variance,
        "explained_variance_ratio": result.explained_variance_ratio,
        "mean": result.mean, "info": info})
    arrays = {"components": result.components, "explained_variance": result.explained_variance,
              "mean": result.mean}
    written = [path / "result.json"]
    for name, array in arrays.items():
        if array is not None:
            atomic_write(path / f"{name}.npy", partial(_save_npy, array))
            written.append(path / f"{name}.npy")
    logger.info("wrote %s", ", ".join(str(p) for p in written))


def check_secure_shape(settings: PCARunSettings) -> None:
    """Under ``trust="secure-aggregation"``, refuse a dataset whose secure sums need more
    than SecAgg+'s ``2^30`` before any node is contacted.

    The run config names the dataset, so its number of training rows ``n`` and features
    ``d`` are known at the server without the clients (the public shape
    :func:`~dpprecond.adapters.flower.pca.fit_pca_on_flower` would otherwise learn at
    registration; this loads the dataset). Every sum the method may make is bounded as
    the fit bounds it (:func:`~dpprecond.adapters.flower.pca_secagg.check_modulus`) at the
    run config's ``n-clients``, or, when it is ``0``, at the fewest clients that may
    register: ``min-clients`` (a federation has at least that many) or 2 (the fewest
    SecAgg+ masks). With ``K`` clients, ``min_clients <= K``, a sum's bound ``gamma n
    Delta + K`` and noise variance ``K / min_clients`` times the plan's are no smaller,
    so a shape whose sums need more than ``2^30`` at that ``K`` needs more at every ``K``.
    One refusal does not carry over: without ``min-clients`` (every client a share) each
    Skellam share carries ``1 / K`` of the noise, so a sum with no plan at 2 clients (a
    share's mean above the samplers' ``2^50``) may have one at more; that case is left
    to the exact check after registration (still before the charge). Raises
    :class:`~dpprecond.adapters.flower.pca.SecureAggregationUnavailableError` naming the
    sum and the bits; a shape that passes is checked again, exactly, after registration.
    """
    if settings.trust != "secure-aggregation":
        return
    from dpprecond.adapters.flower.data import raw_dataset
    from dpprecond.adapters.flower.pca import SecureAggregationUnavailableError
    from dpprecond.adapters.flower.pca_secagg import check_modulus
    from dpprecond.pca.secure_plan import ModulusUnavailableError

    n_rows, d = raw_dataset(settings.data.name, settings.data.data_path).X_train.shape
    k = settings.n_clients or max(2, settings.min_clients or 2)
    try:
        check_modulus(d, n_rows, k, settings.min_clients, method=settings.method,
                      n_components=settings.n_components,
                      target_epsilon=settings.target_epsilon,
                      target_delta=settings.target_delta, center=settings.center)
    except SecureAggregationUnavailableError as exc:
        cause = exc.__cause__
        no_plan = isinstance(cause, ModulusUnavailableError) and cause.__cause__ is not None
        if settings.n_clients or settings.min_clients or not no_plan:
            raise
        # K unknown and min_clients = K: a share's mean (var / 2K) falls as K grows, so
        # "no plan at 2 clients" is no bound on the federation that registers
        logger.info("secure PCA pre-flight: no plan at 2 clients (%s); the federation's "
                    "size decides after registration", cause)


def run_pca_from_run_config(grid: Grid, context: Context) -> PCAResult:
    """The whole run: check the run config (and, under secure aggregation, the dataset's
    shape: :func:`check_secure_shape`), register the clients, fit, log, save."""
    settings = check_pca_run_config(dict(context.run_config))  # before anything starts
    check_secure_shape(settings)  # before any node is contacted
    result = fit_pca_on_flower(grid, **settings.fit_kwargs())
    logger.info("federated PCA (%s, k=%d, %d clients, trust=%s): epsilon=%.6g at "
                "delta=%g", result.method, settings.n_components, result.info["n_clients"],
                settings.trust, result.epsilon, result.delta)
    save_pca_result(result, settings)
    return result


def check_pca_app(app_dir: str | Path, overrides: Sequence[str] = ()) -> PCARunSettings:
    """Check a PCA app's run config (``pyproject.toml`` plus ``--run-config`` overrides)
    and, under secure aggregation, its dataset's shape (:func:`check_secure_shape`)."""
    settings = check_pca_run_config(read_app_run_config(app_dir, overrides))
    try:
        check_secure_shape(settings)
    except ValueError as exc:
        raise RunConfigError(f"Invalid run config: {exc}") from exc
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpprecond.adapters.flower.pca_app APP_DIR [--run-config "k=v ..."]...``."""
    return preflight_main(check_pca_app, "dpprecond.adapters.flower.pca_app", "PCA Flower",
                          argv)


#: ServerApp configured by the run config: :func:`run_pca_from_run_config`.
server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    run_pca_from_run_config(grid, context)


#: ClientApp: this node's rows from the run config's ``data`` (:func:`load_pca_rows`);
#: noise from fresh OS entropy unless the node consented to the run config's ``noise-seed``.
client_app = make_pca_client_app(load_pca_rows)


if __name__ == "__main__":
    raise SystemExit(main())
