"""Fixed (data-independent) feature maps for image datasets.

- :func:`featurize` with ``kind="pixels"``: standardized pixels with fixed constants
  (:mod:`dpprecond.features.pixels`).
- :func:`featurize` with ``kind="resnet20"``: the frozen CIFAR-100 ResNet-20 as a 64-dim
  extractor (:mod:`dpprecond.features.resnet20`, needs the optional torch extra and a local
  checkpoint file), with an on-disk cache (:mod:`dpprecond.features.cache`).

Importing this package does not import torch.
"""

from dpprecond.features.extract import (
    FEATURE_KINDS,
    RESNET20_CHECKPOINT_NAME,
    RESNET20_CHECKPOINT_URL,
    featurize,
    load_features,
    resolve_checkpoint,
)
from dpprecond.features.pixels import standardize_pixels

__all__ = [
    "FEATURE_KINDS",
    "RESNET20_CHECKPOINT_NAME",
    "RESNET20_CHECKPOINT_URL",
    "featurize",
    "load_features",
    "resolve_checkpoint",
    "standardize_pixels",
]
