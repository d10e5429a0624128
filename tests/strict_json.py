"""Read an output file as the strict JSON of docs/outputs.md (a test helper)."""

from __future__ import annotations

import json
from pathlib import Path


def load_strict(path: Path) -> object:
    """Parse ``path`` as strict JSON: bare Infinity/NaN (not JSON) and numbers written as
    strings ("inf", "nan") are refused with an AssertionError naming the file."""
    def refuse(token: str) -> None:
        raise AssertionError(f"{path} holds the non-JSON token {token}")

    def no_number_strings(obj: object) -> object:
        if isinstance(obj, str) and obj.lower() in ("inf", "-inf", "nan", "infinity",
                                                    "-infinity"):
            raise AssertionError(f"{path} writes a number as the string {obj!r}")
        if isinstance(obj, dict):
            return {k: no_number_strings(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [no_number_strings(v) for v in obj]
        return obj

    return no_number_strings(json.loads(Path(path).read_text(), parse_constant=refuse))
