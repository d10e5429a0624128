"""What travels between the Flower server and its clients, without Flower.

This module is the contract of the adapter: the keys of the records, the per-round request
the server sends (:class:`RoundRequest`), the seed tree that makes a seeded Flower run
reproduce the in-process simulator, and the two Flower-free steps the adapter delegates:
the client's message (:func:`client_message`, a call of the simulator's client mechanism on
one client) and the server's aggregate (:func:`aggregate`). No mathematics of its own: the
mechanisms live in :mod:`dpprecond.fl.client`, the weights in
:mod:`dpprecond.fl.partition`, the server transforms in :mod:`dpprecond.fl.server`.

Library functions used (the whole dependency of the adapter on :mod:`dpprecond.fl`):
``fl.client.full_batch_messages``, ``fl.client.poisson_local_messages``,
``fl.client.stream``, ``fl.partition.client_weights``, ``fl.accounting.training_event``
(through :func:`epsilon_after_rounds`) and ``dpprecond.accounting.epsilon_of``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from dpprecond import accounting
from dpprecond._validation import check_choice, check_fraction, check_int, check_positive
from dpprecond.fl import client as client_mod
from dpprecond.fl.accounting import training_event
from dpprecond.fl.models import FLModel
from dpprecond.fl.partition import client_weights

__all__ = [
    "CLIENT_MECHANISMS",
    "KEYS",
    "RoundRequest",
    "SeedTree",
    "aggregate",
    "client_message",
    "client_rng",
    "epsilon_after_rounds",
    "simulator_seeds",
]

#: Client mechanisms that are "one noisy message per client per round" with the noise added
#: by the client. ``"client-level"`` needs a trusted aggregator that adds the noise after
#: aggregation, which is exactly what this adapter avoids; use the simulator for it.
CLIENT_MECHANISMS: tuple[str, ...] = ("full-batch", "poisson")


class _Keys(NamedTuple):
    params: str = "params"      # ArrayRecord (server -> client): the current model
    config: str = "config"      # ConfigRecord (server -> client): the RoundRequest
    message: str = "message"    # ArrayRecord (client -> server): the noisy message
    metrics: str = "metrics"    # MetricRecord (client -> server): client id and size
    client_id: str = "client-id"
    n_clients: str = "num-partitions"
    n_examples: str = "num-examples"


#: Record and field names shared by the server and the client.
KEYS = _Keys()


@dataclass(frozen=True)
class RoundRequest:
    """What the server asks every client in one round (sent as a ConfigRecord).

    ``server_round`` counts from 1 as in Flower; the simulator's round index is
    ``server_round - 1``. The remaining fields are the client mechanism's settings
    (:mod:`dpprecond.fl.client`).
    """

    server_round: int
    clip_norm: float
    noise_multiplier: float
    mechanism: str = "full-batch"
    sampling_rate: float = 1.0
    local_steps: int = 1
    local_lr: float = 0.1

    def validated(self) -> RoundRequest:
        """Check every field (``ValueError``/``TypeError`` naming it); return self."""
        check_int("server_round", self.server_round, low=1)
        check_positive("clip_norm", self.clip_norm, allow_inf=True)
        check_positive("noise_multiplier", self.noise_multiplier, allow_zero=True)
        check_choice("mechanism", self.mechanism, CLIENT_MECHANISMS)
        check_fraction("sampling_rate", self.sampling_rate, low_open=True, high_open=False)
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        if self.noise_multiplier > 0 and math.isinf(self.clip_norm):
            raise ValueError("A noisy request needs a finite clip_norm (the sensitivity is "
                             "2 * clip_norm); got clip_norm=inf.")
        if self.mechanism == "full-batch" and (self.local_steps != 1
                                               or self.sampling_rate != 1.0):
            raise ValueError("mechanism='full-batch' sends one full-batch step: it needs "
                             "local_steps=1 and sampling_rate=1.")
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


class SeedTree(NamedTuple):
    """The seed sequences that :func:`dpprecond.fl.simulator.run_federated` derives."""

    init: np.random.SeedSequence       # model initialization
    noise: np.random.SeedSequence      # root of the (round, client) noise streams
    partition: np.random.SeedSequence  # the client split


def simulator_seeds(seed: int) -> SeedTree:
    """The seed tree of ``run_federated(seed=seed)``, rebuilt from the integer.

    ``run_federated`` spawns ``(simulation, partition)`` from ``SeedSequence(seed)`` and
    :func:`~dpprecond.fl.simulator.simulate` spawns ``(init, noise)`` from the simulation
    sequence; client ``i`` draws round ``t`` from ``fl.client.stream(noise, t, i)``. Every
    process rebuilds the same tree from the integer, so a Flower client and the simulator
    draw identical numbers. This is the only place the adapter mirrors the simulator's
    spawn order (a test pins it).
    """
    root = np.random.SeedSequence(check_int("seed", seed, low=0))
    simulation, partition = root.spawn(2)
    init, noise = simulation.spawn(2)
    return SeedTree(init, noise, partition)


def client_rng(noise_seed: int | None, server_round: int, client_id: int) -> np.random.Generator:
    """The generator of one client in one round.

    ``noise_seed=None`` (every deployment): a generator seeded from fresh OS entropy at each
    call, so no two clients, rounds or runs share noise and nobody can predict it. With an
    integer (testing only): the simulator's stream of ``(server_round - 1, client_id)``.
    """
    if noise_seed is None:
        return np.random.default_rng()
    check_int("server_round", server_round, low=1)
    check_int("client_id", client_id, low=0)
    return client_mod.stream(simulator_seeds(noise_seed).noise, server_round - 1, client_id)


def client_message(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                   request: RoundRequest, rng: np.random.Generator) -> np.ndarray:
    """One client's noisy message, shape ``(n_params,)``, from the simulator's mechanism.

    The client's examples are one block ``bounds = [0, n]`` of the simulator's
    client-contiguous layout, so this is row ``i`` of what the simulator computes for all
    clients at once. Privacy unit, sensitivity and event: see :mod:`dpprecond.fl.client`
    (``"full-batch"``: replace-one, ``2C``, ``GaussianDpEvent(z)`` per round).
    """
    request = request.validated()
    bounds = np.array([0, X.shape[0]], dtype=np.int64)
    if request.mechanism == "full-batch":
        U = client_mod.full_batch_messages(model, params, X, y, bounds, request.clip_norm,
                                           request.noise_multiplier, [rng])
    else:
        U = client_mod.poisson_local_messages(
            model, params, X, y, bounds, request.clip_norm, request.noise_multiplier, [rng],
            sampling_rate=request.sampling_rate, local_steps=request.local_steps,
            local_lr=request.local_lr)
    return U[0]


def aggregate(messages: np.ndarray, sizes: np.ndarray, weighting: str = "uniform") -> np.ndarray:
    """``G = sum_i w_i u_i`` over the clients that replied, rows in client-id order.

    The weights are :func:`dpprecond.fl.partition.client_weights` of the repliers only, so
    they sum to one over the clients present: ``1/m`` each (uniform) or ``|D_i| / sum |D_j|``
    over the ``m`` repliers (size). With every client present this is the simulator's
    ``weights @ U`` term for term.
    """
    return client_weights(sizes, weighting) @ messages  # type: ignore[arg-type]


@lru_cache(maxsize=4096)
def epsilon_after_rounds(noise_multiplier: float, n_rounds: int, delta: float,
                         mechanism: str = "full-batch", *, sampling_rate: float = 1.0,
                         local_steps: int = 1, accountant: str = "pld") -> float:
    """Epsilon of one privacy unit whose client was asked in ``n_rounds`` rounds.

    The same ``dp_accounting`` events as the simulator (:func:`fl.accounting.training_event`,
    composed by :func:`dpprecond.accounting.epsilon_of`); ``0`` rounds cost nothing and a
    zero noise multiplier is not private (``inf``).
    """
    if n_rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    event = training_event(noise_multiplier, n_rounds, mechanism,  # type: ignore[arg-type]
                           sampling_rate=sampling_rate, local_steps=local_steps)
    return accounting.epsilon_of(event, delta, accountant)  # type: ignore[arg-type]
