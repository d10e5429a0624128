"""Federated private PCA over a network under ``trust="secure-aggregation"``.

The in-process secure fit (:mod:`dpprecond.pca.federated`, ``trust="secure-aggregation"``)
makes every release a secure sum with distributed Skellam noise
(:class:`~dpprecond.secagg.sums.SecureSums`). Here the same fit runs with the clients far
away (:class:`~dpprecond.pca.remote.RemoteFederation` with a ``secure_transport``; on
Flower's SecAgg+ :mod:`dpprecond.adapters.flower.pca_secagg`):

- :class:`RemoteSecureSums` is the fit's noise source (one per stream: mean, init, main).
  :func:`dpprecond.noise.release` hands it each release (a
  :class:`~dpprecond.pca.remote.DeferredSum`, its central std and sensitivity); it plans
  the sum with :func:`~dpprecond.secagg.sums.release_plan` (the derivation of
  :class:`~dpprecond.secagg.sums.SecureSums`), sends the deferred expression and the plan
  in one ``secure-release`` request, receives only the modular sum of the clients'
  messages and decodes it with :func:`~dpprecond.secagg.skellam.decode` (refused below
  ``min_clients`` shares: :class:`~dpprecond.secagg.skellam.InsufficientNoiseError`);
- :func:`client_secure_message` is the client's half: it evaluates the expression on its
  own rows with the passes the local path uses
  (:func:`~dpprecond.pca.remote.evaluate_part`), checks the plan, and encodes its part with
  :func:`~dpprecond.secagg.sums.client_message` (scale ``gamma``, shared-uniform
  stochastic rounding, its Skellam share, modulo ``2^bits``) from its own stream;
- :func:`client_public_draw` gives the server's public randomness (the power method's
  random start): client 0's draw from its public stream is used (a data-independent
  value; seeded, every client's public stream is the in-process fit's public stream).

Privacy unit, sensitivities and accounting are the in-process secure fit's (one row,
replace-one, rows clipped to norm 1 after division by ``row_norm``; the plan's Skellam
events, charged to a ledger before the first share). The client refuses a request whose
plan is not the one :func:`~dpprecond.secagg.sums.plan_sum` derives from its public inputs
(scale and modulus; a capped plan's under its cap, with an inflation bound in ``[2^-10,
2^-3]``), whose sum would not cover the client's own bound on its part's
sensitivity (the leaf sensitivities times the public maps' norms, times its rounding
factor for the plan's ``n`` rows, which must count at least its own), whose coordinates
are not the declared release's, whose federation size is not its own, or whose noise
multiplier, with the fit's earlier releases, falls below its ``min_noise_multiplier``
(the precisions ``1/z^2`` add). The floor compares Gaussian precisions: a secure sum's
own Skellam event (``rho = 1/(2 z^2) + 1/(2 z^4 D2^2)``) costs ``1/(z D2)^2`` more,
relatively, which is below ``1e-6 / z^2`` at the default scale and at most ``1.2% / z^2``
at the coarsest a capped fit takes (``D2 >= 9``); the fit's reported epsilon counts it.

Seeds: a client with ``noise_seed`` draws release ``r`` of stream ``j`` from
``keyed_stream(noise_seed, j, i)`` (rounding uniforms, then Skellam share) and public
values from ``keyed_stream(noise_seed, j, K)``: the streams
``fit_private_pca(X, ..., seed=noise_seed, clients=bounds, trust="secure-aggregation")``
gives its client ``i`` and its public source (``default_rng(seed).spawn(3)[j].spawn(K +
1)``), so a seeded fit over a network releases the in-process fit's sums exactly (integer
sums: bit for bit). Without a seed every message draws fresh OS entropy.

Secure mode (:mod:`dpprecond.secure`), as for the local path
(:func:`~dpprecond.pca.remote.client_answer`): a request's ``secure`` flag (the server's
``fit_private_pca(..., secure=True)``, sent with every request of the fit) or the
client's own ``secure=True`` (node config ``secure-noise=true`` on Flower, whatever the
server asks) makes the client draw its rounding uniforms and Skellam share
(:func:`~dpprecond.secagg.sums.client_message`: ``.random`` then ``.poisson``) and its
public draws from :class:`~dpprecond.secure.SecureGenerator` (the OS CSPRNG), as the
in-process secure fit's clients do; the decoded sums are not snapped (integer noise on
integer parts). A seeded client refuses a request in secure mode, before it draws. The
fit's :attr:`RemoteSecureSums.secure` (and ``info["secure_aggregation"]["secure"]``) is
whether the fit asked for secure mode: every share of its sums and every public draw then
came from a client that honoured it or refused (a refusing client's share is in no
released sum).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpprecond.noise import keyed_stream
from dpprecond.pca.remote import (
    COV_TOL,
    REMOTE_METHODS,
    STREAMS,
    ClientState,
    DeferredSum,
    RemoteFederation,
    _client_rows,
    _encode,
    _Session,
    begin_request,
    evaluate_part,
    request_row_norm,
)
from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES
from dpprecond.pca.secure_plan import MAX_FIT_INFLATION
from dpprecond.secagg.skellam import InsufficientNoiseError, decode
from dpprecond.secagg.sums import (
    PCA_MIN_SCALE,
    ROUNDING_INFLATION,
    SumPlan,
    check_release_args,
    client_message,
    flatten_release,
    plan_sum,
    plans_summary,
    release_dim,
    release_plan,
    unflatten_release,
)
from dpprecond.secure import SecureGenerator

__all__ = ["SECURE_REMOTE_METHODS", "RemoteSecureSums", "SecureTransport",
           "client_public_draw", "client_secure_message", "plan_from_request",
           "plan_to_request", "secure_noise_sources"]

#: The methods a secure fit over a network runs: those of the in-process secure fit
#: whose releases are sums and whose random choices are public draws (``fixed``'s trials
#: spawn streams; ``select`` needs the exact ``A^T A``).
SECURE_REMOTE_METHODS = REMOTE_METHODS

#: ``secure_transport(request, arrays, plan) -> (sum modulo 2^bits, number of shares)``:
#: one secure sum of the clients' :func:`client_secure_message` replies (it raises
#: :class:`~dpprecond.pca.remote.ClientMissingError` when no sum was formed).
SecureTransport = Callable[[dict[str, Any], list[np.ndarray], SumPlan], tuple[np.ndarray, int]]

#: The most values a client draws for one public request (a ``(d, k)`` start).
MAX_PUBLIC_DRAW = 10**7

_PLAN_FIELDS = ("dim", "sensitivity", "noise_multiplier", "n_rows", "n_clients",
                "min_clients", "scale", "bits")
#: A capped fit's plans also carry the cap and the fit's inflation bound.
_CAP_FIELDS = ("fit_bits", "max_inflation")


def plan_to_request(plan: SumPlan, *, fit_bits: int | None = None,
                    max_inflation: float | None = None) -> dict[str, Any]:
    """A sum's plan as request fields (every field is public); with ``fit_bits``, also the
    cap and the inflation bound its scale was coarsened under
    (:mod:`dpprecond.pca.secure_plan`)."""
    fields: dict[str, Any] = {key: getattr(plan, key) for key in _PLAN_FIELDS}
    if fit_bits is not None:
        fields.update(fit_bits=int(fit_bits), max_inflation=float(max_inflation or 0.0))
    return fields


def plan_from_request(fields: Any, n_clients: int) -> SumPlan:
    """The plan a client accepts: re-derived from the sent inputs with
    :func:`~dpprecond.secagg.sums.plan_sum` (which validates them); a sent scale or modulus
    that differs from the derived one, or a federation of another size than the client's
    ``n_clients``, is refused (``ValueError``). A plan sent with ``fit_bits`` and
    ``max_inflation`` is re-derived under that cap; the bound must lie in ``[2^-10, 2^-3]``
    (:func:`~dpprecond.pca.secure_plan.fit_inflations`: what an honest capped fit sends)."""
    capped = isinstance(fields, dict) and set(fields) == set(_PLAN_FIELDS) | set(_CAP_FIELDS)
    if not isinstance(fields, dict) or (set(fields) != set(_PLAN_FIELDS) and not capped):
        raise ValueError(f"Refusing a secure release whose plan has fields "
                         f"{sorted(fields) if isinstance(fields, dict) else fields!r}; "
                         f"expected {list(_PLAN_FIELDS)}, optionally with "
                         f"{list(_CAP_FIELDS)}.")
    cap: dict[str, Any] = {}
    if capped:
        bits, bound = fields["fit_bits"], fields["max_inflation"]
        if isinstance(bits, bool) or not isinstance(bits, int) \
                or isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise ValueError(f"Refusing a plan with fit_bits={bits!r}, max_inflation="
                             f"{bound!r}: expected an int and a number.")
        if not ROUNDING_INFLATION <= float(bound) <= MAX_FIT_INFLATION:
            raise ValueError(f"Refusing a plan with max_inflation={bound!r}: a capped fit's "
                             f"inflation bound lies in [2^-10, 2^-3] (secure_plan."
                             "fit_inflations); a coarser one would make this client's share "
                             "cover a sum of more rounding than any fit accounts for.")
        cap = {"fit_bits": bits, "max_inflation": float(bound), "min_scale": PCA_MIN_SCALE}
    for key in ("dim", "n_rows", "n_clients", "min_clients", "bits"):
        if isinstance(fields[key], bool) or not isinstance(fields[key], int):
            raise ValueError(f"Refusing a plan with {key}={fields[key]!r}: expected an int.")
    if fields["n_clients"] != n_clients:
        raise ValueError(f"Refusing a plan for n_clients={fields['n_clients']}: this client "
                         f"is one of num-partitions={n_clients} (the shares' variance and the "
                         "modulus depend on it).")
    plan = plan_sum(fields["dim"], float(fields["sensitivity"]),
                    float(fields["noise_multiplier"]), n_rows=fields["n_rows"],
                    n_clients=fields["n_clients"], min_clients=fields["min_clients"], **cap)
    for key in ("scale", "bits"):
        if fields[key] != getattr(plan, key):
            raise ValueError(f"Refusing a plan whose {key}={fields[key]!r} is not the "
                             f"{getattr(plan, key)!r} derived from its dim, sensitivity, noise "
                             "multiplier, rows and clients.")
    return plan


class RemoteSecureSums:
    """One of the fit's streams (:data:`~dpprecond.pca.remote.STREAMS`) as secure sums of
    the clients' messages: :class:`~dpprecond.secagg.sums.SecureSums` over a network.

    Every release is one ``secure-release`` request through the federation's secure
    transport; ``plans`` (shared by the fit's three sources) lists every sum's plan.
    """

    def __init__(self, session: _Session, stream: int, *, n_rows: int, fp: float,
                 min_clients: int | None = None, plans: list[SumPlan] | None = None,
                 fit_bits: int | None = None, max_inflation: float | None = None) -> None:
        self._session, self.stream = session, int(stream)
        self.n_clients = int(session.n_clients)
        self.n_rows, self.fp = int(n_rows), float(fp)
        self.min_clients = self.n_clients if min_clients is None else int(min_clients)
        self.plans: list[SumPlan] = [] if plans is None else plans
        #: the transport's cap and the fit's inflation bound (SecureSums' attributes)
        self.fit_bits, self.max_inflation = fit_bits, max_inflation

    @property
    def noise_amplification(self) -> float:
        """``sqrt(K / min_clients)``, as :class:`~dpprecond.secagg.sums.SecureSums`."""
        return math.sqrt(self.n_clients / self.min_clients)

    @property
    def secure(self) -> bool:
        """Whether the fit asked for secure mode (``fit_private_pca(..., secure=True)``): then
        every request says so and every client draws its rounding, its Skellam share and
        its public draws from the OS CSPRNG, or refuses (module docstring)."""
        return self._session.secure

    def standard_normal(self, size: Any = None) -> Any:
        """Public randomness (never a release's noise): client 0's draw from its public
        stream (module docstring)."""
        shape = () if size is None else tuple(int(v) for v in np.atleast_1d(size))
        parts = self._session.call("secure-public", shape, stream=self.stream,
                                   draw_shape=list(shape))
        return float(parts[0]) if size is None else parts[0]

    def release_sum(self, value: Any, std: float, *, symmetric: bool = False,
                    sensitivity: float | None = None) -> np.ndarray:
        """The release of ``value`` (a :class:`~dpprecond.pca.remote.DeferredSum`) as one
        secure sum; the decoded sum in the value's shape (mirrored when ``symmetric``)."""
        if not isinstance(value, DeferredSum):
            raise TypeError(f"Over a network a release is a pass over the clients' rows; got "
                            f"a {type(value).__name__} (the server holds no private value).")
        sensitivity = check_release_args(std, sensitivity)
        plan = release_plan(release_dim(value.shape, symmetric), std, sensitivity,
                            fp=self.fp, n_rows=self.n_rows, n_clients=self.n_clients,
                            min_clients=self.min_clients, fit_bits=self.fit_bits,
                            max_inflation=self.max_inflation)
        self.plans.append(plan)
        arrays: list[np.ndarray] = []
        encoded = _encode(value, arrays)
        s = self._session
        total, n_shares = s.secure_call(arrays, plan, stream=self.stream,
                                        symmetric=bool(symmetric), value=encoded,
                                        plan=plan_to_request(
                                            plan, fit_bits=self.fit_bits,
                                            max_inflation=self.max_inflation))
        try:
            out = decode(total, plan, n_shares)
        except InsufficientNoiseError as exc:
            spent = s.spent(s.asked, s.releases) if s.spent is not None else ""
            raise InsufficientNoiseError(f"{exc} {spent}".strip()) from None
        s.releases += 1
        return unflatten_release(out, value.shape, symmetric)

    def spawn(self, n_children: int) -> Any:
        raise TypeError(f"A method that spawns streams (trials) does not run over a network; "
                        f"use one of {list(SECURE_REMOTE_METHODS)}.")

    def summary(self) -> dict[str, Any]:
        """As :meth:`~dpprecond.secagg.sums.SecureSums.summary` (``secure``: whether the
        fit asked for secure mode)."""
        return {**plans_summary(self.plans, self.min_clients), "secure": self.secure}


def secure_noise_sources(federation: RemoteFederation, *, fp: float,
                         min_clients: int | None, fit_bits: int | None = None,
                         max_inflation: float | None = None
                         ) -> tuple[RemoteSecureSums, ...]:
    """The fit's mean, init and main streams as secure sums over ``federation`` (sharing
    one plan list); ``fp`` is the rows' rounding factor
    (:func:`~dpprecond.pca.rows.noise_inflation` of its remote rows); ``fit_bits`` and
    ``max_inflation`` cap every sum's modulus (:mod:`dpprecond.pca.secure_plan`)."""
    if not federation.secure_aggregation:
        raise ValueError("This federation has no secure_transport; trust="
                         "'secure-aggregation' needs one (RemoteFederation(..., "
                         "secure_transport=...)).")
    plans: list[SumPlan] = []
    return tuple(RemoteSecureSums(federation.session, j, n_rows=federation.shape[0], fp=fp,
                                  min_clients=min_clients, plans=plans, fit_bits=fit_bits,
                                  max_inflation=max_inflation)
                 for j in range(len(STREAMS)))


def _stream_index(request: dict[str, Any]) -> int:
    j = request.get("stream")
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < len(STREAMS):
        raise ValueError(f"Refusing a request for stream {j!r}; expected 0..{len(STREAMS) - 1}.")
    return j


def _secure_mode(request: dict[str, Any], secure: bool, seed: int | None) -> bool:
    """Secure mode for this request (asked by the server, or the client's own); refused
    (``ValueError``) for a seeded client."""
    if not isinstance(secure, bool):
        raise TypeError(f"Expected secure to be True or False, got {secure!r}.")
    asked = request.get("secure", False)
    if not isinstance(asked, bool):
        raise ValueError(f"Refusing a request with secure={asked!r}: expected a bool.")
    on = secure or asked
    if on and seed is not None:
        raise ValueError(f"Secure mode refuses seeds (this client has noise_seed={seed!r}, "
                         f"secure mode asked by {'the server' if asked else 'this client'}): "
                         "a seeded stream can be regenerated by whoever knows the seed. "
                         "Run the client unseeded, or without secure mode.")
    return on


def _generator(state: ClientState, key: str, seed: int | None, secure: bool,
               *spawn_key: int) -> Any:
    """Secure mode's CSPRNG, fresh OS entropy, or the seeded stream ``spawn_key`` where
    this fit left it."""
    if secure:
        return SecureGenerator()
    if seed is None:
        return np.random.default_rng()
    gen = keyed_stream(seed, *spawn_key)
    if key in state.streams:
        gen.bit_generator.state = state.streams[key]
    return gen


def _keep(state: ClientState, key: str, gen: Any, seed: int | None) -> None:
    if seed is not None:
        state.streams[key] = gen.bit_generator.state


def client_secure_message(request: dict[str, Any], arrays: Sequence[np.ndarray], X: Any, *,
                          client_id: int, n_clients: int, state: ClientState,
                          noise_seed: int | None = None, min_noise_multiplier: float = 0.0,
                          secure: bool = False,
                          block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[np.ndarray, SumPlan]:
    """One client's message of a ``secure-release`` request, and the plan it follows.

    The message is :func:`~dpprecond.secagg.sums.client_message` of the client's part
    (int64 in ``[0, 2^bits)``); ``state`` is updated in place. ``secure`` (or the
    request's ``secure`` flag) draws its rounding uniforms and Skellam share from
    :class:`~dpprecond.secure.SecureGenerator`; a seeded client refuses it. Raises
    ``ValueError`` for a request it refuses (module docstring).
    """
    begin_request(request, X, state, noise_seed)
    if request.get("kind") != "secure-release":
        raise ValueError(f"Expected a 'secure-release' request, got {request.get('kind')!r}.")
    secure = _secure_mode(request, secure, noise_seed)
    plan = plan_from_request(request.get("plan"), n_clients)
    j = _stream_index(request)
    symmetric = request.get("symmetric")
    if not isinstance(symmetric, bool):
        raise ValueError(f"Refusing symmetric={symmetric!r}: expected a bool.")
    base = _client_rows(X, request_row_norm(request), block_bytes)
    if plan.n_rows < base.shape[0]:  # n counts every client's rows (and sets the slack)
        raise ValueError(f"Refusing a plan for n_rows={plan.n_rows}: this client alone holds "
                         f"{base.shape[0]} rows (its rounding bound and the modulus are "
                         "for the federation's n).")
    part, sens = evaluate_part(request["value"], arrays, base)
    flat = flatten_release(part, symmetric)
    if flat.size != plan.dim:
        raise ValueError(f"Refusing a plan of dim={plan.dim} for a release of shape "
                         f"{np.shape(part)} (symmetric={symmetric}): it sends {flat.size} "
                         "coordinates.")
    if not (math.isfinite(sens) and np.all(np.isfinite(flat))):
        raise ValueError(f"Refusing a release whose sensitivity bound is {sens!r} or whose "
                         "part is not finite.")
    own = sens * (1.0 + base.rounding_slack(plan.n_rows))
    if not own <= plan.sensitivity:
        raise ValueError(f"Refusing a plan of sensitivity {plan.sensitivity!r}: this "
                         f"client's part moves by up to {own!r} (its bound {sens!r} times its "
                         "rounding factor); the Skellam noise would not cover it.")
    z = plan.noise_multiplier
    floor = float(min_noise_multiplier)
    precision = state.precision + 1.0 / (z * z)
    if floor > 0 and not precision * floor * floor <= 1.0 + COV_TOL:
        raise ValueError(f"The plan's noise multiplier {z:.4g}, with this fit's "
                         f"{len(state.released)} earlier release(s), makes the fit a mechanism "
                         f"of noise multiplier {precision ** -0.5:.4g}, below this client's "
                         f"min-noise-multiplier={floor:g}; refusing.")
    gen = _generator(state, str(j), noise_seed, secure, j, client_id)
    message = client_message(flat, plan, gen)
    _keep(state, str(j), gen, noise_seed)
    state.precision = precision
    state.released.append({})
    return message, plan


def client_public_draw(request: dict[str, Any], X: Any, *, n_clients: int,
                       state: ClientState, noise_seed: int | None = None,
                       secure: bool = False) -> np.ndarray:
    """A ``secure-public`` request's standard normal draw of the requested shape, from the
    client's public stream ``(j, K)`` (seeded), fresh OS entropy, or in secure mode
    (``secure`` or the request's flag; refused when seeded) the OS CSPRNG; never noise."""
    begin_request(request, X, state, noise_seed)
    secure = _secure_mode(request, secure, noise_seed)
    j = _stream_index(request)
    shape = request.get("draw_shape")
    if not isinstance(shape, list) or len(shape) > 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape) \
            or math.prod(shape) > MAX_PUBLIC_DRAW:
        raise ValueError(f"Refusing a public draw of shape {shape!r}: expected at most 2 "
                         f"dimensions and {MAX_PUBLIC_DRAW} values.")
    key = f"public-{j}"
    gen = _generator(state, key, noise_seed, secure, j, n_clients)
    out = np.asarray(gen.standard_normal(None if not shape else tuple(shape)))
    _keep(state, key, gen, noise_seed)
    return out
