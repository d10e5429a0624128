"""The strict schema of an experiment file (pydantic), with errors that name the key.

Every table forbids unknown keys and every value has a declared type, so a typo
(``epsilon =`` for ``epsilons =``, ``round =``, ``reference = "sofiim"``) stops the load with
a message naming the table and the key and suggesting the closest valid one, instead of
silently running a sweep with defaults. Method parameters are checked against the method's
own signature (and, for the server optimizers, by building the optimizer) at load time.
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dpprecond._validation import MAX_DELTA, check_choice
from dpprecond.accounting import DEFAULT_ACCOUNTANT, Accountant
from dpprecond.pca.api import DEFAULT_METHOD
from dpprecond.pca.federated import TrustModel
from dpprecond.pca.methods import PIPELINE_METHODS

__all__ = [
    "ExperimentFile",
    "check_method_params",
    "format_errors",
    "method_parameters",
]

Number = StrictFloat | StrictInt
PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
#: an epsilon: a positive number, or "inf" for a non-private run
Epsilon = Annotated[StrictFloat | StrictInt, Field(gt=0)] | Literal["inf"]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DataTable(_Table):
    """``[data]``: which dataset and which fixed features."""

    name: Literal["digits", "fashion-mnist", "cifar10", "pathmnist"]
    features: StrictStr = "pixels"
    pca_share: Annotated[Number, Field(gt=0, lt=1)] = 0.2
    pca_method: StrictStr = DEFAULT_METHOD
    trust: TrustModel = "local"
    row_norm: Annotated[Number, Field(gt=0, allow_inf_nan=False)] | None = None
    path: StrictStr | None = None
    checkpoint: StrictStr | None = None
    cache_dir: StrictStr | None = None


    @field_validator("pca_method")
    @classmethod
    def _pca_method(cls, value: str) -> str:
        return check_choice("pca_method", value, PIPELINE_METHODS)

    @field_validator("features")
    @classmethod
    def _features(cls, value: str) -> str:
        if value == "resnet20":
            return value
        from dpprecond.pipeline import parse_features

        parse_features(value)
        return value


class FederationTable(_Table):
    """``[federation]``: numbers of clients, partitions, Dirichlet concentration."""

    clients: list[PositiveInt] = Field(default=[20], min_length=1)
    partitions: list[Literal["iid", "dirichlet"]] = Field(default=["iid"], min_length=1)
    alpha: Annotated[Number, Field(gt=0, allow_inf_nan=False)] = 0.5


class PrivacyTable(_Table):
    """``[privacy]``: the epsilon grid, delta, clipping and accountant."""

    epsilons: list[Epsilon] = Field(default=[1.0], min_length=1)
    delta: Annotated[Number, Field(gt=0, le=MAX_DELTA)] = 1e-5
    clip_norm: Annotated[Number, Field(gt=0, allow_inf_nan=False)] = 10.0
    accountant: Accountant = DEFAULT_ACCOUNTANT

    @field_validator("epsilons")
    @classmethod
    def _finite(cls, values: list[Any]) -> list[Any]:
        for v in values:
            if not isinstance(v, str) and not math.isfinite(v):
                raise ValueError('write a non-private run as "inf", not a float infinity')
        return values


class ProtocolTable(_Table):
    """``[protocol]``: per-round or per-T runs, rounds, seeds, the reference method, and
    the kernel's precision and backend (``FLConfig.precision``, ``FLConfig.backend``)."""

    kind: Literal["per-round", "per-T"] = "per-round"
    rounds: PositiveInt = 70
    rounds_list: list[PositiveInt] = Field(default_factory=list)
    seeds: list[NonNegativeInt] = Field(default=[0], min_length=1)
    reference: StrictStr | None = None
    precision: Literal["float64", "float32"] = "float64"
    backend: Literal["numpy", "torch"] = "numpy"

    @field_validator("rounds", mode="before")
    @classmethod
    def _scalar_rounds(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError("must be one integer; for several T use kind = 'per-T' with "
                             "rounds_list = [...]")
        return value

    @model_validator(mode="after")
    def _per_t(self) -> ProtocolTable:
        if self.kind == "per-T" and not self.rounds_list:
            raise ValueError("kind = 'per-T' needs rounds_list = [1, 2, ...]")
        return self


class TuningTable(_Table):
    """``[tuning]``: the validation split and the grid of each method to tune;
    ``mean_trials`` and ``trials`` (the distribution of the number of trials, or a
    truncated-negative-binomial shape) set the private selection (``tune --private``),
    and ``clip_norms`` adds the clip norm to its search (``tune --private`` only)."""

    validation_fraction: Annotated[Number, Field(gt=0, lt=1)] = 0.1
    mean_trials: Annotated[Number, Field(ge=1, allow_inf_nan=False)] = 3.0
    trials: Literal["geometric", "logarithmic", "poisson"] | Annotated[
        Number, Field(ge=0, allow_inf_nan=False)] = "logarithmic"
    clip_norms: list[Annotated[Number, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        default=None, min_length=1)
    epsilons: list[Epsilon] = Field(default=[1.0], min_length=1)
    seeds: list[NonNegativeInt] = Field(default=[0], min_length=1)
    grid: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)


class ExperimentFile(_Table):
    """A whole experiment file."""

    name: StrictStr = "experiment"
    output: StrictStr | None = None
    report: StrictStr | None = None
    description: StrictStr | None = None
    tuned_from: StrictStr | None = None
    data: DataTable
    federation: FederationTable = FederationTable()
    privacy: PrivacyTable = PrivacyTable()
    protocol: ProtocolTable = ProtocolTable()
    methods: dict[str, dict[str, Any]] = Field(min_length=1)
    tuning: TuningTable | None = None


# -- method parameters ------------------------------------------------------------------


def method_parameters(algorithm: str) -> dict[str, inspect.Parameter]:
    """The options a method table may set for ``algorithm`` (name -> Parameter)."""
    from dpprecond.fl.methods import method_options

    return method_options(algorithm)


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_method_params(where: str, algorithm: str, params: dict[str, Any]) -> None:
    """Raise ``ValueError`` for an unknown or bad parameter of ``algorithm``.

    Names are checked against the method's options (the keyword arguments of its factory
    in :mod:`dpprecond.fl.methods`), types against the option's default, and values by
    building the method once, which runs its own checks.
    """
    from dpprecond.fl.methods import make_method

    allowed = method_parameters(algorithm)
    for key, value in params.items():
        if key not in allowed:
            raise ValueError(f"{where}: unknown parameter {key!r} for algorithm "
                             f"{algorithm!r}{_suggest(key, list(allowed))} Valid "
                             f"parameters: {sorted(allowed)}.")
        default = allowed[key].default
        if isinstance(default, bool) or isinstance(value, bool):
            ok = isinstance(value, bool) == isinstance(default, bool)
        elif isinstance(default, (int, float)) or default is None:
            ok = isinstance(value, (int, float)) and math.isfinite(value)
        else:
            ok = isinstance(value, type(default))
        if not ok:
            raise ValueError(f"{where}.{key} = {value!r} has the wrong type for algorithm "
                             f"{algorithm!r} (default {default!r}).")
    try:
        make_method(algorithm, **params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


# -- error messages -----------------------------------------------------------------------


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = ExperimentFile
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,))
                      if isinstance(a, type) and issubclass(a, BaseModel)), ann)
    return list(getattr(model, "model_fields", {}))


def format_errors(exc: ValidationError, source: str) -> str:
    """One readable message for every schema error, naming the table and the key."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        dotted = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            table = ".".join(str(p) for p in loc[:-1])
            where = f"[{table}]" if table else "the top level"
            valid = _valid_keys(loc)
            lines.append(f"{where} has an unknown key {loc[-1]!r}"
                         f"{_suggest(str(loc[-1]), valid)} Valid keys: {sorted(valid)}.")
        elif err["type"] == "missing":
            lines.append(f"{dotted} is required.")
        else:
            msg = err["msg"]
            if err["type"] == "too_short":
                msg = "must list at least one value"
            lines.append(f"{dotted} = {err.get('input')!r}: {msg}.")
    return f"{source}: " + " ".join(lines)
