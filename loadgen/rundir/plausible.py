"""What a request row may hold: the one check of recorded values every reader of ``requests.parquet`` applies.

The schema (``schema.REQUESTS_SCHEMA``) fixes types and which columns may be null; this fixes the values no writer
of loadgen produces, so a hand-edited file or one written by a foreign tool is refused in one line (file, request,
field, value, what was expected) instead of turning into an absurd figure: instants out of order within a request
(sent before scheduled, first token before sent, done before the first token ...), negative token counts, and
token counts beyond any model's context.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.util.errors import RunDirError
from loadgen.util.limits import MAX_EXACT_NS

__all__ = [
    "INSTANT_ORDER",
    "MAX_EXACT_NS",
    "MAX_PLAUSIBLE_TOKENS",
    "TOKEN_COLUMNS",
    "checked_row",
    "implausible_row",
    "refuse_implausible_requests",
]

#: Instants that cannot come before another one of the same request: (earlier, later). The driver sends no
#: earlier than the scheduled instant (``driver.schedule.sleep_until``).
INSTANT_ORDER = (
    ("scheduled_ns", "sent_ns"),
    ("scheduled_ns", "done_ns"),
    ("sent_ns", "first_token_ns"),
    ("first_token_ns", "last_token_ns"),
    ("first_token_ns", "done_ns"),
    ("sent_ns", "done_ns"),
)
#: Token counts of one request row (null: not observed).
TOKEN_COLUMNS = (
    "target_prompt_tokens",
    "target_output_tokens",
    "client_prompt_tokens",
    "server_prompt_tokens",
    "client_output_tokens",
    "server_output_tokens",
    "client_reasoning_tokens",
    "server_reasoning_tokens",
    "cancel_after_tokens",
)
#: More tokens than this in one request is no model's context (the largest published is 10^7): a corrupt count.
MAX_PLAUSIBLE_TOKENS = 100_000_000


def _refuse(path: Path, ids: pa.Array, bad: np.ndarray, what: str, expected: str) -> None:
    raise RunDirError(
        f"{path}: request_id {ids[int(bad[0])].as_py()!r}: {what}: expected {expected} ({len(bad)} such row(s)): "
        "a hand-edited or foreign file"
    )


def refuse_implausible_requests(path: Path, ids: pa.Array, cols: dict[str, np.ndarray]) -> None:
    """Refuse (RunDirError) the first implausible value of ``cols`` (float arrays, NaN = null; the columns present
    are checked). NaN (never observed) passes every check."""
    for earlier, later in INSTANT_ORDER:
        if earlier in cols and later in cols:
            a, b = cols[earlier], cols[later]
            bad = np.flatnonzero(b < a)  # NaN compares false
            if len(bad):
                i = int(bad[0])
                _refuse(
                    path, ids, bad, f"{later} = {b[i]:.0f} is before {earlier} = {a[i]:.0f}", f"{later} >= {earlier}"
                )
    for name in TOKEN_COLUMNS:
        if name in cols:
            v = cols[name]
            bad = np.flatnonzero((v < 0) | (v > MAX_PLAUSIBLE_TOKENS))
            if len(bad):
                expected = f"a count from 0 to {MAX_PLAUSIBLE_TOKENS:,} (more is no model's context)"
                _refuse(path, ids, bad, f"{name} = {v[int(bad[0])]:.0f}", expected)


def implausible_row(row: Mapping[str, Any]) -> str | None:
    """What a reader would refuse in one request row about to be written (an importer's, built from another
    tool's file), as "field = value: expected ..."; None when it would read. The same checks as
    ``refuse_implausible_requests``, plus the exact range of an instant, so an import never writes a run that
    ``analyze`` then refuses."""
    for name, value in row.items():
        if name.endswith("_ns") and value is not None and abs(value) > MAX_EXACT_NS:
            return f"{name} = {value}: expected an instant within 2**53 ns (104 days) of the run's zero"
    for earlier, later in INSTANT_ORDER:
        a, b = row.get(earlier), row.get(later)
        if a is not None and b is not None and b < a:
            return f"{later} = {b} is before {earlier} = {a}: expected {later} >= {earlier}"
    for name in TOKEN_COLUMNS:
        v = row.get(name)
        if v is not None and not 0 <= v <= MAX_PLAUSIBLE_TOKENS:
            return f"{name} = {v}: expected a count from 0 to {MAX_PLAUSIBLE_TOKENS:,} (more is no model's context)"
    return None


def checked_row(source: Path, row: dict[str, Any], record: int | None = None) -> dict[str, Any]:
    """``row``, built by an importer from a record of ``source`` (``record``: its index there), if a run's reader
    would take it; else one RunDirError line naming the record. Importers check every row before the run
    directory is begun, so a refused file writes nothing."""
    problem = implausible_row(row)
    if problem is not None:
        where = f"record {record} ({row['request_id']})" if record is not None else f"request_id {row['request_id']!r}"
        raise RunDirError(f"{source}: {where}: {problem}: a record no run can hold")
    return row
