"""The main job: canonical trace → open-loop run → analysis, against a target or the embedded simulator."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from loadgen.analysis import Analysis, analyze_run
from loadgen.driver.options import RunSettings
from loadgen.targets import RunRequest, StateResult, TargetSpec, open_target
from loadgen.trace.generate import generate_trace_file
from loadgen.util.errors import RunDirError
from loadgen.util.outputfile import make_output_dir
from loadgen.workload.presets import canonical_scenario
from loadgen.workload.scenario import load_scenario

__all__ = ["BenchResult", "run_bench", "DEFAULT_SCENARIO"]

DEFAULT_SCENARIO = canonical_scenario()


@dataclass
class BenchResult:
    run_dir: Path
    trace_path: Path
    analysis: Analysis


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
    scenario = load_scenario(scenario_path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(out_dir) if out_dir else Path("runs") / f"bench-{stamp}"
    make_output_dir(out_dir, "a directory for the bench run (--out)", RunDirError)
    trace_path = generate_trace_file(scenario, trace_name, out_dir / f"trace-{trace_name}.parquet", seed)
    spec = (
        TargetSpec(url=target_url, model=model or scenario.model, api_key_env=api_key_env)
        if target_url
        else TargetSpec(sim=engine)
    )
    settings = RunSettings(endpoint=endpoint) if endpoint else None
    with open_target(spec, out_dir) as target:
        run_dir = target.run(
            RunRequest(
                trace_path,
                out_dir / "run",
                StateResult("unknown", False),
                scenario_path=Path(scenario_path),
                settings=settings,
            )
        )
    return BenchResult(run_dir=run_dir, trace_path=trace_path, analysis=analyze_run(run_dir, scenario=scenario))
