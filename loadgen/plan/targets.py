"""What a plan runs its cells against, and how each target reaches a known warm or cold state.

Three kinds of target share one small interface (``prepare`` a state, ``run`` a cell, ``check_alive``,
``recover``, ``close``):

- ``WorksheetTarget``: the simulated engine in virtual time (fast, deterministic). Every run starts
  from the same empty engine, so "warm" holds by construction and "cold" is not a different state.
- ``SimServerTarget``: the simulated engine as a live HTTP server on loopback that this process
  launched; cold = restart the server process, warm = a fixed warm-up set through the real driver.
- ``UrlTarget``: any OpenAI-compatible URL; warm = the warm-up set, cold is not achievable (the tool
  did not launch the engine, so it cannot restart it) and such cells are reported, not run.
- ``VllmTarget``: a real vLLM server this process launched (``loadgen.engines.vllm``); cold = restart
  it (weights reloaded, graphs recompiled, KV and prefix cache empty), warm = the warm-up set.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PlanError, TargetError
from ..rundir import read_manifest, write_manifest

__all__ = [
    "StateResult",
    "CellTarget",
    "WorksheetTarget",
    "SimServerTarget",
    "UrlTarget",
    "VllmTarget",
    "SimServerProcess",
    "run_driver",
]

_LISTEN_RE = re.compile(r"listening on (http://\S+)")


@dataclass
class StateResult:
    """What was done to reach a cell's warm/cold state, and whether it was reached."""

    requested: str
    achieved: bool
    actions: list[str] = field(default_factory=list)
    reason: str | None = None  # why not achievable

    @property
    def label(self) -> str:
        return self.requested if self.achieved else "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.label, "requested": self.requested, "achieved": self.achieved,
                "actions": list(self.actions), "reason": self.reason}


def run_driver(
    trace_path: Path, target_url: str, out_dir: Path, *, model: str | None, scenario_path: Path | None,
    max_concurrency: int | None = None, state: StateResult | None = None, order_index: int | None = None,
    repeat: int | None = None, plan_cell: dict[str, Any] | None = None, deadline_s: float | None = None,
    extra_manifest: dict[str, Any] | None = None, api_key_env: str | None = None, tokenizer: str = "cl100k_base",
) -> Path:
    """One real replay through the driver (``loadgen.driver.run_trace_sync``); returns the run dir."""
    from ..driver import RunOptions, run_trace_sync

    options = RunOptions(
        trace_path=trace_path, target_url=target_url, out_dir=out_dir, model=model, scenario_path=scenario_path,
        max_concurrency=max_concurrency, warm_state=(state.label if state else "unknown"),
        warm_actions=(state.actions if state else []), order_index=order_index, repeat=repeat, plan_cell=plan_cell,
        deadline_s=deadline_s, extra_manifest=extra_manifest or {}, progress="off", api_key_env=api_key_env,
        tokenizer=tokenizer,
    )
    return Path(run_trace_sync(options))


class CellTarget:
    """Interface of a plan target (see the module docstring)."""

    kind = "abstract"
    #: True when a cell's wall time is the trace duration (live); False for virtual time.
    real_time = True

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def url(self) -> str | None:
        """Live base URL (for contract replay), None when there is none."""
        return None

    @property
    def model(self) -> str | None:
        return None

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        raise NotImplementedError

    def run(self, trace_path: Path, out_dir: Path, *, scenario_path: Path | None, state: StateResult,
            order_index: int, repeat: int, plan_cell: dict[str, Any], deadline_s: float | None, seed: int) -> Path:
        raise NotImplementedError

    def check_alive(self) -> str | None:
        """None when the target still answers, else one line saying what failed."""
        return None

    def recover(self) -> list[str]:
        """Bring the target back after a server failure; returns the actions taken."""
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> "CellTarget":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class WorksheetTarget(CellTarget):
    """The simulated engine in virtual time (``loadgen.sim.run_worksheet``)."""

    kind = "worksheet"
    real_time = False

    def __init__(self, engine: Any) -> None:
        from ..sim import load_engine_config

        self.engine = load_engine_config(engine)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "engine": self.engine.name, "engine_sha256": self.engine.sha256,
                "engine_path": self.engine.source_path}

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "warm":
            return StateResult("warm", True, ["virtual-time worksheet: every run starts from the same fresh engine "
                                              "(nothing to load or compile; prefix cache empty at t=0)"])
        return StateResult("cold", False, [], "not achievable on the worksheet: a virtual engine has no load, compile "
                                               "or cache state to lose, so cold is the same run as warm")

    def run(self, trace_path: Path, out_dir: Path, *, scenario_path: Path | None, state: StateResult,
            order_index: int, repeat: int, plan_cell: dict[str, Any], deadline_s: float | None, seed: int) -> Path:
        from ..sim import run_worksheet

        run_dir = Path(run_worksheet(trace_path, self.engine, out_dir, seed=seed, scenario=scenario_path))
        manifest = read_manifest(run_dir)
        manifest.update(order_index=order_index, repeat=repeat, plan_cell=plan_cell)
        manifest["warm_state"] = {**manifest.get("warm_state", {}), **state.to_dict(),
                                  "actions": list(manifest.get("warm_state", {}).get("actions", [])) + state.actions}
        write_manifest(run_dir, manifest)
        return run_dir


class SimServerProcess:
    """``loadgen sim serve`` as a child process on loopback; restartable (that is how cold is reached)."""

    def __init__(self, engine: str | Path, log_dir: Path, extra_args: list[str] | None = None,
                 startup_timeout_s: float = 60.0) -> None:
        self.engine = str(engine)
        self.log_dir = Path(log_dir)
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url: str | None = None
        self.starts = 0

    def start(self) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.engine).stem)
        log_path = self.log_dir / f"sim-server-{stem}-{self.starts}.log"
        cmd = [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", self.engine,
               "--host", "127.0.0.1", "--port", "0", *self.extra_args]
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1"}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            match = _LISTEN_RE.search(text)
            if match:
                self.base_url = match.group(1).rstrip("/")
                return self.base_url
            if self.process.poll() is not None:
                tail = " | ".join(text.strip().splitlines()[-3:])
                raise TargetError(f"sim server (engine {self.engine}) exited with code {self.process.returncode} at start: {tail}")
            time.sleep(0.05)
        self.stop()
        raise TargetError(f"sim server (engine {self.engine}) did not print its address within {self.startup_timeout_s:.0f} s")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); returns its exit code."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def restart(self) -> tuple[int | None, int | None]:
        old = self.pid
        self.stop()
        self.start()
        return old, self.pid


def _warmup(url: str, model: str | None, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None,
            api_key_env: str | None = None) -> list[str]:
    """Send the fixed warm-up set through the driver; returns what was done, as one action line."""
    if warmup_trace is None:
        return ["warm-up set empty (warmup.requests = 0): no requests sent"]
    if work_dir.exists():
        import shutil

        shutil.rmtree(work_dir)
    run_dir = run_driver(warmup_trace, url, work_dir, model=model, scenario_path=scenario_path,
                         state=StateResult("unknown", False, ["warm-up run"]), api_key_env=api_key_env)
    manifest = read_manifest(run_dir)
    counts = manifest.get("status_counts", {})
    total = sum(counts.values())
    return [f"warm-up: {total} requests from the cell's own trace (shared prefixes primed) at a fixed rate; "
            f"{counts.get('ok', 0)} ok (run dir {run_dir.name})"]


class SimServerTarget(CellTarget):
    """The simulated engine as a live server this process launched (restart = cold)."""

    kind = "sim"

    def __init__(self, engine: str | Path, work_dir: Path, extra_args: list[str] | None = None) -> None:
        from ..sim import load_engine_config

        self.engine_config = load_engine_config(engine)
        self.engine = str(engine)
        self.server = SimServerProcess(self.engine, Path(work_dir) / "server-logs", extra_args)
        self.server.start()
        self._fresh = True  # no request served since the (re)start

    @property
    def url(self) -> str | None:
        return self.server.base_url

    @property
    def model(self) -> str | None:
        return self.engine_config.model

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "engine": self.engine_config.name, "engine_sha256": self.engine_config.sha256,
                "engine_path": self.engine_config.source_path, "launched_by_loadgen": True}

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        actions: list[str] = []
        if state == "cold":
            old, new = self.server.restart()
            self._fresh = True
            return StateResult("cold", True, [f"sim server restarted (pid {old} → {new}): empty KV and prefix cache, "
                                              f"no warm-up sent"])
        if not self.server.alive():
            old, new = self.server.restart()
            actions.append(f"sim server was not running; restarted (pid {old} → {new})")
        actions += _warmup(self.server.base_url or "", self.model, warmup_trace, work_dir, scenario_path)
        self._fresh = False
        return StateResult("warm", True, actions)

    def run(self, trace_path: Path, out_dir: Path, *, scenario_path: Path | None, state: StateResult,
            order_index: int, repeat: int, plan_cell: dict[str, Any], deadline_s: float | None, seed: int) -> Path:
        return run_driver(
            trace_path, self.server.base_url or "", out_dir, model=self.model, scenario_path=scenario_path,
            state=state, order_index=order_index, repeat=repeat, plan_cell=plan_cell, deadline_s=deadline_s,
            extra_manifest={"plan_target": {**self.describe(), "server_pid": self.server.pid,
                                            "server_starts": self.server.starts}},
        )

    def check_alive(self) -> str | None:
        if self.server.process is not None and self.server.process.poll() is not None:
            return f"sim server process exited with code {self.server.process.returncode} during the cell"
        return None

    def recover(self) -> list[str]:
        old, new = self.server.restart()
        return [f"sim server restarted after a failure (pid {old} → {new})"]

    def close(self) -> None:
        self.server.stop()


class UrlTarget(CellTarget):
    """Any OpenAI-compatible endpoint the tool did not launch (cold cells are not achievable)."""

    kind = "url"

    def __init__(self, url: str, model: str | None = None, api_key_env: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise PlanError(f"--target {url!r}: expected an http:// or https:// URL")
        self._url = url.rstrip("/")
        self._model = model
        self.api_key_env = api_key_env

    @property
    def url(self) -> str | None:
        return self._url

    @property
    def model(self) -> str | None:
        return self._model

    def describe(self) -> dict[str, Any]:
        from ..driver import redact_url

        return {"kind": self.kind, "base_url": redact_url(self._url), "model": self._model, "launched_by_loadgen": False}

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "cold":
            return StateResult("cold", False, [], "not achievable: loadgen did not launch this target, so it cannot "
                                                   "restart it; launch it with --sim or the vLLM path for cold cells")
        return StateResult("warm", True, _warmup(self._url, self._model, warmup_trace, work_dir, scenario_path,
                                                 self.api_key_env))

    def run(self, trace_path: Path, out_dir: Path, *, scenario_path: Path | None, state: StateResult,
            order_index: int, repeat: int, plan_cell: dict[str, Any], deadline_s: float | None, seed: int) -> Path:
        return run_driver(trace_path, self._url, out_dir, model=self._model, scenario_path=scenario_path, state=state,
                          order_index=order_index, repeat=repeat, plan_cell=plan_cell, deadline_s=deadline_s,
                          api_key_env=self.api_key_env)


class VllmTarget(CellTarget):
    """A real vLLM server launched by loadgen (``loadgen.engines.vllm``): restartable, so cold is reachable."""

    kind = "vllm"

    def __init__(self, config: Any, work_dir: Path, *, model: str | None = None, tokenizer: str = "server") -> None:
        import dataclasses

        self._replace = dataclasses.replace
        self.config = config
        self.work_dir = Path(work_dir)
        self._model = model or config.served_model_name or str(config.model_dir)
        self.tokenizer = tokenizer
        self.starts = 0
        self.server: Any = None
        self._start()

    def _start(self) -> float:
        from ..engines.vllm import VllmServer

        self.starts += 1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cfg = self._replace(self.config, log_path=self.work_dir / f"vllm-{self.starts}.log")
        self.server = VllmServer(cfg).start()
        try:
            return self.server.wait_healthy()
        except BaseException:
            self.server.stop()
            raise

    def _restart(self) -> tuple[int | None, int | None, float]:
        old = self.server.proc.pid if self.server and self.server.proc else None
        if self.server is not None:
            self.server.stop()
        ready_s = self._start()
        return old, self.server.proc.pid, ready_s

    @property
    def url(self) -> str | None:
        return self.server.base_url if self.server else None

    @property
    def model(self) -> str | None:
        return self._model

    def describe(self) -> dict[str, Any]:
        import hashlib
        import json as _json

        raw = self.config.args(0)
        at = raw.index("--port")
        args = raw[:at] + raw[at + 2:]  # the port changes with every (re)start
        return {"kind": self.kind, "engine": f"vllm:{Path(self.config.model_dir).name}",
                "engine_sha256": hashlib.sha256(_json.dumps(args).encode()).hexdigest(), "args": args,
                "launched_by_loadgen": True}

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "cold":
            old, new, ready = self._restart()
            return StateResult("cold", True, [f"vLLM restarted (pid {old} → {new}), healthy after {ready:.1f} s: weights "
                                              "reloaded, graphs recompiled, KV and prefix cache empty; no warm-up sent"])
        actions: list[str] = []
        if self.server.proc is None or self.server.proc.poll() is not None:
            old, new, ready = self._restart()
            actions.append(f"vLLM was not running; restarted (pid {old} → {new}), healthy after {ready:.1f} s")
        actions += _warmup(self.server.base_url, self._model, warmup_trace, work_dir, scenario_path)
        return StateResult("warm", True, actions)

    def run(self, trace_path: Path, out_dir: Path, *, scenario_path: Path | None, state: StateResult,
            order_index: int, repeat: int, plan_cell: dict[str, Any], deadline_s: float | None, seed: int) -> Path:
        from ..driver import RunOptions
        from ..engines.vllm import run_with_server

        options = RunOptions(
            trace_path=trace_path, target_url=self.server.base_url, out_dir=out_dir, model=self._model,
            scenario_path=scenario_path, warm_state=state.label, warm_actions=state.actions, order_index=order_index,
            repeat=repeat, plan_cell=plan_cell, deadline_s=deadline_s, progress="off", tokenizer=self.tokenizer,
            extra_manifest={"plan_target": {**self.describe(), "server_pid": self.server.proc.pid,
                                            "server_starts": self.starts}},
        )
        return run_with_server(self.server, options)

    def check_alive(self) -> str | None:
        proc = self.server.proc if self.server else None
        if proc is not None and proc.poll() is not None:
            return f"vLLM exited with code {proc.returncode} during the cell (log {self.server.log_path})"
        return None

    def recover(self) -> list[str]:
        old, new, ready = self._restart()
        return [f"vLLM restarted after a failure (pid {old} → {new}), healthy after {ready:.1f} s"]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
