"""ClientApp: each client clips and noises its own release before it leaves the node.

Adapt it: replace ``load_client_data`` by your own ``load_data(info) -> LocalData``
(``info.client_id``, ``info.node_config``: where this node's records are).
"""

from dpprecond.adapters.flower import make_client_app
from dpprecond.adapters.flower.app import load_client_data

app = make_client_app(load_client_data)
