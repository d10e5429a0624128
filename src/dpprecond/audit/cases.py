"""Worst-case audits of this library's own mechanisms (see :mod:`dpprecond.audit`).

Each builder returns an :class:`AuditCase`: a vectorized mechanism that runs the library's
*own* release code (not a re-derivation of it) on a dataset, a neighbouring pair that
reaches the release's sensitivity (replace-one), the statistic (the projection of the
output on the sensitivity direction, or the closest released quantity), the epsilon the
library claims for what is released, and ``pair_mu``: sensitivity reached by the pair
divided by the noise standard deviation. For a Gaussian release no audit of that pair can
prove more than the exact epsilon of a Gaussian mechanism with ``mu = pair_mu``
(:attr:`AuditCase.pair_epsilon`); a pair that is tight for the claim has
``pair_epsilon`` equal to ``claimed_epsilon`` when the claim is exact (PLD: the Gaussian-only
PCA methods and FL) and a little below it under the Renyi accountant (the selection).

Cases:

- :func:`pca_init_case`: the release ``M = A^T A + W`` of Algorithm 1 / Analyze Gauss
  (:func:`dpprecond.pca.core.private_init`), unit rows ``a = e1`` against ``b = e2``;
- :func:`iteration_case`: one iteration of Algorithm 2 (:func:`~dpprecond.pca.core.run_trials`
  with ``T = 1``) with the changed row clipped at the radius;
- :func:`selection_case`: the noisy score of Algorithm 3 (:func:`~dpprecond.pca.core.select`);
- :func:`fl_message_case`: one client message of full-batch DP-FedGD
  (:func:`dpprecond.fl.client.full_batch_messages`, :class:`~dpprecond.fl.models.LinearSoftmax`);
- :func:`fl_run_case`: a few rounds of DP-FedGD through :func:`dpprecond.fl.engine.simulate`;
- :func:`fl_count_case`: adaptive clipping's noisy count of one client
  (:class:`dpprecond.fl.tasks.RecordCountTask`, the client half the engine and the Flower
  client run), a record inside the clip replaced by one outside it;
- :func:`probe_case`: ``auto``'s probe, counts and rest energies per bin
  (:func:`dpprecond.pca.auto.probe`);
- :func:`auto_coupled_case`: ``auto``'s two coupled releases of ``A^T A`` (``M1``, ``M2``);
- :func:`federated_pca_case`: federated PCA's release under each trust model;
- :func:`pipeline_case`: :func:`dpprecond.pipeline.run_pipeline` end to end, every release
  observed (:func:`dpprecond.secure.observe_releases`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from dp_accounting import dp_event

from dpprecond.accounting import calibrate_noise, compose, epsilon_of, gaussian

if TYPE_CHECKING:
    from dpprecond.pca.rows import RowSource

__all__ = [
    "AuditCase",
    "BatchNoise",
    "auto_coupled_case",
    "federated_pca_case",
    "fl_count_case",
    "fl_message_case",
    "fl_run_case",
    "gram_release_statistics",
    "iteration_case",
    "pca_init_case",
    "pca_plan",
    "pipeline_case",
    "probe_case",
    "selection_case",
    "upper_triangle",
]

SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True)
class AuditCase:
    """One mechanism of the library with its worst-case pair and its claim.

    Attributes
    ----------
    name : str
    mechanism : callable
        ``(dataset, rng, n_runs) -> statistics`` of shape ``(n_runs,)`` if ``batch``,
        else ``(dataset, rng) -> statistic``.
    batch : bool
    pair : (D, D')
        Neighbouring datasets (replace-one).
    claimed_epsilon : float
        The epsilon the library reports for the audited release at ``delta``.
    delta : float
    pair_mu : float
        Sensitivity reached by the pair / noise std (see the module docstring).
    info : dict
        Noise multipliers and other parameters of the case.
    """

    name: str
    mechanism: Callable[..., Any]
    batch: bool
    pair: tuple[Any, Any]
    claimed_epsilon: float
    delta: float
    pair_mu: float
    info: dict[str, Any]

    @property
    def pair_epsilon(self) -> float:
        """Exact epsilon at ``delta`` of a Gaussian mechanism with ``mu = pair_mu``."""
        return epsilon_of(gaussian(1.0 / self.pair_mu), self.delta, "pld")


def upper_triangle(M: np.ndarray) -> np.ndarray:
    """The upper triangle (diagonal included) of the last two axes, flattened."""
    d = M.shape[-1]
    iu = np.triu_indices(d)
    return M[..., iu[0], iu[1]]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# --------------------------------------------------------------------------------------
# PCA
# --------------------------------------------------------------------------------------


def gram_release_statistics(S: np.ndarray, noise_multiplier: float, direction: np.ndarray,
                            rng: np.random.Generator, n_runs: int,
                            chunk: int = 64) -> np.ndarray:
    """``n_runs`` releases of ``S`` by :func:`~dpprecond.pca.core.private_init`, projected.

    Batched through the library's release: ``private_init`` is called on the block-diagonal
    ``I_c (x) S`` (``c = chunk`` copies); its release is ``I_c (x) S + W`` with ``W``
    symmetric Gaussian, so the ``c`` diagonal blocks are ``c`` independent releases of
    ``S`` with exactly the library's noise (the off-diagonal noise is discarded). Returns
    the projection of each block's upper triangle on ``direction`` (unit length, the
    layout of :func:`upper_triangle`).
    """
    from dpprecond.pca.core import private_init

    d = S.shape[0]
    out = np.empty(n_runs)
    for lo in range(0, n_runs, chunk):
        c = min(chunk, n_runs - lo)
        big = np.kron(np.eye(c), S)
        M = private_init(big, 1, noise_multiplier, rng).M
        if M is None:  # private_init always keeps its release
            raise RuntimeError("private_init returned no released matrix.")
        blocks = M.reshape(c, d, c, d)[np.arange(c), :, np.arange(c), :]
        out[lo:lo + c] = upper_triangle(blocks) @ direction
    return out


def pca_plan(method: str, epsilon: float, delta: float) -> tuple[Any, float, str]:
    """A PCA method's budget plan, its reported epsilon and its accountant.

    Through the method registry (:data:`dpprecond.pca.methods.METHODS`) with the method's
    default options, as :func:`dpprecond.pca.fit_private_pca` builds them.
    """
    from dpprecond.pca.methods import METHODS

    spec = METHODS[method]
    opts = spec.options({})
    plan = spec.plan(epsilon, delta, opts, None)
    return plan, epsilon_of(plan.event, delta, opts["accountant"]), opts["accountant"]


def _library_gram(X: np.ndarray) -> np.ndarray:
    from dpprecond.pca.rows import ClippedRows

    return ClippedRows.from_data(X, 1.0).gram()


def pca_init_case(epsilon: float = 1.0, delta: float = 1e-5, *, n: int = 100, d: int = 2,
                  data_seed: int = 0) -> AuditCase:
    """Algorithm 1 / Analyze Gauss: the release of the upper triangle of ``A^T A``.

    Data: ``n - 1`` fixed rows of norm <= 1 and one changed row, ``e1`` in ``D`` and ``e2``
    in ``D'`` (orthogonal unit rows: ``||triu(a a^T - b b^T)||_F = sqrt(2)``, the stated
    sensitivity). ``row_norm = 1``; the Gram matrix is the library's
    (:meth:`dpprecond.pca.rows.ClippedRows.gram`) and the noise multiplier is the one the
    method registry's Analyze Gauss plan calibrates for ``(epsilon, delta)``
    (:func:`pca_plan`; without the float-rounding inflation of ``fit_private_pca``, below
    ``1e-6``: a slightly *less* noisy release, which only makes the audit stricter).
    Statistic: the projection of the released upper triangle on
    ``triu(a a^T - b b^T) / sqrt(2)``.
    """
    rows = np.random.default_rng(data_seed).standard_normal((n - 1, d))
    rows /= np.linalg.norm(rows, axis=1).max()
    a, b = np.eye(d)[0], np.eye(d)[1]
    D, D2 = np.vstack([a, rows]), np.vstack([b, rows])
    plan, claim, accountant = pca_plan("analyze_gauss", epsilon, delta)
    z0 = plan.noise_multipliers["z0"]
    direction = _unit(upper_triangle(np.outer(b, b) - np.outer(a, a)))

    def mechanism(X: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        return gram_release_statistics(_library_gram(X), z0, direction, rng, n_runs)

    return AuditCase("PCA init / Analyze Gauss (A^T A + W)", mechanism, True, (D, D2),
                     claim, delta, 1.0 / z0,
                     {"z0": z0, "direction": direction, "n": n, "d": d,
                      "accountant": accountant})


def iteration_case(epsilon: float = 1.0, delta: float = 1e-5, *, d: int = 64,
                   clip_radius: float = 0.002, n: int = 32, h_share: float = 0.5,
                   h_floor_factor: float = 4.0, data_seed: int = 0) -> AuditCase:
    """One iteration of Algorithm 2 (releases ``H`` and ``Z``), a changed row at the radius.

    Noise: the iteration's event ``Composed([Gaussian(zH), Gaussian(zZ)])`` is calibrated to
    ``(epsilon, delta)`` with the library's split
    (:func:`dpprecond.pca.budget.trial_multipliers`, ``T = 1``) and the accountant of the
    ``"fixed"`` method (the registry's default). Public start ``X0 = e1``
    (``k = 1``). The changed row is ``a = cos(phi) e1 + sin(phi) e2`` in ``D`` and
    ``a' = cos(phi) e1 - sin(phi) e2`` in ``D'``; the other rows lie in
    ``span(e3, ..., ed)``, so ``H = X0^T A^T A X0 = cos(phi)^2`` is the same for both and
    the preconditioner sits at its public floor (``B = floor^-1/2`` unless the noise of
    ``H`` exceeds 4 standard deviations). ``cos(phi)`` is chosen so that
    ``y = cos(phi) B > R``: both rows are clipped to ``c = R`` and
    ``Z - Z' = 2 R sin(phi) e2``, within ``1e-4`` relatively of the sensitivity ``2R``.
    The mechanism runs :func:`~dpprecond.pca.core.run_trials` once with ``n_runs`` trials
    of ``T = 1`` (each with its own generator; the library batches them). The release is
    observed through the returned ``X1 = Z / ||Z||``; statistic:
    ``X1[1] / ||X1[2:]||`` (the e2 coordinate over the norm of the coordinates that carry
    only noise, which removes the normalization).
    """
    from dpprecond.pca.budget import trial_multipliers
    from dpprecond.pca.core import TrialSpec, run_trials
    from dpprecond.pca.methods import METHODS
    from dpprecond.pca.rows import ClippedRows

    accountant = METHODS["fixed"].defaults["accountant"]

    def multipliers(c: float) -> dict[str, float]:
        return trial_multipliers(c, 1, score_share=None, h_share=h_share)

    def event(c: float) -> dp_event.DpEvent:
        z = multipliers(c)
        return compose([gaussian(z["zH"]), gaussian(z["zZ"])])

    z_run = calibrate_noise(event, epsilon, delta, accountant)
    z = multipliers(z_run)
    floor = h_floor_factor * z["zH"] * SQRT2
    cos_phi = 1.01 * clip_radius * math.sqrt(floor)
    sin_phi = math.sqrt(1.0 - cos_phi**2)
    rest = np.zeros((n - 1, d))
    rest[:, 2:] = np.random.default_rng(data_seed).standard_normal((n - 1, d - 2))
    rest /= np.linalg.norm(rest, axis=1).max()
    a = np.zeros(d)
    a[0], a[1] = cos_phi, sin_phi
    a2 = a.copy()
    a2[1] = -sin_phi
    D, D2 = np.vstack([a, rest]), np.vstack([a2, rest])
    X0 = np.eye(d)[:, :1]

    def mechanism(X: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        rows = ClippedRows.from_data(X, 1.0)
        specs = [TrialSpec(clip_radius, 1, z["zH"], z["zZ"], g, h_floor_factor)
                 for g in rng.spawn(n_runs)]
        # cast: RowSource declares norms as a variable, ClippedRows has a property
        out, _ = run_trials(cast("RowSource", rows), rows.gram(), X0, specs)
        X1 = np.stack([x[:, 0] for x in out])
        return X1[:, 1] / np.linalg.norm(X1[:, 2:], axis=1)

    return AuditCase("PCA iteration (H and Z releases, T = 1)", mechanism, True, (D, D2),
                     epsilon_of(event(z_run), delta, accountant), delta, sin_phi / z["zZ"],
                     {"z_run": z_run, **z, "clip_radius": clip_radius, "sin_phi": sin_phi,
                      "d": d, "accountant": accountant})


def selection_case(epsilon: float = 1.0, delta: float = 1e-5, *, m: int = 1000, d: int = 3,
                   score_share: float = 0.9, clip_radius: float | None = None) -> AuditCase:
    """The noisy score of Algorithm 3, through :func:`dpprecond.pca.core.select`.

    Selection from a public init (``X0 = e1``, released eigenvalues ``(1, 0)`` with
    negligible noise, so ``tau_lo ~ 0``, ``tau_hi ~ 1``, ``h ~ 1``), one trial
    (``mean_trials = 1``) of ``T = 1``. ``z_run`` is calibrated so that the selection's
    event ``RepeatAndSelect(Gaussian(z_run), mean_trials=1)`` (as built by
    :func:`dpprecond.pca.budget.plan_select`) meets ``(epsilon, delta)``; the score gets
    the share ``score_share`` of it.

    Data: ``m`` rows ``e1`` plus the changed row, ``e2`` in ``D`` and the zero row in
    ``D'``. The trial's iterate depends only on rows with an ``e1`` component, so it has
    the same distribution under ``D`` and ``D'``; only the score differs:
    ``||(I - X X^T) phi(A^T A)||_2`` is about 1 for ``D`` (``phi(1) = 1`` on ``e2``) and
    about ``sin(X, e1) ~ 1e-3`` for ``D'``. The score's noise is calibrated to the
    Frobenius sensitivity ``sqrt(2)/h``; this pair (like any: the score moves by at most
    the spectral norm of the change of ``phi``) moves it by ``~1/h``, so
    ``pair_mu = 1 / (sqrt(2) z_score)``. Statistic: the released ``noisy_score``.
    """
    from dpprecond.pca.budget import trial_multipliers
    from dpprecond.pca.core import InitRelease, select
    from dpprecond.pca.methods import METHODS
    from dpprecond.pca.rows import ClippedRows

    mean_trials = 1.0
    accountant = METHODS["select"].defaults["accountant"]  # RDP: repeat-and-select

    def event(c: float) -> dp_event.DpEvent:
        return dp_event.RepeatAndSelectDpEvent(gaussian(c), mean_trials, 1)

    z_run = calibrate_noise(event, epsilon, delta, accountant)
    z = trial_multipliers(z_run, 1, score_share=score_share, h_share=0.5)
    R = 1.0 / math.sqrt(m) if clip_radius is None else clip_radius
    base = np.zeros((m + 1, d))
    base[:m, 0] = 1.0
    D, D2 = base.copy(), base.copy()
    D[m, 1] = 1.0
    init = InitRelease(X0=np.eye(d)[:, :1], eigvals=np.array([1.0, 0.0]), noise_std=1e-12)

    def mechanism(X: np.ndarray, rng: np.random.Generator) -> float:
        rows = ClippedRows.from_data(X, 1.0)
        res = select(cast("RowSource", rows), rows.gram(), init, z_run=z_run,
                     mean_trials=mean_trials,
                     score_share=score_share, h_share=0.5, radii=np.array([R]),
                     iters=np.array([1]), rng=rng)
        return res.noisy_score

    return AuditCase("PCA selection score (Algorithm 3, one trial)", mechanism, False,
                     (D, D2), epsilon_of(event(z_run), delta, accountant), delta,
                     1.0 / (SQRT2 * z["z_score"]),
                     {"z_run": z_run, "z_score": z["z_score"], "score_share": score_share,
                      "clip_radius": R, "m": m})


# --------------------------------------------------------------------------------------
# Federated learning
# --------------------------------------------------------------------------------------


def _fl_records() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four records with two features; record 0 has label 0 in ``D`` and 1 in ``D'``."""
    X = np.array([[3.0, 0.0], [1.0, 1.0], [-1.0, 0.5], [0.0, -1.0]])
    y = np.array([0, 1, 0, 1])
    y2 = y.copy()
    y2[0] = 1
    return X, y, y2


def _sensitivity_direction(model: Any, x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Unit direction of ``clip(g(x, 0)) - clip(g(x, 1))`` at the initial parameters.

    Computed with the model's own clipped gradients (two one-record clients).
    """
    params = model.init_params(np.random.default_rng(0))
    G = model.clipped_grad_sums(params, np.vstack([x, x]), np.array([0, 1]),
                                np.array([0, 1, 2]), clip_norm)
    return _unit(G[0] - G[1])


def _client_copies(release: Any, data: tuple[np.ndarray, np.ndarray],
                   rng: np.random.Generator, n_runs: int, chunk: int) -> np.ndarray:
    """``n_runs`` releases of one client's records, batched as copies of the client.

    ``release(X, y, bounds, rngs)`` runs the library's client half on ``c`` stacked copies
    (client ``i`` the ``i``-th copy, drawing from stream ``(0, i)`` of a fresh root) and
    returns one statistic per copy; ``chunk`` copies at a time.
    """
    from dpprecond.fl.client import round_generators

    Xd, yd = data
    n = Xd.shape[0]
    out = np.empty(n_runs)
    for lo in range(0, n_runs, chunk):
        c = min(chunk, n_runs - lo)
        root = np.random.SeedSequence(int(rng.integers(0, 2**63)))
        out[lo:lo + c] = release(np.tile(Xd, (c, 1)), np.tile(yd, c),
                                 np.arange(0, c * n + 1, n), round_generators(root, 0, c))
    return out


def fl_message_case(epsilon: float = 1.0, delta: float = 1e-5, *, clip_norm: float = 1.0,
                    chunk: int = 20000) -> AuditCase:
    """One client message of full-batch DP-FedGD (record-level, replace-one).

    The client holds four records; record 0 is ``(x, 0)`` in ``D`` and ``(x, 1)`` in ``D'``
    with ``||x~|| ||softmax - onehot|| > C`` at the initial (zero) parameters of
    :class:`~dpprecond.fl.models.LinearSoftmax`, so both clipped gradients have norm ``C``
    and are opposite (two classes): the change of the clipped sum is ``2C``, the stated
    sensitivity. ``z`` is the library's calibration for one round
    (:func:`dpprecond.fl.accounting.calibrate` of a one-round schedule). Runs are batched through
    the library's function: :func:`~dpprecond.fl.client.full_batch_messages` is called
    with ``chunk`` copies of the client, each drawing from its own stream (spawn key
    ``(0, i)``). Statistic: the message projected on the sensitivity direction.
    """
    from dpprecond.fl.accounting import Schedule, calibrate, training_event
    from dpprecond.fl.client import full_batch_messages
    from dpprecond.fl.models import LinearSoftmax

    X, y, y2 = _fl_records()
    model = LinearSoftmax(X.shape[1], 2)
    z = calibrate(Schedule("rounds", 1), epsilon, delta)
    u = _sensitivity_direction(model, X[0], clip_norm)
    params = model.init_params(np.random.default_rng(0))

    def copies(Xc: np.ndarray, yc: np.ndarray, bounds: np.ndarray,
               rngs: list[Any]) -> np.ndarray:
        return full_batch_messages(model, params, Xc, yc, bounds, clip_norm, z, rngs) @ u

    def mechanism(data: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
                  n_runs: int) -> np.ndarray:
        return _client_copies(copies, data, rng, n_runs, chunk)

    return AuditCase("FL client message (full-batch DP-FedGD, one round)", mechanism, True,
                     ((X, y), (X, y2)), epsilon_of(training_event(z, 1), delta, "pld"),
                     delta, 1.0 / z, {"noise_multiplier": z, "clip_norm": clip_norm})


def fl_count_case(epsilon: float = 1.0, delta: float = 1e-5, *, clip_norm: float = 1.0,
                  count_share: float = 0.5, chunk: int = 20000) -> AuditCase:
    """Adaptive clipping's count of one client (record-level, replace-one).

    The client holds the four records of :func:`fl_message_case`, except that record 0 is
    ``(0, 0)`` in ``D`` (gradient norm ``||softmax - onehot|| = 0.71 <= C`` at the zero
    parameters of :class:`~dpprecond.fl.models.LinearSoftmax`: inside the clip) and
    ``(3, 0)`` in ``D'`` (norm ``sqrt(10) * 0.71 > C``: outside), so the count changes by
    1, the stated sensitivity. ``z_b`` is the library's: the count's multiplier of a
    one-round DP-FedGD run with ``AdaptiveClip(count_share=count_share)`` calibrated to
    ``epsilon`` (:class:`~dpprecond.fl.adaptive_clip.AdaptiveClipMethod`); the claim is
    the epsilon of the count's own event, ``Gaussian(z_b)``. Runs are batched through the
    library's client half, :class:`~dpprecond.fl.tasks.RecordCountTask` on ``chunk``
    copies of the client, each drawing from its own stream. Statistic: the released count.
    """
    from dpprecond.fl.accounting import resolve_scale
    from dpprecond.fl.adaptive_clip import AdaptiveClip, AdaptiveClipMethod
    from dpprecond.fl.config import FLConfig
    from dpprecond.fl.methods import RunSpec, make_method
    from dpprecond.fl.models import LinearSoftmax
    from dpprecond.fl.tasks import RecordCountTask

    X, y, _ = _fl_records()
    X2 = X.copy()
    X[0] = 0.0  # inside the clip in D; X2[0] = (3, 0) outside it in D'
    model = LinearSoftmax(X.shape[1], 2)
    settings = AdaptiveClip(count_share=count_share)
    config = FLConfig(n_rounds=1, clip_norm=clip_norm, target_epsilon=epsilon,
                      target_delta=delta, adaptive_clip=settings).validated()
    method = AdaptiveClipMethod(make_method("fedgd"), settings)
    schedule = method.schedule(config)
    spec = RunSpec(config, schedule.multipliers(resolve_scale(schedule, config)), model, 1)
    params = model.init_params(np.random.default_rng(0))
    _, task, _ = method.begin_round(spec, None)
    event = method.count_releases(spec)[0][0]
    z_b = float(task.noise_multiplier)

    def copies(Xc: np.ndarray, yc: np.ndarray, bounds: np.ndarray,
               rngs: list[Any]) -> np.ndarray:
        return task.release(model, params, Xc, yc, bounds, rngs).arrays["count"][:, 0]

    def mechanism(data: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
                  n_runs: int) -> np.ndarray:
        return _client_copies(copies, data, rng, n_runs, chunk)

    assert isinstance(task, RecordCountTask) and event == gaussian(z_b)
    return AuditCase("FL adaptive-clipping count (one client, one round)", mechanism, True,
                     ((X, y), (X2, y)), epsilon_of(event, delta, "pld"), delta, 1.0 / z_b,
                     {"noise_multiplier": z_b, "clip_norm": clip_norm,
                      "count_share": count_share})


def fl_run_case(epsilon: float = 1.0, delta: float = 1e-5, *, n_rounds: int = 3,
                clip_norm: float = 1.0, learning_rate: float = 0.01) -> AuditCase:
    """A short DP-FedGD run through the round engine, :func:`dpprecond.fl.engine.simulate`.

    One client with the four records of :func:`fl_message_case` (record 0 relabelled in
    ``D'``), ``n_rounds`` rounds of full-batch DP-FedGD (server SGD), the noise multiplier
    calibrated by the library for ``n_rounds`` rounds and passed explicitly
    (``target_epsilon=None``), and an explicit seed per run. With a small server step the
    model stays near zero, record 0 stays clipped and its clipped gradient keeps its
    direction, so the final parameters of ``D`` and ``D'`` differ by about
    ``n_rounds * 2C`` (times the step) against noise of ``sqrt(n_rounds) 2 z C``:
    ``pair_mu = sqrt(n_rounds) / z``, the composition's own mu. Statistic: the final
    parameters projected on the round-one sensitivity direction. The claim is the epsilon
    ``simulate`` reports.
    """
    from dpprecond.fl.accounting import Schedule, calibrate, training_event
    from dpprecond.fl.config import FLConfig
    from dpprecond.fl.data import ClientData
    from dpprecond.fl.engine import simulate
    from dpprecond.fl.models import LinearSoftmax
    from dpprecond.fl.server import sgd

    X, y, y2 = _fl_records()
    model = LinearSoftmax(X.shape[1], 2)
    z = calibrate(Schedule("rounds", n_rounds), epsilon, delta)
    u = _sensitivity_direction(model, X[0], clip_norm)
    config = FLConfig(n_rounds=n_rounds, clip_norm=clip_norm, target_epsilon=None,
                      target_delta=delta, noise_multiplier=z)
    parts = [np.arange(X.shape[0])]
    pair = (ClientData.from_partition(X, y, parts, 2), ClientData.from_partition(X, y2, parts, 2))

    def mechanism(data: Any, rng: np.random.Generator) -> float:
        seed = np.random.SeedSequence(int(rng.integers(0, 2**63)))
        res = simulate(model, data, sgd(learning_rate), config, X_test=X, y_test=y, seed=seed)
        return float(res.params @ u)

    return AuditCase(f"FL run (DP-FedGD, {n_rounds} rounds, final model)", mechanism, False,
                     pair, epsilon_of(training_event(z, n_rounds), delta, "pld"), delta,
                     math.sqrt(n_rounds) / z,
                     {"noise_multiplier": z, "n_rounds": n_rounds, "clip_norm": clip_norm,
                      "learning_rate": learning_rate, "config": config, "model": model})


# --------------------------------------------------------------------------------------
# auto's releases on the production path, federated PCA, the pipeline (issue 17)
# --------------------------------------------------------------------------------------


class BatchNoise:
    """A noise source that draws a batch of ``n`` independent draws per call.

    Stands in for the generator of a release whose value is computed once (the same data in
    every run): ``standard_normal(size)`` returns shape ``(n, *size)``, so the library's
    ``value + noise`` (:func:`dpprecond.noise.release`) broadcasts to ``n`` releases, each
    with exactly the noise law of one call.
    """

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self.rng, self.n = rng, int(n)

    def standard_normal(self, size: Any = None) -> np.ndarray:
        """``n`` draws of shape ``size``: an array of shape ``(n, *size)``."""
        shape = () if size is None else tuple(np.atleast_1d(size))
        return self.rng.standard_normal((self.n, *shape))


def probe_case(epsilon: float = 1.0, delta: float = 1e-5, *, n: int = 40,
               b: float = 1e9, eps: float = 1e-4) -> AuditCase:
    """``auto``'s probe: the counts and rest energies per bin of :func:`dpprecond.pca.auto.
    probe`, on the production path.

    The release is the probe's own: its per-block vector (:func:`dpprecond.pca.auto.
    _block_probe`, summed by the rows' own pass, as ``probe`` sums it) plus Gaussian noise
    of std ``2 z`` through :func:`dpprecond.noise.release`; a test checks that for one run
    it equals ``probe``'s release for the same stream. (``probe`` splits the released
    vector into counts and energies; the audit keeps it whole, and batches the runs with
    :class:`BatchNoise`.) The noise multiplier is calibrated for one Gaussian release at
    ``(epsilon, delta)``. Pair (the sensitivity, 2): public ``X = e1``, ``B = b``
    (``k = 1``, ``d = 3``); the changed row is ``e2`` in ``D`` (no top-k part: bin 0, rest
    energy 1) and ``sqrt(1 - eps^2) e2 + eps e1`` in ``D'`` (preconditioned norm ``b eps``:
    the top bin, rest energy ``1 - eps^2``), so the vector moves by
    ``sqrt(1 + 1 + 1 + (1 - eps^2)^2) -> 2``. Statistic: the release on that change.
    """
    from dpprecond.noise import release
    from dpprecond.pca.auto import HIST_EDGES, _block_probe, _block_sum
    from dpprecond.pca.rows import ClippedRows

    unit = math.sqrt(1.0 / n)
    z = calibrate_noise(gaussian, epsilon, delta, "pld")
    rest = np.zeros((n - 1, 3))
    rest[:, 2] = np.random.default_rng(0).uniform(0.1, 0.9, n - 1)  # fixed rows, bin 0
    a = np.eye(3)[1]
    a2 = math.sqrt(1.0 - eps * eps) * np.eye(3)[1] + eps * np.eye(3)[0]
    D, D2 = np.vstack([a, rest]), np.vstack([a2, rest])
    X, B = np.eye(3)[:, :1], b * np.eye(1)
    size = 2 * (HIST_EDGES.size + 1)

    def noiseless(A: np.ndarray) -> np.ndarray:
        rows = ClippedRows.from_data(A, 1.0)
        return _block_sum(rows, _block_probe, X, B, unit, HIST_EDGES, shape=(size,))

    change = noiseless(D2) - noiseless(D)
    direction = change / np.linalg.norm(change)

    def mechanism(A: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        total = noiseless(A)
        std = 2.0 * z
        return release(total, std, BatchNoise(rng, n_runs)) @ direction

    return AuditCase("PCA auto: the probe (counts and rest energies per bin)", mechanism,
                     True, (D, D2), epsilon_of(gaussian(z), delta, "pld"), delta,
                     float(np.linalg.norm(change)) / (2.0 * z),
                     {"noise_multiplier": z, "direction": direction, "X": X, "B": B,
                      "unit": unit, "change": change})


def auto_coupled_case(epsilon: float = 1.0, delta: float = 1e-5, *, n: int = 100,
                      chunk: int = 64) -> AuditCase:
    """``auto``'s two releases of ``A^T A``, drawn coupled, through the production functions.

    The noise multipliers are :func:`~dpprecond.pca.budget.plan_auto`'s for ``(epsilon,
    delta)`` with ``auto``'s default shares: ``M1 = A^T A + first`` (multiplier
    ``z / sqrt(init_share)``) and, in the Analyze Gauss completion without a probe (the
    rule's choice when no histogram could change it), ``M2 = A^T A + second``
    (``z / sqrt(1 - init_share)``), the pair drawn by
    :func:`~dpprecond.noise.coupled_symmetric_gaussian` and released by
    :func:`dpprecond.noise.release`, exactly as :func:`~dpprecond.pca.auto.fit_auto` does
    (a test checks that, for the same stream, the releases are ``fit_auto``'s). The claim
    is the composition of those two releases. When the probe is released between them,
    ``M2`` adds to ``second`` an independent draw for the probe's share (more noise than
    here), and the probe is audited by :func:`probe_case`. Pair and batching as
    :func:`pca_init_case` (``c`` runs are the diagonal blocks of one release of
    ``I_c (x) S``). Statistic: the inverse-variance combination of the two releases'
    projections (the sufficient statistic of the pair).
    """
    from dpprecond.noise import coupled_symmetric_gaussian, release
    from dpprecond.pca.auto import AUTO_DEFAULTS
    from dpprecond.pca.budget import plan_auto

    s1 = AUTO_DEFAULTS["init_share"]
    z = plan_auto(epsilon, delta).noise_multipliers["z_pca"]
    z1, zr = z / math.sqrt(s1), z / math.sqrt(1.0 - s1)
    std1, std_ag = SQRT2 * z1, SQRT2 * z
    base = pca_init_case(epsilon, delta, n=n)
    direction = base.info["direction"]
    d = base.pair[0].shape[1]

    def mechanism(X: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        S = _library_gram(X)
        out = np.empty(n_runs)
        for lo in range(0, n_runs, chunk):
            c = min(chunk, n_runs - lo)
            big = np.kron(np.eye(c), S)
            coupled = coupled_symmetric_gaussian(c * d, std_ag, std1, rng)
            M1 = release(big, std1, rng, noise=coupled.first)
            M2 = release(big, math.sqrt(coupled.var_second), rng, noise=coupled.second)
            v1, v2 = coupled.var_first, coupled.var_second
            stats = []
            for M in (M1, M2):
                blocks = M.reshape(c, d, c, d)[np.arange(c), :, np.arange(c), :]
                stats.append(upper_triangle(blocks) @ direction)
            out[lo:lo + c] = (stats[0] / v1 + stats[1] / v2) / (1.0 / v1 + 1.0 / v2)
        return out

    event = compose([gaussian(z1), gaussian(zr)])
    return AuditCase("PCA auto: M1 and M2 of A^T A, coupled (Analyze Gauss completion)",
                     mechanism, True, base.pair, epsilon_of(event, delta, "pld"), delta,
                     math.sqrt(1.0 / z1**2 + 1.0 / zr**2),
                     {"z": z, "z1": z1, "zr": zr, "std1": std1, "std_ag": std_ag,
                      "direction": direction})


def federated_pca_case(trust: str, epsilon: float = 1.0, delta: float = 1e-5, *,
                       n: int = 99, n_clients: int = 3, chunk: int = 64) -> AuditCase:
    """Federated PCA's first release (``A^T A`` plus noise) in a trust model.

    The production path of ``fit_private_pca(clients=...)``: the changed row is client 0's,
    the noise multiplier is the registry's Analyze Gauss plan, and the release is made by
    :func:`~dpprecond.pca.core.private_init` from the source ``fit_private_pca`` builds.
    Under ``trust="local"`` the clients' parts are summed by
    :class:`~dpprecond.pca.federated.FederatedRows` and a
    :class:`~dpprecond.pca.federated.LocalNoise` of ``K`` client streams adds the noise
    (every client the central std); the claim audited is what the server sees, the
    aggregate of ``K`` client messages each carrying the central noise, i.e. the Gaussian
    mechanism with multiplier ``z sqrt(K)`` (each client's own message meets the target;
    the aggregate, its post-processing together with the other clients' noise, meets this
    stronger claim). Batching as :func:`pca_init_case`. Under ``"secure-aggregation"``
    the release is the secure sum of the clients' rounded Gram parts and Skellam shares
    (:class:`~dpprecond.secagg.sums.SecureSums`, one sum per run), the noise multiplier
    the recalibrated plan's (:func:`~dpprecond.pca.budget.secure_aggregation_plan`) and
    the claim its RDP epsilon (the target).
    """
    from dpprecond.noise import release
    from dpprecond.pca.budget import secure_aggregation_plan
    from dpprecond.pca.core import private_init
    from dpprecond.pca.federated import TRUST_MODELS, FederatedRows, LocalNoise
    from dpprecond.secagg.sums import SecureSums

    if trust not in TRUST_MODELS:
        raise ValueError(f"Unknown trust={trust!r}; expected one of {list(TRUST_MODELS)}.")
    base = pca_init_case(epsilon, delta, n=n)
    plan, claim, _ = pca_plan("analyze_gauss", epsilon, delta)
    if trust == "secure-aggregation":
        plan = secure_aggregation_plan(plan, epsilon, delta)
        claim = epsilon_of(plan.event, delta, "rdp")
    z0 = plan.noise_multipliers["z0"]
    bounds = np.linspace(0, n, n_clients + 1).astype(np.int64)
    amp = math.sqrt(n_clients) if trust == "local" else 1.0
    if trust == "local":
        claim = epsilon_of(gaussian(z0 * amp), delta, "pld")
    direction = base.info["direction"]
    d = base.pair[0].shape[1]

    def secure_mechanism(X: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        rows = FederatedRows.from_data(X, bounds, 1.0, shared=True)
        fp = 1.0 + rows.rounding_slack()
        S = rows.gram()
        streams = rng.spawn(n_clients + 1)
        source = SecureSums(streams[:n_clients], streams[n_clients], n_rows=X.shape[0],
                            fp=fp)
        out = np.empty(n_runs)
        for i in range(n_runs):  # private_init's release (its eigenvectors are not needed)
            M = release(S, z0 * fp * math.sqrt(2.0), source, symmetric=True,
                        sensitivity=math.sqrt(2.0))
            out[i] = upper_triangle(M) @ direction
        return out

    def mechanism(X: np.ndarray, rng: np.random.Generator, n_runs: int) -> np.ndarray:
        if trust == "secure-aggregation":
            return secure_mechanism(X, rng, n_runs)
        S = FederatedRows.from_data(X, bounds, 1.0).gram()
        source: Any = LocalNoise(rng.spawn(n_clients))
        out = np.empty(n_runs)
        for lo in range(0, n_runs, chunk):
            c = min(chunk, n_runs - lo)
            M = private_init(np.kron(np.eye(c), S), 1, z0, source).M
            if M is None:  # private_init always keeps its release
                raise RuntimeError("private_init returned no released matrix.")
            blocks = M.reshape(c, d, c, d)[np.arange(c), :, np.arange(c), :]
            out[lo:lo + c] = upper_triangle(blocks) @ direction
        return out

    view = ("the aggregate of 3 clients' messages" if trust == "local"
            else "the secure sum of the clients' Skellam shares")
    return AuditCase(f"Federated PCA, trust={trust}: {view}", mechanism, True, base.pair,
                     claim, delta, 1.0 / (z0 * amp),
                     {"z0": z0, "bounds": bounds, "trust": trust, "direction": direction})


def pipeline_case(epsilon: float = 1.0, delta: float = 1e-2, *, clip_norm: float = 0.5,
                  row_norm: float = 3.0, n_rounds: int = 1) -> AuditCase:
    """The pipeline end to end: :func:`dpprecond.pipeline.run_pipeline`, every release seen.

    Each run is one call of ``run_pipeline`` (private federated PCA to ``k = d = 2``
    features with the default ``auto``, then full-batch DP-FedGD; one client, so the
    federated PCA is the central one; the default ``pca_share``) with an explicit seed. The
    audit observes what an attacker of the whole pipeline sees: every release, recorded by
    :func:`dpprecond.secure.observe_releases` (``M1`` and ``M2``, then each round's client
    message; at ``k = d`` ``auto`` releases no probe). Pair: the changed record is
    ``(row_norm e1, 0)`` in ``D`` and ``(row_norm e2, 1)`` in ``D'`` (the other record is
    the same): the PCA rows move by the Gram sensitivity ``sqrt(2)``, and the record's
    clipped gradient at the zero model changes by ``sqrt(8/3) C`` (of the sensitivity
    ``2C``) whatever the released components. Statistic: the sum over releases of
    ``<r - m_D, m_D' - m_D> / std^2``, with ``m`` the noiseless release on each dataset
    given the public values before it (the components for the messages) and ``std`` the release's
    recorded noise std: the log-likelihood ratio of the Gaussian releases. The claim is the
    total ``run_pipeline`` reports (one ledger over both stages).
    """
    from dpprecond.fl.accounting import Schedule, calibrate
    from dpprecond.fl.models import LinearSoftmax
    from dpprecond.pca.budget import plan_auto
    from dpprecond.pipeline import run_pipeline, split_budget
    from dpprecond.secure import observe_releases

    fixed = np.array([[row_norm / 2, row_norm / 2]])
    D = (np.vstack([[row_norm, 0.0], fixed]), np.array([0, 1]))
    D2 = (np.vstack([[0.0, row_norm], fixed]), np.array([1, 1]))
    X_test, y_test = np.vstack([D[0], D2[0]]), np.array([0, 1, 1, 1])
    model = LinearSoftmax(2, 2)
    kw: dict[str, Any] = {"features": "pca:2", "target_epsilon": epsilon, "target_delta": delta,
          "row_norm": row_norm, "algorithm": "fedgd", "n_clients": 1,
          "n_rounds": n_rounds, "clip_norm": clip_norm, "learning_rate": 1e-6,
          # the statistic models the fixed clip's one message per round
          "adaptive_clip": None, "weighting": "uniform"}
    grams = [_library_gram(X / row_norm) for X, _ in (D, D2)]

    def features(X: np.ndarray, components: np.ndarray) -> np.ndarray:
        """The pipeline's features: the rows on the released components (k x d, as rows),
        rescaled by ``sqrt(k) / row_norm``."""
        return X @ components.T * (math.sqrt(components.shape[0]) / row_norm)

    def gradient(X: np.ndarray, y: np.ndarray, components: np.ndarray) -> np.ndarray:
        return model.clipped_grad_sums(model.init_params(np.random.default_rng(0)),
                                       features(X, components), y, np.array([0, len(y)]),
                                       clip_norm)[0]

    def mechanism(data: tuple[np.ndarray, np.ndarray], rng: np.random.Generator) -> float:
        seed = np.random.SeedSequence(int(rng.integers(0, 2**63)))
        with observe_releases() as seen:
            res = run_pipeline(data[0], data[1], X_test, y_test, 2, seed=seed, **kw)
        V = res.components  # (k, d): the released components, as rows
        if V is None or len(seen) != 2 + n_rounds:  # pragma: no cover - guards the indexing
            raise RuntimeError(f"run_pipeline released {len(seen)} values, expected M1, M2 "
                               f"and {n_rounds} client message(s)")
        stat = 0.0
        for i, (value, std) in enumerate(seen):
            if i < 2:  # M1, M2: the Gram matrix of the scaled rows
                m0, m1 = grams
            else:  # a round's client message, at the (still zero) model
                m0, m1 = gradient(*D, V), gradient(*D2, V)
                value = value.ravel()
            shift = upper_triangle(m1 - m0) if i < 2 else m1 - m0
            centred = upper_triangle(value - m0) if i < 2 else value - m0
            stat += float(centred @ shift) / std**2
        return stat

    eps_pca, eps_fl = split_budget(epsilon, delta, 0.2)

    z = plan_auto(eps_pca, delta).noise_multipliers["z_pca"]
    share = 1.0  # M1 and M2 together: the whole precision (no probe at k = d)
    z_fl = calibrate(Schedule("rounds", n_rounds), eps_fl, delta)
    mu_fl = math.sqrt(n_rounds) * math.sqrt(8.0 / 3.0) / (2.0 * z_fl)
    mu = math.sqrt(share / z**2 + mu_fl**2)
    return AuditCase("Pipeline end to end (pca:2 features, then DP-FedGD)", mechanism, False,
                     (D, D2), epsilon, delta, mu,
                     {"z_pca": z, "z_fl": z_fl, "eps_pca": eps_pca, "eps_fl": eps_fl,
                      "kw": kw, "features": features, "X_test": X_test, "y_test": y_test})
