"""A real vLLM server loadgen launched (``loadgen.vllm``): restartable, so cold is reachable.

cold = restart it (weights reloaded, graphs recompiled, KV and prefix cache empty); warm = every step
size met once per server process (``engines.vllm.warmup``), then the fixed warm-up set. A measured run
samples the server's memory and adds the engine's identity, log facts, memory high-water mark and the
ledger reconciliation to the run's manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from loadgen.rundir.manifest import amend_manifest, merge_sections
from loadgen.rundir.target_identity import VllmPlanTarget
from loadgen.util.errors import EngineError
from loadgen.vllm import (
    VLLM_LOG_FILE,
    MemorySampler,
    VllmConfig,
    VllmServer,
    batch_limits,
    reconcile_server_run,
    warm_step_shapes,
)

from ..driver import RunOptions, RunSettings, run_trace_sync
from .base import RunRequest, StateResult, Target
from .identity import VllmIdentity
from .replay import warm_up

__all__ = ["VllmTarget", "engine_memory", "measure_with_server"]


def engine_memory(
    server: VllmServer, sampler: MemorySampler, source: Path, *, runtime_gib: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``sampler`` saw of ``server``'s memory, against the ledger for what vLLM reported in ``source`` (a run
    dir or its log); returns (memory, reconciliation).

    The memory summary gains the runtime this measured (``runtime_measured_bytes``): the high-water mark (RSS of
    the process tree on CPU, device memory on CUDA) beyond the ledger's model-memory lines (its runtime and safety
    margin left out). ``runtime_gib``: the ledger's runtime line comes from an earlier measurement (a calibrated
    engine TOML) instead of the default, and ``peak_over_ledger`` then tests that prediction.
    """
    reconciliation = reconcile_server_run(Path(server.config.model_dir), source, runtime_gib=runtime_gib)
    total = reconciliation.get("ledger_total_bytes")
    memory = sampler.summary(total)
    model = reconciliation.get("model_memory_bytes") or {}
    on_gpu = reconciliation.get("device") == "cuda"
    peak = memory.get("gpu_high_water_bytes" if on_gpu else "rss_high_water_bytes")
    if model and peak:
        memory["runtime_measured_bytes"] = int(peak) - sum(model.values())
        memory["peak_bytes"] = int(peak)
        memory["peak_basis"] = "device memory" if on_gpu else "RSS of the process tree"
        if total:
            memory["peak_over_ledger"] = round(int(peak) / int(total), 4)
    return memory, reconciliation


def measure_with_server(server: VllmServer, options: RunOptions, *, sample_interval_s: float = 0.5) -> Path:
    """Replay ``options`` against a healthy launched ``server``, sampling its memory; returns the run dir.

    The manifest gets the vLLM identity, engine args and log notes when the files open; after the
    run, the memory high-water mark, the re-read log notes and the ledger reconciliation are merged
    in (``amend_manifest``), and the server log is copied into the run dir.
    """
    if server.proc is None:
        raise EngineError("vLLM server: not started: expected start() and wait_healthy() first")
    extra = merge_sections(options.extra_manifest, server.manifest_extra())
    headers = dict(options.headers)
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # vLLM rejects bodies without it (HTTP 400)
    options = options.model_copy(update={"extra_manifest": extra, "headers": headers})
    sampler = MemorySampler(server.proc.pid, sample_interval_s).start()
    try:
        run_dir = Path(run_trace_sync(options))
    finally:
        sampler.stop()
    died = server.exit_line()
    if died is not None:  # the run's records stay; what follows would only blame an unreachable target
        shutil.copyfile(server.log_path, run_dir / VLLM_LOG_FILE)
        amend_manifest(run_dir, {"engine_notes": {"died": died}})
        raise EngineError(f"during the run into {run_dir}: {died}")
    shutil.copyfile(server.log_path, run_dir / VLLM_LOG_FILE)
    memory, reconciliation = engine_memory(server, sampler, run_dir)
    amend_manifest(
        run_dir,
        {
            "engine_notes": {
                "memory": memory,
                "log": server.engine_notes(),  # re-read: the log may have grown during the run
                "ledger_reconcile": reconciliation,
            }
        },
    )
    return run_dir


class VllmTarget(Target):
    """A vLLM server launched by loadgen from ``config``; logs under ``work_dir``."""

    kind = "vllm"

    def __init__(
        self, config: VllmConfig, work_dir: Path, *, model: str | None = None, tokenizer: str = "server"
    ) -> None:
        self.config = config
        self.work_dir = Path(work_dir)
        self._model = model or config.served_model_name or str(config.model_dir)
        self.tokenizer = tokenizer
        self.starts = 0
        self.server: VllmServer | None = None
        self._swept_pid: int | None = None  # the server process the step sizes were swept on
        self._start()

    def _start(self) -> float:
        self.starts += 1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(self.config, log_path=self.work_dir / f"vllm-{self.starts}.log")
        server = self.server = VllmServer(cfg).start()
        try:
            return server.wait_healthy()
        except BaseException:
            server.stop()
            raise

    def _restart(self) -> tuple[int | None, int | None, float]:
        old = self.pid
        if self.server is not None:
            self.server.stop()
        ready_s = self._start()
        return old, self.pid, ready_s

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server is not None and self.server.proc is not None else None

    @property
    def ready_s(self) -> float | None:
        return self.server.ready_s if self.server is not None else None

    @property
    def url(self) -> str | None:
        return self.server.base_url if self.server else None

    @property
    def model(self) -> str | None:
        return self._model

    def describe(self) -> dict[str, Any]:
        raw = self.config.args(0)
        at = raw.index("--port")
        args = raw[:at] + raw[at + 2 :]  # the port changes with every (re)start
        return VllmIdentity(
            kind="vllm",
            engine=f"vllm:{Path(self.config.model_dir).name}",
            engine_sha256=hashlib.sha256(json.dumps(args).encode()).hexdigest(),
            args=args,
            launched_by_loadgen=True,
        ).document()

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "cold":
            old, new, ready = self._restart()
            return StateResult(
                "cold",
                True,
                [
                    f"vLLM restarted (pid {old} → {new}), healthy after {ready:.1f} s: weights "
                    "reloaded, graphs recompiled, KV and prefix cache empty; no warm-up sent"
                ],
                method="restart",
            )
        actions: list[str] = []
        if self.check_alive() is not None:
            old, new, ready = self._restart()
            actions.append(f"vLLM was not running; restarted (pid {old} → {new}), healthy after {ready:.1f} s")
        actions += self._sweep_step_sizes()
        actions += warm_up(self.url or "", self._model, warmup_trace, work_dir, scenario_path)
        return StateResult("warm", True, actions)

    def _sweep_step_sizes(self) -> list[str]:
        """Once per server process: every step size met once (``warm_step_shapes``), as a serving engine has."""
        assert self.server is not None
        if self._swept_pid == self.pid:
            return []
        notes = self.server.engine_notes()
        budget = batch_limits(notes, notes.get("max_model_len")).max_num_batched_tokens
        warmed = warm_step_shapes(self.url or "", budget)
        self._swept_pid = self.pid
        return [warmed.line()]

    def run(self, request: RunRequest) -> Path:
        assert self.server is not None
        settings = RunSettings(progress="off", tokenizer=self.tokenizer).over(self.driver_options(request))
        options = settings.options(
            trace_path=request.trace_path,
            target_url=self.server.base_url,
            out_dir=request.out_dir,
            model=self._model,
            scenario_path=request.scenario_path,
            warm_state=request.state.label,
            warm_actions=request.state.actions,
            extra_manifest={
                "plan_target": VllmPlanTarget.model_validate(
                    {**self.describe(), "server_pid": self.pid, "server_starts": self.starts}
                ).document(),
                **request.state.manifest_extra(),
                **request.extra_manifest,
            },
        )
        return measure_with_server(self.server, options)

    def check_alive(self) -> str | None:
        proc = self.server.proc if self.server else None
        if proc is None or self.server is None:
            return f"vLLM was not started (work dir {self.work_dir})"
        died = self.server.exit_line()
        return f"during the cell: {died}" if died is not None else None

    def recover(self) -> list[str]:
        old, new, ready = self._restart()
        return [f"vLLM restarted after a failure (pid {old} → {new}), healthy after {ready:.1f} s"]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
