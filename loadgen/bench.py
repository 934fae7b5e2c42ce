"""The main job: canonical trace → open-loop run → analysis, against a target or the embedded simulator."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .presets import canonical_scenario
from .scenario import load_scenario
from .trace.generate import generate_trace_file

__all__ = ["BenchResult", "run_bench", "DEFAULT_SCENARIO"]

DEFAULT_SCENARIO = canonical_scenario()


@dataclass
class BenchResult:
    run_dir: Path
    trace_path: Path
    analysis: Any  # loadgen.analysis.Analysis


def run_bench(
    *,
    scenario_path: Path = DEFAULT_SCENARIO,
    trace_name: str = "steady",
    seed: int | None = None,
    target_url: str | None = None,
    model: str | None = None,
    engine: str = "interactive-small-batch",
    out_dir: Path | None = None,
    api_key_env: str | None = None,
    endpoint: str | None = None,
) -> BenchResult:
    """Generate the scenario's trace, replay it, analyse it. Without a target, launch the simulator."""
    from .analysis import analyze_run
    from .driver import RunOptions, run_trace_sync

    scenario = load_scenario(scenario_path)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(out_dir) if out_dir else Path("runs") / f"bench-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = generate_trace_file(scenario, trace_name, out_dir / f"trace-{trace_name}.parquet", seed)
    run_dir = out_dir / "run"

    def replay(url: str) -> Path:
        options: dict[str, Any] = dict(
            trace_path=trace_path, target_url=url, model=model or scenario.model, out_dir=run_dir,
            scenario_path=Path(scenario_path), api_key_env=api_key_env,
        )
        if endpoint:
            options["endpoint"] = endpoint
        return run_trace_sync(RunOptions(**options))

    if target_url:
        run_trace_dir = replay(target_url)
    else:
        from .plan.targets import SimServerProcess

        server = SimServerProcess(engine, out_dir / "server-logs")
        try:
            run_trace_dir = replay(server.start())
        finally:
            server.stop()
    return BenchResult(run_dir=run_trace_dir, trace_path=trace_path, analysis=analyze_run(run_trace_dir, scenario=scenario))
