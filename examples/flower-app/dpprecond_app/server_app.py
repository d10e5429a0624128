"""ServerApp: dpprecond's DP strategy, configured by the run config.

Adapt it: build a ``DPFedStrategy`` (or a ``SecAggDPStrategy``) in Python instead (your
model, method and ``FLConfig``), or write the result somewhere else. Keep the check first:
a bad run config then fails before any data is loaded or any node is waited for.
"""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dpprecond.adapters.flower.app import (
    check_run_config,
    federation_size,
    run_secagg,
    save_result,
    secagg_strategy_from_run_config,
    strategy_from_run_config,
)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Check the run config, size the federation, train, save."""
    run_config = dict(context.run_config)
    check_run_config(run_config)  # RunConfigError naming the key, before anything starts
    # n-clients = 0: the federation's size, as the SuperNodes report it (num-partitions)
    n_clients = int(run_config["n-clients"]) or federation_size(
        grid, float(run_config["connect-timeout"]))
    timeout = float(run_config["round-timeout"])
    if run_config["trust"] == "secure-aggregation":  # Flower's SecAgg+, distributed noise
        strategy = secagg_strategy_from_run_config(context, n_clients=n_clients)
        result = run_secagg(grid, context, strategy, timeout)
    else:  # each client adds its own noise
        # test accuracy on the public test split: Flower's "ServerApp-side Evaluate Metrics"
        result = strategy_from_run_config(context, n_clients=n_clients).run(grid,
                                                                          timeout=timeout)
    # with adaptive-clip = true, result.config["clip_norms"] holds the clip of every round
    save_result(result, context)  # result.json and params.npy in output-dir, if set
