"""torch is an optional extra: the package imports without it and says what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpprecond.data import Dataset
from dpprecond.features import featurize


def test_without_torch_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    ds = Dataset("imgs", rng.random((2, 12)), np.array([0, 1]), rng.random((1, 12)),
                 np.array([1]), n_classes=2, image_shape=(2, 2, 3))
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ImportError, match=r'pip install "dpprecond\[torch\]"'):
        featurize(ds, "resnet20", use_cache=False)
    assert featurize(ds, "pixels").X_train.shape == (2, 12)  # pixels need no torch


def test_importing_features_does_not_import_torch() -> None:
    code = ("import sys, dpprecond.features as f; "
            "f.featurize; assert 'torch' not in sys.modules, 'torch imported'")
    src = Path(__file__).resolve().parents[2] / "src"
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={"PYTHONPATH": str(src), "PATH": ""})
