"""Crash-safe file writes and the one JSON format of every output.

:func:`atomic_write` writes to ``<name>.tmp<pid>``, flushes it to disk and renames it over
the target, so a crash leaves the old file or the new one, never a torn file. A process
killed between the write and the rename leaves its temporary file behind;
:func:`remove_stale_temps` deletes those whose process no longer exists. A full disk is a
clear ``OSError`` naming the file, and the partial temporary file is removed.

Every JSON file the library and the CLI write (``dpprecond pca --json``, ``history.json``
of ``dpprecond fl``, the Flower app's ``result.json``, an experiment's ``runs/*.json``,
``results.json`` and ``tuning.json``) goes through :func:`write_json`: strict JSON
(RFC 8259; no bare ``Infinity`` or ``NaN``, which are not JSON), written atomically.
Numbers that are not finite are written as ``null``: an ``epsilon`` of ``null`` is a
non-private run (infinite epsilon), any other ``null`` an undefined value (the clip radius
of a fit that did not clip, the loss of a non-finite model). Arrays are nested lists (a
matrix is a list of rows), numpy scalars plain numbers. See docs/outputs.md.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["atomic_write", "json_ready", "remove_stale_temps", "strict_json", "write_json"]

_TEMP = re.compile(r"\.tmp(\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(directory: str | os.PathLike) -> int:
    """Delete ``*.tmp<pid>`` files in ``directory`` left by processes that no longer exist.

    Returns how many were removed.
    """
    removed = 0
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    for path in directory.iterdir():
        m = _TEMP.search(path.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` atomically: ``write(fh)`` fills a temporary file that replaces it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        hint = ("the disk is full: free space or write elsewhere" if exc.errno == errno.ENOSPC
                else "check the path and its permissions")
        raise OSError(exc.errno, f"Could not write {path}: {exc.strerror} ({hint}).") from None


def json_ready(obj: Any) -> Any:
    """``obj`` with arrays as nested lists, numpy scalars as numbers, non-finite floats as
    ``None`` and tuples as lists (see the module docstring); other types are a TypeError."""
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, np.generic):
        return json_ready(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"Cannot write a {type(obj).__name__} as JSON.")


def strict_json(obj: Any, indent: int | None = None) -> str:
    """The strict JSON text of ``obj`` (:func:`json_ready`; never ``Infinity``/``NaN``)."""
    return json.dumps(json_ready(obj), indent=indent, allow_nan=False)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    """Write ``obj`` as strict JSON (:func:`strict_json`), atomically (:func:`atomic_write`)."""
    data = (strict_json(obj, indent) + "\n").encode("utf-8")

    def write(fh: IO[bytes]) -> None:
        fh.write(data)

    atomic_write(path, write)
