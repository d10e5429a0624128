"""DP federated learning on Flower (flwr >= 1.42, the Message API).

Needs the optional extra: ``pip install 'dpprecond[flower]'``; importing this package
without Flower raises an ``ImportError`` that says so (``import dpprecond`` never imports
Flower).

Layout (adapters move arrays and configurations; the mathematics stays in
:mod:`dpprecond.fl`):

- :mod:`~dpprecond.adapters.flower.protocol`: the message contract and the Flower-free steps
  (a client's message from :mod:`dpprecond.fl.client`, the aggregate, the accounting call);
- :mod:`~dpprecond.adapters.flower.strategy`: :class:`DPFedStrategy`, the server side of
  DP-FedSOFIM, DP-FedGD, DP-FedAdam and DP-FedYogi (any
  :func:`dpprecond.fl.server.make_optimizer` transform), with dropout handling;
- :mod:`~dpprecond.adapters.flower.client_app`: the ClientApp (clip, add noise, send);
- :mod:`~dpprecond.adapters.flower.server_app`: the ServerApp running a strategy on the Grid;
- :mod:`~dpprecond.adapters.flower.data`: where a client's data comes from;
- :mod:`~dpprecond.adapters.flower.app`: ``server_app``/``client_app`` driven by the run
  config, the components of ``examples/flower-app``.

See docs/flower.md for the privacy model and a deployment guide.
"""

from dpprecond.adapters.flower._require import require_flwr

require_flwr()

from dpprecond.adapters.flower.client_app import (  # noqa: E402
    ClientInfo,
    LocalData,
    make_client_app,
    query_reply,
    train_reply,
)
from dpprecond.adapters.flower.data import NodeFileData, PartitionedDataset  # noqa: E402
from dpprecond.adapters.flower.protocol import (  # noqa: E402
    RoundRequest,
    aggregate,
    client_message,
    client_rng,
    simulator_seeds,
)
from dpprecond.adapters.flower.server_app import make_server_app  # noqa: E402
from dpprecond.adapters.flower.strategy import DPFedStrategy  # noqa: E402

__all__ = [
    "ClientInfo",
    "DPFedStrategy",
    "LocalData",
    "NodeFileData",
    "PartitionedDataset",
    "RoundRequest",
    "aggregate",
    "client_message",
    "client_rng",
    "make_client_app",
    "make_server_app",
    "query_reply",
    "simulator_seeds",
    "train_reply",
]
