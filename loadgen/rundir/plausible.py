"""What a request row may hold: the one check of recorded values every reader of ``requests.parquet`` applies.

The schema (``schema.REQUESTS_SCHEMA``) fixes types and which columns may be null; this fixes the values no writer
of loadgen produces, so a hand-edited file or one written by a foreign tool is refused in one line (file, request,
field, value, what was expected) instead of turning into an absurd figure: instants out of order within a request
(sent before scheduled, first token before sent, done before the first token ...), negative token counts, and
token counts beyond any model's context.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from loadgen.util.errors import RunDirError

__all__ = ["INSTANT_ORDER", "MAX_PLAUSIBLE_TOKENS", "TOKEN_COLUMNS", "refuse_implausible_requests"]

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
