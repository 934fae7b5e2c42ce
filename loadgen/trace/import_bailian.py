"""Alibaba Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon) JSONL, one request a line:
``chat_id``, ``parent_chat_id`` (-1 for a session's first turn), ``timestamp`` (s), ``input_length``,
``output_length``, ``type`` (``text``, ``search``, ``image``, ``file``), ``turn``, ``hash_ids`` (one id per
16-token prompt block: more ids than input_length has blocks is refused with its request; fewer are kept).

Sessions become threads: following ``parent_chat_id`` up to the first turn names the conversation
(``bl<first chat_id>``); turns are numbered in arrival order within it (a parent outside the file, as in a cut
sample, makes its child a first turn). ``hash_ids`` become ``prompt_block_hashes`` (B = 16), so the driver builds a
first turn's prompt block by block; later turns grow from the previous one, as every thread does. Classes: one
(``--request-class``) or one per ``type`` (``--class-by type``). Parsed with ``pyarrow.json``; threads are found
by vectorised pointer jumping (no per-row Python).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from loadgen.util.errors import TraceError

from .import_table import Source, bad_seconds, first_missing

__all__ = ["BAILIAN_BLOCK_TOKENS", "read_bailian"]

#: Tokens per Bailian hash id.
BAILIAN_BLOCK_TOKENS = 16
_SCHEMA = pa.schema(
    [
        ("chat_id", pa.int64()),
        ("parent_chat_id", pa.int64()),
        ("timestamp", pa.float64()),
        ("input_length", pa.int64()),
        ("output_length", pa.int64()),
        ("type", pa.string()),
        ("turn", pa.int64()),
        ("hash_ids", pa.list_(pa.int64())),
    ]
)
_REQUIRED = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length")
_MAX_DEPTH_DOUBLINGS = 64  # pointer jumping reaches any depth below 2**64 in this many rounds


def _read_table(path: Path) -> pa.Table:
    try:
        return pajson.read_json(
            path,
            read_options=pajson.ReadOptions(block_size=1 << 24),
            parse_options=pajson.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, OSError) as exc:
        detail = str(exc).splitlines()[0][:200]
        raise TraceError(
            f"{path}: {detail}: expected Bailian JSONL (chat_id, parent_chat_id, timestamp, ...)"
        ) from None


def _first_turns(path: Path, chat_ids: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Row of every row's session start: parent pointers followed to a row whose parent is -1 or absent."""
    order = np.argsort(chat_ids, kind="stable")
    sorted_ids = chat_ids[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(dup):
        raise TraceError(f"{path}: chat_id = {int(sorted_ids[dup[0]])} appears more than once: expected unique ids")
    n = len(chat_ids)
    pos = np.minimum(np.searchsorted(sorted_ids, parents), n - 1)
    found = (parents != -1) & (sorted_ids[pos] == parents)
    up = np.where(found, order[pos], np.arange(n))
    for _ in range(_MAX_DEPTH_DOUBLINGS):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    looped = np.flatnonzero(found[up])  # a session start must have no parent in the file
    if not len(looped):
        return up
    row = int(looped[0])
    raise TraceError(f"{path}: chat_id = {int(chat_ids[row])}: its parent_chat_id chain loops: expected a tree")


def _check_hash_counts(path: Path, hashes: pa.Array, prompts: np.ndarray) -> None:
    """At most one hash id per 16-token block of input_length: more would name blocks the prompt has not (fewer
    are kept: the prompt's tokens past them are its own)."""
    counts = pc.list_value_length(hashes).fill_null(0).to_numpy()
    blocks = -(-np.maximum(prompts, 0) // BAILIAN_BLOCK_TOKENS)
    over = np.flatnonzero(counts > blocks)
    if len(over):
        row = int(over[0])
        raise TraceError(
            f"{path}: request {row + 1}: hash_ids holds {int(counts[row])} ids: expected at most one per "
            f"{BAILIAN_BLOCK_TOKENS}-token block of input_length = {int(prompts[row])} ({int(blocks[row])} ids)"
        )


def read_bailian(path: str | Path, class_by: str | None = None) -> Source:
    """The requests of a Bailian JSONL file; ``class_by``: None or ``type``."""
    path = Path(path)
    if class_by not in (None, "type"):
        raise TraceError(f"--class-by = {class_by!r}: expected type for bailian")
    table = _read_table(path)
    if table.num_rows == 0:
        raise TraceError(f"{path}: no requests: expected at least one line")
    missing = first_missing(table, _REQUIRED)
    if missing is not None:
        raise TraceError(f"{path}: request {missing[1] + 1}: missing {missing[0]}: expected {', '.join(_REQUIRED)}")
    seconds = table.column("timestamp").to_numpy()
    bad = bad_seconds(seconds, 1e10)
    if bad is not None:
        raise TraceError(f"{path}: request {bad + 1}: timestamp = {float(seconds[bad])!r}: expected seconds >= 0")
    chat_ids = table.column("chat_id").to_numpy()
    first = _first_turns(path, chat_ids, table.column("parent_chat_id").to_numpy())
    conversations = pc.binary_join_element_wise("bl", pa.array(chat_ids[first]).cast(pa.string()), "")
    hashes = table.column("hash_ids").combine_chunks()
    _check_hash_counts(path, hashes, table.column("input_length").to_numpy())
    return Source(
        kind="bailian",
        path=path,
        times_ns=np.rint(seconds * 1e9).astype(np.int64),
        prompts=table.column("input_length").to_numpy(),
        outputs=table.column("output_length").to_numpy(),
        class_values=table.column("type").combine_chunks() if class_by else None,
        class_field="type" if class_by else None,
        conversations=conversations,
        block_hashes=hashes if hashes.null_count < len(hashes) else None,
        block_tokens=BAILIAN_BLOCK_TOKENS,
        block_rule="Bailian hash_ids as given",
    )
