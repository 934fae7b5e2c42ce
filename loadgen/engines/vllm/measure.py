"""A measured run against a launched vLLM: replay with memory sampling, then add what the server reported.

``run_with_server`` runs the driver and afterwards rewrites the run's manifest with the memory
high-water mark, the re-read startup-log notes and the ledger reconciliation (``_reconcile_run``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...driver import RunOptions, run_trace_sync
from ...errors import EngineError, LoadgenError
from ...ledger import read_model_config
from ...rundir import read_manifest, write_manifest
from .log import VLLM_LOG_FILE
from .memory import MemorySampler
from .report import reconcile
from .server import VllmServer

__all__ = ["run_with_server"]


def run_with_server(server: VllmServer, options: RunOptions, *, ledger_total_bytes: int | None = None,
                    sample_interval_s: float = 0.5) -> Path:
    """Replay ``options`` (a driver RunOptions) against a healthy ``server`` with memory sampling.

    The manifest gets the vLLM identity, engine args and log notes (through ``extra_manifest``), then
    the memory high-water mark after the run; the server log is copied into the run dir as ``vllm.log``.
    """
    if server.proc is None:
        raise EngineError("vLLM server: not started: expected start() and wait_healthy() first")
    extra = server.manifest_extra()
    merged = dict(options.extra_manifest)
    for key, value in extra.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    headers = dict(options.headers)
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # vLLM rejects bodies without it (HTTP 400)
    options = options.model_copy(update={"extra_manifest": merged, "headers": headers})
    sampler = MemorySampler(server.proc.pid, sample_interval_s).start()
    try:
        run_dir = Path(run_trace_sync(options))
    finally:
        sampler.stop()
    shutil.copyfile(server.log_path, run_dir / VLLM_LOG_FILE)
    reconciliation = _reconcile_run(server, run_dir)
    if ledger_total_bytes is None and reconciliation.get("ledger_total_bytes"):
        ledger_total_bytes = reconciliation["ledger_total_bytes"]
    manifest = read_manifest(run_dir)
    notes = manifest.setdefault("engine_notes", {})
    notes["memory"] = sampler.summary(ledger_total_bytes)
    notes["log"] = server.engine_notes()  # re-read: the log may have grown during the run
    notes["ledger_reconcile"] = reconciliation
    write_manifest(run_dir, manifest)
    return run_dir


def _reconcile_run(server: VllmServer, run_dir: Path) -> dict[str, Any]:
    """Ledger vs what this vLLM reported (log + scraped cache_config_info), for the manifest."""
    config = Path(server.config.model_dir) / "config.json"
    if not config.is_file():
        return {"ok": None, "reason": f"{config}: not found"}
    try:
        result = reconcile(read_model_config(config), None, run_dir)
    except LoadgenError as exc:
        return {"ok": None, "reason": str(exc)}
    return {"ok": result.ok, "rows": [r.to_dict() for r in result.rows], "ledger_total_bytes": result.ledger.total_bytes,
            "ledger_lines": {line.name: line.bytes for line in result.ledger.lines}}
