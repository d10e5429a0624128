"""Record-level differentially private federated learning with DP-FedSOFIM.

The layout follows the architecture (one round engine; methods are configurations of it):

- :mod:`dpprecond.fl.client`: what a client sends (clipping, its own Gaussian noise): the
  full-batch, Poisson and client-level mechanisms and the one-off covariance release;
  :mod:`dpprecond.fl.local_steps`: the baselines' per-client local steps;
- :mod:`dpprecond.fl.tasks`: the client halves of the methods (what a client computes and
  releases in a phase), which the engine and the Flower adapter both run;
- :mod:`dpprecond.fl.server`: server transforms as ``(init, update)`` pairs, including the
  DP-FedSOFIM rank-one Fisher preconditioner (:func:`~dpprecond.fl.server.sofim`) and the
  baselines' server steps;
- :mod:`dpprecond.fl.accounting`: those releases as DpEvents (release schedules) and their
  calibration through :mod:`dpprecond.accounting`;
- :mod:`dpprecond.fl.methods`: every named algorithm (DP-FedGD, the SOFIM forms, Adam, Yogi,
  DP-FedAvg, DP-SCAFFOLD, DP-FedFC, DP-FedNew), one module per family, each a release
  schedule, a client half and a server half, and the registry;
- :mod:`dpprecond.fl.engine`: the one round loop (:func:`simulate`), with the ledger and
  crash-safe checkpoints;
- :mod:`dpprecond.fl.simulator`: :func:`run_federated`, partition + model + method + engine;
- :mod:`dpprecond.fl.adaptive_clip`: adaptive clipping (a private quantile of the norms),
  charged inside the run's budget, for every method;
- :mod:`dpprecond.fl.tuning`: :func:`tune_private`, private hyperparameter selection by
  repeat-and-select (:mod:`dpprecond.selection`), charged to the budget;
- :mod:`dpprecond.fl.models`, :mod:`dpprecond.fl.partition`, :mod:`dpprecond.fl.data`,
  :mod:`dpprecond.fl.config`: models, client splits, client data, run settings;
- :mod:`dpprecond.fl.kernels`, :mod:`dpprecond.fl.backend`: the linear head's one-pass
  kernel and its array backends (numpy, torch on the CPU or CUDA);
- :mod:`dpprecond.fl.module_validator`: which torch layers per-example gradients can go
  through, and :func:`fix_module` for the others.
"""

from dpprecond.fl.accounting import round_event, training_event
from dpprecond.fl.adaptive_clip import AdaptiveClip
from dpprecond.fl.config import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import FLResult, simulate
from dpprecond.fl.methods import METHODS, make_method, method_options
from dpprecond.fl.models import LinearSoftmax, TorchModel
from dpprecond.fl.module_validator import UnsupportedModuleError, fix_module, validate_module
from dpprecond.fl.partition import dirichlet_partition, iid_partition, make_partition
from dpprecond.fl.server import adam, chain, sgd, sofim, yogi
from dpprecond.fl.simulator import DEFAULT_ALGORITHM, run_federated
from dpprecond.fl.tuning import Candidate, TuningResult, search_space, tune_private

__all__ = [
    "DEFAULT_ALGORITHM",
    "METHODS",
    "AdaptiveClip",
    "Candidate",
    "ClientData",
    "FLConfig",
    "FLResult",
    "LinearSoftmax",
    "TorchModel",
    "TuningResult",
    "UnsupportedModuleError",
    "adam",
    "chain",
    "dirichlet_partition",
    "fix_module",
    "iid_partition",
    "make_method",
    "make_partition",
    "method_options",
    "round_event",
    "run_federated",
    "search_space",
    "sgd",
    "simulate",
    "sofim",
    "training_event",
    "tune_private",
    "validate_module",
    "yogi",
]
