"""The one round engine of federated learning: clients -> messages -> server -> ledger.

:func:`simulate` runs every method of :mod:`dpprecond.fl.methods` the same way, with all
clients in one process (vectorized over clients):

1. the method's release schedule gives the noise (calibrated once from the target, or
   given), and a ledger passed by the caller checks the *whole plan* against its
   ``max_epsilon`` before any data is touched;
2. the method's setup task on every client (its one-off releases, if any) and the server
   half's initial state;
3. each round: the method's round task on every client at once (each client draws its
   noise from its own stream, spawn key ``(round, client)``, so a run is
   engine-independent), the server half on the replies, and the schedule's releases
   (:meth:`~dpprecond.fl.accounting.Schedule.releases`) recorded in the run's ledger (and
   the caller's); with adaptive clipping, the one hook beside the halves: every client
   also releases its noisy count at the round's clip ``C_t`` (recorded before it is made;
   computed in the round's gradient pass where the model can,
   :func:`dpprecond.fl.tasks.release_round`), and the counts set ``C_{t+1}``
   (:class:`dpprecond.fl.adaptive_clip.AdaptiveClipMethod`);
4. the history: test accuracy and loss, the epsilon spent so far, the update norm;
5. optionally a crash-safe checkpoint every few rounds (:mod:`dpprecond.fl.checkpoint`):
   a run killed at any point and started again with the same arguments resumes and ends
   with the same model as an uninterrupted run.

Privacy: every client's messages satisfy the (epsilon, delta) reported in the history for
its records (for ``"client-level"``, for the whole client); see
:mod:`dpprecond.fl.accounting`. The server step is post-processing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from dp_accounting import dp_event
from tqdm.auto import tqdm

from dpprecond._threads import serial_blas
from dpprecond._validation import (
    SeedLike,
    check_array,
    check_int,
    check_labels,
    check_seed,
    check_target_delta,
)
from dpprecond.accounting import PrivacyLedger
from dpprecond.fl.accounting import resolve_scale
from dpprecond.fl.adaptive_clip import (
    AdaptiveClipMethod,
    count_root,
    resolve_adaptive_clip,
    with_adaptive_clip,
)
from dpprecond.fl.checkpoint import (
    fingerprint_of,
    lost_rounds,
    open_checkpoint,
    pending_rounds,
    resumed_spend,
    write_checkpoint,
)
from dpprecond.fl.client import kernel_rows, round_generators
from dpprecond.fl.config import MAX_NOISE_STD, FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.divergence import check_history
from dpprecond.fl.methods import Method, RunSpec
from dpprecond.fl.models import FLModel, LinearSoftmax, round_evaluator
from dpprecond.fl.result import FLResult, as_method
from dpprecond.fl.server import GradientTransformation
from dpprecond.fl.tasks import release_round
from dpprecond.secure import SECURE_ROOT

__all__ = ["FLResult", "as_method", "plan_event", "simulate"]

logger = logging.getLogger(__name__)


def _plan(model: FLModel, method: Method,
          config: FLConfig) -> tuple[Any, float, dict[str, float]]:
    """The release schedule of a run, its calibrated scale and noise multipliers."""
    method.check(config, model)
    schedule = method.schedule(config)
    scale = resolve_scale(schedule, config)
    multipliers = schedule.multipliers(scale)
    largest = max(multipliers.values()) * 2.0 * config.clip_norm
    if config.private and largest > MAX_NOISE_STD:
        raise ValueError(f"The noise std 2 z C = {largest:.3g} (noise multiplier "
                         f"{max(multipliers.values()):.3g}, clip_norm {config.clip_norm:g}) "
                         f"exceeds {MAX_NOISE_STD:g}: the run would overflow float64 and "
                         "learn nothing. Lower noise_multiplier or clip_norm (or raise "
                         "target_epsilon).")
    return schedule, scale, multipliers


def plan_event(model: FLModel, method: Method | GradientTransformation | str,
               config: FLConfig) -> dp_event.DpEvent:
    """Every release a run of ``method`` under ``config`` will make per record, as one event.

    Computed from the settings alone (no data), exactly as :func:`simulate` plans and
    charges the run: callers that compose a run with other releases check their whole
    plan against a ledger with it before touching any data.
    """
    if config.trust == "secure-aggregation":  # (1 +) T Skellam sums (dpprecond.secagg)
        from dpprecond.secagg.fl import check_secure_aggregation, secure_plan_event

        checked = check_secure_aggregation(as_method(method), config.validated(), secure=False)
        return secure_plan_event(model, config, checked)
    config = config.validated()
    schedule, scale, _ = _plan(model, with_adaptive_clip(as_method(method), config), config)
    return schedule.event(scale)


def simulate(model: FLModel, data: ClientData,
             method: Method | GradientTransformation | str, config: FLConfig, *,
             X_test: Any, y_test: Any, seed: SeedLike = None,
             ledger: PrivacyLedger | None = None, progress: bool = False,
             callback: Callable[[dict[str, float]], None] | None = None,
             checkpoint: str | os.PathLike | None = None,
             checkpoint_every: int = 10, secure: bool = False) -> FLResult:
    """Run ``config.n_rounds`` rounds of DP federated training with full participation.

    Parameters
    ----------
    model : FLModel
        The model (e.g. :class:`~dpprecond.fl.models.LinearSoftmax`).
    data : ClientData
        Client-contiguous training data.
    method : Method, GradientTransformation or str
        The algorithm: a method of :mod:`dpprecond.fl.methods` (``make_method("sofim")``),
        its name, or a server transform of :mod:`dpprecond.fl.server` (run on the config's
        client mechanism).
    config : FLConfig
        Privacy and training settings.
    X_test, y_test : ndarray
        Held-out data for the per-round accuracy and loss.
    seed : None, int, SeedSequence or Generator
        Root of all randomness: model init, and noise/sampling streams per (round, client).
        ``None`` (default) draws fresh OS entropy, so the noise is unpredictable; a fixed
        seed is for reproducible research only (anyone who knows it can regenerate the
        noise).
    ledger : PrivacyLedger, optional
        A ledger shared with other fits and runs on the same records: the whole run is
        checked against its ``max_epsilon`` before any data is touched
        (:class:`~dpprecond.PrivacyBudgetExceededError`), and every release is recorded in
        it. The history's epsilons are this run's own.
    progress : bool
        Show a tqdm progress bar.
    callback : callable, optional
        Called with each round's history record.
    checkpoint : path, optional
        A checkpoint file: written atomically every ``checkpoint_every`` rounds, resumed
        from when it exists (it must belong to the same run: method, config, model and
        data, else ``ValueError``), and deleted when the run completes. It holds the noise
        seed, so it is as sensitive as the data.
    checkpoint_every : int
        Rounds between checkpoints.
    secure : bool
        Secure mode (:mod:`dpprecond.secure`): every noise draw and Poisson mask from the
        OS CSPRNG, every release snapped to a public grid; ``seed`` must be ``None``. The
        run is not reproducible: a resumed checkpoint continues with fresh noise, and
        charges again the rounds the stopped run may have released after its last
        checkpoint (:mod:`dpprecond.fl.checkpoint`), so each resume adds at most
        ``checkpoint_every`` rounds to the epsilon.

    Returns
    -------
    FLResult
        ``history[t]`` has ``round``, ``test_accuracy``, ``test_loss``, ``epsilon`` (spent
        after the round), ``update_norm`` (``||theta_{t+1} - theta_t||``), ``seconds``.
    """
    config = config.validated()
    if config.trust == "secure-aggregation":  # the distributed-noise rounds (dpprecond.secagg)
        from dpprecond.secagg.fl import simulate_secure

        return simulate_secure(model, data, method, config, X_test=X_test, y_test=y_test,
                               seed=seed, ledger=ledger, secure=secure, progress=progress,
                               callback=callback, checkpoint=checkpoint,
                               checkpoint_every=checkpoint_every)
    # adaptive clipping as the run uses it ("auto" resolved), recorded in the run's config
    config = replace(config, adaptive_clip=resolve_adaptive_clip(as_method(method), config))
    method = with_adaptive_clip(as_method(method), config)  # a no-op without adaptive_clip
    model_classes = getattr(model, "n_classes", None)
    if model_classes is not None and model_classes != data.n_classes:
        raise ValueError(f"The model has {model_classes} classes but the data has n_classes="
                         f"{data.n_classes}; build the model with n_classes={data.n_classes}.")
    X_test = check_array("X_test", X_test)
    y_test = check_labels("y_test", y_test, data.n_classes, n_rows=X_test.shape[0])
    if X_test.shape[1] != data.X.shape[1]:
        raise ValueError(f"X_test has {X_test.shape[1]} features but the training data has "
                         f"{data.X.shape[1]}.")
    n_features = getattr(model, "n_features", data.X.shape[1])
    if n_features != data.X.shape[1]:
        raise ValueError(f"The model expects {n_features} features but the data has "
                         f"{data.X.shape[1]}; build the model with n_features="
                         f"{data.X.shape[1]}.")
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
    if config.private:  # n, the records of all clients, is treated as public
        check_target_delta("target_delta", config.target_delta, data.X.shape[0])
    schedule, scale, multipliers = _plan(model, method, config)
    if ledger is not None:  # refuse the whole plan before any data is touched
        ledger.check(schedule.event(scale))

    if secure and seed is not None:
        raise ValueError(f"secure=True refuses seeds (got seed={seed!r}): a seeded run's "
                         "noise can be regenerated by whoever knows the seed.")
    root = check_seed("seed", seed)
    resume = None
    fingerprint = ""
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        fingerprint = fingerprint_of(method, config, data, model, X_test, y_test,
                                     extra={"secure": True} if secure else None)
        resume, root = open_checkpoint(checkpoint, fingerprint, root, seeded=seed is not None,
                                       n_rounds=config.n_rounds, model=model)
    init_seq, noise_root, setup_root = root.spawn(3)
    if secure:
        noise_root = setup_root = SECURE_ROOT  # type: ignore[assignment]

    run_ledger = PrivacyLedger(config.target_delta, accountant=config.accountant)
    events: list[dp_event.DpEvent] = []

    def release(releases: list[tuple[dp_event.DpEvent, int]]) -> None:
        for event, count in releases:
            run_ledger.spend(event, count)
            events.extend([event] * count)
            if ledger is not None:
                ledger.spend(event, count)

    K = data.n_clients
    spec = RunSpec(config, multipliers, model, K)
    # adaptive clipping's hook (dpprecond.fl.adaptive_clip): a private count before each
    # round sets its clip, and the method's releases are noised at raised multipliers
    clipping = method if isinstance(method, AdaptiveClipMethod) else None
    setup_releases, round_releases = schedule.releases(
        multipliers if clipping is None else clipping.inner_spec(spec).multipliers)
    task = method.round_task(spec)
    clients = list(range(K))
    sizes = np.diff(data.bounds)
    X_run, x_sq_norms = kernel_rows(data.X, config, model)
    history: list[dict[str, float]] = []
    if resume is None:
        params = model.init_params(np.random.default_rng(init_seq))
        setup_task = method.setup_task(spec)
        setup = None
        if setup_task is not None:  # the one-off releases, from the setup streams
            setup = setup_task.release(model, None, data.X, data.y, data.bounds,
                                       round_generators(setup_root, 0, K)).arrays
            release(setup_releases)
        state = (method.server_init(spec, params, setup, clients),
                 task.initial_state(K, params.shape[0]))
        first = 0
    else:
        params, state, history = resume["params"], resume["state"], resume["history"]
        first = int(resume["round"])
        lost = lost_rounds(resume, secure)
        per_round = [*(clipping.count_releases(spec) if clipping is not None else []),
                     *round_releases]
        if lost and ledger is not None:  # what this process will spend, before any charge
            ledger.check(resumed_spend(resume["events"], per_round,
                                       lost + config.n_rounds - first))
        release([(event, 1) for event in resume["events"]])
        if lost:  # released by the crashed process, released again now: charged twice
            for _ in range(lost):
                release(per_round)
            assert checkpoint is not None
            # the charge is kept in the file before anything is released, so that a crash
            # of this run before its next checkpoint is charged again on the next resume
            write_checkpoint(checkpoint, fingerprint, root, first, params, state, history,
                             events, int(resume["pending"]))
            logger.warning("Secure mode resumes %s from %s at round %d: the %d rounds after "
                           "it may have been released by the stopped run, and are charged "
                           "again (fresh noise).", method.name, checkpoint, first, lost)
        logger.info("Resuming %s from %s at round %d.", method.name, checkpoint, first)
    logger.info("FL run %s: K=%d, T=%d, noise %s, mechanism=%s", method.name,
                data.n_clients, config.n_rounds, multipliers, config.mechanism)
    # The linear head's kernel runs its own pool of single-threaded BLAS blocks; a
    # multi-threaded BLAS call elsewhere in the round (evaluation, server step) leaves
    # OpenBLAS threads spinning that then compete with that pool (measured on Fashion-MNIST,
    # K = 20: 86 ms against 51 ms per round), so the rounds run with one BLAS thread.
    blas = serial_blas() if isinstance(model, LinearSoftmax) else contextlib.nullcontext()
    evaluate = round_evaluator(model, X_test, y_test)
    with blas:
        for t in tqdm(range(first, config.n_rounds), disable=not progress, desc="rounds",
                      unit="round", initial=first, total=config.n_rounds):
            start = time.perf_counter()
            server_state, client_state = state
            round_spec, round_task, count_task, count_rngs = spec, task, None, None
            if clipping is not None:  # this round's clip C_t and its count, recorded
                round_spec, count_task, server_state = clipping.begin_round(spec,
                                                                            server_state)
                release(clipping.count_releases(spec))
                round_task = clipping.round_task(round_spec)
                count_rngs = round_generators(count_root(noise_root), t, K)
            out = release_round(round_task, count_task, model, params, X_run, data.y,
                                data.bounds,
                                round_generators(noise_root, t, K + task.server_streams),
                                count_rngs, broadcast=method.broadcast(server_state),
                                client_state=client_state, x_sq_norms=x_sq_norms,
                                count_X=data.X)
            release(round_releases)
            if clipping is not None:  # the clip of the next round, from the counts
                server_state = clipping.update_clip(round_spec, out.arrays, sizes,
                                                    server_state)
            updates, server_state = method.server_update(round_spec, out.arrays, clients,
                                                         sizes, server_state, params)
            state = (server_state, out.client_state)
            params = params + updates
            seconds = time.perf_counter() - start
            loss, acc = evaluate(params)
            record = {"round": t + 1, "test_accuracy": acc, "test_loss": loss,
                      "epsilon": run_ledger.epsilon,
                      "update_norm": float(np.linalg.norm(updates)), "seconds": seconds}
            history.append(record)
            if callback is not None:
                callback(record)
            if checkpoint is not None and (t + 1) % checkpoint_every == 0 \
                    and t + 1 < config.n_rounds:
                write_checkpoint(checkpoint, fingerprint, root, t + 1, params, state, history,
                                 events, pending_rounds(secure, checkpoint_every, t + 1,
                                                        config.n_rounds))
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)  # the seed must not outlive the run
    check_history(history, method.name)  # every method warns when its test loss climbed
    eps = history[-1]["epsilon"]
    return FLResult(params, history, method.noise_multiplier(multipliers), eps,
                    config.target_delta, {**asdict(config), **method.describe()},
                    events)
