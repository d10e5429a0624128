"""Record-level differentially private federated learning with DP-FedSOFIM.

The layout follows the architecture:

- :mod:`dpprecond.fl.client`: what a client sends (clipping, its own Gaussian noise);
- :mod:`dpprecond.fl.accounting`: those releases as DpEvents, noise calibration;
- :mod:`dpprecond.fl.server`: server optimizers as (init, update) transforms, including the
  DP-FedSOFIM rank-one Fisher preconditioner (:func:`~dpprecond.fl.server.sofim`);
- :mod:`dpprecond.fl.models`: linear softmax head (closed-form per-example gradients) and a
  ``torch.func`` wrapper for any ``nn.Module``;
- :mod:`dpprecond.fl.partition`: IID and Dirichlet client splits;
- :mod:`dpprecond.fl.simulator`: the vectorized round loop and :func:`run_federated`;
- baselines with their own client state or extra releases, each release charged:
  :mod:`dpprecond.fl.scaffold` (DP-SCAFFOLD, DP-FedAvg), :mod:`dpprecond.fl.fedfc`
  (DP-FedFC), :mod:`dpprecond.fl.fednew` (DP-FedNew), shared pieces in
  :mod:`dpprecond.fl.baseline_common`.
"""

from dpprecond.fl.accounting import calibrate_noise_multiplier, round_event, training_event
from dpprecond.fl.baseline_common import BaselineResult
from dpprecond.fl.fedfc import run_fedfc
from dpprecond.fl.fednew import run_fednew
from dpprecond.fl.models import LinearSoftmax, TorchModel
from dpprecond.fl.partition import dirichlet_partition, iid_partition, make_partition
from dpprecond.fl.scaffold import run_fedavg, run_scaffold
from dpprecond.fl.server import adam, chain, make_optimizer, sgd, sofim, yogi
from dpprecond.fl.simulator import ClientData, FLConfig, FLResult, run_federated, simulate

__all__ = [
    "BaselineResult",
    "ClientData",
    "FLConfig",
    "FLResult",
    "LinearSoftmax",
    "TorchModel",
    "adam",
    "calibrate_noise_multiplier",
    "chain",
    "dirichlet_partition",
    "iid_partition",
    "make_optimizer",
    "make_partition",
    "round_event",
    "run_fedavg",
    "run_federated",
    "run_fedfc",
    "run_fednew",
    "run_scaffold",
    "sgd",
    "simulate",
    "sofim",
    "training_event",
    "yogi",
]
