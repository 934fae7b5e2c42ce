"""Parse a vLLM server log into the facts a manifest's ``engine_notes`` records.

Weights loading, KV cache size in tokens and max concurrency, KV cache memory, compilation and
warm-up times, chunked-prefill token budget, version and non-default engine arguments. Patterns are
those printed by vLLM v1 (vllm/v1/core/kv_cache_utils.py "KV cache size", gpu/cpu worker and model
runner messages); a line that is absent leaves its key out rather than guessing.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loadgen.util.errors import EngineError
from loadgen.util.validation import format_validation_error

from .result import VllmLogNotes

__all__ = [
    "VLLM_LOG_FILE",
    "VLLM_LOG_NAMES",
    "behavior_relevant",
    "find_vllm_log",
    "parse_vllm_log",
    "parse_vllm_log_file",
]

#: The server log's name in a run dir that loadgen measured against a vLLM it launched.
VLLM_LOG_FILE = "vllm.log"
#: Names a run dir may hold a server log under, in the order they are looked for.
VLLM_LOG_NAMES = (VLLM_LOG_FILE, "engine.log", "server.log")

#: A number as vLLM prints it: digits, thousands grouped by commas or not ("512,000", "54.48"); "5,,," is no number.
_NUM = r"((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?)"

# (key, regex): ``_record`` turns a match's groups into notes
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("kv_cache", re.compile(r"\b(CPU|GPU|XPU|TPU|HPU)(?: \+ host)? KV cache size: " + _NUM + r" tokens")),
    ("max_concurrency", re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x")),
    ("kv_cache_explicit_gib", re.compile(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache")),
    ("kv_cache_available_gib", re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB")),
    ("model_loading", re.compile(r"Model loading took " + _NUM + r" ?GiB(?: memory)? and " + _NUM + r" seconds")),
    ("weights_loading_s", re.compile(r"Loading weights took " + _NUM + r" seconds")),
    ("model_init_s", re.compile(r"Initializing model took " + _NUM + r" seconds")),
    (
        "init_engine",
        re.compile(
            r"init engine \(profile, create kv cache, warmup model\) took "
            + _NUM
            + r" s(?: \(compilation: "
            + _NUM
            + r" s)?"
        ),
    ),
    (
        "torch_compile_s",
        re.compile(
            r"torch\.compile (?:and initial profiling/warmup run together )?(?:took|takes) " + _NUM + r" s in total"
        ),
    ),
    ("dynamo_transform_s", re.compile(r"Dynamo bytecode transform time: " + _NUM + r" s")),
    ("warmup_run_s", re.compile(r"Initial profiling/warmup run took " + _NUM + r" s")),
    ("graph_capture", re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + r" GiB")),
    (
        "memory_profile",
        re.compile(
            r"Memory profiling takes "
            + _NUM
            + r" seconds\. Total non KV cache memory: "
            + _NUM
            + r" ?GiB; torch peak memory increase: "
            + _NUM
            + r" ?GiB"
        ),
    ),
    ("max_num_batched_tokens", re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=" + _NUM)),
    ("max_model_len", re.compile(r"Using max model len " + _NUM)),
    ("architecture", re.compile(r"Resolved architecture: (\S+)")),
    (
        "version",
        re.compile(r"(?:Initializing a V1 LLM engine \(v|vLLM API server version |\bversion )(\d+\.\d+\.\d+[\w.+-]*)"),
    ),
    ("kv_cache_layout", re.compile(r"Using (\w+) KV cache layout")),
    ("block_size_override", re.compile(r"block_size=(\d+)\b")),  # only with _OVERRIDE after it (_scan_line)
    ("attention_backend", re.compile(r"\bUsing ([A-Z][A-Z0-9_]+) backend\.")),
]
#: Simple key=value fields of the "Initializing a V1 LLM engine ... with config:" line that change behaviour.
_ENGINE_KEYS = (
    "speculative_config",
    "dtype",
    "max_seq_len",
    "load_format",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "quantization",
    "enforce_eager",
    "kv_cache_dtype",
    "device_config",
    "seed",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)
_ENGINE_KV = re.compile(r"\b(" + "|".join(_ENGINE_KEYS) + r")=([^,\s]+)")
#: What makes a ``block_size=N`` an override, later on its line (a search from the number: one pass, where
#: ``block_size=(\d+)\b.*(?:overrid|requires)`` had backtracked over the line from every ``block_size=``).
_OVERRIDE = re.compile(r"overrid|requires")
#: Begins the dict literal of vLLM's "non-default args" line, which runs to the line's end.
_NON_DEFAULT = "non-default args: {"
#: The longest line read: vLLM's startup lines are a few KiB; a longer one (a logged request's prompt, a damaged
#: file) is skipped, so neither the literal parse nor the patterns spend memory or time on it.
MAX_LOG_LINE_CHARS = 1 << 20
_TS = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)")


def _f(s: str) -> float:
    return float(s.replace(",", ""))


def _i(s: str) -> int | str:
    """A whole number as printed; its digits as text when too long for an int (VllmLogNotes then refuses them)."""
    digits = s.replace(",", "").split(".")[0]
    return int(digits) if len(digits) <= 30 else digits


def _scalar(v: str) -> Any:
    v = v.strip("'")
    if v in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[v]
    try:
        return int(v)
    except ValueError:
        return v.replace("torch.", "")


def _literal_dict(text: str) -> dict[str, Any] | str:
    """The dict a Python literal spells (keys text), as JSON holds it (a tuple a list, a set its text), or the
    text itself when it spells something else."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        return text
    return dict(json.loads(json.dumps(value, default=str)))


def _ts(line: str) -> datetime | None:
    m = _TS.search(line)
    if not m:
        return None
    try:
        return datetime.strptime(m.group(1), "%m-%d %H:%M:%S")
    except ValueError:
        return None


def parse_vllm_log(text: str, source: str | Path = "vLLM log") -> dict[str, Any]:
    """Facts from a vLLM startup log (the first occurrence of each); keys absent when not printed. Built through
    ``VllmLogNotes`` (``loadgen schema vllm-log``): a key it does not declare is a bug, and a number outside its
    range (a damaged or forged line: 10^300 tokens, 0 tokens) an EngineError naming ``source``, the key and the
    value."""
    notes: dict[str, Any] = {}
    warm_start = warm_end = first_ts = ready_ts = None
    for line in text.splitlines():
        if len(line) > MAX_LOG_LINE_CHARS:
            continue
        ts = _ts(line)
        if ts is not None and first_ts is None:
            first_ts = ts
        if "Warming up model" in line and warm_start is None:
            warm_start = ts
        if "Warming up done" in line and warm_end is None:
            warm_end = ts
        if ("Starting vLLM" in line and "server on" in line) or "Application startup complete" in line:
            ready_ts = ready_ts or ts
        _scan_line(notes, line)
    _drop_markers(notes)
    # the timestamps have no year: a span that runs backwards (over New Year, or lines out of order) is not known
    if warm_start and warm_end and warm_end >= warm_start:
        notes["warmup_s"] = (warm_end - warm_start).total_seconds()
    if first_ts and ready_ts and ready_ts >= first_ts:
        notes["startup_s_from_log"] = (ready_ts - first_ts).total_seconds()
    try:
        return VllmLogNotes.model_validate(notes).document()
    except ValidationError as exc:
        raise EngineError(format_validation_error(str(source), exc, VllmLogNotes)) from None


def _scan_line(notes: dict[str, Any], line: str) -> None:
    """Add to ``notes`` what one log line reports and is not there yet."""
    if "engine_config" not in notes and "with config:" in line:
        notes["engine_config"] = {k: _scalar(v) for k, v in _ENGINE_KV.findall(line.split("with config:", 1)[1])}
    if "non_default_args" not in notes:
        at, text = line.find(_NON_DEFAULT), line.rstrip()
        if at >= 0 and text.endswith("}"):
            notes["non_default_args"] = _literal_dict(text[at + len(_NON_DEFAULT) - 1 :])
    for key, pattern in _PATTERNS:
        if (
            key in notes
            or (key == "kv_cache" and "kv_cache_size_tokens" in notes)
            or (key == "max_concurrency" and "kv_cache_max_model_len" in notes)
        ):
            continue
        m = pattern.search(line)
        if m and (key != "block_size_override" or _OVERRIDE.search(line, m.end())):
            _record(notes, key, m.groups())


def _record(notes: dict[str, Any], key: str, g: tuple[Any, ...]) -> None:
    """Store one pattern's groups under their note names (``key`` itself marks a multi-value pattern as seen)."""
    if key == "kv_cache":
        notes["kv_cache_device"] = g[0]
        notes["kv_cache_size_tokens"] = _i(g[1])
    elif key == "max_concurrency":
        notes["kv_cache_max_model_len"] = _i(g[0])
        notes["max_concurrency"] = _f(g[1])
    elif key == "kv_cache_explicit_gib":
        notes["kv_cache_memory_gib"] = _f(g[0])
        notes["host_memory_gib"] = _f(g[1])
        notes[key] = _f(g[0])
    elif key == "kv_cache_available_gib":
        notes["kv_cache_memory_gib"] = _f(g[0])
        notes[key] = _f(g[0])
    elif key == "model_loading":
        notes["weights_memory_gib"] = _f(g[0])
        notes["weights_loading_s"] = notes.get("weights_loading_s", _f(g[1]))
        notes[key] = {"gib": _f(g[0]), "s": _f(g[1])}
    elif key == "init_engine":
        notes["init_engine_s"] = _f(g[0])
        if g[1] is not None:
            notes["compilation_s"] = _f(g[1])
        notes[key] = True
    elif key == "graph_capture":
        notes["graph_capture_s"] = _f(g[0])
        notes["graph_memory_gib"] = _f(g[1])
        notes[key] = True
    elif key == "memory_profile":
        notes["memory_profile_s"] = _f(g[0])
        notes["non_kv_memory_gib"] = _f(g[1])
        notes["torch_peak_increase_gib"] = _f(g[2])
        notes[key] = True
    elif key in ("max_num_batched_tokens", "max_model_len", "block_size_override"):
        notes[key] = _i(g[0])
    elif key in ("architecture", "version", "kv_cache_layout", "attention_backend"):
        notes[key] = g[0]
    else:
        notes[key] = _f(g[0])


def _drop_markers(notes: dict[str, Any]) -> None:
    """Remove the seen-markers ``_record`` left for patterns whose values live under other names."""
    for marker in ("init_engine", "graph_capture", "memory_profile", "kv_cache_explicit_gib", "kv_cache_available_gib"):
        if notes.get(marker) is True:
            del notes[marker]
    notes.pop("kv_cache_explicit_gib", None)
    notes.pop("kv_cache_available_gib", None)


def find_vllm_log(path: str | Path) -> Path:
    """A vLLM log file: the path itself, or ``vllm.log``/``engine.log``/``*.log`` inside a run dir."""
    p = Path(path)
    if p.is_file():
        return p
    for name in VLLM_LOG_NAMES:
        if (p / name).is_file():
            return p / name
    logs = sorted(p.glob("*.log")) if p.is_dir() else []
    if logs:
        return logs[0]
    raise EngineError(f"{p}: no vLLM log found: expected a log file or a run dir with vllm.log")


def parse_vllm_log_file(path: str | Path) -> dict[str, Any]:
    """``parse_vllm_log`` on the file ``find_vllm_log`` picks."""
    p = find_vllm_log(path)
    return parse_vllm_log(p.read_text(errors="replace"), p)


def behavior_relevant(notes: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``behavior_relevant`` entries a vLLM log reveals (prefix caching, quantization, ...)."""
    cfg = notes.get("engine_config") or {}
    out = {
        k: cfg[k]
        for k in (
            "enable_prefix_caching",
            "quantization",
            "kv_cache_dtype",
            "speculative_config",
            "enable_chunked_prefill",
            "dtype",
        )
        if k in cfg
    }
    if "enable_prefix_caching" in out:
        out["prefix_caching"] = out.pop("enable_prefix_caching")
    if "speculative_config" in out:
        out["speculative_decoding"] = out.pop("speculative_config")
    if "max_seq_len" in cfg:
        out["truncation"] = f"prompts + output limited to max_model_len {cfg['max_seq_len']}"
    return out
