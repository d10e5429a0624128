import numpy as np
import pytest

from dpprecond.data.synthetic import exact_spectrum, spiked_covariance


@pytest.fixture(scope="session")
def gap_matrix():
    """Rows of norm <= 1, a clear top-3 gap: sigma_4^2 / sigma_3^2 = 0.3."""
    A = exact_spectrum(400, 12, 3, 0.3, seed=7)
    return A / np.linalg.norm(A, axis=1).max()


@pytest.fixture(scope="session")
def spiked():
    """Family 1 with a gap large enough that private selection does not exit early."""
    return spiked_covariance(20000, 10, 2, 20.0, seed=3)
