"""Crash-safe checkpoints of a federated run: one ``.npz`` file, written atomically.

A checkpoint holds everything a run needs to continue exactly as if it had not stopped:
the round, the model, the server transform's state, the method's client state, the
history, the releases recorded so far, and the root seed sequence of all randomness (from
which every (round, client) noise stream is derived). Resuming from it therefore gives the
same final model as an uninterrupted run.

**A checkpoint is as sensitive as the data.** It contains the noise seed: anyone holding
it (and the published model) can regenerate the noise. Keep it where the data is kept;
:func:`dpprecond.fl.engine.simulate` deletes it when the run completes.

Format: arrays are stored as ``.npy`` members; the structure (nested tuples, the server
transforms' state classes, dicts, scalars, DpEvents) is one JSON member.

**A checkpoint is data, never code.** Loading never unpickles (``allow_pickle=False``),
never imports anything named in the file, and rebuilds only the named tuples of an
explicit allowlist (:data:`STATE_CLASSES`, the state classes of
:mod:`dpprecond.fl.server`), by their name, with exactly their number of fields, each
field decoded as data. Anything else (another name, a wrong field count, an unknown
node, a missing array, a malformed event, a payload without the keys and types of a run's
checkpoint) is a ``ValueError`` that names the file and asks for it to be deleted. Whoever
can write the file can still change the resumed model and history (not run code): keep it
where the data is kept.

The file is written to a temporary name, flushed to disk and renamed over the target, so
a crash leaves either the previous checkpoint or the new one, never a torn file.

**Secure mode** (noise from the OS CSPRNG, which no seed regenerates). A process that
crashes after its last checkpoint may already have released the rounds after it; the
resumed run releases those rounds again, with fresh noise, so they are two releases. A
secure run's checkpoint therefore records ``pending``, the rounds the process may release
before its next checkpoint (``min(every, T - round)``), and the resumed run charges their
events once more and writes that charge back to the file, both before it releases
anything, so a second stop before the next checkpoint is charged again (conservative:
the crash may have come before some of those rounds). Each resume adds at most
``every`` rounds to the epsilon. A run
that is not secure re-releases identical sums (its streams come from the checkpoint's
root seed), which costs nothing, and records ``pending = 0``. The fingerprint of a secure
run differs from the same run's without secure mode, so neither resumes the other.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._files import atomic_write, remove_stale_temps
from dpprecond.accounting import event_from_dict, event_to_dict

__all__ = ["STATE_CLASSES", "fingerprint_of", "load_checkpoint", "lost_rounds",
           "open_checkpoint", "pending_rounds", "resumed_spend", "save_checkpoint",
           "write_checkpoint"]

#: Version 2 names state classes by their allowlisted name; version 1 files (module:name)
#: are still read through the same allowlist.
_FORMAT = 2
_READABLE = (1, 2)


def _allowlist() -> dict[str, type]:
    from dpprecond.fl import server

    classes: tuple[type, ...] = (server.EmptyState, server.TraceState, server.SofimState,
                                 server.AdamState, server.ScaffoldState, server.FedNewState)
    return {cls.__name__: cls for cls in classes}


#: The only classes a checkpoint may rebuild, by name (the server transforms' states).
STATE_CLASSES: dict[str, type] = _allowlist()

#: The payload of a run's checkpoint: key -> the type its value must have.
PAYLOAD_TYPES: dict[str, type | tuple[type, ...]] = {
    "fingerprint": str, "entropy": int, "spawn_key": list, "round": int,
    "params": np.ndarray, "history": list, "events": list}


def _encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    from dp_accounting import dp_event

    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = obj
        return {"__array__": key}
    if isinstance(obj, dp_event.DpEvent):
        return {"__event__": event_to_dict(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        name = type(obj).__name__
        if STATE_CLASSES.get(name) is not type(obj):
            raise TypeError(f"Cannot checkpoint a {type(obj).__module__}.{name}: only the "
                            f"state classes {sorted(STATE_CLASSES)} are allowed "
                            "(dpprecond.fl.checkpoint.STATE_CLASSES).")
        return {"__namedtuple__": name, "fields": [_encode(v, arrays) for v in obj]}
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
        cls = _state_class(tree["__namedtuple__"])
        fields = tree.get("fields")
        if not isinstance(fields, list):
            raise ValueError(f"the fields of a {cls.__name__} must be a list, got "
                             f"{type(fields).__name__}")
        if len(fields) != len(cls._fields):
            raise ValueError(f"{cls.__name__} has {len(cls._fields)} fields {cls._fields}, "
                             f"the file gives {len(fields)}")
        return cls(*(_decode(v, arrays) for v in fields))
    raise ValueError(f"Unknown node in checkpoint structure: {sorted(tree)}")


def _state_class(name: Any) -> Any:
    """The allowlisted class a checkpoint names (``Name``, or version 1's ``module:Name``)."""
    if isinstance(name, str):
        module, sep, short = name.rpartition(":")
        cls = STATE_CLASSES.get(short if sep else name)
        if cls is not None and (not sep or module == cls.__module__):
            return cls
    raise ValueError(f"{name!r} is not an allowed checkpoint state class (a checkpoint is "
                     f"data: only {sorted(STATE_CLASSES)} are rebuilt)")


def _check_payload(payload: Any) -> dict[str, Any]:
    """A run's checkpoint: a dict with every key of :data:`PAYLOAD_TYPES`, of its type."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a dict of run state, got {type(payload).__name__}")
    for key, kind in PAYLOAD_TYPES.items():
        if key not in payload:
            raise ValueError(f"the run state has no {key!r}")
        if not isinstance(payload[key], kind) or isinstance(payload[key], bool):
            raise ValueError(f"{key!r} must be of type {getattr(kind, '__name__', kind)}, got "
                             f"{type(payload[key]).__name__}")
    if "state" not in payload:
        raise ValueError("the run state has no 'state'")
    pending = payload.get("pending", 0)  # absent in files of earlier versions: 0
    if not isinstance(pending, int) or isinstance(pending, bool) or pending < 0:
        raise ValueError(f"'pending' must be an integer >= 0, got {pending!r}")
    payload["pending"] = pending
    return payload


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
            if not isinstance(meta, dict) or meta.get("format") not in _READABLE:
                found = meta.get("format") if isinstance(meta, dict) else meta
                raise ValueError(f"unsupported checkpoint format {found!r}")
            return _check_payload(_decode(meta["tree"], z))
    except FileNotFoundError:
        raise
    except Exception as exc:  # a torn or foreign file: say so, never a raw traceback
        raise ValueError(f"{path} is not a readable dpprecond checkpoint ({exc}); delete it "
                         "to start the run from the beginning.") from None


#: The layout of a checkpoint's state: ``(server state, client state or None)``.
_STATE_FORMAT = 2


def fingerprint_of(method: Any, config: Any, data: Any, model: Any,
                   X_test: np.ndarray, y_test: np.ndarray, *,
                   extra: dict[str, Any] | None = None) -> str:
    """The run a checkpoint belongs to: method, config, model, data and test data (and
    ``extra`` settings of the run, e.g. secure aggregation's ``min_clients``)."""
    h = hashlib.sha256()
    facts = {"method": method.describe(), "config": asdict(config), "model": repr(model),
             "state": _STATE_FORMAT}
    if extra:
        facts["extra"] = extra
    h.update(json.dumps(facts, sort_keys=True, default=str).encode())
    for arr in (data.X, data.y, data.bounds, X_test, y_test):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _check_resume(path: Path, state: dict[str, Any], n_rounds: int, model: Any) -> None:
    """A checkpoint of this run (same fingerprint) whose state fits the run, else ValueError."""
    def refuse(why: str) -> None:
        raise ValueError(f"The checkpoint {path} does not fit this run ({why}); delete it to "
                         "start the run from the beginning.")

    first = state["round"]
    if not 1 <= first < n_rounds:
        refuse(f"round {first} is outside 1..{n_rounds - 1}")
    if len(state["history"]) != first or any(
            not isinstance(h, dict) or h.get("round") != i + 1
            for i, h in enumerate(state["history"])):
        refuse(f"its history does not hold rounds 1..{first}")
    params = state["params"]
    expected = np.shape(model.init_params(np.random.default_rng(0)))
    if params.shape != expected or params.dtype.kind != "f" or not np.all(np.isfinite(params)):
        refuse(f"params of shape {params.shape} and dtype {params.dtype}, expected finite "
               f"floats of shape {expected}")
    if not all(isinstance(e, dp_event.DpEvent) for e in state["events"]):
        refuse("its events are not DpEvents")


def open_checkpoint(path: Path, fingerprint: str, root: np.random.SeedSequence, *,
                    seeded: bool, n_rounds: int, model: Any
                    ) -> tuple[dict[str, Any] | None, np.random.SeedSequence]:
    """``(the checkpoint's state or None, the run's root seed sequence)``: the state of
    ``path`` when it exists and belongs to this run (same ``fingerprint``; with a seed,
    the same seed), whose root it restores; else ``ValueError`` naming the file."""
    if not path.exists():
        return None, root
    resume = load_checkpoint(path)
    if resume["fingerprint"] != fingerprint:
        raise ValueError(f"The checkpoint {path} belongs to another run (method, config, "
                         "model or data differ); delete it or pass another checkpoint path.")
    if seeded and (resume["entropy"], tuple(resume["spawn_key"])) != (
            root.entropy, tuple(root.spawn_key)):
        raise ValueError(f"The checkpoint {path} was made with another seed.")
    _check_resume(path, resume, n_rounds, model)
    return resume, np.random.SeedSequence(resume["entropy"],
                                          spawn_key=tuple(resume["spawn_key"]))


def write_checkpoint(path: Path, fingerprint: str, root: np.random.SeedSequence,
                     done: int, params: np.ndarray, state: Any,
                     history: list[dict[str, float]], events: list[dp_event.DpEvent],
                     pending: int = 0) -> None:
    """Write a run's state after ``done`` rounds (:func:`save_checkpoint`: atomically, the
    root seed included); ``pending``: the rounds a secure run may release before its next
    checkpoint (module docstring; 0 for a run that is not secure)."""
    save_checkpoint(path, {
        "fingerprint": fingerprint, "entropy": root.entropy,
        "spawn_key": list(root.spawn_key), "round": done, "params": params, "state": state,
        "history": history, "events": events, "pending": int(pending)})


def pending_rounds(secure: bool, every: int, done: int, n_rounds: int) -> int:
    """The rounds a run may release after a checkpoint at round ``done`` before its next
    one: ``min(every, n_rounds - done)`` in secure mode, else 0 (module docstring)."""
    return min(every, n_rounds - done) if secure else 0


def lost_rounds(resume: dict[str, Any], secure: bool) -> int:
    """The rounds a resumed run charges again: the checkpoint's ``pending`` in secure mode
    (those rounds may have been released by the crashed process and are released again
    with fresh noise), else 0."""
    return int(resume["pending"]) if secure else 0


def resumed_spend(events: list[dp_event.DpEvent],
                  round_events: list[tuple[dp_event.DpEvent, int]],
                  rounds: int) -> dp_event.DpEvent:
    """What a resumed run will spend in its process: the checkpoint's ``events`` again,
    then ``rounds`` rounds (the lost ones and those left) of ``round_events`` (pairs of an
    event and its count per round), for a ledger's check before any charge."""
    return dp_event.ComposedDpEvent([
        *events, *(dp_event.SelfComposedDpEvent(e, c * rounds) for e, c in round_events)])
