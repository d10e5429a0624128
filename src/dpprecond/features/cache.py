"""On-disk cache of extracted features (``.npz`` files keyed by a content hash).

A cache entry is valid for exactly one combination of: dataset name, split sizes, image
shape, the raw pixel values of both splits (a BLAKE2b digest, so a subsample or a different
file with the same name and sizes never hits a stale entry), the SHA-256 of the checkpoint
file and the preprocessing version. The key is a SHA-256 of these fields in canonical JSON;
the file name carries the dataset name and the first 20 hex digits of the key. Entries are
written atomically (temporary file, then rename), so an interrupted run never leaves a
half-written entry; an unreadable or mismatched entry is logged and recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "array_digest",
    "cache_key",
    "default_cache_dir",
    "file_sha256",
    "load_cached",
    "save_cached",
]

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$DPPRECOND_CACHE`` if set, else ``~/.cache/dpprecond/features``."""
    env = os.environ.get("DPPRECOND_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpprecond" / "features"


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def array_digest(*arrays: np.ndarray) -> str:
    """Hex BLAKE2b digest of the dtypes, shapes and bytes of ``arrays`` (no copy if C-ordered)."""
    h = hashlib.blake2b(digest_size=20)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def cache_key(fields: Mapping[str, Any]) -> str:
    """SHA-256 hex of ``fields`` as canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry_path(cache_dir: Path, fields: Mapping[str, Any]) -> Path:
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(fields["dataset"]))
    return cache_dir / f"{name}-{fields['kind']}-{cache_key(fields)[:20]}.npz"


def load_cached(cache_dir: Path, fields: Mapping[str, Any],
                shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray] | None:
    """Return the cached arrays for ``fields``, or ``None`` on a miss.

    An entry whose stored key fields or array shapes differ from the expected ones, or that
    cannot be read, counts as a miss (and is logged).
    """
    path = _entry_path(cache_dir, fields)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = json.loads(str(npz["fields"]))
            arrays = {k: npz[k].astype(np.float64) for k in shapes}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        logger.warning("ignoring unreadable feature cache %s (%s); recomputing", path, exc)
        return None
    if stored != json.loads(json.dumps(dict(fields))) or any(
            arrays[k].shape != tuple(s) for k, s in shapes.items()):
        logger.warning("ignoring feature cache %s: it was written for other inputs", path)
        return None
    logger.info("feature cache hit: %s", path)
    return arrays


def save_cached(cache_dir: Path, fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                *, dtype: type = np.float32) -> Path:
    """Write ``arrays`` (stored as ``dtype``) with ``fields`` atomically; return the path."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = _entry_path(cache_dir, fields)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as fh:
            members: dict[str, np.ndarray] = {k: np.asarray(v, dtype=dtype)
                                              for k, v in arrays.items()}
            members["fields"] = np.array(json.dumps(dict(fields), sort_keys=True))
            np.savez(fh, **members)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("wrote feature cache %s", path)
    return path
