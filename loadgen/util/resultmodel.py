"""The base of loadgen's published results (analysis, comparison, plan region, fidelity table).

A result is a pydantic model whose fields are the JSON document's keys in the order they are written;
``ResultModel.document()`` gives the plain dict the writers pass to ``json.dumps`` (keys present in the
input only, so a key some results lack stays absent, and the bytes written are those of the dict). Numbers
are ``Number`` (``int | float``: an int stays an int in the file) and a figure that may be a failure
counted as infinite is ``Figure`` (the strings ``"inf"`` / ``"-inf"``, as strict JSON has no infinity).
``json_schema`` is the published JSON Schema of a result with its ``$id`` and schema version
(``loadgen schema NAME``; the checked-in copies are ``docs/schema/NAME.schema.json``).
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["SCHEMA_DIALECT", "Figure", "Inf", "Number", "ResultModel", "json_schema", "schema_id"]

R = TypeVar("R", bound="ResultModel")

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: A JSON number: an int stays an int (pydantic's smart union), a float a float.
Number = int | float
#: A positive or negative infinity as strict JSON writes it.
Inf = Literal["inf", "-inf"]
#: A figure that may be missing (None) or a failure counted as +inf.
Figure = Number | Inf | None


class ResultModel(BaseModel):
    """Every key named (``extra="forbid"``): a key no model declares is a bug, caught at write time."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @classmethod
    def from_document(cls: type[R], doc: dict[str, Any]) -> R:
        """Validate a document as its writer would write it: through ``json.dumps(..., default=str)`` first, so
        a Path is its string and a tuple a list, exactly the values the file gets."""
        return cls.model_validate(json.loads(json.dumps(doc, default=str)))

    def document(self) -> dict[str, Any]:
        """The JSON document as a dict: the keys it was built with, in field order, under their JSON names."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)


def schema_id(name: str, version: str | int) -> str:
    """The ``$id`` of result ``name`` at ``version``: changing the version changes the id."""
    return f"urn:loadgen:schema:{name}:v{version}"


def json_schema(model: type[BaseModel], name: str, version: str | int, description: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a result model, with ``$id`` and ``x-loadgen-schema-version``."""
    body = model.model_json_schema(by_alias=True, mode="serialization")
    head = {"$schema": SCHEMA_DIALECT, "$id": schema_id(name, version), "x-loadgen-schema-version": str(version)}
    return (
        head
        | {"title": f"loadgen {name} result", "description": description}
        | {k: v for k, v in body.items() if k not in ("title", "description")}
    )
