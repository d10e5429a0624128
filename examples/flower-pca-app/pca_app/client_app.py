"""ClientApp: each client scales, clips and noises its own part before it leaves the node.

Under ``trust = "local"`` every release carries the client's full Gaussian noise; under
``trust = "secure-aggregation"`` the client sends its part, rounded, with its Skellam
share of the noise, through Flower's SecAgg+ (masked: the server sees only the sum). Adapt it:
replace ``load_pca_rows`` by your own ``load_rows(info) -> X_i`` (this node's raw rows;
``info.client_id``, ``info.node_config``: where they are). The server's public
``row-norm`` scales and clips them here.
"""

from dpprecond.adapters.flower.pca import make_pca_client_app
from dpprecond.adapters.flower.pca_app import load_pca_rows

app = make_pca_client_app(load_pca_rows)
