"""``featurize``: turn a loaded image :class:`~dpprecond.data.base.Dataset` into features."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from pathlib import Path
from types import ModuleType

import numpy as np

from dpprecond._validation import check_choice, check_int
from dpprecond.data.base import Dataset, default_data_root
from dpprecond.features import cache as _cache
from dpprecond.features.pixels import check_unit_pixels, standardize_pixels

__all__ = [
    "FEATURE_KINDS",
    "RESNET20_CHECKPOINT_NAME",
    "RESNET20_CHECKPOINT_URL",
    "RESNET20_PREPROCESSING_VERSION",
    "featurize",
    "load_features",
    "resolve_checkpoint",
]

logger = logging.getLogger(__name__)

FEATURE_KINDS = ("pixels", "resnet20")
#: File name of the public CIFAR-100 ResNet-20 weights (the 8 hex digits prefix its SHA-256).
RESNET20_CHECKPOINT_NAME = "cifar100_resnet20-23dac2f1.pt"
RESNET20_CHECKPOINT_URL = ("https://github.com/chenyaofo/pytorch-cifar-models/releases/download/"
                           f"resnet/{RESNET20_CHECKPOINT_NAME}")
#: Bump when the preprocessing or the extraction changes: it is part of every cache key.
RESNET20_PREPROCESSING_VERSION = "resnet20-v1:hwc01-bilinear32-cifar100norm-gap64-float32"
_CHECKPOINT_ENV = "DPPRECOND_RESNET20_CHECKPOINT"


def _require_torch() -> ModuleType:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ImportError(
            'The "resnet20" features need PyTorch, which is an optional extra: '
            'pip install "dpprecond[torch]"') from None


def _default_checkpoint() -> Path:
    return default_data_root() / RESNET20_CHECKPOINT_NAME


def resolve_checkpoint(checkpoint: str | os.PathLike | None = None) -> Path:
    """Locate the ResNet-20 weights file. Nothing is ever downloaded.

    Order: the ``checkpoint`` argument; the ``DPPRECOND_RESNET20_CHECKPOINT`` environment
    variable; ``$DPPRECOND_DATA/cifar100_resnet20-23dac2f1.pt``; else
    ``~/.cache/dpprecond/cifar100_resnet20-23dac2f1.pt``.

    Raises
    ------
    FileNotFoundError
        Saying which file to get, from where, and where to put it.
    """
    if checkpoint is not None:
        path, origin = Path(checkpoint).expanduser(), "the checkpoint argument"
    elif os.environ.get(_CHECKPOINT_ENV):
        path, origin = Path(os.environ[_CHECKPOINT_ENV]).expanduser(), f"${_CHECKPOINT_ENV}"
    else:
        path, origin = _default_checkpoint(), "the default location"
    if not path.is_file():
        raise FileNotFoundError(
            f"ResNet-20 checkpoint not found: {path} (from {origin}) is not a file. The "
            f"'resnet20' features need the public CIFAR-100 ResNet-20 weights "
            f"{RESNET20_CHECKPOINT_NAME} (a torch state dict, about 1 MB) from "
            f"{RESNET20_CHECKPOINT_URL}. Put it at {_default_checkpoint()} (the environment "
            f"variable DPPRECOND_DATA sets that directory), or pass checkpoint=..., or set "
            f"{_CHECKPOINT_ENV} to its path.")
    return path


def _resnet20_features(dataset: Dataset, checkpoint: str | os.PathLike | None,
                       cache_dir: str | os.PathLike | None, batch_size: int, use_cache: bool,
                       progress: bool) -> tuple[np.ndarray, np.ndarray]:
    shape = dataset.image_shape
    if shape is None or len(shape) != 3 or shape[2] not in (1, 3):
        raise ValueError(f"The 'resnet20' features need images of shape (H, W, 1) or (H, W, 3); "
                         f"dataset {dataset.name!r} has image_shape={shape}.")
    if int(np.prod(shape)) != dataset.n_features:
        raise ValueError(f"Dataset {dataset.name!r}: image_shape={shape} does not match its "
                         f"{dataset.n_features} features per row.")
    _require_torch()
    ckpt = resolve_checkpoint(checkpoint)
    fields = {
        "kind": "resnet20",
        "version": RESNET20_PREPROCESSING_VERSION,
        "dataset": dataset.name,
        "n_train": int(dataset.X_train.shape[0]),
        "n_test": int(dataset.X_test.shape[0]),
        "image_shape": [int(s) for s in shape],
        "checkpoint_sha256": _cache.file_sha256(ckpt),
    }
    shapes = {"X_train": (int(dataset.X_train.shape[0]), 64),
              "X_test": (int(dataset.X_test.shape[0]), 64)}
    cdir = None
    if use_cache:
        cdir = _cache.default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
        fields["pixels_blake2b"] = _cache.array_digest(dataset.X_train, dataset.X_test)
        hit = _cache.load_cached(cdir, fields, shapes)
        if hit is not None:
            return hit["X_train"], hit["X_test"]
    resnet = importlib.import_module("dpprecond.features.resnet20")
    model = resnet.load_resnet20(ckpt)
    logger.info("extracting resnet20 features of %s (%d + %d images) with %s", dataset.name,
                fields["n_train"], fields["n_test"], ckpt)
    F_train = resnet.extract_features(model, dataset.X_train, shape, batch_size=batch_size,
                                      progress=progress)
    F_test = resnet.extract_features(model, dataset.X_test, shape, batch_size=batch_size,
                                     progress=progress)
    if cdir is not None:
        _cache.save_cached(cdir, fields, {"X_train": F_train, "X_test": F_test})
    return F_train, F_test


def featurize(dataset: Dataset, kind: str = "pixels", *,
              checkpoint: str | os.PathLike | None = None,
              cache_dir: str | os.PathLike | None = None, batch_size: int = 256,
              use_cache: bool = True, progress: bool = False) -> Dataset:
    """Return a copy of ``dataset`` whose ``X_train`` and ``X_test`` are features.

    Feature extraction is fixed (no parameter depends on the data), so it is
    post-processing of each record on its own: it costs no privacy and changes no
    sensitivity downstream, provided the downstream mechanism clips what it releases.

    Parameters
    ----------
    dataset : Dataset
        As returned by :func:`dpprecond.data.load_dataset`: raw pixels in [0, 1].
    kind : {"pixels", "resnet20"}, default="pixels"
        ``"pixels"``: the fixed rule ``(x - 0.5) / 0.5`` per pixel (no statistic of the
        private data, see :mod:`dpprecond.features.pixels`), shape (n, H*W*C).
        ``"resnet20"``: 64 globally pooled activations of the frozen CIFAR-100 ResNet-20
        (:mod:`dpprecond.features.resnet20`); needs torch and the checkpoint file.
    checkpoint : path-like, optional
        The ``cifar100_resnet20`` weights; see :func:`resolve_checkpoint` for the defaults.
    cache_dir : path-like, optional
        Directory of the feature cache (``"resnet20"`` only); default ``$DPPRECOND_CACHE``
        or ``~/.cache/dpprecond/features``. See :mod:`dpprecond.features.cache`.
    batch_size : int, default=256
        Images per forward pass; affects memory only.
    use_cache : bool, default=True
        Read and write the feature cache.
    progress : bool, default=False
        Show a progress bar while extracting.

    Returns
    -------
    Dataset
        Named ``"<name>+<kind>"``, same labels and ``n_classes``, float64 features and
        ``image_shape=None`` (the rows are no longer raw pixels in [0, 1]).

    Raises
    ------
    ImportError
        ``"resnet20"`` without torch installed.
    FileNotFoundError
        ``"resnet20"`` without the checkpoint file.
    ValueError
        Unknown ``kind``; values outside [0, 1]; ``"resnet20"`` on non-image data.
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"Expected dataset to be a dpprecond.data.Dataset, got "
                        f"{type(dataset).__name__}; load one with dpprecond.data.load_dataset.")
    check_choice("kind", kind, FEATURE_KINDS)
    batch_size = check_int("batch_size", batch_size, low=1)
    for split in ("X_train", "X_test"):
        check_unit_pixels(f"dataset.{split}", getattr(dataset, split))
    if kind == "pixels":
        F_train, F_test = standardize_pixels(dataset.X_train), standardize_pixels(dataset.X_test)
    else:
        F_train, F_test = _resnet20_features(dataset, checkpoint, cache_dir, batch_size,
                                             use_cache, progress)
    return dataclasses.replace(dataset, name=f"{dataset.name}+{kind}", X_train=F_train,
                               X_test=F_test, image_shape=None)


def load_features(data: str, data_path: str | os.PathLike | None = None,
                  features: str = "pixels", checkpoint: str | os.PathLike | None = None,
                  cache_dir: str | os.PathLike | None = None) -> tuple[Dataset, str]:
    """Load a named dataset and featurize it; return ``(dataset, description)``.

    ``"pixels"`` is the fixed public rule ``(x - 0.5) / 0.5``; ``"resnet20"`` the frozen
    CIFAR-100 ResNet-20 (see :func:`featurize`).
    """
    from dpprecond.data import load_dataset

    ds = load_dataset(data, data_path)
    desc = "pixels (x - 0.5) / 0.5" if features == "pixels" else f"{features} features"
    return featurize(ds, kind=features, checkpoint=checkpoint, cache_dir=cache_dir), desc
