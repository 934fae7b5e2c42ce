"""The checked-in result schemas (docs/schema/<name>.schema.json) as validators for tests."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

REPO = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO / "docs" / "schema"


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(name: str, document: Any) -> list[str]:
    """Every way ``document`` breaks the published schema ``name`` (path: message), none when it conforms."""
    errors = validator(name).iter_errors(document)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors]


def assert_valid(name: str, document: Any) -> None:
    errors = schema_errors(name, document)
    assert errors == [], f"{name}: " + "; ".join(errors[:5])
