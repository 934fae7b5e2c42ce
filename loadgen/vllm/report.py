"""What a vLLM reported about its KV cache, read from a log file or a run dir, and the ledger held against it.

Sources, in a run dir or as a bare log file: the vLLM startup log ("KV cache size: N tokens, Maximum
concurrency ..."), the manifest's ``engine_notes``, ``server_metrics.parquet``'s
``vllm:cache_config_info`` labels (num_gpu_blocks, block_size, kv_cache_size_tokens,
kv_cache_memory_bytes), or, for an imported run (``loadgen import llmservingsim``), the same facts as its
meta.json logged them (the manifest's ``target.engine.config.kv_cache``); ``cache_config_source`` says which.
The comparison itself is the ledger's (``ledger.reconcile_report``); this module only gathers the engine's
side, so the dependency runs engines → ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pyarrow.compute as pc
from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from loadgen.ledger import (
    EngineSettings,
    ModelConfig,
    Reconciliation,
    read_model_config,
    reconcile_report,
)
from loadgen.ledger.settings import MAX_MEMORY_GIB, vllm_batch_defaults
from loadgen.rundir.foreign_input import read_measured_engine_config
from loadgen.rundir.io import read_run_table
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import MANIFEST_FILE, SERVER_METRICS_FILE
from loadgen.util.errors import LedgerError, LoadgenError
from loadgen.util.limits import MAX_PARAM, InputModel
from loadgen.util.validation import format_validation_error
from loadgen.vllm.log import VLLM_LOG_NAMES, parse_vllm_log
from loadgen.vllm.result import VllmEngineNotes

__all__ = ["BatchLimits", "batch_limits", "engine_report", "reconcile", "reconcile_server_run"]


@dataclass(frozen=True)
class BatchLimits:
    """A vLLM's scheduler limits: what its startup log reported, else vLLM's own default for its device."""

    max_num_batched_tokens: int
    max_num_seqs: int
    device: str  # "cpu" | "cuda"
    tokens_from_log: bool
    seqs_from_log: bool


def batch_limits(notes: dict[str, Any], max_model_len: int | None) -> BatchLimits:
    """The token budget and sequence cap a vLLM runs with, from its startup log's facts (``parse_vllm_log``)."""
    device = "cpu" if notes.get("kv_cache_device") == "CPU" else "cuda"
    raw_args = notes.get("non_default_args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
    seqs = args.get("max_num_seqs")
    tokens = notes.get("max_num_batched_tokens") or args.get("max_num_batched_tokens")
    d_tokens, d_seqs = vllm_batch_defaults(
        device, max_model_len=max_model_len, max_num_seqs=seqs, max_num_batched_tokens=tokens
    )
    return BatchLimits(int(tokens or d_tokens), int(seqs or d_seqs), device, bool(tokens), bool(seqs))


def _label_value(value: Any) -> Any:
    """A Prometheus label is text: vLLM writes an unset setting as "None"."""
    return None if value in ("None", "") else value


#: A count or size the engine reported (a label's text or a JSON integer): a whole number from 1.
_Reported = Annotated[Annotated[int, Field(ge=1, le=int(MAX_PARAM))] | None, BeforeValidator(_label_value)]


class CacheConfigInfo(InputModel):
    """The KV cache facts reconcile compares (``vllm:cache_config_info``'s labels, or an imported run's logged
    ``kv_cache``): checked before they become the engine's side of a row. Other keys kept as written."""

    model_config = ConfigDict(extra="allow")

    num_gpu_blocks: _Reported = None
    block_size: _Reported = None
    kv_cache_size_tokens: _Reported = None
    kv_cache_memory_bytes: Annotated[
        Annotated[int, Field(ge=1, le=int(MAX_MEMORY_GIB) << 30)] | None, BeforeValidator(_label_value)
    ] = None


def _cache_info(source: str, info: Any) -> dict[str, Any]:
    """``info`` checked as ``CacheConfigInfo``, returned as written; LedgerError with one line on a problem."""
    if not isinstance(info, dict):
        raise LedgerError(f"{source} = {info!r:.80}: expected an object of the KV cache's settings")
    try:
        CacheConfigInfo.model_validate(info)
    except ValidationError as exc:
        raise LedgerError(format_validation_error(source, exc, CacheConfigInfo)) from None
    return info


def _metrics_cache_info(run_dir: Path) -> dict[str, Any]:
    """The labels of the last ``vllm:cache_config_info`` sample scraped into the run dir, or {}."""
    table = read_run_table(run_dir, SERVER_METRICS_FILE, ["name", "labels"]) if run_dir.is_dir() else None
    if table is None:
        return {}
    rows = table.filter(pc.equal(table["name"], "vllm:cache_config_info"))
    if rows.num_rows == 0:
        return {}
    source = f"{run_dir / SERVER_METRICS_FILE}: vllm:cache_config_info labels"
    try:
        labels = json.loads(rows["labels"][rows.num_rows - 1].as_py() or "")
    except (ValueError, RecursionError):
        raise LedgerError(f"{source}: not JSON: expected the labels as a JSON object") from None
    return _cache_info(source, labels)


def _manifest_log_notes(path: Path, engine_notes: dict[str, Any]) -> dict[str, Any]:
    """The vLLM log's facts a run's manifest keeps (``engine_notes.log``, or ``engine_notes`` itself), the keys
    ``VllmEngineNotes`` declares checked as it checks them (the manifest may have been edited since the run; the
    simulated engine's and importers' own keys are left as they are); LedgerError with one line on a problem."""
    where = "engine_notes.log" if "log" in engine_notes else "engine_notes"
    notes = engine_notes.get("log", engine_notes)
    if not isinstance(notes, dict):
        raise LedgerError(f"{path}: {where} = {notes!r:.80}: expected an object (a vLLM log's notes)")
    try:
        VllmEngineNotes.model_validate({k: v for k, v in notes.items() if k in VllmEngineNotes.model_fields})
    except ValidationError as exc:
        raise LedgerError(format_validation_error(f"{path}: {where}", exc, VllmEngineNotes)) from None
    return notes


def engine_report(source: str | Path) -> dict[str, Any]:
    """What the engine reported about its KV cache: merged from log, manifest engine_notes and /metrics."""
    p = Path(source)
    report: dict[str, Any] = {"sources": []}
    if p.is_file():
        report.update(parse_vllm_log(p.read_text(errors="replace"), p))
        report["sources"].append(str(p))
        return report
    if not p.is_dir():
        raise LedgerError(f"{p}: no such file or directory: expected a vLLM log or a run dir")
    manifest = p / MANIFEST_FILE
    if manifest.is_file():
        read = read_manifest(p)
        for k, v in _manifest_log_notes(manifest, read.engine_notes.model_dump(mode="json")).items():
            report.setdefault(k, v)
        where = f"{manifest}: target.engine.config"
        config = read_measured_engine_config(where, read.target.engine.config if read.target.engine else None)
        logged = config.get("kv_cache")
        if isinstance(logged, dict) and logged.get("num_gpu_blocks") is not None:  # an imported run's meta.json
            report["cache_config_info"] = _cache_info(f"{where}.kv_cache", logged)
            report["cache_config_source"] = "run: meta.json kv_cache"
        report["sources"].append(str(manifest))
    for name in VLLM_LOG_NAMES:
        if (p / name).is_file():
            for k, v in parse_vllm_log((p / name).read_text(errors="replace"), p / name).items():
                report.setdefault(k, v)
            report["sources"].append(str(p / name))
            break
    info = _metrics_cache_info(p)
    if info:
        report["cache_config_info"] = info
        report["cache_config_source"] = "metrics: cache_config_info"
        report["sources"].append(str(p / SERVER_METRICS_FILE))
    if len(report["sources"]) == 0:
        raise LedgerError(f"{p}: no vLLM log, engine_notes or server metrics: expected a vLLM run dir")
    return report


def reconcile(
    model: ModelConfig, engine: EngineSettings | None, source: str | Path, *, fixed: set[str] | None = None
) -> Reconciliation:
    """Ledger vs what vLLM reported in ``source`` (a log or a run dir); settings not in ``fixed`` are taken from the engine."""
    return reconcile_report(model, engine, engine_report(source), fixed=fixed, source=source)


def reconcile_server_run(model_dir: Path, source: Path, *, runtime_gib: float | None = None) -> dict[str, Any]:
    """Ledger vs what a launched vLLM reported (``source``: a run dir with its log and scraped cache_config_info, or
    the log itself), for the manifest; ``runtime_gib``: a runtime measured before (a calibrated engine TOML's)."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return {"ok": None, "reason": f"{config}: not found"}
    try:
        engine = EngineSettings(runtime_gib=runtime_gib) if runtime_gib is not None else None
        result = reconcile(read_model_config(config), engine, source)
    except LoadgenError as exc:
        return {"ok": None, "reason": str(exc)}
    return {
        "ok": result.ok,
        "rows": [r.to_dict() for r in result.rows],
        "ledger_total_bytes": result.ledger.total_bytes,
        "ledger_lines": {line.name: line.bytes for line in result.ledger.lines},
        "model_memory_bytes": result.ledger.model_memory_bytes,
        "device": result.ledger.engine.device,
    }
