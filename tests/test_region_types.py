"""region.json is typed to its leaves: every field the plan writes (target, scenario, budget, start, ledger,
search, probes, each cell's warm state) has a model, so a reader of the published schema knows what each holds.
The region of every way a plan is built (a worksheet plan with a ledger, paused and resumed; a fleet plan with
replicas, searched along concurrency) validates against it, and a reader refuses a wrongly typed one in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from result_schemas import SCHEMA_DIR, assert_valid
from shared_paths import shared_trace

from loadgen.cli.schema_cmd import RESULT_NAMES
from loadgen.plan.results import RegionResult
from loadgen.targets import UrlTarget, VllmTarget, WorksheetTarget
from loadgen.targets.identity import TargetIdentity
from loadgen.vllm import VllmConfig

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "canonical.toml"
MODEL_CONFIG = REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json"

PLAN = f"""name = "typed"
scenario = "{SCENARIO}"
trace = "steady"
duration_s = 4
classes = ["short-message"]
concurrency = [8, 64]
rates_rps = [2, 16]
repeats = 1
[start]
model_config = "{MODEL_CONFIG}"
[search]
mode = "bisect"
[stops]
contract_every_cell = false
"""

FLEET = f"""name = "typed-fleet"
scenario = "{SCENARIO}"
trace = "steady"
duration_s = 4
classes = ["short-message"]
concurrency = [8, 64]
rates_rps = [4, 32]
repeats = 1
[search]
dimension = "concurrency"
[fleet]
replicas = [1, 2]
route_policy = "least-in-flight"
[stops]
contract_every_cell = false
"""


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )


def _untyped(schema: Any, where: str = "") -> list[str]:
    """Every place of a JSON Schema that accepts any value: an empty schema, or an object open to any value."""
    if not isinstance(schema, dict):
        return []
    found = []
    if not set(schema) - {"title", "description", "default"}:
        found.append(where or "(root)")
    if schema.get("additionalProperties") is True:
        found.append(where or "(root)")
    for key, sub in schema.items():
        if key in ("properties", "$defs"):
            found += [p for name, s in sub.items() for p in _untyped(s, f"{where}/{name}")]
        elif key in ("items", "additionalProperties"):
            found += _untyped(sub, f"{where}[]")
        elif key in ("anyOf", "oneOf", "allOf"):
            found += [p for s in sub for p in _untyped(s, where)]
    return found


#: The analysis's open places: a run's own sections as its manifest holds them (another tool's, an engine's keys).
ANALYSIS_OPEN = [
    "/RunInfo/synthesized",
    "/RunInfo/source",
    "/RunState/recovery",
    "/RunTarget/version",
    "/warm_cold",
    "/server",
    "/replicas",
]
#: The places of a published schema still open to any value, and why; every other place of every schema is typed.
STILL_OPEN = {
    "analysis": ANALYSIS_OPEN,
    "managed": ["/ServerMetrics/server_metrics"],  # the engine's own /metrics names
    "reconciliation": ["/engine_report"],  # what this log, /metrics or manifest happened to report
    "trace-stats": ["/metadata"],  # a trace file's metadata as written (another tool's keys for an import)
    "handoff-workload": ["/WorkloadTrace/metadata"],  # the same trace metadata, as the run's manifest recorded it
    "handoff-observed": ANALYSIS_OPEN,  # observed.json is the analysis (without its series): its open places
    "contract": ["/CaseResult/settings"],  # a behaviour case's request settings, passed to the target as given
    "vllm-log": ["/non_default_args"],  # vLLM's own argument names and values
    "vllm-serve": ["/VllmEngineNotes/non_default_args"],
}


@pytest.mark.parametrize("name", RESULT_NAMES)
def test_the_schema_types_every_field(name: str) -> None:
    """No field of a published schema accepts any value but those named in STILL_OPEN: the region's target,
    scenario, budget, start, ledger, search and probes once did (a cell's warm_state was a list of anything), the
    decision's GPUs and warm state, a plan directory's state files (plan.json and cell_result.json were untyped),
    practice's workload settings and every ledger line's factors."""
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    assert _untyped(schema) == STILL_OPEN.get(name, [])


def test_a_decision_types_the_gpus_of_an_imported_run(tmp_path: Path) -> None:
    """An imported run's hardware record (another tool's keys) is a candidate's GPU entry as it is, typed."""
    runs = []
    for name in ("RTX4090/Llama-3.1-8B", "RTXPRO6000/Llama-3.1-8B"):
        src = shared_trace(f"llmservingsim/bench/examples/{name}")
        runs.append(str(tmp_path / name.replace("/", "-")))
        assert _loadgen("import", "llmservingsim", str(src), "--out", runs[-1]).returncode == 0
    decided = _loadgen("compare", *runs, "--allow-differences", "--json")
    assert decided.returncode in (0, 4), decided.stderr[-2000:]
    decision = json.loads(decided.stdout)
    assert_valid("decision", decision)
    meta = json.loads((shared_trace("llmservingsim/bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json")).read_text())
    assert decision["candidates"][0]["context"]["hardware"]["gpus"] == [meta["hardware"]]
    assert decision["candidates"][0]["context"]["warm_state"]["state"] == "unknown"


def test_every_target_describes_itself_as_its_typed_identity(tmp_path: Path) -> None:
    """``describe()`` (a plan's target, a manifest's plan_target) is the published identity of its kind."""
    identity = TypeAdapter(TargetIdentity)
    url = UrlTarget("http://user:secret@127.0.0.1:9/v1", "m").describe()
    assert identity.validate_python(url).kind == "url" and "secret" not in json.dumps(url)
    one = WorksheetTarget("interactive-small-batch").describe()
    assert identity.validate_python(one).kind == "worksheet" and "replicas" not in one  # absent, not null
    two = WorksheetTarget("interactive-small-batch", 2, "least-in-flight").describe()
    assert identity.validate_python(two).model_dump(exclude_unset=True) == two and two["replicas"] == 2
    vllm = VllmTarget.__new__(VllmTarget)  # describe() alone: no server launched (it needs only the config)
    vllm.config = VllmConfig(tmp_path / "tiny-model", max_num_seqs=8, extra_args=["--enforce-eager"])
    described = identity.validate_python(vllm.describe())
    assert described.kind == "vllm" and "--port" not in described.args and described.engine == "vllm:tiny-model"


@pytest.mark.slow  # ~60 s: four plans through the real CLI
def test_every_way_a_plan_is_built_writes_a_region_the_schema_holds(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text(PLAN)
    (tmp_path / "fleet.toml").write_text(FLEET)
    out = tmp_path / "p"
    ws = ("--sim-worksheet", "interactive-small-batch", "--quiet", "--json")
    paused = _loadgen("plan", str(tmp_path / "plan.toml"), "--out", str(out), "--max-runs", "1", *ws)
    assert paused.returncode == 3, paused.stderr[-2000:]  # paused by the run limit: a probe without its result
    region = json.loads((out / "region.json").read_text())
    assert_valid("region", region)
    assert region["probes"][-1].keys() == {"cell_id", "repeat", "why"}
    resumed = _loadgen("plan", str(tmp_path / "plan.toml"), "--out", str(out), *ws)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for document in (json.loads((out / "region.json").read_text()), json.loads(resumed.stdout)):
        assert_valid("region", document)
        typed = RegionResult.model_validate(document)
        assert typed.target.kind == "worksheet" and typed.scenario.name == "canonical"
        assert typed.start is not None and set(typed.start.lines) == {"short-message.c8", "short-message.c64"}
        assert typed.ledger is not None and typed.ledger.model_config_path == str(MODEL_CONFIG)
        assert typed.search.mode == "bisect" and all(p.result for p in typed.probes)
        assert typed.budget is not None and typed.budget.consumed_requests > 0
        ran = [c for s in typed.classes.values() for r in s.values() for c in r.cells if c.repeats]
        assert ran and all(c.warm_state[0].state == "warm" for c in ran)
    fleet = tmp_path / "f"
    sized = _loadgen("plan", str(tmp_path / "fleet.toml"), "--out", str(fleet), *ws)
    assert sized.returncode == 0, sized.stderr[-2000:]
    for n in (1, 2):
        region = json.loads((fleet / f"replicas-{n}" / "region.json").read_text())
        assert_valid("region", region)
        typed = RegionResult.model_validate(region)
        assert typed.target.kind == "worksheet" and (typed.target.replicas or 1) == n
        assert typed.search.dimension == "concurrency" and typed.ledger is None
        assert typed.start is not None and typed.start.lines == {} and "concurrency" in typed.start.note


@pytest.mark.slow  # ~15 s: a plan, then its resume
def test_a_plan_resumed_from_runs_recorded_before_the_cold_method_still_writes_its_region(tmp_path: Path) -> None:
    """A cell result written before 2026-12-01 has a warm_state without ``method``; a resume rebuilds the region
    from it, and the writer's model (which validates every region it writes) takes it."""
    (tmp_path / "plan.toml").write_text(PLAN)
    out = tmp_path / "p"
    args = ("plan", str(tmp_path / "plan.toml"), "--out", str(out), "--sim-worksheet", "interactive-small-batch")
    assert _loadgen(*args, "--max-runs", "1").returncode == 3
    (marker,) = out.glob("cells/*/rep*/cell_result.json")
    old = json.loads(marker.read_text())
    del old["warm_state"]["method"]
    marker.write_text(json.dumps(old))
    resumed = _loadgen(*args, "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    region = json.loads((out / "region.json").read_text())
    assert_valid("region", region)
    cells = [c for s in region["classes"]["short-message"].values() for c in s["cells"]]
    assert any(c["warm_state"] and "method" not in c["warm_state"][0] for c in cells)


#: A wrong type in each typed field, and what the reader's one line says about it.
DAMAGES = [
    (lambda r: r["search"].pop("dimension"), "search.dimension: missing; required"),
    (
        lambda r: r["probes"][0].update(repeat="two"),
        "probes[0].repeat = 'two': expected input should be a valid integer",
    ),
    (lambda r: r["target"].update(engine=7), "target.worksheet.engine = 7: expected"),
    (lambda r: r["start"]["lines"]["short-message.c8"].update(start_index=None), "start_index = None: expected"),
    (
        lambda r: r["budget"].update(requests="many"),
        "budget.requests = 'many': expected input should be a valid integer",
    ),
]


@pytest.mark.slow  # ~40 s: a plan, then compare on it once per damage
def test_a_wrongly_typed_region_is_refused_in_one_line(tmp_path: Path) -> None:
    """The reader (``compare`` of a plan directory) refuses each in one line: file, field, value, what was
    expected; exit 2, no traceback, nothing judged."""
    (tmp_path / "plan.toml").write_text(PLAN)
    out = tmp_path / "p"
    ran = _loadgen("plan", str(tmp_path / "plan.toml"), "--out", str(out), "--sim-worksheet", "interactive-small-batch")
    assert ran.returncode == 0, ran.stderr[-2000:]
    path = out / "region.json"
    written = path.read_text()
    for damage, expected in DAMAGES:
        region = json.loads(written)
        damage(region)
        path.write_text(json.dumps(region))
        refused = _loadgen("compare", str(out), str(out), "--json")
        line = refused.stderr.strip()
        assert refused.returncode == 2 and refused.stdout == "", line
        assert "\n" not in line and "Traceback" not in line
        assert f"{path}: " in line and expected in line, line


def test_a_nested_value_of_an_imported_hardware_record_is_kept_as_its_json_text() -> None:
    """A GPU entry's values are scalars in the decision: a nested one (another tool's record may hold one) is
    its JSON text, so the decision is written, typed, instead of refused."""
    from loadgen.plan.compare import _gpus
    from loadgen.plan.results import ContextHardware

    gpus = _gpus([{"device_name": "X", "caps": {"sm": 89}, "count": 1}])
    assert gpus == [{"device_name": "X", "caps": '{"sm": 89}', "count": 1}]
    ContextHardware.model_validate({"cpu_model": None, "cpu_count": None, "gpus": gpus, "os": None})
    assert _gpus(None) is None
