"""Reading a JSON input file with one-line errors (manifests, plan state, results); the twin of ``tomlfile``.

Every failure names the file and what was expected: missing, unreadable, not UTF-8, not JSON, nested too
deeply, NaN/Infinity (with ``allow_nan=False``), or (``read_json_object``) not a JSON object at the top.
loadgen's own writers may store NaN (Python's json does), so NaN is accepted unless a caller says not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadgen.util.errors import LoadgenError
from loadgen.util.inputfile import read_input_text

__all__ = ["read_json", "read_json_object"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def read_json(path: str | Path, what: str, error: type[LoadgenError] = LoadgenError, *, allow_nan: bool = True) -> Any:
    """Parse ``path`` as JSON in UTF-8; ``what`` names the expected file kind."""
    path = Path(path)
    text = read_input_text(path, what, error)
    try:
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: expected {what}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply: expected {what}") from None
    except ValueError as exc:  # NaN / Infinity
        raise error(f"{path}: {exc}: expected {what}") from None


def read_json_object(
    path: str | Path, what: str, error: type[LoadgenError] = LoadgenError, *, allow_nan: bool = True
) -> dict[str, Any]:
    """``read_json``, and the top level must be a JSON object."""
    data = read_json(path, what, error, allow_nan=allow_nan)
    if not isinstance(data, dict):
        raise error(f"{path}: top level is a JSON {_kind(data)}: expected {what} (a JSON object)")
    return data


def _kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
