"""The simulated engine as a target: the virtual-time worksheet, or a live server on loopback.

- ``WorksheetTarget``: ``loadgen.sim.run_worksheet`` in virtual time (fast, deterministic). Every
  run starts from the same empty engine, so "warm" holds by construction and "cold" is not a
  different state.
- ``SimServerProcess``: ``loadgen sim serve --port 0`` as a child process (``loadgen.util.childproc``),
  ready when it prints its ready line (``loadgen.sim.ready``); restartable.
- ``SimServerTarget``: that process as a plan/practice/bench target; cold = restart it, warm = the
  fixed warm-up set through the real driver.
- ``launch_sim_server``: the process as a context manager, for tests, benchmarks and handoff reruns.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
from loadgen.rundir.target_identity import SimServerPlanTarget
from loadgen.util.childproc import ChildProcess
from loadgen.util.pinning import engine_cpus
from loadgen.workload.routing import RoutePolicy

from ..driver.options import RunSettings
from ..sim import EngineConfig, load_engine_config, run_worksheet
from ..sim.ready import find_ready_url
from ..sim.worksheet import WORKSHEET_WARM_ACTION
from .base import RunRequest, StateResult, Target
from .identity import SimServerIdentity, WorksheetIdentity
from .replay import run_driver, warm_up

__all__ = ["SimServerHandle", "SimServerProcess", "SimServerTarget", "WorksheetTarget", "launch_sim_server"]

#: The directory that holds the running ``loadgen`` package: a child imports the same code.
_PACKAGE_ROOT = str(Path(loadgen.__file__).resolve().parents[1])


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class SimServerProcess:
    """``loadgen sim serve`` as a child process on loopback; restartable (that is how cold is reached)."""

    def __init__(
        self,
        engine: str | Path,
        log_dir: Path,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.engine = str(engine)
        self.log_dir = Path(log_dir)
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.child: ChildProcess | None = None
        self.base_url: str | None = None
        self.starts = 0

    def start(self) -> str:
        """Launch the server and wait for its ready line; returns its base URL."""
        self.starts += 1
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.engine).stem)
        argv = [
            sys.executable,
            "-m",
            "loadgen",
            "sim",
            "serve",
            "--engine",
            self.engine,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *self.extra_args,
        ]
        child = ChildProcess(
            argv,
            log_path=self.log_dir / f"sim-server-{stem}-{self.starts}.log",
            what=f"sim server (engine {self.engine})",
            env=_child_env(self.env),
            cpus=engine_cpus(),
        )
        self.child = child.start()
        self.base_url = child.wait_ready(lambda: find_ready_url(child.log_text()), self.startup_timeout_s)
        return self.base_url

    @property
    def process(self) -> Any:
        """The ``subprocess.Popen`` of the running server (None before start / after stop)."""
        return self.child.proc if self.child is not None else None

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def exit_code(self) -> int | None:
        """The exit code when the server has exited on its own, else None."""
        return self.child.returncode if self.child is not None else None

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); returns its exit code."""
        child, self.child = self.child, None
        return child.stop() if child is not None else None

    def restart(self) -> tuple[int | None, int | None]:
        old = self.pid
        self.stop()
        self.start()
        return old, self.pid

    def __enter__(self) -> SimServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SimServerHandle:
    """A running ``loadgen sim serve``: its URL, process and JSONL fault log."""

    base_url: str
    server: SimServerProcess
    fault_log_path: Path

    @property
    def process(self) -> Any:
        return self.server.process

    def fault_lines(self) -> list[dict[str, Any]]:
        """The fault log's entries so far."""
        if not self.fault_log_path.exists():
            return []
        return [json.loads(line) for line in self.fault_log_path.read_text().splitlines() if line.strip()]


@contextmanager
def launch_sim_server(
    engine: str | Path = "interactive-small-batch",
    *extra_args: str,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
    log_dir: Path | None = None,
) -> Iterator[SimServerHandle]:
    """Start ``loadgen sim serve --engine ENGINE --port 0 [extra_args]`` (fault log included); stop it on exit."""
    work = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="loadgen-sim-"))
    args = list(extra_args)
    if "--fault-log" in args:
        fault_log = Path(args[args.index("--fault-log") + 1])
    else:
        fault_log = work / "faults.jsonl"
        args += ["--fault-log", str(fault_log)]
    server = SimServerProcess(engine, work, args, startup_timeout_s=ready_timeout_s, env=env)
    with server:
        yield SimServerHandle(base_url=server.base_url or "", server=server, fault_log_path=fault_log)


class WorksheetTarget(Target):
    """The simulated engine in virtual time (``loadgen.sim.run_worksheet``)."""

    kind = "worksheet"
    real_time = False

    def __init__(
        self, engine: str | Path | EngineConfig, replicas: int = 1, route_policy: RoutePolicy = "round-robin"
    ) -> None:
        self.engine = engine if isinstance(engine, EngineConfig) else load_engine_config(engine)
        self.replicas = replicas  # > 1: a fleet of engines behind route_policy (loadgen.sim.worksheet)
        self.route_policy: RoutePolicy = route_policy

    def describe(self) -> dict[str, Any]:
        fleet: dict[str, Any] = (
            {"replicas": self.replicas, "route_policy": self.route_policy} if self.replicas > 1 else {}
        )
        return WorksheetIdentity(
            kind="worksheet",
            engine=self.engine.name,
            engine_sha256=self.engine.sha256,
            engine_path=self.engine.source_path,
            **fleet,
        ).document()

    @property
    def model(self) -> str | None:
        return self.engine.model

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "warm":
            return StateResult(
                "warm",
                True,
                [
                    "virtual-time worksheet: every run starts from the same fresh engine "
                    "(nothing to load or compile; prefix cache empty at t=0)"
                ],
            )
        return StateResult(
            "cold",
            False,
            [],
            "not achievable on the worksheet: a virtual engine has no load, compile "
            "or cache state to lose, so cold is the same run as warm",
        )

    def run(self, request: RunRequest) -> Path:
        labels = {
            "order_index": request.order_index,
            "repeat": request.repeat,
            "plan_cell": request.plan_cell,
            "warm_state": {**request.state.to_dict(), "actions": [WORKSHEET_WARM_ACTION, *request.state.actions]},
            **request.extra_manifest,
        }
        return Path(
            run_worksheet(
                request.trace_path,
                self.engine,
                request.out_dir,
                seed=request.seed,
                scenario=request.scenario_path,
                extra_manifest=labels,
                replicas=self.replicas,
                route_policy=self.route_policy,
            )
        )


class SimServerTarget(Target):
    """The simulated engine as a live server this process launched (restart = cold)."""

    kind = "sim"

    def __init__(
        self, engine: str | Path, work_dir: Path, extra_args: list[str] | None = None, api_key_env: str | None = None
    ) -> None:
        self.engine_config = load_engine_config(engine)
        self.engine = str(engine)
        self.api_key_env = api_key_env
        self.server = SimServerProcess(self.engine, Path(work_dir) / "server-logs", extra_args)
        self.server.start()

    @property
    def url(self) -> str | None:
        return self.server.base_url

    @property
    def model(self) -> str | None:
        return self.engine_config.model

    def describe(self) -> dict[str, Any]:
        return SimServerIdentity(
            kind="sim",
            engine=self.engine_config.name,
            engine_sha256=self.engine_config.sha256,
            engine_path=self.engine_config.source_path,
            launched_by_loadgen=True,
        ).document()

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "cold":
            old, new = self.server.restart()
            return StateResult(
                "cold",
                True,
                [f"sim server restarted (pid {old} → {new}): empty KV and prefix cache, no warm-up sent"],
                method="restart",
            )
        actions: list[str] = []
        if not self.server.alive():
            old, new = self.server.restart()
            actions.append(f"sim server was not running; restarted (pid {old} → {new})")
        actions += warm_up(
            self.server.base_url or "", self.model, warmup_trace, work_dir, scenario_path, self.api_key_env
        )
        return StateResult("warm", True, actions)

    def run(self, request: RunRequest) -> Path:
        sections = {
            "plan_target": SimServerPlanTarget.model_validate(
                {**self.describe(), "server_pid": self.server.pid, "server_starts": self.server.starts}
            ).document(),
            **request.extra_manifest,
        }
        return run_driver(
            request.trace_path,
            self.server.base_url or "",
            request.out_dir,
            model=self.model,
            scenario_path=request.scenario_path,
            state=request.state,
            extra_manifest=sections,
            settings=RunSettings(api_key_env=self.api_key_env).over(self.driver_options(request)),
        )

    def check_alive(self) -> str | None:
        code = self.server.exit_code()
        if code is not None:
            return f"sim server process exited with code {code} during the cell"
        return None

    def recover(self) -> list[str]:
        old, new = self.server.restart()
        return [f"sim server restarted after a failure (pid {old} → {new})"]

    def close(self) -> None:
        self.server.stop()
