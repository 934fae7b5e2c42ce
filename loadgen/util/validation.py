"""One line for a pydantic ``ValidationError`` on a user's file: ``source: field = value: expected ...``.

Every loader of a user's or another tool's file (scenario, plan, prices, engine config, contract cases, the
importers' input models) reports its first problem this way: the file, the field's path, the value given (a
URL's user-info removed; an ``api_key_env`` value never shown) and what was expected; a misspelt field names
the accepted one nearest in spelling. ``check_section`` does the same for one table of a file that its model keeps
as a mapping (an engine TOML's ``[behavior]`` and ``[calibration]``), naming the table.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from loadgen.util.fieldnames import closest_field
from loadgen.util.inputs import without_userinfo

__all__ = ["check_section", "format_validation_error"]


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("fixed", "uniform", "normal", "lognormal", "empirical", "mixture", "function-after"):
            continue  # discriminator tags and validator names are not fields
        elif isinstance(item, str) and item.startswith("function-") or item in ("int", "float"):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


_NAMED_MSG = re.compile(r"^[\w.\-\[\]*]+ = [^:]+: expected ")


def _first_error(errors: list[Any]) -> Any:
    """The problem to report: a misspelt field before the required one it was meant as (``shares`` for ``share``:
    pydantic lists "share: missing" first), else pydantic's first."""
    missing = {tuple(e["loc"][:-1]) for e in errors if e["type"] == "missing"}
    misspelt = [e for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) in missing]
    return misspelt[0] if misspelt else errors[0]


#: The longest value an error line repeats: a 200 MB field is named and cut, not echoed.
MAX_SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """The value as the error line shows it: its repr without a URL's user-info, cut to MAX_SHOWN_CHARS."""
    text = without_userinfo(repr(value))
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} chars)"


def format_validation_error(source: str, exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line: ``source: field = value: expected ...`` for the first problem (+N more). With the ``model`` that
    was validated, an unknown field names the accepted one nearest in spelling (``did you mean 'ttft_ms'?``)."""
    errors = exc.errors(include_url=False)
    first = _first_error(errors)
    field = _field_path(tuple(first["loc"]))
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    value = first.get("input")
    shown = "" if isinstance(value, dict) or first["type"] == "missing" else f" = {_shown(value)}"
    if field.endswith("api_key_env") and shown:  # a key pasted in place of its variable's NAME is never echoed
        shown = " (value not shown)"
    if first["type"] == "missing":
        msg = "missing; required"
    elif first["type"] == "extra_forbidden":
        meant = closest_field(model, tuple(first["loc"])) if model is not None else None
        msg = f"unknown field (did you mean {meant!r}?)" if meant else "unknown field"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if first["type"] == "value_error" and _NAMED_MSG.match(msg):  # "sub.field = value: expected ..." from a validator
        return f"{source}: {field + '.' if field else ''}{msg}{more}"
    where = f"{field}{shown}: " if field else ""
    expected = msg if msg.startswith(("expected", "missing", "unknown")) else f"expected {msg[0].lower()}{msg[1:]}"
    if field == "" and ":" in msg:
        expected = msg
    return f"{source}: {where}{expected}{more}"


def check_section(name: str, model: type[BaseModel], data: Any) -> None:
    """Validate table ``name`` of a file against ``model``; ValueError ``name.field = value: expected ...`` (the
    line the file's loader prefixes with the file) on the first problem."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        rest = format_validation_error(name, exc, model)[len(name) + 2 :]
        raise ValueError(f"{name}.{rest}" if _FIELD_FIRST.match(rest) else f"{name}: {rest}") from None


#: A message that starts with the field it is about (``memory.runtime_gib = 'x': ...``, ``engine: unknown ...``).
_FIELD_FIRST = re.compile(r"^[\w.\-\[\]*]+( = |: )")
