"""Rerunning a bundle: verify it, replay its trace (against a URL or the bundled simulated engine),
analyse the new run and re-measure the checks that failed originally."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ..analysis import Analysis, Check, analyze_run
from ..driver import RunOptions, run_trace_sync
from ..errors import RunDirError
from ..scenario import load_scenario
from ..sim.worksheet import run_worksheet
from ..tomlfile import dumps_toml
from . import layout
from .experiment import find_key, set_dotted
from .verify import verify_bundle

__all__ = ["RerunResult", "rerun_bundle"]


@dataclass
class RerunResult:
    run_dir: Path
    reproduced: bool | None  # None: nothing had failed originally
    checks: list[dict[str, Any]]  # the original failing checks re-measured
    experiment_applied: dict[str, Any] | None


class _SimServer:
    """``loadgen sim serve`` as a subprocess on a free port (the bundled engine config)."""

    def __init__(self, engine_path: Path) -> None:
        self.engine_path = engine_path
        self.process: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> Self:
        cmd = [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", str(self.engine_path),
               "--host", "127.0.0.1", "--port", "0"]
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                        cwd=str(Path(__file__).resolve().parents[2]))
        assert self.process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base_url = m.group(1)
                # keep draining stdout so a chatty server never blocks on a full pipe
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return self
        self._stderr.seek(0)
        tail = self._stderr.read()[-300:].decode("utf-8", "replace")
        self.__exit__(None, None, None)
        raise RunDirError(f"{self.engine_path}: the simulated engine did not start ({' '.join(tail.split())}): "
                          "expected 'loadgen sim serve' to listen")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()
            self._stderr = None


def _replay_on_live_sim(engine_path: Path, replay: Callable[[str], Path]) -> Path:
    """Start the bundled engine's live server, replay against it, stop it (to move to the target layer)."""
    with _SimServer(engine_path) as server:
        return replay(server.base_url)


@dataclass(frozen=True)
class _Bundle:
    """The verified bundle's files that a rerun reads."""

    path: Path
    failure: dict[str, Any]
    proposal: dict[str, Any]
    identity: dict[str, Any]
    options: dict[str, Any]  # the original run's options (runtime.json)
    scenario: Path | None

    @classmethod
    def open(cls, bundle: Path) -> _Bundle:
        if not bundle.is_dir():
            raise RunDirError(f"{bundle}: not a directory: expected an unpacked handoff bundle (tar xzf it first)")
        result = verify_bundle(bundle)
        if not result.ok:
            raise RunDirError(f"{bundle}: bundle does not verify: {result.first_problem}")
        scenario = bundle / layout.SCENARIO

        def read(name: str) -> Any:
            return json.loads((bundle / name).read_text())

        return cls(bundle, read(layout.FAILURE), read(layout.EXPERIMENT), read(layout.IDENTITY),
                   (read(layout.RUNTIME).get("options") or {}) if (bundle / layout.RUNTIME).is_file() else {},
                   scenario if scenario.is_file() else None)


def _apply_experiment(engine_path: Path, proposal: dict[str, Any], out: Path) -> tuple[Path, dict[str, Any]]:
    """Write the engine config with the proposed change beside ``out``; returns its path and the change."""
    variable = str(proposal.get("variable") or "")
    config = tomllib.loads(engine_path.read_text())
    found = find_key(config, (variable.rsplit(".", 1)[-1],)) if variable else None
    if found is None:
        raise RunDirError(f"{layout.EXPERIMENT}: variable = {variable or None!r}: not an engine setting this command can apply")
    set_dotted(config, found[0], proposal["to"])
    exp_dir = out.parent / (out.name + ".engine")
    exp_dir.mkdir(parents=True, exist_ok=True)
    path = exp_dir / "engine-experiment.toml"
    path.write_text(dumps_toml(config, what=f"{path.name} (the proposed experiment applied)"))
    return path, {"variable": found[0], "from": found[1], "to": proposal["to"]}


def _replayer(b: _Bundle, out: Path, model: str | None, api_key_env: str | None,
              applied: dict[str, Any] | None) -> Callable[[str], Path]:
    """Replays the bundled trace against a base URL into ``out``."""
    def replay(url: str) -> Path:
        options = RunOptions(trace_path=b.path / layout.TRACE, target_url=url, out_dir=out,
                             model=model or (b.identity.get("package") or {}).get("model"),
                             scenario_path=b.scenario, api_key_env=api_key_env,
                             extra_manifest={"handoff": {"bundle": str(b.path), "experiment": applied}})
        return Path(run_trace_sync(options))
    return replay


def _rerun_simulated(b: _Bundle, out: Path, experiment: bool, model: str | None,
                     api_key_env: str | None) -> tuple[Path, dict[str, Any] | None]:
    """The bundled simulated engine: in virtual time for a worksheet run, else as a live server."""
    engine_path = b.path / layout.ENGINE
    if not engine_path.is_file():
        raise RunDirError(f"{b.path}: no {layout.ENGINE} (the run was not against the simulated engine): expected --target URL")
    applied = None
    if experiment:
        engine_path, applied = _apply_experiment(engine_path, b.proposal, out)
    if b.identity.get("run_kind") == "simulated" and b.options.get("face") == "worksheet":
        run_dir = run_worksheet(b.path / layout.TRACE, engine_path, out, seed=int(b.options.get("seed") or 0),
                                scenario=b.scenario)
        return Path(run_dir), applied
    return _replay_on_live_sim(engine_path, _replayer(b, out, model, api_key_env, applied)), applied


def _remeasure(failures: list[dict[str, Any]], analysis: Analysis) -> list[dict[str, Any]]:
    """Each originally failing check with its value, verdict and sample count in the new run."""
    by_key: dict[tuple[Any, ...], Check] = {(c.class_name, c.metric, c.percentile): c for c in analysis.checks}
    checks = []
    for f in failures:
        c = by_key.get((f.get("class"), f.get("metric"), f.get("percentile")))
        if c is None:
            checks.append({**f, "rerun_observed": None, "rerun_passed": None, "rerun_samples": None})
            continue
        obs = c.observed
        checks.append({**f, "rerun_observed": "inf" if isinstance(obs, float) and math.isinf(obs) else obs,
                       "rerun_passed": c.passed, "rerun_samples": c.n, "rerun_reason": c.reason})
    return checks


def rerun_bundle(bundle: str | Path, out: str | Path, *, target_url: str | None = None, model: str | None = None,
                 api_key_env: str | None = None, experiment: bool = False) -> RerunResult:
    """Verify the bundle, replay its trace (against ``target_url`` or the bundled simulated engine),
    analyse the new run and re-measure the originally failing checks."""
    b = _Bundle.open(Path(bundle))
    out = Path(out)
    applied = None
    if target_url is not None:
        if experiment:
            raise RunDirError("--experiment: applies only to the bundled simulated engine; "
                              "change the variable on the real engine and rerun with --target")
        run_dir = _replayer(b, out, model, api_key_env, None)(target_url)
    else:
        run_dir, applied = _rerun_simulated(b, out, experiment, model, api_key_env)
    analysis = analyze_run(run_dir, scenario=load_scenario(b.scenario) if b.scenario else None)
    checks = _remeasure(b.failure.get("failures", []), analysis)
    evaluated = [c for c in checks if c["rerun_passed"] is not None]
    reproduced = None if not b.failure.get("failures") else (any(not c["rerun_passed"] for c in evaluated) if evaluated else False)
    return RerunResult(Path(run_dir), reproduced, checks, applied)
