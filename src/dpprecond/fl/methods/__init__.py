"""Every named federated algorithm, one definition each, and the registry.

A method (:class:`~dpprecond.fl.methods.base.Method`) is a release schedule, a client half
and a server half; the round engine (:mod:`dpprecond.fl.engine`) and the Flower adapter
(:mod:`dpprecond.adapters.flower`) run every method the same way.

=================  ========================================  ==============================
name               client releases (per client)              server transform
=================  ========================================  ==============================
fedgd              config.mechanism, 1 per round             SGD on the aggregate
sofim              "                                         SOFIM, the paper's form
sofim-momentum     "                                         SOFIM, the authors' code form
sofim-lagged       "                                         SOFIM, our lagged form
adam, yogi         "                                         server Adam / Yogi
fedavg             L noisy full-batch local steps per round  mean model change
scaffold           same, corrected by control variates       mean change + control variate
fedfc              one covariance, then 1 gradient per round  P (mean C + gamma I)^-1 step
fednew             one covariance, then 1 gradient per round  one ADMM Newton iteration
fedprox            fedavg's, on the proximal local objective  mean model change
=================  ========================================  ==============================

Modules: :mod:`~dpprecond.fl.methods.gradient` (fedgd, the SOFIM forms, adam, yogi),
:mod:`~dpprecond.fl.methods.local` (fedavg, scaffold),
:mod:`~dpprecond.fl.methods.covariance` (the client half of fedfc and fednew),
:mod:`~dpprecond.fl.methods.fedfc`, :mod:`~dpprecond.fl.methods.fednew`,
:mod:`~dpprecond.fl.methods.fedprox`.

:func:`make_method` builds one by name with its options (each factory's keyword arguments;
:func:`method_options` lists them with their defaults, which the experiment schema uses to
check a config at load time). A new method is one module and one line of :data:`METHODS`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dpprecond._validation import check_choice
from dpprecond.fl.methods.base import Method, NoisyPreconditionerWarning, RunSpec
from dpprecond.fl.methods.covariance import CovarianceMethod
from dpprecond.fl.methods.fedfc import FedFC, fedfc
from dpprecond.fl.methods.fednew import FedNew, fednew
from dpprecond.fl.methods.fedprox import FedProx, fedprox
from dpprecond.fl.methods.gradient import (
    PAPER_FORM_WARNING,
    GradientMethod,
    adaptive_factory,
    fedgd,
    sofim_factory,
)
from dpprecond.fl.methods.local import LocalStepsMethod, fedavg, scaffold

__all__ = [
    "METHODS",
    "PAPER_FORM_WARNING",
    "CovarianceMethod",
    "FedFC",
    "FedNew",
    "FedProx",
    "GradientMethod",
    "LocalStepsMethod",
    "Method",
    "NoisyPreconditionerWarning",
    "RunSpec",
    "make_method",
    "method_options",
]

#: name -> factory; each factory's keyword arguments are the method's options.
METHODS: dict[str, Callable[..., Method]] = {
    "fedgd": fedgd,
    "sofim": sofim_factory("sofim", "gradient", False),
    "sofim-momentum": sofim_factory("sofim-momentum", "momentum", False),
    "sofim-lagged": sofim_factory("sofim-lagged", "gradient", True),
    "adam": adaptive_factory("adam"),
    "yogi": adaptive_factory("yogi"),
    "fedavg": fedavg,
    "scaffold": scaffold,
    "fedfc": fedfc,
    "fednew": fednew,
    "fedprox": fedprox,
}


def method_options(name: str) -> dict[str, inspect.Parameter]:
    """The options of method ``name`` (keyword name -> ``inspect.Parameter``)."""
    check_choice("method", name, list(METHODS))
    return dict(inspect.signature(METHODS[name]).parameters)


def make_method(name: str, learning_rate: float | None = None, **options: Any) -> Method:
    """Build a method by name (see the module docstring); ``learning_rate=None`` keeps the
    method's default. Unknown options raise ``TypeError`` naming them and the valid ones."""
    valid = method_options(name)
    if learning_rate is not None:
        options["learning_rate"] = learning_rate
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown} for method {name!r}; valid options: "
                        f"{sorted(valid)}.")
    return METHODS[name](**options)
