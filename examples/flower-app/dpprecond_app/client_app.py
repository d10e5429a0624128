"""ClientApp: each client clips and noises its own release before it leaves the node.

With ``trust = "local"`` a release carries the client's full noise; with
``trust = "secure-aggregation"`` it is the client's share of the distributed noise, sent
through Flower's ``secaggplus_mod`` (the server sees only the sum). Adapt it: replace
``load_client_data`` by your own ``load_data(info) -> LocalData`` (``info.client_id``,
``info.node_config``: where this node's records are). ``pca=True`` makes the same nodes
answer dpprecond's federated PCA too, under both trust models (off here: this app's
ServerApp trains only, and a node answers only the releases its operator chose).
"""

from dpprecond.adapters.flower.app import load_client_data
from dpprecond.adapters.flower.secagg import make_dual_client_app

app = make_dual_client_app(load_client_data)
