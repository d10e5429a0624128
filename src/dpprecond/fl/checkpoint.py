"""Crash-safe checkpoints of a federated run: one ``.npz`` file, written atomically.

A checkpoint holds everything a run needs to continue exactly as if it had not stopped:
the round, the model, the server transform's state, the method's client state, the
history, the releases recorded so far, and the root seed sequence of all randomness (from
which every (round, client) noise stream is derived). Resuming from it therefore gives the
same final model as an uninterrupted run.

**A checkpoint is as sensitive as the data.** It contains the noise seed: anyone holding
it (and the published model) can regenerate the noise. Keep it where the data is kept;
:func:`dpprecond.fl.engine.simulate` deletes it when the run completes.

Format: arrays are stored as ``.npy`` members; the structure (nested tuples, named tuples
of dpprecond's own classes, dicts, scalars, DpEvents) is one JSON member. Loading never
unpickles (``allow_pickle=False``) and only rebuilds named tuples defined in dpprecond.
The file is written to a temporary name, flushed to disk and renamed over the target, so
a crash leaves either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond._files import atomic_write, remove_stale_temps
from dpprecond.accounting import event_from_dict, event_to_dict

__all__ = ["load_checkpoint", "save_checkpoint"]

_FORMAT = 1


def _encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    from dp_accounting import dp_event

    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = obj
        return {"__array__": key}
    if isinstance(obj, dp_event.DpEvent):
        return {"__event__": event_to_dict(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        cls = type(obj)
        return {"__namedtuple__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, arrays) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("checkpoint dicts need string keys")
        return {"__dict__": {k: _encode(v, arrays) for k, v in obj.items()}}
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": repr(obj)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"Cannot checkpoint an object of type {type(obj).__name__}.")


def _decode(tree: Any, arrays: Any) -> Any:
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__array__" in tree:
        return np.array(arrays[tree["__array__"]])
    if "__event__" in tree:
        return event_from_dict(tree["__event__"])
    if "__tuple__" in tree:
        return tuple(_decode(v, arrays) for v in tree["__tuple__"])
    if "__dict__" in tree:
        return {k: _decode(v, arrays) for k, v in tree["__dict__"].items()}
    if "__float__" in tree:
        return float(tree["__float__"])
    if "__namedtuple__" in tree:
        module, _, name = tree["__namedtuple__"].partition(":")
        if not module.startswith("dpprecond."):
            raise ValueError(f"Refusing to rebuild {tree['__namedtuple__']!r} from a "
                             "checkpoint: only dpprecond's own state classes are allowed.")
        cls = getattr(importlib.import_module(module), name)
        return cls(*(_decode(v, arrays) for v in tree["fields"]))
    raise ValueError(f"Unknown node in checkpoint structure: {sorted(tree)}")


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` (see the module docstring) to ``path`` atomically."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(payload, arrays)
    meta = json.dumps({"format": _FORMAT, "tree": tree})
    remove_stale_temps(path.parent)
    members = {**arrays, "__meta__": np.array(meta)}
    atomic_write(path, lambda fh: np.savez(fh, **members))  # type: ignore[arg-type]


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``ValueError`` if corrupt)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            if meta.get("format") != _FORMAT:
                raise ValueError(f"unsupported checkpoint format {meta.get('format')!r}")
            return _decode(meta["tree"], z)
    except FileNotFoundError:
        raise
    except Exception as exc:  # a torn or foreign file: say so, never a raw traceback
        raise ValueError(f"{path} is not a readable dpprecond checkpoint ({exc}); delete it "
                         "to start the run from the beginning.") from None
