"""Review 32b: a SuperNode's own secure-mode setting on Flower's SecAgg+ PCA releases.

Node config ``secure-noise=true`` is documented as the operator's own demand for
secure-mode noise "whatever the server asks" (docs/flower.md). The SecAgg+ PCA client
draws its Skellam shares from numpy generators, so such a node must refuse a secure PCA
release rather than answer it with non-secure noise.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message

from dpprecond.adapters.flower.pca import ClientMissingError, SplitRows, fit_pca_on_flower
from tests.adapters.test_flower_pca import _task_identity  # noqa: F401  (autouse)
from tests.adapters.test_flower_pca_secagg import FIT, Grid, K


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)
    return X, np.linspace(0, X.shape[0], K + 1).astype(np.int64)


@pytest.mark.parametrize("dual", [False, True])
def test_a_secure_noise_node_refuses_a_secagg_plus_pca_release(digits, dual) -> None:
    """Every node sets secure-noise=true: none answers a SecAgg+ PCA release (whose share
    would come from a numpy generator), by name; nothing is released."""
    from dpprecond.adapters.flower.pca import make_pca_client_app
    from dpprecond.adapters.flower.secagg import make_dual_client_app

    rows = SplitRows(*digits)
    inner = (make_dual_client_app(rows, pca=True) if dual else make_pca_client_app(rows))
    errors: list[str] = []

    def recording(message: Message, context: Context) -> Message:
        try:
            return inner(message, context)
        except Exception as exc:
            errors.append(str(exc))
            raise

    def cfg(i: int) -> dict:
        return {"partition-id": i, "num-partitions": K, "secure-noise": True}

    with pytest.raises(ClientMissingError, match="released nothing"):
        fit_pca_on_flower(Grid(recording, node_config=cfg), 4,  # type: ignore[arg-type]
                          method="analyze_gauss", connect_timeout=0.5, **FIT)
    assert errors and all("secure-noise" in e for e in errors)
