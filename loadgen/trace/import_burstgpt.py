"""BurstGPT (HPMLL/BurstGPT) CSV: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.

``Timestamp`` is seconds from the trace start; ``Model`` is e.g. ``ChatGPT`` or ``GPT-4``; ``Log Type`` is
``Conversation log`` or ``API log``. A failed request logs ``Response tokens`` 0 and is replayed with one output
token (the engine still had to run its prompt). ``Total tokens`` must equal the other two's sum (a row where it
does not is damaged, and which count is wrong cannot be told: refused with its row). Classes: one for all (``--request-class``), or one per model or
log type (``class_by``), named by ``--class-map`` or the value's slug (``GPT-4`` -> ``gpt-4``). Parsed with
``pyarrow.csv`` (no per-row Python).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from loadgen.util.errors import TraceError

from .import_table import Source, bad_seconds, first_missing

__all__ = ["BURSTGPT_CLASS_FIELDS", "BURSTGPT_COLUMNS", "read_burstgpt"]

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
#: ``--class-by`` values and the column each names classes from.
BURSTGPT_CLASS_FIELDS = {"model": "Model", "log-type": "Log Type"}
_TYPES = {
    "Timestamp": pa.float64(),
    "Model": pa.string(),
    "Request tokens": pa.int64(),
    "Response tokens": pa.int64(),
    "Total tokens": pa.int64(),
    "Log Type": pa.string(),
}


def _read_table(path: Path) -> pa.Table:
    try:
        with open(path, "rb") as handle:
            header = handle.readline().decode("utf-8", "replace").strip().lstrip("\ufeff")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if [h.strip() for h in header.split(",")] != list(BURSTGPT_COLUMNS):
        raise TraceError(f"{path}: header = {header[:120]!r}: expected {','.join(BURSTGPT_COLUMNS)} (BurstGPT)")
    try:
        return pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=1 << 24),
            convert_options=pacsv.ConvertOptions(column_types=_TYPES, strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, OSError) as exc:
        detail = str(exc).splitlines()[0][:200]
        column = re.search(r"CSV column #(\d+)", detail)
        if column is not None and int(column.group(1)) < len(BURSTGPT_COLUMNS):
            detail = f"column {BURSTGPT_COLUMNS[int(column.group(1))]}: {detail}"
        raise TraceError(f"{path}: {detail}: expected BurstGPT rows (seconds, model, token counts, log type)") from None


def _check_totals(path: Path, table: pa.Table) -> None:
    """``Total tokens`` is ``Request tokens + Response tokens`` in every published row (a failed request's 0
    response included): a row where it is not is damaged, and which count is wrong cannot be told."""
    request, response = table.column("Request tokens").to_numpy(), table.column("Response tokens").to_numpy()
    total = table.column("Total tokens").to_numpy()
    wrong = np.flatnonzero(total != request + response)
    if len(wrong):
        row = int(wrong[0])
        raise TraceError(
            f"{path}: row {row + 2}: Total tokens = {int(total[row])}: expected Request tokens + Response tokens "
            f"= {int(request[row])} + {int(response[row])}"
        )


def read_burstgpt(path: str | Path, class_by: str | None = None) -> Source:
    """The requests of a BurstGPT CSV; ``class_by``: None, ``model`` or ``log-type``."""
    path = Path(path)
    if class_by is not None and class_by not in BURSTGPT_CLASS_FIELDS:
        raise TraceError(f"--class-by = {class_by!r}: expected one of {', '.join(BURSTGPT_CLASS_FIELDS)} for burstgpt")
    table = _read_table(path)
    missing = first_missing(table, BURSTGPT_COLUMNS)
    if missing is not None:
        raise TraceError(f"{path}: row {missing[1] + 2}: {missing[0]} is empty: expected a value")
    seconds = table.column("Timestamp").to_numpy()
    row = bad_seconds(seconds, 1e9)
    if row is not None:
        raise TraceError(f"{path}: row {row + 2}: Timestamp = {float(seconds[row])!r}: expected seconds >= 0")
    _check_totals(path, table)
    field = BURSTGPT_CLASS_FIELDS.get(class_by) if class_by else None
    return Source(
        kind="burstgpt",
        path=path,
        times_ns=np.rint(seconds * 1e9).astype(np.int64),
        prompts=table.column("Request tokens").to_numpy(),
        outputs=table.column("Response tokens").to_numpy(),
        class_values=table.column(field).combine_chunks() if field else None,
        class_field=field,
    )
