"""Array backends of the federated kernels: numpy (default) and torch (CPU, or CUDA).

The round engine, the client mechanisms, the noise and the ledger are the same whatever
the backend: a backend only holds the training rows and runs the per-round kernel of the
linear head (:func:`dpprecond.fl.kernels.clipped_sums`) on them, returning the per-client
clipped sums to the host as float64 numpy arrays. The noise is then drawn on the host by
the library's noise source (:mod:`dpprecond.fl.client`, :mod:`dpprecond.secure`), never by
the backend's random number generator, so secure mode (the OS CSPRNG and snapping) holds
on every backend.

The interface is the handful of array operations the kernel needs (:class:`ArrayBackend`):
moving rows to the backend once per run, a matrix product, the row reductions and
elementwise maps of the softmax and of the clip factors, the float32 sub-block products
of :func:`dpprecond.fl.kernels.clipped_sums` with their float64 accumulation, and moving
the sums back. Arithmetic operators and slicing are the arrays' own (numpy arrays and
torch tensors share them).

Select a backend with ``FLConfig(backend="torch", device=...)``; ``device=None`` takes
CUDA when a GPU is present and the CPU otherwise. The torch backend needs the optional
extra ``dpprecond[torch]``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["BACKENDS", "ArrayBackend", "NumpyBackend", "TorchBackend", "backend_of",
           "cuda_available", "get_backend", "import_torch"]

#: The backend names ``FLConfig.backend`` accepts.
BACKENDS = ("numpy", "torch")


@runtime_checkable
class ArrayBackend(Protocol):
    """What the kernels need from an array library (see the module docstring)."""

    name: str
    device: str

    def asarray(self, a: np.ndarray, dtype: Any = None) -> Any:
        """``a`` on the backend (a copy unless it is already there with ``dtype``)."""
        ...

    def to_numpy(self, a: Any) -> np.ndarray:
        """``a`` as a host numpy array (no copy for numpy)."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """Zeros of ``shape``; ``dtype`` is a numpy dtype."""
        ...

    def errstate(self) -> contextlib.AbstractContextManager[Any]:
        """Silence overflow and invalid-value warnings (non-finite rows are handled)."""
        ...

    def col_max(self, a: Any) -> Any:
        """Maximum of each column of a 2-D array, shape (n,)."""
        ...

    def col_sum(self, a: Any) -> Any:
        """Sum of each column, shape (n,)."""
        ...

    def col_sq_norms(self, a: Any) -> Any:
        """Squared norm of each column, in ``a``'s dtype."""
        ...

    def exp_(self, a: Any) -> Any:
        """``exp`` in place."""
        ...

    def isfinite(self, a: Any) -> Any:
        """Elementwise finiteness."""
        ...

    def sqrt(self, a: Any) -> Any:
        """Elementwise square root."""
        ...

    def minimum(self, a: Any, b: float) -> Any:
        """Elementwise minimum with a scalar."""
        ...

    def where(self, cond: Any, a: Any, b: float) -> Any:
        """``a`` where ``cond``, else the scalar ``b``."""
        ...

    def astype(self, a: Any, dtype: Any) -> Any:
        """``a`` converted to the numpy dtype ``dtype``."""
        ...

    def sub_block_sums(self, A: Any, X: Any, rows: int) -> Any:
        """``A X`` as float64 (``A`` of shape (k, n), ``X`` (n, d)): float32 products of
        ``rows``-row sub-blocks of ``X``, whose partial sums are added in float64 (the
        rounding bound of :func:`dpprecond.fl.kernels.rounding_slack`)."""
        ...

    def label_index(self, y: np.ndarray) -> Any:
        """The labels as an index array on the backend."""
        ...


class NumpyBackend:
    """numpy arrays on the host (the default; the results of every committed run)."""

    name = "numpy"
    device = "cpu"

    def __repr__(self) -> str:
        return "NumpyBackend()"

    def asarray(self, a: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def errstate(self) -> contextlib.AbstractContextManager[Any]:
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")

    def col_max(self, a: np.ndarray) -> np.ndarray:
        return a.max(axis=0)

    def col_sum(self, a: np.ndarray) -> np.ndarray:
        return a.sum(axis=0)

    def col_sq_norms(self, a: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->j", a, a)

    def exp_(self, a: np.ndarray) -> np.ndarray:
        return np.exp(a, out=a)

    def isfinite(self, a: np.ndarray) -> np.ndarray:
        return np.isfinite(a)

    def sqrt(self, a: np.ndarray) -> np.ndarray:
        return np.sqrt(a)

    def minimum(self, a: np.ndarray, b: float) -> np.ndarray:
        return np.minimum(b, a)

    def where(self, cond: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
        return np.where(cond, a, b)

    def astype(self, a: np.ndarray, dtype: Any) -> np.ndarray:
        return a.astype(dtype)

    def sub_block_sums(self, A: np.ndarray, X: np.ndarray, rows: int) -> np.ndarray:
        n, d = X.shape
        k = A.shape[0]
        m = n // rows
        out = np.zeros((k, d))
        if m:  # one stacked product A_s X_s of all full sub-blocks, their partials
            # summed in float64
            P = np.matmul(A[:, :m * rows].reshape(k, m, rows).transpose(1, 0, 2),
                          X[:m * rows].reshape(m, rows, d))
            out += P.sum(axis=0, dtype=np.float64)
        if m * rows < n:
            out += A[:, m * rows:] @ X[m * rows:]
        return out

    def label_index(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y)


def import_torch(what: str = "backend='torch'") -> Any:
    """``torch``, or an ImportError saying that ``what`` needs the extra ``[torch]``."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"{what} needs PyTorch: pip install 'dpprecond[torch]'") from exc
    return torch


_TORCH_DTYPES = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32",
                 np.dtype(np.int64): "int64", np.dtype(bool): "bool"}


class TorchBackend:
    """torch tensors on one device (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).

    Parameters
    ----------
    device : str or None
        ``None``: CUDA when ``torch.cuda.is_available()``, else the CPU.
    """

    name = "torch"

    def __init__(self, device: str | None = None) -> None:
        torch = import_torch("backend='torch' (or use backend='numpy')")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r} is not a torch device; use 'cpu', 'cuda' or "
                             "'cuda:N' (or None: CUDA when present).") from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs a CUDA GPU, and torch sees none; use "
                             "device='cpu' or device=None.")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}: only 'cpu' and 'cuda' devices are "
                             "supported.")
        self.torch = torch
        self._device = dev
        self.device = str(dev)

    def __repr__(self) -> str:
        return f"TorchBackend(device={self.device!r})"

    def _dtype(self, dtype: Any) -> Any:
        return getattr(self.torch, _TORCH_DTYPES[np.dtype(dtype)])

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        torch = self.torch
        if isinstance(a, torch.Tensor):
            t = a
        else:
            t = torch.from_numpy(np.ascontiguousarray(a))
        return t.to(device=self._device,
                    dtype=self._dtype(dtype) if dtype is not None else None)

    def to_numpy(self, a: Any) -> np.ndarray:
        if isinstance(a, self.torch.Tensor):
            return a.detach().cpu().numpy()
        return np.asarray(a)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.zeros(shape, dtype=self._dtype(dtype), device=self._device)

    def errstate(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def col_max(self, a: Any) -> Any:
        return a.amax(dim=0)

    def col_sum(self, a: Any) -> Any:
        return a.sum(dim=0)

    def col_sq_norms(self, a: Any) -> Any:
        return (a * a).sum(dim=0)

    def exp_(self, a: Any) -> Any:
        return a.exp_()

    def isfinite(self, a: Any) -> Any:
        return self.torch.isfinite(a)

    def sqrt(self, a: Any) -> Any:
        return self.torch.sqrt(a)

    def minimum(self, a: Any, b: float) -> Any:
        return self.torch.clamp(a, max=b)

    def where(self, cond: Any, a: Any, b: float) -> Any:
        return self.torch.where(cond, a, self.torch.tensor(b, dtype=a.dtype,
                                                           device=a.device))

    def astype(self, a: Any, dtype: Any) -> Any:
        return a.to(self._dtype(dtype))

    def sub_block_sums(self, A: Any, X: Any, rows: int) -> Any:
        n, d = X.shape
        k = A.shape[0]
        m = n // rows
        out = self.torch.zeros((k, d), dtype=self.torch.float64, device=X.device)
        if m:
            P = self.torch.bmm(A[:, :m * rows].reshape(k, m, rows).transpose(0, 1),
                               X[:m * rows].reshape(m, rows, d))
            out += P.to(self.torch.float64).sum(dim=0)
        if m * rows < n:
            out += (A[:, m * rows:] @ X[m * rows:]).to(self.torch.float64)
        return out

    def label_index(self, y: np.ndarray) -> Any:
        return self.asarray(np.asarray(y, dtype=np.int64))


_NUMPY = NumpyBackend()


def get_backend(name: str = "numpy", device: str | None = None) -> ArrayBackend:
    """The backend ``name`` (``"numpy"`` or ``"torch"``) on ``device`` (torch only)."""
    if name == "numpy":
        if device not in (None, "cpu"):
            raise ValueError(f"device={device!r} needs backend='torch' (the numpy backend "
                             "runs on the CPU).")
        return _NUMPY
    if name == "torch":
        return TorchBackend(device)
    raise ValueError(f"backend={name!r} is not one of {BACKENDS}.")


def backend_of(a: Any) -> ArrayBackend:
    """The backend holding ``a``: a torch tensor's device, else numpy."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        return TorchBackend(str(a.device))
    return _NUMPY


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA GPU (False without torch)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    return bool(torch.cuda.is_available())
