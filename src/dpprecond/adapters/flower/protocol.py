"""What travels between the Flower server and its clients, without Flower.

The contract of the adapter: the record keys, the request the server sends a client in one
round (:class:`RoundRequest`), the arrays a client replies with (:func:`reply_shapes`), the
seed tree that makes a seeded Flower run reproduce the in-process engine
(:func:`simulator_seeds`) and the choice of a client's noise source (:func:`client_rng`).
No mathematics: what a client computes is in :mod:`~dpprecond.adapters.flower.client_side`
(calls of :mod:`dpprecond.fl.client`), what the server does in
:mod:`~dpprecond.adapters.flower.server_side` (the method's server transform).

A request has one of three kinds, one per client mechanism of :mod:`dpprecond.fl.methods`:

``"gradient"``
    ``config.mechanism``'s message (full-batch or Poisson local steps): DP-FedGD, the SOFIM
    forms, Adam, Yogi, and the gradient rounds of DP-FedFC and DP-FedNew.
``"local-steps"``
    ``local_steps`` noisy full-batch steps (DP-FedAvg), corrected by control variates
    (DP-SCAFFOLD: the server's ``c`` travels with the parameters, the client's ``c_i``
    stays in its own Flower ``context.state``).
``"second-moment"``
    The one-off noisy feature second moment of DP-FedFC and DP-FedNew (the setup round,
    numbered 0; ``clip_norm`` is then the row clip ``C_x``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from dpprecond._validation import check_choice, check_fraction, check_int, check_positive
from dpprecond.fl import client as client_mod
from dpprecond.secure import SecureGenerator

__all__ = [
    "CLIENT_MECHANISMS",
    "KEYS",
    "REQUEST_KINDS",
    "RoundRequest",
    "SeedTree",
    "client_rng",
    "reply_shapes",
    "simulator_seeds",
]

#: Client mechanisms whose noise is added by the client. ``"client-level"`` needs a trusted
#: aggregator that adds the noise after aggregation, which this adapter avoids on purpose;
#: use the in-process engine for it.
CLIENT_MECHANISMS: tuple[str, ...] = ("full-batch", "poisson")

#: The kinds of client work (module docstring).
REQUEST_KINDS: tuple[str, ...] = ("gradient", "local-steps", "second-moment")


class _Keys(NamedTuple):
    params: str = "params"        # ArrayRecord (server -> client): model, and "control" c
    control: str = "control"      # array name of the server's control variate (SCAFFOLD)
    config: str = "config"        # ConfigRecord (server -> client): the RoundRequest
    reply: str = "reply"          # ArrayRecord (client -> server): the released arrays
    message: str = "message"      # array: a gradient message (kind "gradient")
    delta_y: str = "delta-y"      # array: model change (kind "local-steps")
    delta_c: str = "delta-c"      # array: control-variate change (SCAFFOLD)
    moment: str = "moment"        # array: the noisy second moment (kind "second-moment")
    metrics: str = "metrics"      # MetricRecord (client -> server): client id (and size)
    client_id: str = "client-id"
    n_clients: str = "num-partitions"
    n_examples: str = "num-examples"
    state: str = "dpprecond-control"         # client context.state: c_i and a pending c_i+
    state_round: str = "dpprecond-control-round"  # ConfigRecord: the pending one's round


#: Record and field names shared by the server and the client.
KEYS = _Keys()


@dataclass(frozen=True)
class RoundRequest:
    """What the server asks one client in one round (sent as a ConfigRecord).

    Parameters
    ----------
    server_round : int
        Flower's round (1, 2, ...; the engine's round index is ``server_round - 1``), or 0
        for the setup round (kind ``"second-moment"``).
    kind : {"gradient", "local-steps", "second-moment"}
        What to release (module docstring).
    clip_norm : float
        Per-example clip norm ``C``; for ``"second-moment"`` the row clip ``C_x``.
    noise_multiplier : float
        The release's noise multiplier (the client adds the noise).
    mechanism, sampling_rate, local_steps, local_lr
        ``"gradient"``: the config's client mechanism; ``"local-steps"``: the method's local
        steps and local learning rate (full-batch).
    control_variates : bool
        ``"local-steps"`` with SCAFFOLD's correction (the request carries the server's ``c``).
    accepted_round : int
        SCAFFOLD: the last round in which this client's reply was aggregated (0: none). The
        client commits the control variate it computed in that round and discards any later
        one, so that its ``c_i`` only moves when the server's ``c`` moved with it.
    report_size : bool
        Reply with ``|D_i|`` (for size-weighted aggregation, and for a noise-aware server
        transform, whose noise variance depends on the sizes; the sizes are public under
        the record-level, replace-one unit, as in the paper).
    secure : bool
        Draw the noise in secure mode (:mod:`dpprecond.secure`).
    """

    server_round: int
    kind: str
    clip_norm: float
    noise_multiplier: float
    mechanism: str = "full-batch"
    sampling_rate: float = 1.0
    local_steps: int = 1
    local_lr: float = 0.1
    control_variates: bool = False
    accepted_round: int = 0
    report_size: bool = False
    secure: bool = False

    def validated(self) -> RoundRequest:
        """Check every field (``ValueError``/``TypeError`` naming it); return self."""
        check_int("server_round", self.server_round, low=0)
        check_choice("kind", self.kind, REQUEST_KINDS)
        check_positive("clip_norm", self.clip_norm, allow_inf=True)
        check_positive("noise_multiplier", self.noise_multiplier, allow_zero=True)
        check_choice("mechanism", self.mechanism, CLIENT_MECHANISMS)
        check_fraction("sampling_rate", self.sampling_rate, low_open=True, high_open=False)
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        for name in ("control_variates", "report_size", "secure"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Expected {name} to be a bool, got "
                                f"{getattr(self, name)!r}.")
        check_int("accepted_round", self.accepted_round, low=0,
                  high=max(self.server_round - 1, 0))
        if self.noise_multiplier > 0 and math.isinf(self.clip_norm):
            raise ValueError("A noisy request needs a finite clip_norm (the sensitivity is "
                             "proportional to it); got clip_norm=inf.")
        if (self.kind == "second-moment") != (self.server_round == 0):
            raise ValueError(f"Round 0 is the setup round and only asks for kind="
                             f"'second-moment'; got server_round={self.server_round}, "
                             f"kind={self.kind!r}.")
        if self.kind != "gradient" and (self.mechanism != "full-batch"
                                        or self.sampling_rate != 1.0):
            raise ValueError(f"kind={self.kind!r} releases full-batch quantities: it needs "
                             "mechanism='full-batch' and sampling_rate=1.")
        if self.kind == "gradient" and self.mechanism == "full-batch" and (
                self.local_steps != 1 or self.sampling_rate != 1.0):
            raise ValueError("mechanism='full-batch' sends one full-batch step: it needs "
                             "local_steps=1 and sampling_rate=1.")
        if self.control_variates and self.kind != "local-steps":
            raise ValueError("control_variates=True needs kind='local-steps'.")
        return self

    def to_config(self) -> dict[str, Any]:
        """Flat dict for a Flower ConfigRecord (keys with dashes, as Flower's)."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RoundRequest:
        """Parse and validate a ConfigRecord written by :meth:`to_config`."""
        names = [k.replace("_", "-") for k in cls.__dataclass_fields__]
        missing = [k for k in names if k not in config]
        if missing:
            raise ValueError(f"The round request is missing {missing}; the server and the "
                             "client run different versions of the dpprecond adapter.")
        return cls(**{k.replace("-", "_"): config[k] for k in names}).validated()


def reply_shapes(request: RoundRequest, n_params: int,
                 n_features: int | None = None) -> dict[str, tuple[int, ...]]:
    """The arrays (name -> shape) a client replies with to ``request``.

    ``n_features`` (the linear head's ``d``) is needed for ``"second-moment"``, whose reply
    is the ``(d + 1, d + 1)`` moment.
    """
    if request.kind == "gradient":
        return {KEYS.message: (n_params,)}
    if request.kind == "local-steps":
        shapes: dict[str, tuple[int, ...]] = {KEYS.delta_y: (n_params,)}
        if request.control_variates:
            shapes[KEYS.delta_c] = (n_params,)
        return shapes
    if n_features is None:
        raise ValueError("A second-moment reply's shape needs n_features.")
    return {KEYS.moment: (n_features + 1, n_features + 1)}


class SeedTree(NamedTuple):
    """The seed sequences of ``run_federated(seed=s)`` (and of ``simulate(seed=simulation)``).

    Each field is a fresh ``SeedSequence`` (nothing spawned from it yet), so it can be
    passed on: ``simulate(..., seed=simulator_seeds(s).simulation)`` is the engine run of
    ``run_federated(..., seed=s)`` on the same partition.
    """

    simulation: np.random.SeedSequence  # simulate()'s root
    init: np.random.SeedSequence        # model initialization
    noise: np.random.SeedSequence       # root of the (round, client) gradient streams
    setup: np.random.SeedSequence       # root of the one-off (covariance) releases
    partition: np.random.SeedSequence   # the client split


def simulator_seeds(seed: int) -> SeedTree:
    """The seed tree of ``run_federated(seed=seed)``, rebuilt from the integer.

    ``run_federated`` spawns ``(simulation, partition)`` from ``SeedSequence(seed)``, and
    :func:`dpprecond.fl.engine.simulate` spawns ``(init, noise, setup)`` from the simulation
    sequence; client ``i`` draws round ``t``'s noise from ``fl.client.stream(noise, t, i)``
    and its covariance from ``stream(setup, 0, i)``. Every process rebuilds the same tree
    from the integer, so a Flower client and the engine draw identical numbers. This is the
    only place the adapter mirrors the engine's spawn order (a test pins it).
    """
    seed = check_int("seed", seed, low=0)

    def child(*key: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(seed, spawn_key=key)

    return SeedTree(child(0), child(0, 0), child(0, 1), child(0, 2), child(1))


def client_rng(noise_seed: int | None, request: RoundRequest, client_id: int, *,
               secure: bool = False) -> Any:
    """The noise source of one client for one request.

    ``noise_seed=None`` (every deployment): fresh OS entropy, a new generator per call, so
    no two clients, rounds or runs share noise and nobody can predict it; in secure mode
    (``secure`` or ``request.secure``) a :class:`dpprecond.secure.SecureGenerator` (the OS
    CSPRNG, and the releases are snapped). With an integer (testing only): the engine's
    stream of ``run_federated(seed=noise_seed)`` for this (round, client); refused in secure
    mode, as the engine refuses seeds there.
    """
    secure = secure or request.secure
    if noise_seed is None:
        return SecureGenerator() if secure else np.random.default_rng()
    if secure:
        raise ValueError(f"Secure mode refuses seeded noise (got noise_seed={noise_seed!r}): "
                         "a seeded release can be regenerated by whoever knows the seed.")
    client_id = check_int("client_id", client_id, low=0)
    tree = simulator_seeds(noise_seed)
    if request.kind == "second-moment":
        return client_mod.stream(tree.setup, 0, client_id)
    return client_mod.stream(tree.noise, request.server_round - 1, client_id)
