"""Importers for public traces: Azure LLM inference 2023 (CSV), Mooncake FAST'25 (JSONL), LLMServingSim
workloads (JSONL of token ids), and (in their own modules) BurstGPT (CSV), Alibaba Bailian (JSONL) and ShareGPT
(JSON, with its text).

All become ordinary loadgen traces (TRACE_SCHEMA), optionally cut to a window and time-scaled,
so they replay exactly like generated ones. Imported requests get one class (``request_class``).
Token counts must be integers in 0..``limits.MAX_TOKENS`` (a 0 is replayed as 1 token, as the source
logged a request the engine still had to run); a negative or huge count is refused with its row.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.rundir.identity import sha256_file
from loadgen.util.errors import TraceError
from loadgen.util.inputfile import read_input_text
from loadgen.util.limits import MAX_OFFSET_NS, MAX_TOKENS, MAX_TRACE_REQUESTS, is_finite
from loadgen.workload.scenario import class_name_problem

from .. import __version__
from .block_hashes import BLOCK_HASH_RULE, TOKEN_BLOCK_TOKENS, chained_block_hashes
from .import_bailian import read_bailian
from .import_burstgpt import read_burstgpt
from .import_sharegpt import read_sharegpt
from .import_table import ImportOptions, Source, write_imported
from .io import trace_table, write_trace

__all__ = ["IMPORT_KINDS", "MOONCAKE_BLOCK_TOKENS", "import_azure", "import_mooncake", "import_trace"]

#: The source formats ``import_trace`` reads.
IMPORT_KINDS = ("azure", "mooncake", "llmservingsim", "burstgpt", "bailian", "sharegpt")
#: Importers in their own modules (loadgen.trace.import_<kind>), written through ``import_table``.
_TABLE_KINDS = ("burstgpt", "bailian", "sharegpt")

#: Mooncake hash_ids each stand for one 512-token block of the prompt.
MOONCAKE_BLOCK_TOKENS = 512
_NS = 1_000_000_000
_BLOCK_TOKENS = {"mooncake": MOONCAKE_BLOCK_TOKENS, "llmservingsim": TOKEN_BLOCK_TOKENS}
_BLOCK_RULES = {"mooncake": "Mooncake hash_ids as given", "llmservingsim": BLOCK_HASH_RULE}


def _count(path: Path, where: str, column: str, value: Any) -> int:
    """A token count from a source row: an integer in 0..MAX_TOKENS, else one TraceError line."""
    if isinstance(value, bool):  # int(True) is 1: a boolean is no count
        raise TraceError(f"{path}: {where}: {column} = {value!r}: expected an integer")
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{path}: {where}: {column} = {value!r}: expected an integer") from None
    if isinstance(value, float) and count != value:
        raise TraceError(f"{path}: {where}: {column} = {value!r}: expected a whole number of tokens")
    if not 0 <= count <= MAX_TOKENS:
        raise TraceError(f"{path}: {where}: {column} = {count}: expected 0..{MAX_TOKENS} tokens")
    return count


def _parse_azure_time(value: str, path: Path, row: int) -> int:
    """'2023-11-16 18:17:03.9799600' (7 fractional digits) → ns since the epoch (naive, exact)."""
    try:
        whole, _, frac = value.strip().partition(".")
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        frac_ns = int((frac + "000000000")[:9]) if frac else 0
    except ValueError:
        raise TraceError(
            f"{path}: row {row}: TIMESTAMP = {value!r}: expected 'YYYY-MM-DD HH:MM:SS[.fffffff]'"
        ) from None
    days = (base - datetime(1970, 1, 1)).days
    secs = days * 86400 + base.hour * 3600 + base.minute * 60 + base.second
    if not 0 <= secs < 1 << 33:  # int64 ns: 1970 .. 2242
        raise TraceError(f"{path}: row {row}: TIMESTAMP = {value!r}: expected a time between 1970 and 2242")
    return secs * _NS + frac_ns


def _read_azure(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    text = read_input_text(path, "an Azure LLM inference trace 2023 CSV", TraceError)
    reader = csv.reader(io.StringIO(text))  # handles CRLF and a missing final newline
    header = next(reader, None)
    expected = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    if header is None or [h.strip() for h in header] != expected:
        raise TraceError(f"{path}: header = {header!r}: expected {','.join(expected)} (Azure LLM inference trace 2023)")
    times: list[int] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for row_no, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != 3:
            raise TraceError(f"{path}: row {row_no}: {len(row)} fields: expected 3")
        times.append(_parse_azure_time(row[0], path, row_no))
        for column, value, sink in (("ContextTokens", row[1], prompts), ("GeneratedTokens", row[2], outputs)):
            sink.append(_count(path, f"row {row_no}", column, value.strip()))
    return (
        np.asarray(times, np.int64),
        np.asarray(prompts, np.int64),
        np.asarray(outputs, np.int64),
        [None] * len(times),
    )


def _mooncake_record(path: Path, line_no: int, rec: Any) -> tuple[int, int, int, tuple[int, ...]]:
    """(arrival ns, prompt tokens, output tokens, hash_ids) of one Mooncake record, each field checked by name."""
    if not isinstance(rec, dict):
        raise TraceError(f"{path}: line {line_no}: a JSON {type(rec).__name__}: expected a Mooncake record")
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in rec]
    if missing:
        raise TraceError(
            f"{path}: line {line_no}: missing field {missing[0]!r}: expected timestamp, input_length, output_length"
        )
    stamp = rec["timestamp"]
    if not is_finite(stamp) or not 0 <= stamp <= MAX_OFFSET_NS / 1_000_000 * 100:
        raise TraceError(f"{path}: line {line_no}: timestamp = {stamp!r}: expected milliseconds >= 0")
    prompt = _count(path, f"line {line_no}", "input_length", rec["input_length"])
    output = _count(path, f"line {line_no}", "output_length", rec["output_length"])
    ids = rec.get("hash_ids", [])
    blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if not isinstance(ids, list) or (ids and len(ids) != blocks):
        got = f"{len(ids)} ids" if isinstance(ids, list) else repr(ids)[:40]
        raise TraceError(
            f"{path}: line {line_no}: hash_ids = {got}: expected a list of one id per "
            f"{MOONCAKE_BLOCK_TOKENS}-token block of input_length = {prompt} ({blocks} ids)"
        )
    return round(float(stamp) * 1_000_000), prompt, output, tuple(_int64(path, line_no, "hash_ids", h) for h in ids)


def _read_mooncake(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    rows = []
    text = read_input_text(path, "a Mooncake trace JSONL", TraceError)
    # one record a line ("\n" only: a U+2028 inside a JSON string is not a line break)
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise TraceError(f"{path}: line {line_no}: invalid JSON: expected a Mooncake record") from None
        rows.append(_mooncake_record(path, line_no, rec))
    times, prompts, outputs, hashes = zip(*rows) if rows else ((), (), (), ())
    return np.asarray(times, np.int64), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), list(hashes)


def _int64(path: Path, line_no: int, field: str, value: Any) -> int:
    """An integer that fits Arrow's int64 (a hash or a token id), else one TraceError line."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
        raise TraceError(f"{path}: line {line_no}: {field} holds {value!r}: expected int64 integers")
    return value


def _llmservingsim_record(path: Path, line_no: int, rec: Any) -> tuple[int, int, int, list[int]]:
    """(arrival ns, prompt tokens, output tokens, prompt block hashes) of one flat LLMServingSim request."""
    if not isinstance(rec, dict):
        raise TraceError(f"{path}: line {line_no}: a JSON {type(rec).__name__}: expected an LLMServingSim request")
    if "sub_requests" in rec:
        raise TraceError(f"{path}: line {line_no}: an agentic session (sub_requests): expected flat requests only")
    missing = [k for k in ("input_toks", "output_toks", "arrival_time_ns") if k not in rec]
    if missing:
        raise TraceError(
            f"{path}: line {line_no}: missing field(s) {missing}: expected input_toks, output_toks, arrival_time_ns"
        )
    stamp = rec["arrival_time_ns"]
    if isinstance(stamp, bool) or not isinstance(stamp, int) or not 0 <= stamp <= MAX_OFFSET_NS:
        raise TraceError(
            f"{path}: line {line_no}: arrival_time_ns = {stamp!r}: expected integer ns in 0..{MAX_OFFSET_NS}"
        )
    prompt = _count(path, f"line {line_no}", "input_toks", rec["input_toks"])
    output = _count(path, f"line {line_no}", "output_toks", rec["output_toks"])
    ids = rec.get("input_tok_ids")
    if ids is None:
        return stamp, prompt, output, []
    if not isinstance(ids, list) or len(ids) != prompt:
        got = f"{len(ids)} ids" if isinstance(ids, list) else repr(ids)[:40]
        raise TraceError(f"{path}: line {line_no}: input_tok_ids = {got}: expected a list of input_toks = {prompt} ids")
    return stamp, prompt, output, chained_block_hashes([_int64(path, line_no, "input_tok_ids", t) for t in ids])


def _read_llmservingsim(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    rows = []
    for line_no, line in _json_lines(path):
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise TraceError(f"{path}: line {line_no}: invalid JSON: expected an LLMServingSim request") from None
        rows.append(_llmservingsim_record(path, line_no, rec))
    times, prompts, outputs, hashes = zip(*rows) if rows else ((), (), (), ())
    return np.asarray(times, np.int64), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), list(hashes)


def _json_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every non-blank line of a UTF-8 file; TraceError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(
            f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc}): expected UTF-8 JSONL"
        ) from None
    return [(no, line) for no, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _mooncake_prefixes(hashes: list[tuple[int, ...]], prompts: np.ndarray) -> tuple[list[str | None], list[int | None]]:
    """Shared prefix per request: leading hash blocks that some other request also starts with.

    The group is named by the first block; its length is the number of leading blocks shared with at
    least one other request, × 512 tokens, capped below the prompt length.
    """
    counts: dict[tuple[int, ...], int] = {}
    for h in hashes:
        for k in range(1, len(h) + 1):
            key = h[:k]
            counts[key] = counts.get(key, 0) + 1
    groups: list[str | None] = []
    lengths: list[int | None] = []
    for h, prompt in zip(hashes, prompts):
        shared = 0
        for k in range(1, len(h) + 1):
            if counts[h[:k]] >= 2:
                shared = k
            else:
                break
        tokens = min(shared * MOONCAKE_BLOCK_TOKENS, int(prompt) - 1)
        if shared and tokens > 0:
            groups.append(f"mc{h[0]}")
            lengths.append(tokens)
        else:
            groups.append(None)
            lengths.append(None)
    return groups, lengths


def _read_sorted(kind: str, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    """(times ns, prompt tokens, output tokens, hash blocks) of a source file, in time order (stable)."""
    if kind == "azure":
        times, prompts, outputs, hashes = _read_azure(path)
    elif kind == "mooncake":
        times, prompts, outputs, hashes = _read_mooncake(path)
    elif kind == "llmservingsim":
        times, prompts, outputs, hashes = _read_llmservingsim(path)
    else:
        raise TraceError(f"importer {kind!r}: unknown; expected one of {', '.join(IMPORT_KINDS)}")
    if len(times) == 0:
        raise TraceError(f"{path}: no requests: expected at least one row")
    order = np.argsort(times, kind="stable")
    return times[order], prompts[order], outputs[order], [hashes[i] for i in order]


def _window(
    rel: np.ndarray, path: Path, start_s: float, duration_s: float | None, max_requests: int | None
) -> np.ndarray:
    """Indices of the requests inside the window (``rel``: ns from the first request), at most ``max_requests``."""
    keep = rel >= int(start_s * _NS)
    if duration_s is not None:
        keep &= rel < int((start_s + duration_s) * _NS)
    idx = np.flatnonzero(keep)
    if max_requests is not None:
        idx = idx[:max_requests]
    if len(idx) == 0:
        raise TraceError(f"{path}: window start {start_s} s, duration {duration_s} s holds no requests")
    return idx


def _trace_table(
    offsets: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    groups: list[str | None],
    lengths: list[int | None],
    request_class: str,
    block_hashes: list[Any] | None = None,
) -> pa.Table:
    n = len(offsets)
    width = max(6, len(str(n)))
    return trace_table(
        {
            "request_id": [f"r{i:0{width}d}" for i in range(n)],
            "request_class": [request_class] * n,
            "scheduled_offset_ns": offsets,
            "prompt_tokens": prompts.astype(np.int32),
            "output_tokens": outputs.astype(np.int32),
            "prefix_group": groups,
            "prefix_tokens": lengths,
            "conversation_id": [None] * n,
            "turn_index": [None] * n,
            "cancel_after_tokens": [None] * n,
            "think_after_reply_ns": [None] * n,
            "reasoning_tokens": [None] * n,
            "prompt_block_hashes": block_hashes if block_hashes is not None else [None] * n,
        }
    )


def import_trace(
    kind: str,
    path: str | Path,
    out: str | Path,
    *,
    time_scale: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    request_class: str = "short-message",
    class_by: str | None = None,
    class_map: tuple[tuple[str, str], ...] = (),
    tokenizer: str = "cl100k_base",
    rate_rps: float = 1.0,
) -> Path:
    """Import a public trace into a loadgen trace file.

    ``start_s``/``duration_s`` cut a window (seconds from the first request, before scaling);
    ``time_scale`` multiplies the gaps (0.5 = twice the rate). ``class_by`` (burstgpt: ``model`` or
    ``log-type``; bailian: ``type``) names one class per value of that field, ``class_map`` renaming values.
    ``tokenizer`` and ``rate_rps`` (conversations started per second): sharegpt's token counts and arrivals.
    """
    path = Path(path)
    if class_map and class_by is None:
        raise TraceError("--class-map without --class-by: expected --class-by naming the field the values come from")
    if kind in _TABLE_KINDS:
        options = ImportOptions(time_scale, start_s, duration_s, max_requests, request_class, class_map)
        if kind == "sharegpt":
            if class_by is not None:
                raise TraceError(f"--class-by = {class_by!r}: sharegpt has no field to name classes by")
            return write_imported(read_sharegpt(path, tokenizer, rate_rps), out, options)
        return write_imported(_read_table_kind(kind, path, class_by), out, options)
    if class_by is not None:
        raise TraceError(f"--class-by = {class_by!r}: {kind} has no field to name classes by")
    _check_import_options(time_scale, start_s, duration_s, max_requests)
    problem = class_name_problem(request_class)
    if problem is not None:
        raise TraceError(f"--request-class = {request_class!r}: {problem}")
    times, prompts, outputs, hashes = _read_sorted(kind, path)
    # a workload file's arrival instants are offsets already (kept exactly, its zero too); others start at 0
    keep_zero = kind == "llmservingsim" and start_s == 0
    rel = times - times[0]
    idx = _window(rel, path, start_s, duration_s, max_requests)
    rel = times[idx] if keep_zero else rel[idx] - rel[idx[0]]
    scaled = rel.astype(np.float64) * time_scale
    if scaled[-1] > MAX_OFFSET_NS:
        raise TraceError(
            f"{path}: the window spans {scaled[-1] / _NS:.3g} s after --time-scale {time_scale:g}: "
            f"expected at most {MAX_OFFSET_NS / _NS:.3g} s (cut it with --duration-s)"
        )
    offsets = np.rint(scaled).astype(np.int64)
    prompts, outputs = np.maximum(prompts[idx], 1), np.maximum(outputs[idx], 1)
    n = len(idx)
    blocks: list[Any] | None = None
    if kind == "mooncake":
        groups, lengths = _mooncake_prefixes([hashes[i] for i in idx], prompts)
        blocks = [list(hashes[i]) for i in idx]  # hash_ids as given (each a 512-token block)
    elif kind == "llmservingsim":
        groups, lengths = [None] * n, [None] * n
        blocks = [hashes[i] for i in idx] if any(len(hashes[i]) for i in idx) else None
    else:
        groups, lengths = [None] * n, [None] * n
    metadata = {
        "generator": f"loadgen.trace.importers.{kind}",
        "loadgen_version": __version__,
        "source": str(path),
        "source_sha256": sha256_file(path),
        "trace_name": path.stem,
        "seed": None,
        "mode": "open",
        "max_in_flight": None,
        "time_scale": time_scale,
        "window_start_s": start_s,
        "window_duration_s": duration_s,
        "max_requests": max_requests,
        "request_class": request_class,
        "requests": n,
        "duration_s": float(offsets[-1]) / _NS,
        "block_hash_tokens": _BLOCK_TOKENS[kind] if blocks is not None else None,
        "block_hash_rule": _BLOCK_RULES[kind] if blocks is not None else None,
    }
    table = _trace_table(offsets, prompts, outputs, groups, lengths, request_class, blocks)
    return write_trace(table, out, metadata)


def _read_table_kind(kind: str, path: Path, class_by: str | None) -> Source:
    if kind == "burstgpt":
        return read_burstgpt(path, class_by)
    return read_bailian(path, class_by)


def _check_import_options(
    time_scale: float, start_s: float, duration_s: float | None, max_requests: int | None
) -> None:
    """The window and scale options: finite and in range (the CLI checks its flags too; this guards library use)."""
    if not is_finite(time_scale) or not 0 < time_scale <= 1e6:
        raise TraceError(f"--time-scale = {time_scale}: expected a finite number in (0, 1e6]")
    for name, value in (("--start-s", start_s), ("--duration-s", duration_s)):
        if value is not None and (not is_finite(value) or not 0 <= value <= MAX_OFFSET_NS / _NS):
            raise TraceError(f"{name} = {value}: expected a finite number of seconds in 0..{MAX_OFFSET_NS / _NS:g}")
    if max_requests is not None and not 1 <= max_requests <= MAX_TRACE_REQUESTS:
        raise TraceError(f"--max-requests = {max_requests}: expected 1..{MAX_TRACE_REQUESTS}")


def import_azure(path: str | Path, out: str | Path, **options: Any) -> Path:
    return import_trace("azure", path, out, **options)


def import_mooncake(path: str | Path, out: str | Path, **options: Any) -> Path:
    return import_trace("mooncake", path, out, **options)
