"""The data layer: every loader returns a :class:`Dataset` in one format.

Loaders read local files only; nothing downloads at run time. A loader whose files are
absent raises ``FileNotFoundError`` saying which files it expected and where to put them.

Names known to :func:`load_dataset`:

- ``"digits"``: scikit-learn's bundled 8x8 digits (1797 images), the embedded default. It
  has no official test split; a fixed, seeded 80/20 stratified split is used.
- ``"fashion-mnist"``: the four IDX files (optionally gzipped), by default from the Debian
  package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``).
- ``"cifar10"``: the CIFAR-10 "python version" batches directory.
- ``"pathmnist"``: MedMNIST's ``pathmnist.npz``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dpprecond.data.base import Dataset
from dpprecond.data.digits import load_digits
from dpprecond.data.idx import load_fashion_mnist, read_idx
from dpprecond.data.tabular import load_matrix

__all__ = [
    "DATASETS",
    "Dataset",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_matrix",
    "read_idx",
]


def _cifar10(path: str | os.PathLike | None) -> Dataset:
    from dpprecond.data.cifar10 import load_cifar10

    return load_cifar10(path)


def _pathmnist(path: str | os.PathLike | None) -> Dataset:
    from dpprecond.data.pathmnist import load_pathmnist

    return load_pathmnist(path)


DATASETS: dict[str, Callable[[str | os.PathLike | None], Dataset]] = {
    "digits": lambda path: load_digits(),
    "fashion-mnist": load_fashion_mnist,
    "cifar10": _cifar10,
    "pathmnist": _pathmnist,
}


def load_dataset(name: str, path: str | os.PathLike | None = None) -> Dataset:
    """Load a named dataset (see the module docstring) from ``path`` or its default place.

    Parameters
    ----------
    name : {"digits", "fashion-mnist", "cifar10", "pathmnist"}
        The dataset.
    path : path-like, optional
        Directory or file holding the data; ``None`` uses the dataset's default location.
        Ignored for ``"digits"`` (bundled with scikit-learn).

    Returns
    -------
    Dataset
    """
    if name not in DATASETS:
        raise ValueError(f"Unknown dataset name={name!r}; expected one of {sorted(DATASETS)} "
                         "(or give a .npy/.csv file to the command that accepts one).")
    if path is not None and name != "digits":
        path = Path(path).expanduser()
    return DATASETS[name](path)
