"""The field a misspelt one most likely meant: ``ttft`` -> ``ttft_ms``, for "unknown field" lines.

The names a model accepts at a location come from the pydantic model itself (walking its fields, through
``X | None``, ``Annotated`` and ``dict[str, Model]``), so the suggestion can never name a field that does not
exist. A location the walk cannot follow (a union of models, a list) suggests nothing.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["closest_field"]


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None``, ``Optional[X]`` and ``Annotated[X, ...]``; anything else as it is."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _names(model: type[BaseModel]) -> dict[str, Any]:
    """Every name the model accepts (field names and their aliases) -> its annotation."""
    names: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        names[name] = info.annotation
        if isinstance(info.alias, str):
            names[info.alias] = info.annotation
    return names


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    annotation: Any = model
    for item in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = _names(annotation).get(item)
            if annotation is None:
                return None
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def closest_field(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The accepted field nearest in spelling to ``loc``'s last part, at ``loc``'s parent; None if none is near."""
    if not loc or not isinstance(loc[-1], str):
        return None
    try:
        parent = _model_at(model, loc[:-1])
    except TypeError:  # an annotation the walk does not know: no suggestion rather than a wrong one
        return None
    if parent is None:
        return None
    match = difflib.get_close_matches(loc[-1], list(_names(parent)), n=1, cutoff=0.6)
    return match[0] if match else None
