"""DP federated learning on Flower (flwr >= 1.42, the Message API).

Needs the optional extra: ``pip install 'dpprecond[flower]'``; importing this package
without Flower raises an ``ImportError`` that says so (``import dpprecond`` never imports
Flower).

Every method of :mod:`dpprecond.fl.methods` runs here with the engine's own pieces: its
release schedule calibrates the noise and fills the ledger, its client half (a
:class:`~dpprecond.fl.tasks.ClientTask`) runs on each client, its server half runs on the
server. The adapter names no method; it only moves arrays and configurations:

- :mod:`~dpprecond.adapters.flower.protocol`: the message contract (record keys, the
  per-client :class:`RoundRequest`, reply shapes, the seed tree, the noise source);
- :mod:`~dpprecond.adapters.flower.client_side`: one client's release, the request's task
  run on that client (Flower-free);
- :mod:`~dpprecond.adapters.flower.server_side`: the run's calibration, ledger, requests
  and the method's server half (Flower-free);
- :mod:`~dpprecond.adapters.flower.strategy`: :class:`DPFedStrategy`, the Flower strategy
  (registration, messages, dropout records);
- :mod:`~dpprecond.adapters.flower.client_app`: the ClientApp (guards, noise source, a
  stateful task's client state);
- :mod:`~dpprecond.adapters.flower.server_app`: the ServerApp running a strategy on the Grid;
- :mod:`~dpprecond.adapters.flower.data`: where a client's data comes from;
- :mod:`~dpprecond.adapters.flower.app`: ``server_app``/``client_app`` driven by the run
  config, the components of ``examples/flower-app``;
- :mod:`~dpprecond.adapters.flower.pca`: federated private PCA (``trust="local"``), every
  pass of :func:`dpprecond.pca.fit_private_pca` one ``query.pca`` message round
  (:func:`fit_pca_on_flower`, :func:`make_pca_server_app`, :func:`make_pca_client_app`);
- :mod:`~dpprecond.adapters.flower.pca_app`: federated PCA driven by the run config, the
  parts of ``examples/flower-pca-app``;
- :mod:`~dpprecond.adapters.flower.secagg`: ``trust="secure-aggregation"`` on Flower's
  SecAgg+ (each client sends its share of the distributed Skellam noise; the server sees
  only the sum).

See docs/flower.md for the privacy model, the dropout policies and a deployment guide.
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
from dpprecond.adapters.flower.client_side import client_reply  # noqa: E402
from dpprecond.adapters.flower.data import NodeFileData, PartitionedDataset  # noqa: E402
from dpprecond.adapters.flower.pca import (  # noqa: E402
    add_pca_handler,
    fit_pca_on_flower,
    make_pca_client_app,
    make_pca_server_app,
)
from dpprecond.adapters.flower.protocol import (  # noqa: E402
    RoundRequest,
    client_rng,
    simulator_seeds,
)
from dpprecond.adapters.flower.server_app import make_server_app  # noqa: E402
from dpprecond.adapters.flower.server_side import ServerSide  # noqa: E402
from dpprecond.adapters.flower.strategy import DPFedStrategy  # noqa: E402

__all__ = [
    "ClientInfo",
    "DPFedStrategy",
    "LocalData",
    "NodeFileData",
    "PartitionedDataset",
    "RoundRequest",
    "ServerSide",
    "add_pca_handler",
    "client_reply",
    "client_rng",
    "fit_pca_on_flower",
    "make_client_app",
    "make_pca_client_app",
    "make_pca_server_app",
    "make_server_app",
    "query_reply",
    "simulator_seeds",
    "train_reply",
]
