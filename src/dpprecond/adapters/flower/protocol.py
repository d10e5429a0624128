"""What travels between the Flower server and its clients, without Flower.

The contract of the adapter: the record keys, the request the server sends a client in one
round (:class:`RoundRequest`: the method's client task and the round's bookkeeping), the
arrays a client replies with (:func:`reply_shapes`), the seed tree that makes a seeded
Flower run reproduce the in-process engine (:func:`simulator_seeds`) and the choice of a
client's noise source (:func:`client_rng`). No mathematics and no method names: what a
client computes is its :class:`~dpprecond.fl.tasks.ClientTask` (the method's client half,
which the engine runs too), what the server does is the method's server half
(:mod:`~dpprecond.adapters.flower.server_side`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from dpprecond._validation import check_int
from dpprecond.fl import client as client_mod
from dpprecond.fl.adaptive_clip import count_root
from dpprecond.fl.tasks import ClientTask, task_field_names, task_from_config
from dpprecond.secure import SecureGenerator

__all__ = [
    "KEYS",
    "RoundRequest",
    "SeedTree",
    "client_rng",
    "reply_shapes",
    "simulator_seeds",
]


class _Keys(NamedTuple):
    params: str = "params"        # ArrayRecord (server -> client): model and broadcasts
    config: str = "config"        # ConfigRecord (server -> client): the RoundRequest
    reply: str = "reply"          # ArrayRecord (client -> server): the released arrays
    metrics: str = "metrics"      # MetricRecord (client -> server): client id (and size)
    client_id: str = "client-id"
    n_clients: str = "num-partitions"
    n_examples: str = "num-examples"
    state: str = "dpprecond-state"               # client context.state: its state, pending
    state_round: str = "dpprecond-state-round"   # ConfigRecord: the pending one's round


#: Record and field names shared by the server and the client.
KEYS = _Keys()

_BOOKKEEPING = ("server-round", "accepted-round", "report-size", "secure")
#: Prefix of the count task's fields in a request's ConfigRecord.
_COUNT = "count-"


class RoundRequest(NamedTuple):
    """What the server asks one client in one round (sent as a ConfigRecord).

    Parameters
    ----------
    server_round : int
        Flower's round (1, 2, ...; the engine's round index is ``server_round - 1``), or 0
        for the setup round (a setup task).
    task : ClientTask
        The method's client half for this phase (what to compute and release, with which
        clip norm and noise multiplier; the client adds the noise).
    accepted_round : int
        A stateful task (a client state across rounds, e.g. a control variate): the last
        round in which this client's reply was aggregated (0: none). The client commits the
        state it computed in that round and discards any later one, so that its state only
        moves when the server's moved with it.
    report_size : bool
        Reply with ``|D_i|`` (the method's server step needs the sizes; they are public
        under the record-level, replace-one unit, as in the paper).
    secure : bool
        Draw the noise in secure mode (:mod:`dpprecond.secure`).
    count_task : ClientTask or None
        A count released beside the task, at the same parameters, with noise from the
        client's count stream (adaptive clipping's
        :class:`~dpprecond.fl.tasks.RecordCountTask`: the client's records inside the
        round's clip, :mod:`dpprecond.fl.adaptive_clip`); ``None``: none.
    """

    server_round: int
    task: ClientTask
    accepted_round: int = 0
    report_size: bool = False
    secure: bool = False
    count_task: ClientTask | None = None

    @property
    def kind(self) -> str:
        """The task's kind."""
        return self.task.kind

    @property
    def noise_multiplier(self) -> float:
        """The task's noise multiplier."""
        return self.task.noise_multiplier

    def validated(self) -> RoundRequest:
        """Check every field (``ValueError``/``TypeError`` naming it); return self."""
        check_int("server_round", self.server_round, low=0)
        if not isinstance(self.task, ClientTask):
            raise TypeError(f"Expected task to be a ClientTask, got "
                            f"{type(self.task).__name__}.")
        self.task.validated()
        for name in ("report_size", "secure"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Expected {name} to be a bool, got "
                                f"{getattr(self, name)!r}.")
        check_int("accepted_round", self.accepted_round, low=0,
                  high=max(self.server_round - 1, 0))
        if self.task.setup != (self.server_round == 0):
            raise ValueError(f"Round 0 is the setup round and only asks for a setup task; "
                             f"got server_round={self.server_round}, kind={self.kind!r}.")
        if self.task.server_streams:
            raise ValueError(f"The {self.kind!r} task's noise is added by a trusted "
                             "aggregator, which this adapter avoids on purpose; use the "
                             "in-process engine for it.")
        if self.count_task is not None:
            self._check_count(self.count_task)
        return self

    def _check_count(self, count: Any) -> None:
        if not isinstance(count, ClientTask):
            raise TypeError(f"Expected count_task to be a ClientTask or None, got "
                            f"{type(count).__name__}.")
        count.validated()
        if count.setup or self.task.setup:
            raise ValueError(f"A count is released in a round, beside the round's task; got "
                             f"count kind {count.kind!r} with task kind {self.kind!r}.")
        if count.server_streams or count.stateful or count.broadcast_names:
            raise ValueError(f"The count task {count.kind!r} must be stateless, without "
                             "broadcast arrays or aggregator noise.")
        shared = set(count.reply_shapes(1, 1)) & set(self.task.reply_shapes(1, 1))
        if shared:
            raise ValueError(f"The count task's replies {sorted(shared)} clash with the "
                             f"{self.kind!r} task's.")

    @property
    def noise_multipliers(self) -> tuple[float, ...]:
        """The noise multiplier of every release the request asks for (task, count)."""
        tasks = (self.task,) if self.count_task is None else (self.task, self.count_task)
        return tuple(float(t.noise_multiplier) for t in tasks)

    def to_config(self) -> dict[str, Any]:
        """Flat dict for a Flower ConfigRecord (keys with dashes, as Flower's)."""
        count = {} if self.count_task is None else {
            _COUNT + k: v for k, v in self.count_task.to_config().items()}
        return {"server-round": self.server_round, "accepted-round": self.accepted_round,
                "report-size": self.report_size, "secure": self.secure,
                **self.task.to_config(), **count}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RoundRequest:
        """Parse and validate a ConfigRecord written by :meth:`to_config`."""
        missing = [k for k in (*_BOOKKEEPING, "kind") if k not in config]
        if not missing:
            missing = [k for k in task_field_names(config["kind"]) if k not in config]
        count = None
        if _COUNT + "kind" in config:
            fields = {k[len(_COUNT):]: v for k, v in config.items() if k.startswith(_COUNT)}
            missing += [_COUNT + k for k in task_field_names(fields["kind"])
                        if k not in fields]
            if not missing:
                count = task_from_config(fields)
        if missing:
            raise ValueError(f"The round request is missing {missing}; the server and the "
                             "client run different versions of the dpprecond adapter.")
        return cls(config["server-round"], task_from_config(config),
                   config["accepted-round"], config["report-size"],
                   config["secure"], count).validated()


def reply_shapes(request: RoundRequest, n_params: int,
                 n_features: int | None = None) -> dict[str, tuple[int, ...]]:
    """The arrays (name -> shape) a client replies with to ``request`` (its task's, and
    its count's if any).

    ``n_features`` (the linear head's ``d``) is needed for the second moment's
    ``(d + 1, d + 1)`` reply.
    """
    shapes = request.task.reply_shapes(n_params, n_features)
    if request.count_task is not None:
        shapes = {**shapes, **request.count_task.reply_shapes(n_params, n_features)}
    return shapes


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
    counts: np.random.SeedSequence      # root of the (round, client) count streams


def simulator_seeds(seed: int) -> SeedTree:
    """The seed tree of ``run_federated(seed=seed)``, rebuilt from the integer.

    ``run_federated`` spawns ``(simulation, partition)`` from ``SeedSequence(seed)``, and
    :func:`dpprecond.fl.engine.simulate` spawns ``(init, noise, setup)`` from the simulation
    sequence; client ``i`` draws round ``t``'s noise from ``fl.client.stream(noise, t, i)``,
    its covariance from ``stream(setup, 0, i)`` and its adaptive-clipping count from
    ``stream(counts, t, i)`` (``counts`` is :func:`dpprecond.fl.adaptive_clip.count_root`
    of ``noise``, as in the engine). Every process rebuilds the same tree from the integer, so
    a Flower client and the engine draw identical numbers. This is the only place the
    adapter mirrors the engine's spawn order (a test pins it).
    """
    seed = check_int("seed", seed, low=0)

    def child(*key: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(seed, spawn_key=key)

    return SeedTree(child(0), child(0, 0), child(0, 1), child(0, 2), child(1),
                    count_root(child(0, 1)))


def client_rng(noise_seed: int | None, request: RoundRequest, client_id: int, *,
               secure: bool = False, count: bool = False) -> client_mod.Stream:
    """The noise source of one client for one request (``count=True``: for its count).

    ``noise_seed=None`` (every deployment): fresh OS entropy, a new generator per call, so
    no two clients, rounds or runs share noise and nobody can predict it; in secure mode
    (``secure`` or ``request.secure``) a :class:`dpprecond.secure.SecureGenerator` (the OS
    CSPRNG, and the releases are snapped). With an integer (testing only): the engine's
    stream of ``run_federated(seed=noise_seed)`` for this (round, client), the count
    stream with ``count=True``; refused in secure mode, as the engine refuses seeds there.
    """
    secure = secure or request.secure
    if noise_seed is None:
        return SecureGenerator() if secure else np.random.default_rng()
    if secure:
        raise ValueError(f"Secure mode refuses seeded noise (got noise_seed={noise_seed!r}): "
                         "a seeded release can be regenerated by whoever knows the seed.")
    client_id = check_int("client_id", client_id, low=0)
    tree = simulator_seeds(noise_seed)
    if count:
        if request.count_task is None:
            raise ValueError("client_rng(count=True) needs a request with a count.")
        return client_mod.stream(tree.counts, request.server_round - 1, client_id)
    if request.task.setup:
        return client_mod.stream(tree.setup, 0, client_id)
    return client_mod.stream(tree.noise, request.server_round - 1, client_id)
