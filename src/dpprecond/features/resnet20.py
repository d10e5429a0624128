"""The CIFAR ResNet-20 backbone as a frozen 64-dimensional feature extractor (needs torch).

Architecture (He et al. 2016, CIFAR variant), laid out so that its ``state_dict`` has exactly
the keys and shapes of the public ``cifar100_resnet20`` checkpoint
(``cifar100_resnet20-23dac2f1.pt``, released with chenyaofo/pytorch-cifar-models):

- ``conv1``: 3x3 conv 3 -> 16, no bias; ``bn1``; ReLU.
- ``layer1``, ``layer2``, ``layer3``: 3 basic blocks each, 16, 32 and 64 channels; the first
  block of ``layer2`` and ``layer3`` has stride 2. A basic block is
  ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with 3x3 convs without bias; the
  shortcut is the identity, or ``downsample`` = (1x1 conv with stride, BatchNorm) where the
  shape changes (keys ``layerK.0.downsample.0.weight`` and ``layerK.0.downsample.1.*``).
- global average pooling to 64 values, then ``fc``: Linear 64 -> 100 (unused for features).

Input preprocessing: pixels in [0, 1], RGB, resized to 32x32 with bilinear interpolation when
needed (``align_corners=False``, as ``torchvision.transforms.Resize`` on tensors; PathMNIST's
28x28 images are upsampled this way), grey images repeated on the three channels, then
normalised with the checkpoint's CIFAR-100 training statistics. Those constants describe a
different, public dataset, so using them leaks nothing about the private data.

This module imports torch at import time; :mod:`dpprecond.features` imports it lazily.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpprecond.features.cache import file_sha256

__all__ = [
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "INPUT_SIDE",
    "CifarResNet20",
    "extract_features",
    "load_resnet20",
    "read_state_dict",
]

logger = logging.getLogger(__name__)

#: Channel means and standard deviations of CIFAR-100's training images, as used to train the
#: public ``cifar100_resnet20`` weights (chenyaofo/image-classification-codebase configs).
CIFAR100_MEAN = (0.5070, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2761)
#: Side of the square input the network was trained on.
INPUT_SIDE = 32
FEATURE_DIM = 64


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out, stride)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = _conv3x3(c_out, c_out)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class CifarResNet20(nn.Module):
    """ResNet-20 for 32x32 inputs: 3 stages x 3 basic blocks, 16/32/64 channels.

    Parameters
    ----------
    num_classes : int, default=100
        Outputs of the ``fc`` classifier (100 for the CIFAR-100 checkpoint).
    """

    def __init__(self, num_classes: int = 100) -> None:
        super().__init__()
        self.conv1 = _conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._stage(16, 16, stride=1)
        self.layer2 = self._stage(16, 32, stride=2)
        self.layer3 = self._stage(32, 64, stride=2)
        self.fc = nn.Linear(FEATURE_DIM, num_classes)

    @staticmethod
    def _stage(c_in: int, c_out: int, stride: int, n_blocks: int = 3) -> nn.Sequential:
        blocks = [_BasicBlock(c_in, c_out, stride)]
        blocks += [_BasicBlock(c_out, c_out, 1) for _ in range(n_blocks - 1)]
        return nn.Sequential(*blocks)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally average-pooled output of ``layer3``: shape (n, 64)."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits, shape (n, num_classes)."""
        return self.fc(self.features(x))


_HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.(?:pt|pth)$")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a ResNet-20 state dict from a local ``torch.save`` file, safely.

    Uses ``torch.load(weights_only=True)``, which refuses arbitrary pickled objects. Accepts a
    bare state dict (the public release's format), or one wrapped under ``"state_dict"`` or
    ``"model"``, with or without the ``"module."`` prefix of ``DataParallel``. If the file
    name carries a hash as in ``cifar100_resnet20-23dac2f1.pt`` (torch.hub's convention: a
    prefix of the SHA-256 of the file), the file's hash must start with it.

    Raises
    ------
    ValueError
        If the file is not a state dict or its hash does not match its name.
    """
    path = Path(path)
    match = _HASH_IN_NAME.search(path.name)
    if match is not None:
        digest = file_sha256(path)
        if not digest.startswith(match.group(1)):
            raise ValueError(f"{path}: SHA-256 {digest[:16]}... does not start with the hash "
                             f"{match.group(1)} in its name; the file is corrupt or "
                             "incomplete. Download it again.")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a bad or unsafe file
        raise ValueError(f"{path} is not a readable torch checkpoint: {exc}") from None
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):
            if wrapper in obj and isinstance(obj[wrapper], Mapping):
                obj = obj[wrapper]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor)
                                               for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict (a mapping of parameter names to "
                         f"tensors), got {type(obj).__name__}.")
    return {str(k).removeprefix("module."): v for k, v in obj.items()}


def load_resnet20(path: str | os.PathLike) -> CifarResNet20:
    """Build ResNet-20, load the checkpoint's weights, freeze it and put it in eval mode.

    Raises
    ------
    ValueError
        If the checkpoint's keys or shapes do not match the ``cifar100_resnet20`` layout;
        the message lists the missing, unexpected and mis-shaped entries.
    """
    state = read_state_dict(path)
    fc = state.get("fc.weight")
    num_classes = int(fc.shape[0]) if fc is not None and fc.ndim == 2 else 100
    model = CifarResNet20(num_classes=num_classes)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k}: {tuple(state[k].shape)} (expected {tuple(v.shape)})"
             for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong:
        def _head(items: list[str]) -> str:
            return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")

        problems = [f"{label} {_head(items)}" for label, items in
                    (("missing", missing), ("unexpected", unexpected), ("mis-shaped", wrong))
                    if items]
        raise ValueError(f"{path} is not a cifar100_resnet20 checkpoint: "
                         f"{'; '.join(problems)}.")
    model.load_state_dict(state, strict=True)
    model.eval()
    model.requires_grad_(False)
    return model


def _preprocess(batch: np.ndarray) -> torch.Tensor:
    """(n, H, W, C) pixels in [0, 1] -> normalised (n, 3, 32, 32) float32 tensor."""
    x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)).permute(0, 3, 1, 2)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if tuple(x.shape[2:]) != (INPUT_SIDE, INPUT_SIDE):
        x = F.interpolate(x, size=(INPUT_SIDE, INPUT_SIDE), mode="bilinear",
                          align_corners=False)
    mean = torch.tensor(CIFAR100_MEAN, dtype=x.dtype).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR100_STD, dtype=x.dtype).view(1, 3, 1, 1)
    return (x - mean) / std


def extract_features(model: CifarResNet20, X: np.ndarray, image_shape: tuple[int, ...], *,
                     batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """Run the frozen backbone on flattened images, in batches.

    Parameters
    ----------
    model : CifarResNet20
        In eval mode (BatchNorm uses its stored running statistics, so a row's features do
        not depend on the other rows of its batch).
    X : ndarray of shape (n, H*W*C)
        Pixels in [0, 1], rows flattened row-major in (H, W, C) order.
    image_shape : (H, W, C)
        With ``C`` in {1, 3}.
    batch_size : int, default=256
        Images per forward pass (memory, not results).
    progress : bool, default=False
        Show a tqdm progress bar.

    Returns
    -------
    ndarray of shape (n, 64), float64
    """
    n = X.shape[0]
    images = X.reshape(n, *image_shape)
    out = np.empty((n, FEATURE_DIM), dtype=np.float64)
    starts = range(0, n, batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="resnet20 features", unit="batch")
    model.eval()
    with torch.inference_mode():
        for start in starts:
            stop = min(start + batch_size, n)
            out[start:stop] = model.features(_preprocess(images[start:stop])).numpy()
    return out
