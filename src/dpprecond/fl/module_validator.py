"""Which torch layers per-example gradients can go through, and a fix for the others.

:class:`dpprecond.fl.models.TorchModel` computes every record's gradient separately with
``torch.func`` (``vmap(grad(loss))``), which is what makes per-example clipping, and so
the sensitivity, hold. Some layers cannot be computed that way, and some would break the
privacy argument even if they could:

- **BatchNorm** (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``): normalises each record with
  statistics of the *other* records of its batch (a record's gradient then depends on the
  others, so clipping it no longer bounds its influence) and updates running statistics in
  place (``torch.func`` refuses: "attempted to call in-place operation"). Fix: ``GroupNorm``
  with ``gcd(32, C)`` groups (per-record statistics), or ``LayerNorm``.
- **InstanceNorm with** ``track_running_stats=True``: in-place running statistics. Fix:
  the same layer with ``track_running_stats=False``.
- **Dropout** (every kind): random inside the per-example gradient (``vmap`` refuses random
  operations; the library's randomness is its noise, drawn apart). Fix: ``Identity``.
- **Recurrent layers** (``RNN``, ``LSTM``, ``GRU``): ``vmap`` has no batching rule for
  their fused kernels. No automatic fix: write the recurrence with ``Linear`` cells.

:func:`validate_module` lists the problems (layer name, type, why, the fix),
:func:`check_module` raises :class:`UnsupportedModuleError` naming them (what
``TorchModel`` does), and :func:`fix_module` returns a copy with every fixable layer
replaced, in the spirit of Opacus's ``ModuleValidator.validate`` / ``fix``.
"""

from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

__all__ = ["LayerProblem", "UnsupportedModuleError", "check_module", "fix_module",
           "validate_module"]


class LayerProblem(NamedTuple):
    """One layer that per-example gradients cannot go through."""

    name: str
    layer: str
    reason: str
    fix: str | None

    def __str__(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else "; no automatic fix"
        return f"{self.name or '<root>'} ({self.layer}): {self.reason}{fix}"


class UnsupportedModuleError(ValueError):
    """A module with layers that per-example gradients cannot go through."""


def _torch() -> Any:
    from dpprecond.fl.backend import import_torch

    return import_torch("Validating a torch module")


def _problem(name: str, mod: Any) -> LayerProblem | None:
    nn = _torch().nn
    kind = type(mod).__name__
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        return LayerProblem(name, kind, "normalises each record with its batch's statistics "
                            "(a record's gradient depends on the others) and updates running "
                            "statistics in place",
                            f"GroupNorm({math.gcd(32, mod.num_features)}, "
                            f"{mod.num_features}) or LayerNorm")
    if isinstance(mod, nn.modules.instancenorm._InstanceNorm) and mod.track_running_stats:
        return LayerProblem(name, kind, "updates running statistics in place",
                            f"{kind}(..., track_running_stats=False)")
    if isinstance(mod, nn.modules.dropout._DropoutNd):
        return LayerProblem(name, kind, "random inside the per-example gradient (vmap refuses "
                            "random operations)", "Identity()")
    if isinstance(mod, nn.RNNBase):
        return LayerProblem(name, kind, "vmap has no batching rule for fused recurrent "
                            "kernels", None)
    return None


def validate_module(module: Any) -> list[LayerProblem]:
    """Every layer of ``module`` that per-example gradients cannot go through (or ``[]``)."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected a torch.nn.Module, got {type(module).__name__}.")
    return [p for name, mod in module.named_modules()
            if (p := _problem(name, mod)) is not None]


def check_module(module: Any) -> None:
    """Raise :class:`UnsupportedModuleError` naming every unsupported layer and its fix."""
    problems = validate_module(module)
    if problems:
        fixable = all(p.fix is not None for p in problems)
        hint = ("dpprecond.fl.fix_module(module) returns a copy with these layers replaced."
                if fixable else "Replace the layers without an automatic fix by hand.")
        raise UnsupportedModuleError(
            "The module has layers that per-example gradients (torch.func) cannot go "
            "through:\n  " + "\n  ".join(str(p) for p in problems) + f"\n{hint}")


def _replacement(mod: Any, norm: str) -> Any:
    nn = _torch().nn
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        c = mod.num_features
        if norm == "layer":
            return nn.LayerNorm(c, eps=mod.eps, elementwise_affine=mod.affine)
        return nn.GroupNorm(math.gcd(32, c), c, eps=mod.eps, affine=mod.affine)
    if isinstance(mod, nn.modules.instancenorm._InstanceNorm):
        new = type(mod)(mod.num_features, eps=mod.eps, momentum=mod.momentum,
                        affine=mod.affine, track_running_stats=False)
        if mod.affine:
            new.load_state_dict({"weight": mod.weight.detach(), "bias": mod.bias.detach()})
        return new
    return nn.Identity()


def fix_module(module: Any, *, norm: str = "group") -> Any:
    """A copy of ``module`` with every fixable unsupported layer replaced.

    BatchNorm becomes ``GroupNorm(gcd(32, C), C)`` (``norm="group"``, the default) or
    ``LayerNorm(C)`` (``norm="layer"``, for (n, C) inputs), with fresh affine parameters;
    InstanceNorm stops tracking running statistics; Dropout becomes ``Identity``. The new
    layers take the dtype and device of the module's parameters. Raises
    :class:`UnsupportedModuleError` when a layer has no automatic fix (recurrent layers).
    """
    if norm not in ("group", "layer"):
        raise ValueError(f"norm={norm!r} is not one of ('group', 'layer').")
    problems = validate_module(module)
    manual = [p for p in problems if p.fix is None]
    if manual:
        raise UnsupportedModuleError("No automatic fix for:\n  "
                                     + "\n  ".join(str(p) for p in manual))
    fixed = copy.deepcopy(module)
    ref = next(iter(fixed.parameters()), None)
    for p in problems:
        parent_name, _, child = p.name.rpartition(".")
        if not child:
            raise UnsupportedModuleError(f"The module itself is {p.layer}: {p.reason}; "
                                         f"use {p.fix} instead.")
        parent = fixed.get_submodule(parent_name) if parent_name else fixed
        new = _replacement(getattr(parent, child), norm)
        if ref is not None:
            new = new.to(dtype=ref.dtype, device=ref.device)
        setattr(parent, child, new)
    return fixed
