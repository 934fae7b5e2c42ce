"""Reading a TOML input file with one-line errors; shared by scenarios, plans, engine configs and contract cases."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

from .errors import ScenarioError

__all__ = ["read_toml"]


def read_toml(path: str | Path, what: str) -> tuple[dict[str, Any], str]:
    """Parse ``path`` as TOML; returns (data, sha256 of the bytes). ``what`` names the expected file kind."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file: expected {what}") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror}): expected {what}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: invalid TOML ({exc}): expected {what}") from None
    return data, hashlib.sha256(raw).hexdigest()
