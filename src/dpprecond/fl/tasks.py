"""The client halves of the federated methods: what a client computes and releases.

A :class:`ClientTask` is a small immutable description (public scalars only) of one
client's work in one phase of a run, and :meth:`ClientTask.release` computes it. The same
task runs everywhere:

- the engine (:mod:`dpprecond.fl.engine`) calls it once per round on every client at once
  (client-contiguous ``bounds``, one generator per client);
- a Flower client (:mod:`dpprecond.adapters.flower`) rebuilds it from the request
  (:func:`task_from_config`) and calls it on its own examples alone (``bounds = [0, n]``,
  its own generator), so its reply is row ``i`` of the engine's arrays.

Tasks (privacy unit, sensitivity and event of each: :mod:`dpprecond.fl.client`,
:mod:`dpprecond.fl.local_steps` and :mod:`dpprecond.fl.accounting`):

``"gradient"`` (:class:`GradientTask`)
    The config's client mechanism: full-batch (the paper), Poisson local steps, or
    client-level (whose noise a trusted aggregator adds: engine only). Replies
    ``"message"`` (client-level: the one noisy ``"aggregate"``).
``"local-steps"`` (:class:`LocalStepsTask`)
    Full-batch local steps, optionally corrected by control variates (DP-SCAFFOLD: the
    server's ``"control"`` is broadcast, the client keeps ``c_i`` as its state) or pulled
    towards the broadcast model by a proximal term (DP-FedProx); record-level (noise at
    every step; replies ``"delta-y"`` and ``"delta-c"``) or client-level (non-private
    steps, the clipped update; a trusted aggregator's noisy ``"aggregate"``).
``"second-moment"`` (:class:`SecondMomentTask`)
    The one-off noisy feature second moment of DP-FedFC and DP-FedNew (a setup task, run
    before the first round; ``clip_norm`` is the row clip ``C_x``). Replies ``"moment"``.
``"record-count"`` (:class:`RecordCountTask`)
    Adaptive clipping's count (:mod:`dpprecond.fl.adaptive_clip`): the client's records
    whose gradient norm at the round's parameters is at most ``clip_norm`` (the round's
    clip ``C_t``), plus its own Gaussian noise (sensitivity 1). Released beside the round's
    task, from its own noise stream. Replies ``"count"``.

A new kind of client work is one subclass here and one entry of :data:`TASKS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np

from dpprecond._validation import check_choice, check_fraction, check_int, check_positive
from dpprecond.fl import client as client_mod
from dpprecond.fl.client import Stream
from dpprecond.fl.config import MECHANISMS
from dpprecond.fl.local_steps import local_step_deltas, updated_controls
from dpprecond.fl.models import FLModel

__all__ = [
    "TASKS",
    "ClientTask",
    "GradientTask",
    "LocalStepsTask",
    "RecordCountTask",
    "SecondMomentTask",
    "TaskOutput",
    "release_round",
    "task_field_names",
    "task_from_config",
]


class TaskOutput(NamedTuple):
    """What a task released (name -> one row per client) and the clients' new state."""

    arrays: dict[str, np.ndarray]
    client_state: np.ndarray | None = None


@dataclass(frozen=True)
class ClientTask:
    """One client's work in one phase: a release with ``noise_multiplier`` and clip norm.

    Subclasses set :attr:`kind`, add their own public fields and implement
    :meth:`release` and :meth:`reply_shapes`.
    """

    clip_norm: float
    noise_multiplier: float

    kind: ClassVar[str] = "task"
    #: A setup task runs once before the first round (no model is sent).
    setup: ClassVar[bool] = False

    def validated(self) -> ClientTask:
        """Check every field (``ValueError``/``TypeError`` naming it); return self."""
        check_positive("clip_norm", self.clip_norm, allow_inf=True)
        check_positive("noise_multiplier", self.noise_multiplier, allow_zero=True)
        if self.noise_multiplier > 0 and math.isinf(self.clip_norm):
            raise ValueError("A noisy release needs a finite clip_norm (the sensitivity is "
                             "proportional to it); got clip_norm=inf.")
        return self

    @property
    def server_streams(self) -> int:
        """Noise streams the aggregator draws from (after the clients' ``K``)."""
        return 0

    @property
    def broadcast_names(self) -> tuple[str, ...]:
        """Arrays the server sends with the parameters (beyond the model)."""
        return ()

    @property
    def stateful(self) -> bool:
        """True when each client keeps a state across rounds (:meth:`release`'s
        ``client_state``)."""
        return False

    def initial_state(self, n_clients: int, n_params: int) -> np.ndarray | None:
        """The clients' state before their first round (one row each), if
        :attr:`stateful`."""
        return np.zeros((n_clients, n_params)) if self.stateful else None

    def reply_shapes(self, n_params: int,
                     n_features: int | None = None) -> dict[str, tuple[int, ...]]:
        """The arrays (name -> shape) one client replies with."""
        raise NotImplementedError

    def release(self, model: FLModel, params: np.ndarray | None, X: np.ndarray,
                y: np.ndarray, bounds: np.ndarray, rngs: Sequence[Stream], *,
                broadcast: Mapping[str, np.ndarray] | None = None,
                client_state: np.ndarray | None = None,
                x_sq_norms: np.ndarray | None = None) -> TaskOutput:
        """The clients' releases, one row per client of ``bounds``.

        ``rngs``: one noise source per client (then :attr:`server_streams` more);
        ``broadcast``: the arrays of :attr:`broadcast_names`; ``client_state``: one row per
        client for a :attr:`stateful` task.
        """
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        """Flat dict (``kind`` and every field, dashes for underscores)."""
        return {"kind": self.kind, **{k.replace("_", "-"): v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class GradientTask(ClientTask):
    """``mechanism``'s message (:mod:`dpprecond.fl.client`); one release per round."""

    mechanism: str = "full-batch"
    sampling_rate: float = 1.0
    local_steps: int = 1
    local_lr: float = 0.1

    kind: ClassVar[str] = "gradient"

    def validated(self) -> GradientTask:
        super().validated()
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_fraction("sampling_rate", self.sampling_rate, low_open=True, high_open=False)
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        if self.mechanism == "full-batch" and (self.local_steps != 1
                                               or self.sampling_rate != 1.0):
            raise ValueError("mechanism='full-batch' sends one full-batch step: it needs "
                             "local_steps=1 and sampling_rate=1.")
        return self

    @property
    def server_streams(self) -> int:
        return 1 if self.mechanism == "client-level" else 0

    def reply_shapes(self, n_params: int,
                     n_features: int | None = None) -> dict[str, tuple[int, ...]]:
        return {"message": (n_params,)}

    def release(self, model: FLModel, params: np.ndarray | None, X: np.ndarray,
                y: np.ndarray, bounds: np.ndarray, rngs: Sequence[Stream], *,
                broadcast: Mapping[str, np.ndarray] | None = None,
                client_state: np.ndarray | None = None,
                x_sq_norms: np.ndarray | None = None) -> TaskOutput:
        assert params is not None
        K = len(bounds) - 1
        C, z = self.clip_norm, self.noise_multiplier
        if self.mechanism == "full-batch":
            U = client_mod.full_batch_messages(model, params, X, y, bounds, C, z, rngs[:K],
                                               x_sq_norms=x_sq_norms)
        elif self.mechanism == "poisson":
            U = client_mod.poisson_local_messages(
                model, params, X, y, bounds, C, z, rngs[:K], sampling_rate=self.sampling_rate,
                local_steps=self.local_steps, local_lr=self.local_lr)
        else:  # the trusted aggregator's noise, from the stream after the clients'
            G = client_mod.client_level_aggregate(model, params, X, y, bounds, C, z, rngs[K],
                                                  local_steps=self.local_steps,
                                                  local_lr=self.local_lr)
            return TaskOutput({"aggregate": G[None, :]})
        return TaskOutput({"message": U})


@dataclass(frozen=True)
class LocalStepsTask(ClientTask):
    """``local_steps`` full-batch local steps (:func:`dpprecond.fl.client.local_deltas`).

    ``control_variates``: DP-SCAFFOLD's correction ``c - c_i`` (``c`` broadcast as
    ``"control"``, ``c_i`` the client's state); ``proximal_mu``: DP-FedProx's proximal
    gradient ``mu (y - theta)`` added to every step (0: none).

    ``mechanism``: ``"full-batch"`` (record-level: every local step is a noisy full-batch
    release, :mod:`dpprecond.fl.local_steps`; replies ``"delta-y"`` and ``"delta-c"``) or
    ``"client-level"`` (one client, replace-one: the local steps are non-private, the
    client's average gradient ``(theta - y_L) / (L eta_l)`` is clipped to ``clip_norm``,
    :func:`dpprecond.fl.client.client_level_updates`, and a trusted aggregator adds the
    noise to the sum once, :func:`dpprecond.fl.client.client_level_release`: engine only;
    under secure aggregation each client adds a share instead, :mod:`dpprecond.secagg.fl`). A
    client-level reply is the one noisy ``"aggregate"`` (the mean clipped update); control
    variates have no client-level form (refused: :mod:`dpprecond.fl.methods.local`).
    """

    local_steps: int = 5
    local_lr: float = 0.1
    control_variates: bool = False
    proximal_mu: float = 0.0
    mechanism: str = "full-batch"

    kind: ClassVar[str] = "local-steps"

    def validated(self) -> LocalStepsTask:
        super().validated()
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        check_positive("proximal_mu", self.proximal_mu, allow_zero=True)
        check_choice("mechanism", self.mechanism, ("full-batch", "client-level"))
        if not isinstance(self.control_variates, bool):
            raise TypeError(f"Expected control_variates to be a bool, got "
                            f"{self.control_variates!r}.")
        if self.control_variates and self.client_level:
            raise ValueError("control_variates has no client-level form (the server's "
                             "control variate would drift from the clients' by the sum of "
                             "the rounds' noise: dpprecond.fl.methods.local); use "
                             "mechanism='full-batch' for it.")
        return self

    @property
    def client_level(self) -> bool:
        """Whether the privacy unit is one client (``mechanism="client-level"``)."""
        return self.mechanism == "client-level"

    @property
    def server_streams(self) -> int:
        return 1 if self.client_level else 0

    @property
    def broadcast_names(self) -> tuple[str, ...]:
        return ("control",) if self.control_variates else ()

    @property
    def stateful(self) -> bool:
        return self.control_variates

    def reply_shapes(self, n_params: int,
                     n_features: int | None = None) -> dict[str, tuple[int, ...]]:
        if self.client_level:
            return {"aggregate": (n_params,)}
        shapes: dict[str, tuple[int, ...]] = {"delta-y": (n_params,)}
        if self.control_variates:
            shapes["delta-c"] = (n_params,)
        return shapes

    def _controls(self, broadcast: Mapping[str, np.ndarray] | None,
                  client_state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """``(c, c_i)`` of a control-variate task (``None`` without control variates)."""
        if not self.control_variates:
            return None
        if broadcast is None or "control" not in broadcast or client_state is None:
            raise ValueError("A control-variate task needs the server's control variate "
                             "and the client's own.")
        return broadcast["control"], client_state

    def release(self, model: FLModel, params: np.ndarray | None, X: np.ndarray,
                y: np.ndarray, bounds: np.ndarray, rngs: Sequence[Stream], *,
                broadcast: Mapping[str, np.ndarray] | None = None,
                client_state: np.ndarray | None = None,
                x_sq_norms: np.ndarray | None = None) -> TaskOutput:
        assert params is not None
        K = len(bounds) - 1
        if self.client_level:  # the trusted aggregator's noise, from the stream after K
            D = client_mod.client_level_updates(model, params, X, y, bounds, self.clip_norm,
                                                local_steps=self.local_steps,
                                                local_lr=self.local_lr,
                                                proximal_mu=self.proximal_mu)
            G = client_mod.client_level_release(D, self.clip_norm, self.noise_multiplier,
                                                rngs[K])
            return TaskOutput({"aggregate": G[None, :]})
        controls = self._controls(broadcast, client_state)
        correction = None if controls is None else controls[0] - controls[1]
        delta_y = local_step_deltas(model, params, X, y, bounds, self.clip_norm,
                                    self.noise_multiplier, rngs[:K],
                                    local_steps=self.local_steps, local_lr=self.local_lr,
                                    correction=correction, proximal_mu=self.proximal_mu,
                                    x_sq_norms=x_sq_norms)
        if controls is None:
            return TaskOutput({"delta-y": delta_y})
        c, c_i = controls
        c_new = updated_controls(c_i, c, delta_y, local_steps=self.local_steps,
                                 local_lr=self.local_lr)
        return TaskOutput({"delta-y": delta_y, "delta-c": c_new - c_i}, c_new)


@dataclass(frozen=True)
class SecondMomentTask(ClientTask):
    """The noisy feature second moment ``C_i`` (:func:`dpprecond.fl.client.
    second_moment_releases`; ``clip_norm`` is the row clip ``C_x``). A setup task."""

    kind: ClassVar[str] = "second-moment"
    setup: ClassVar[bool] = True

    def reply_shapes(self, n_params: int,
                     n_features: int | None = None) -> dict[str, tuple[int, ...]]:
        if n_features is None:
            raise ValueError("A second-moment reply's shape needs n_features.")
        return {"moment": (n_features + 1, n_features + 1)}

    def release(self, model: FLModel, params: np.ndarray | None, X: np.ndarray,
                y: np.ndarray, bounds: np.ndarray, rngs: Sequence[Stream], *,
                broadcast: Mapping[str, np.ndarray] | None = None,
                client_state: np.ndarray | None = None,
                x_sq_norms: np.ndarray | None = None) -> TaskOutput:
        K = len(bounds) - 1
        moments = client_mod.second_moment_releases(X, bounds, self.clip_norm,
                                                    self.noise_multiplier, rngs[:K])
        return TaskOutput({"moment": np.stack(list(moments))})


@dataclass(frozen=True)
class RecordCountTask(ClientTask):
    """The noisy count of adaptive clipping (:func:`dpprecond.fl.client.noisy_counts` of
    :func:`dpprecond.fl.client.record_counts`): ``#{x in D_i : ||g(x)|| <= clip_norm} +
    N(0, noise_multiplier^2)`` (sensitivity 1, event ``Gaussian(noise_multiplier)``)."""

    kind: ClassVar[str] = "record-count"

    def reply_shapes(self, n_params: int,
                     n_features: int | None = None) -> dict[str, tuple[int, ...]]:
        return {"count": (1,)}

    def release(self, model: FLModel, params: np.ndarray | None, X: np.ndarray,
                y: np.ndarray, bounds: np.ndarray, rngs: Sequence[Stream], *,
                broadcast: Mapping[str, np.ndarray] | None = None,
                client_state: np.ndarray | None = None,
                x_sq_norms: np.ndarray | None = None) -> TaskOutput:
        assert params is not None
        K = len(bounds) - 1
        counts = client_mod.record_counts(model, params, X, y, bounds, self.clip_norm)
        return TaskOutput({"count": client_mod.noisy_counts(
            counts, self.noise_multiplier, rngs[:K])[:, None]})


def release_round(task: ClientTask, count: ClientTask | None, model: FLModel,
                  params: np.ndarray | None, X: Any, y: np.ndarray, bounds: np.ndarray,
                  rngs: Sequence[Stream], count_rngs: Sequence[Stream] | None = None, *,
                  broadcast: Mapping[str, np.ndarray] | None = None,
                  client_state: np.ndarray | None = None,
                  x_sq_norms: Any = None, count_X: np.ndarray | None = None) -> TaskOutput:
    """A round's release and, with adaptive clipping, its count: one :class:`TaskOutput`.

    What every driver runs in a round (the engine on all clients, a Flower client on its
    own rows), so the two compute the same statistics. ``count`` (a
    :class:`RecordCountTask`, or ``None``) is released from ``count_rngs`` and its reply
    ``"count"`` joins the task's arrays. When the task is the full-batch gradient at the
    count's clip and the model counts inside its gradient pass (the linear head,
    ``counts_in_pass``), the count comes from the norms the pass clips with
    (:func:`dpprecond.fl.client.full_batch_messages_and_counts`): one read of ``X``
    instead of two. Otherwise the count task runs on its own, on ``count_X`` (default
    ``X``: the host float64 records where the round's rows are a float32 or device copy).
    The two draw from separate streams, so neither changes the other's noise.
    """
    kwargs = {"broadcast": broadcast, "client_state": client_state, "x_sq_norms": x_sq_norms}
    if count is None:
        return task.release(model, params, X, y, bounds, rngs, **kwargs)
    if count_rngs is None:
        raise ValueError("A round with a count needs its noise sources count_rngs.")
    K = len(bounds) - 1
    # only the tasks' own releases (a subclass with its own release is called, as a model
    # that overrides its sums is: counts_in_pass)
    fused = (type(task).release is GradientTask.release and isinstance(task, GradientTask)
             and task.mechanism == "full-batch"
             and type(count).release is RecordCountTask.release
             and isinstance(count, RecordCountTask) and count.clip_norm == task.clip_norm
             and getattr(model, "counts_in_pass", False))
    if fused:
        assert params is not None
        U, counts = client_mod.full_batch_messages_and_counts(
            model, params, X, y, bounds, task.clip_norm, task.noise_multiplier, rngs[:K],
            x_sq_norms=x_sq_norms)
        noisy = client_mod.noisy_counts(counts, count.noise_multiplier, count_rngs[:K])
        return TaskOutput({"message": U, "count": noisy[:, None]})
    out = task.release(model, params, X, y, bounds, rngs, **kwargs)
    counted = count.release(model, params, X if count_X is None else count_X, y, bounds,
                            count_rngs)
    return TaskOutput({**out.arrays, **counted.arrays}, out.client_state)


#: kind -> task class (what a Flower client may be asked to run).
TASKS: dict[str, type[ClientTask]] = {
    cls.kind: cls for cls in (GradientTask, LocalStepsTask, SecondMomentTask,
                              RecordCountTask)}


def task_field_names(kind: str) -> list[str]:
    """The config keys of a task of ``kind`` (dashes for underscores)."""
    check_choice("kind", kind, list(TASKS))
    return [f.name.replace("_", "-") for f in fields(TASKS[kind])]


def task_from_config(config: Mapping[str, Any]) -> ClientTask:
    """The validated task a :meth:`ClientTask.to_config` dict describes.

    Raises ``ValueError`` naming any missing key.
    """
    if "kind" not in config:
        raise ValueError("The task is missing ['kind'].")
    kind = config["kind"]
    names = task_field_names(kind)
    missing = [k for k in names if k not in config]
    if missing:
        raise ValueError(f"The {kind!r} task is missing {missing}.")
    return TASKS[kind](**{k.replace("-", "_"): config[k] for k in names}).validated()
