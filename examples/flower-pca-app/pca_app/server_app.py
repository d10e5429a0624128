"""ServerApp: dpprecond's federated private PCA, configured by the run config.

Adapt it: call ``fit_pca_on_flower(grid, k, ...)`` with your own settings, or write the
result somewhere else. Keep the check first: a bad run config then fails before any node is
waited for or any message is sent.
"""

from logging import INFO

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from dpprecond.adapters.flower.pca import fit_pca_on_flower
from dpprecond.adapters.flower.pca_app import (
    check_pca_run_config,
    check_secure_shape,
    save_pca_result,
)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Check the run config, register the clients, fit, save."""
    # RunConfigError naming the key, before anything starts
    settings = check_pca_run_config(dict(context.run_config))
    # secure aggregation: a dataset whose sums SecAgg+ cannot carry, before any node
    check_secure_shape(settings)
    # n-clients = 0: every SuperNode of the federation (partition-id 0 .. num-partitions - 1)
    result = fit_pca_on_flower(grid, **settings.fit_kwargs())
    log(INFO, "federated PCA (%s, k=%d, %d clients, trust=%s): epsilon=%.6g at delta=%g",
        result.method, settings.n_components, result.info["n_clients"], settings.trust,
        result.epsilon, result.delta)
    save_pca_result(result, settings)  # result.json, components.npy, ... in output-dir, if set
