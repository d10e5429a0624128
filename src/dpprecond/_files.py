"""Crash-safe file writes shared by the experiment runner and the checkpoints.

:func:`atomic_write` writes to ``<name>.tmp<pid>``, flushes it to disk and renames it over
the target, so a crash leaves the old file or the new one, never a torn file. A process
killed between the write and the rename leaves its temporary file behind;
:func:`remove_stale_temps` deletes those whose process no longer exists. A full disk is a
clear ``OSError`` naming the file, and the partial temporary file is removed.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "remove_stale_temps"]

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
