"""Compare the ledger's KV capacity with what a running vLLM reported, line by line.

The engine's report is a dict of the facts vLLM printed or exported (its startup log's "KV cache size:
N tokens, Maximum concurrency ...", the manifest's ``engine_notes``, ``vllm:cache_config_info`` labels
under ``cache_config_info``). Gathering it from a log file or run dir is the engine's side
(``loadgen.vllm.report``), so this package never imports ``loadgen.vllm``. Settings the
engine reports (block size, max_model_len, KV budget) are adopted unless the caller fixed them, so the
comparison is for the same configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.util.errors import LedgerError

from .compute import Ledger, compute_ledger
from .config import ModelConfig
from .kv import vllm_cpu_block_size
from .result import RECONCILIATION_SCHEMA_VERSION, ReconciliationResult
from .settings import GIB, EngineSettings

__all__ = ["ReconcileRow", "Reconciliation", "reconcile_report"]


@dataclass(frozen=True)
class ReconcileRow:
    quantity: str
    ledger: float | int | None
    engine: float | int | None
    source: str
    exact: bool  # an exact match is required for this quantity

    @property
    def match(self) -> bool | None:
        if self.ledger is None or self.engine is None:
            return None
        if self.exact:
            return int(self.ledger) == int(self.engine)
        return abs(float(self.ledger) - float(self.engine)) <= max(0.01 * abs(float(self.engine)), 0.01)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantity": self.quantity,
            "ledger": self.ledger,
            "engine": self.engine,
            "source": self.source,
            "exact": self.exact,
            "match": self.match,
        }


@dataclass
class Reconciliation:
    ledger: Ledger
    report: dict[str, Any]
    rows: list[ReconcileRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        compared = [r.match for r in self.rows if r.match is not None]
        return bool(compared) and all(compared)

    def result(self) -> ReconciliationResult:
        """The typed reconciliation document (``loadgen ledger --reconcile SOURCE --json``)."""
        head = {"kind": "loadgen.ledger_reconciliation", "version": RECONCILIATION_SCHEMA_VERSION}
        return ReconciliationResult.from_document(head | self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": [r.to_dict() for r in self.rows],
            "engine_report": self.report,
            "ledger": {
                "kv_cache_blocks": self.ledger.kv_cache_blocks,
                "kv_cache_tokens": self.ledger.kv_cache_tokens,
                "vllm_kv_cache_size_tokens": self.ledger.vllm_kv_cache_size_tokens,
                "kv_bytes_per_token": self.ledger.kv_bytes_per_token,
                "engine": self.ledger.engine.to_dict(),
            },
        }

    def format(self) -> str:
        out = [f"{'quantity':<28} {'ledger':>16} {'vLLM':>16}  {'match':<6} source"]
        for r in self.rows:
            mark = {True: "yes", False: "NO", None: "-"}[r.match]
            out.append(f"{r.quantity:<28} {_fmt(r.ledger):>16} {_fmt(r.engine):>16}  {mark:<6} {r.source}")
        if not any(r.match is not None for r in self.rows):
            out.append(
                "reconciled: nothing to compare: the engine reported none of the KV quantities the ledger gives "
                "(KV cache size, KV blocks, block size)"
            )
        else:
            out.append("reconciled: " + ("yes, every compared quantity matches" if self.ok else "NO"))
        return "\n".join(out)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.2f}"
    return f"{int(v):,}"


def _int(v: Any) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def reconcile_report(
    model: ModelConfig,
    engine: EngineSettings | None,
    report: dict[str, Any],
    *,
    fixed: set[str] | None = None,
    source: str | Path = "engine report",
) -> Reconciliation:
    """Ledger vs an engine report for the same config; settings not in ``fixed`` are taken from the report.

    ``source`` names where the report came from, for the error message when it has no KV budget.
    """
    fixed = fixed or set()
    engine = (engine or EngineSettings()).with_(**_adopted_settings(model, report, fixed))
    if engine.kv_cache_gib is None and engine.device_memory_gib is None:
        raise LedgerError(
            f"{source}: KV budget: not reported by the engine; expected --kv-cache-gib or --device-memory-gib"
        )
    ledger = compute_ledger(model, engine)
    return Reconciliation(ledger=ledger, report=report, rows=_rows(ledger, report, fixed))


_KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2")


def _engine_args(report: dict[str, Any]) -> dict[str, Any]:
    """What the log says the engine was started with: its non-default args, then its config line."""
    args = report.get("non_default_args")
    merged = dict(args) if isinstance(args, dict) else {}
    for k, v in (report.get("engine_config") or {}).items():
        merged.setdefault(k, v)
    return merged


def _reported_block_size(model: ModelConfig, report: dict[str, Any]) -> int | None:
    """The block size the engine ran with: /metrics, else the CPU backend's rule on the logged facts."""
    block = _int(report.get("cache_config_info", {}).get("block_size"))
    if block is not None:
        return block
    if report.get("block_size_override"):  # vLLM's warning names the size it forced
        return int(report["block_size_override"])
    user = _int(_engine_args(report).get("block_size"))
    if report.get("kv_cache_device") == "CPU":
        return vllm_cpu_block_size(model.is_mla, user_block_size=user, backend=report.get("attention_backend"))
    return user


def _adopted_settings(model: ModelConfig, report: dict[str, Any], fixed: set[str]) -> dict[str, Any]:
    """The EngineSettings changes the report implies, except for settings in ``fixed``."""
    info = report.get("cache_config_info", {})
    args = _engine_args(report)
    changes: dict[str, Any] = {}
    if report.get("kv_cache_device") == "CPU" and "device" not in fixed:
        changes["device"] = "cpu"
    block = _reported_block_size(model, report)
    if "block_size" not in fixed and block:
        changes["block_size"] = block
    mml = report.get("kv_cache_max_model_len") or report.get("max_model_len")
    if "max_model_len" not in fixed and mml:
        changes["max_model_len"] = int(mml)
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        value = _int(report.get(name)) or _int(args.get(name))
        if name not in fixed and value:
            changes[name] = value
    kv_bytes = _int(info.get("kv_cache_memory_bytes"))
    if "kv_cache_gib" not in fixed:
        if kv_bytes:
            changes["kv_cache_gib"] = kv_bytes / GIB
        elif report.get("kv_cache_memory_gib"):
            changes["kv_cache_gib"] = float(report["kv_cache_memory_gib"])
        if "kv_cache_gib" in changes:
            changes["device_memory_gib"] = None
    dtype = info.get("cache_dtype") or args.get("kv_cache_dtype")
    if dtype in _KV_DTYPES and "kv_cache_dtype" not in fixed:
        changes["kv_cache_dtype"] = dtype
    return changes


def _rows(ledger: Ledger, report: dict[str, Any], fixed: set[str]) -> list[ReconcileRow]:
    """One row per quantity both the ledger and the report give."""
    info = report.get("cache_config_info", {})
    info_source = report.get("cache_config_source", "metrics: cache_config_info")
    kv_bytes = _int(info.get("kv_cache_memory_bytes"))
    rows: list[ReconcileRow] = []
    budget_exact = kv_bytes is not None or report.get("kv_cache_device") == "CPU" or "kv_cache_gib" in fixed
    if "kv_cache_size_tokens" in report:
        rows.append(
            ReconcileRow(
                "kv_cache_size_tokens",
                ledger.vllm_kv_cache_size_tokens,
                int(report["kv_cache_size_tokens"]),
                "log: KV cache size",
                budget_exact,
            )
        )
    if info.get("kv_cache_size_tokens") not in (None, "None"):
        rows.append(
            ReconcileRow(
                "kv_cache_size_tokens",
                ledger.vllm_kv_cache_size_tokens,
                _int(info["kv_cache_size_tokens"]),
                info_source,
                budget_exact,
            )
        )
    if info.get("num_gpu_blocks") not in (None, "None"):
        rows.append(
            ReconcileRow(
                "kv_cache_blocks",
                ledger.kv_cache_blocks,
                _int(info["num_gpu_blocks"]),
                f"{info_source}.num_gpu_blocks",
                budget_exact,
            )
        )
    if "max_concurrency" in report:
        ours = round(ledger.max_concurrency_at_max_len or 0.0, 2)
        rows.append(
            ReconcileRow(
                "max_concurrency",
                ours,
                float(report["max_concurrency"]),
                "log: Maximum concurrency (2 decimals)",
                False,
            )
        )
    if info.get("block_size"):
        rows.append(ReconcileRow("block_size", ledger.kv.block_size, _int(info["block_size"]), info_source, True))
    if kv_bytes:
        rows.append(
            ReconcileRow("kv_budget_bytes", ledger.kv_budget_bytes, kv_bytes, "metrics: kv_cache_memory_bytes", True)
        )
    if report.get("max_model_len"):
        rows.append(
            ReconcileRow(
                "max_model_len", ledger.max_model_len, int(report["max_model_len"]), "log: Using max model len", True
            )
        )
    if report.get("weights_memory_gib"):
        rows.append(
            ReconcileRow(
                "weights_gib",
                round(ledger.line("weights").bytes / GIB, 2),
                float(report["weights_memory_gib"]),
                "log: Model loading took (GiB)",
                False,
            )
        )
    return rows
