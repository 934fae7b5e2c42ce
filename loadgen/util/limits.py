"""Sane bounds for every number loadgen reads from a file or a flag, in one place.

Anything outside them is a mistake (or an attack), not a workload: a rate of 1e9 requests/s, a 2^31-token
prompt or an offset near 2^63 ns would allocate gigabytes or overflow before any useful work. Inputs beyond
a bound are rejected with one line naming the file, field, value and the bound; nothing is clamped silently.
"""

from __future__ import annotations

import math
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, model_validator

__all__ = [
    "InputModel",
    "MAX_CONCURRENCY",
    "MAX_DURATION_S",
    "MAX_EXACT_NS",
    "MAX_HTTP_STATUS",
    "MAX_MEMORY_GIB",
    "MAX_OFFSET_NS",
    "MAX_PARALLEL",
    "MAX_PARAM",
    "MAX_REPLAY_OFFSET_NS",
    "MAX_RATE_RPS",
    "MAX_SEED",
    "MAX_TIMEOUT_S",
    "MAX_TOKENS",
    "MAX_TRACE_REQUESTS",
    "MAX_TURNS",
    "check_number",
    "is_finite",
]

#: Tokens in one prompt or one output (prompt = the whole thread context). 2^20: the largest context
#: windows in service; a 10M-token prompt is refused before any text is synthesised.
MAX_TOKENS = 1 << 20
#: Requests in one trace (about 1 GiB of prompt bookkeeping at the driver; split bigger replays).
MAX_TRACE_REQUESTS = 10_000_000
#: Arrival rate of one trace, requests per second.
MAX_RATE_RPS = 1_000_000.0
#: Length of one synthetic trace or plan step.
MAX_DURATION_S = 7 * 86400.0
#: Latest scheduled offset in any trace (one year in ns; 2^63 ns is 292 years).
MAX_OFFSET_NS = 366 * 86400 * 1_000_000_000
#: The largest instant a run's readers hold exactly (as a float64): 2**53 ns, 104 days from the run's anchor.
MAX_EXACT_NS = 1 << 53
#: The latest scheduled offset a replay (a measured or simulated run) takes: a week (the longest timeout) before
#: MAX_EXACT_NS, so every instant of its last request still reads. A trace may span longer (MAX_OFFSET_NS): cut it.
MAX_REPLAY_OFFSET_NS = MAX_EXACT_NS - 7 * 86400 * 1_000_000_000
#: Concurrency / in-flight caps.
MAX_CONCURRENCY = 1_000_000
#: Tensor- or data-parallel degree of one deployment (GPUs per replica, engine replicas).
MAX_PARALLEL = 4096
#: Turns in one conversation.
MAX_TURNS = 10_000
#: Largest seed (numpy seeds are non-negative integers; 2^63 - 1 keeps them int64 everywhere).
MAX_SEED = (1 << 63) - 1
#: Longest timeout (one week).
MAX_TIMEOUT_S = 7 * 86400.0
#: Any other free-form magnitude (cost-model coefficients, distribution parameters, budgets in ms).
MAX_PARAM = 1e12
#: HTTP status codes.
MAX_HTTP_STATUS = 599
#: Largest memory budget or figure read, GiB (1 PiB).
MAX_MEMORY_GIB = float(1 << 20)


def is_finite(value: object) -> bool:
    """True for an int, or a float that is neither NaN nor infinite (bools are not numbers here)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


class InputModel(BaseModel):
    """The base of every model read from a user's file (scenario, plan, prices, engine config, contract cases):
    a boolean where a number is expected is refused (pydantic would take ``true`` as 1), and so is anything but
    a boolean where a boolean is (pydantic would take ``"yes"``, ``"off"`` or ``1``). A model validator, not a
    field one: pydantic allows no "before" validator on a discriminator field."""

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        for name, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(name)
            if field is None:
                continue
            if isinstance(value, bool) and _numbers_only(field.annotation):
                raise ValueError(f"{name} = {value}: expected a number, got the boolean {str(value).lower()}")
            if value is not None and not isinstance(value, bool) and _boolean_only(field.annotation):
                raise ValueError(f"{name} = {value!r:.80}: expected true or false (a TOML boolean, unquoted)")
            if isinstance(value, list | tuple) and _number_list(field.annotation):
                for i, item in enumerate(value):
                    if isinstance(item, bool):
                        raise ValueError(
                            f"{name}[{i}] = {item}: expected a number, got the boolean {str(item).lower()}"
                        )
        return data


def _kinds(annotation: Any) -> tuple[Any, ...]:
    """The types a field may hold: a union's members (or the type itself), each without its ``Annotated``."""
    kinds = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return tuple(get_args(k)[0] if get_origin(k) is Annotated else k for k in kinds)


def _numbers_only(annotation: Any) -> bool:
    """A field of type int or float (or either or None), which a boolean does not belong in."""
    kinds = _kinds(annotation)
    return bool not in kinds and (int in kinds or float in kinds)


def _boolean_only(annotation: Any) -> bool:
    """A field of type bool (or bool or None): pydantic's lax mode would read "yes", "off", 1 or 0.0 as one."""
    return set(_kinds(annotation)) - {type(None)} == {bool}


def _number_list(annotation: Any) -> bool:
    """A field that is a list or tuple of numbers (or None): a boolean item does not belong in it."""
    for kind in _kinds(annotation):
        if get_origin(kind) in (list, tuple):
            items = [a for a in get_args(kind) if a is not Ellipsis]
            return bool(items) and all(_numbers_only(a) for a in items)
    return False


def check_number(value: object, lo: float, hi: float) -> str | None:
    """None when ``value`` is a finite number in [lo, hi]; else the 'expected ...' text for an error line."""
    if not is_finite(value):
        return f"expected a finite number in [{lo:g}, {hi:g}]"
    assert isinstance(value, (int, float))
    if not lo <= value <= hi:
        return f"expected a number in [{lo:g}, {hi:g}]"
    return None
