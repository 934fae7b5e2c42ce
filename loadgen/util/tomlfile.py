"""TOML in and out with one-line errors: the one reader (scenarios, plans, engine configs, contract cases)
and the one writer (configs rebuilt from manifests, e.g. by the handoff bundle)."""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

import tomli_w

from loadgen.util.errors import ScenarioError
from loadgen.util.inputfile import read_input_bytes

__all__ = ["dumps_toml", "read_toml"]


def read_toml(path: str | Path, what: str) -> tuple[dict[str, Any], str]:
    """Parse ``path`` as TOML; returns (data, sha256 of the bytes). ``what`` names the expected file kind."""
    path = Path(path)
    raw = read_input_bytes(path, what, ScenarioError)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: invalid TOML ({exc}): expected {what}") from None
    return data, hashlib.sha256(raw).hexdigest()


def dumps_toml(data: Mapping[str, Any], *, what: str) -> str:
    """``data`` as TOML text. TOML has no null, so a table key whose value is None is omitted (readers
    treat a missing key as unset); None inside a list, a non-finite float anywhere, or a value TOML cannot
    hold raises ScenarioError naming ``what``, the dotted key path and the value."""
    return tomli_w.dumps(_writable(data, "", what))


def _writable(value: Any, path: str, what: str) -> Any:
    """A copy of ``value`` that tomli_w writes as intended: None table values dropped, the rest checked."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ScenarioError(f"{what}: {_join(path, repr(key))}: key is {type(key).__name__}: expected a string")
            if item is not None:
                out[key] = _writable(item, _join(path, key), what)
        return out
    if isinstance(value, (list, tuple)):
        return [_writable(item, f"{path}[{i}]", what) for i, item in enumerate(value)]
    if value is None:
        raise ScenarioError(f"{what}: {path} = None: TOML has no null; expected a value in every list item")
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(f"{what}: {path} = {value!r}: expected a finite number")
    if isinstance(value, (bool, int, float, str, date, datetime, time)):
        return value
    raise ScenarioError(f"{what}: {path} = {value!r}: expected a TOML value, not a {type(value).__name__}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
