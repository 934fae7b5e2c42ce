"""The published result schemas: the checked-in files equal ``loadgen schema NAME``, their ids carry each
result's schema version, and every JSON the real CLI writes (analyze --json, compare, plan, sim validate,
practice) validates against them; a document with a key missing, a key added or a value of the wrong type
does not."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from result_schemas import SCHEMA_DIR, assert_valid, schema_errors

from loadgen.analysis import ANALYSIS_SCHEMA_VERSION
from loadgen.calibration.calibrate_result import CALIBRATION_SCHEMA_VERSION
from loadgen.calibration.fidelity import FIDELITY_SCHEMA_VERSION
from loadgen.calibration.offline_result import MEASURED_VALIDATION_SCHEMA_VERSION
from loadgen.cli.schema_cmd import RESULT_NAMES
from loadgen.contract.result import CONTRACT_DIFF_SCHEMA_VERSION, CONTRACT_SCHEMA_VERSION
from loadgen.handoff.findings import HANDOFF_EXPERIMENT_SCHEMA_VERSION, HANDOFF_FAILURE_SCHEMA_VERSION
from loadgen.handoff.observed_file import HANDOFF_OBSERVED_SCHEMA_VERSION
from loadgen.handoff.result import (
    HANDOFF_BUNDLE_SCHEMA_VERSION,
    HANDOFF_RERUN_SCHEMA_VERSION,
    HANDOFF_VERIFY_SCHEMA_VERSION,
)
from loadgen.handoff.workload_file import HANDOFF_WORKLOAD_SCHEMA_VERSION
from loadgen.ledger.result import LEDGER_SCHEMA_VERSION, RECONCILIATION_SCHEMA_VERSION
from loadgen.managed_result import MANAGED_COMPARISON_SCHEMA_VERSION
from loadgen.plan.results import COMPARISON_SCHEMA_VERSION, FLEET_SCHEMA_VERSION, REGION_SCHEMA_VERSION
from loadgen.plan.state import CELL_RESULT_SCHEMA_VERSION, PLAN_STATE_SCHEMA_VERSION
from loadgen.practice_result import PRACTICE_SCHEMA_VERSION
from loadgen.runs.catalog_result import RUN_LIST_SCHEMA_VERSION, RUN_SHOW_SCHEMA_VERSION
from loadgen.runs.diff_result import DIFF_SCHEMA_VERSION
from loadgen.targets import launch_sim_server
from loadgen.trace.stats_result import TRACE_STATS_SCHEMA_VERSION
from loadgen.vllm.result import VLLM_LOG_SCHEMA_VERSION, VLLM_SERVE_SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "canonical-burst.parquet"
VERSIONS = {
    "analysis": ANALYSIS_SCHEMA_VERSION,
    "decision": COMPARISON_SCHEMA_VERSION,
    "region": REGION_SCHEMA_VERSION,
    "fleet": FLEET_SCHEMA_VERSION,
    "plan-state": PLAN_STATE_SCHEMA_VERSION,
    "cell-result": CELL_RESULT_SCHEMA_VERSION,
    "fidelity": FIDELITY_SCHEMA_VERSION,
    "diff": DIFF_SCHEMA_VERSION,
    "managed": MANAGED_COMPARISON_SCHEMA_VERSION,
    "ledger": LEDGER_SCHEMA_VERSION,
    "reconciliation": RECONCILIATION_SCHEMA_VERSION,
    "trace-stats": TRACE_STATS_SCHEMA_VERSION,
    "runs-list": RUN_LIST_SCHEMA_VERSION,
    "runs-show": RUN_SHOW_SCHEMA_VERSION,
    "calibration": CALIBRATION_SCHEMA_VERSION,
    "handoff-build": HANDOFF_BUNDLE_SCHEMA_VERSION,
    "handoff-rerun": HANDOFF_RERUN_SCHEMA_VERSION,
    "handoff-verify": HANDOFF_VERIFY_SCHEMA_VERSION,
    "handoff-failure": HANDOFF_FAILURE_SCHEMA_VERSION,
    "handoff-experiment": HANDOFF_EXPERIMENT_SCHEMA_VERSION,
    "handoff-workload": HANDOFF_WORKLOAD_SCHEMA_VERSION,
    "handoff-observed": HANDOFF_OBSERVED_SCHEMA_VERSION,
    "practice": PRACTICE_SCHEMA_VERSION,
    "contract": CONTRACT_SCHEMA_VERSION,
    "validation-measured": MEASURED_VALIDATION_SCHEMA_VERSION,
    "contract-diff": CONTRACT_DIFF_SCHEMA_VERSION,
    "vllm-log": VLLM_LOG_SCHEMA_VERSION,
    "vllm-serve": VLLM_SERVE_SCHEMA_VERSION,
}


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def test_checked_in_schemas_equal_the_command_and_carry_the_version(tmp_path: Path) -> None:
    """A model change without `loadgen schema NAME --out docs/schema/NAME.schema.json` fails here."""
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json")) == sorted(f"{n}.schema.json" for n in RESULT_NAMES)
    for name in RESULT_NAMES:
        printed = _cli("schema", name).stdout
        assert printed == (SCHEMA_DIR / f"{name}.schema.json").read_text(), f"regenerate docs/schema/{name}.schema.json"
        schema = json.loads(printed)
        assert schema["$id"] == f"urn:loadgen:schema:{name}:v{VERSIONS[name]}"
        assert schema["x-loadgen-schema-version"] == str(VERSIONS[name])
        if schema.get("type") == "array":  # runs list --json: an array of rows, each closed
            row = schema["$defs"][schema["items"]["$ref"].rsplit("/", 1)[1]]
            assert row["additionalProperties"] is False and row["required"]
            continue
        # closed, and not vacuous: a required key, or (vllm-log: every key optional) at least one key
        assert schema["additionalProperties"] is False and (schema.get("required") or schema.get("minProperties"))
    _cli("schema", "region", "--out", str(tmp_path / "r.json"))
    assert (tmp_path / "r.json").read_text() == (SCHEMA_DIR / "region.schema.json").read_text()


def test_trace_stats_json_validates(tmp_path: Path) -> None:
    """`trace stats --json` through the real CLI, on the checked-in burst trace and on a trace too short for any
    index of dispersion (its iod figures null), conforms to `loadgen schema trace-stats`."""
    data = json.loads(_cli("trace", "stats", str(TRACE), "--json").stdout)
    assert_valid("trace-stats", data)
    assert data["kind"] == "loadgen.trace_stats" and data["stats"]["requests"] == data["metadata"]["requests"]
    scenario = (REPO / "scenarios" / "canonical.toml").read_text().replace("duration_s = 60", "duration_s = 1")
    (tmp_path / "s.toml").write_text(scenario.replace('cases = ["contract/canonical.toml"]', "cases = []"))
    _cli("trace", "generate", "s.toml", "--trace", "steady", "--out", "t.parquet", cwd=tmp_path)
    short = json.loads(_cli("trace", "stats", str(tmp_path / "t.parquet"), "--json").stdout)
    assert_valid("trace-stats", short)
    assert short["stats"]["iod"]["60s"] is None
    short["stats"]["classes"] = []
    assert any(e.startswith("stats/classes") for e in schema_errors("trace-stats", short))


def test_schema_refuses_an_unknown_result_in_one_line() -> None:
    res = subprocess.run([sys.executable, "-m", "loadgen", "schema", "manifest"], capture_output=True, text=True)
    assert res.returncode == 2 and "invalid choice: 'manifest'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow  # ~30 s: the whole worksheet pipeline, each output validated
def test_worksheet_pipeline_outputs_validate(tmp_path: Path) -> None:
    """sim run → analyze --json → compare --out / --json → plan (region.json, each cell's analysis, --json)."""
    runs = []
    for engine in ("interactive-small-batch", "throughput-large-batch"):
        run = tmp_path / engine
        _cli("sim", "run", str(TRACE), "--engine", engine, "--out", str(run))
        _cli("analyze", str(run), "--json", str(tmp_path / f"{engine}.json"), "--quiet")
        assert_valid("analysis", json.loads((tmp_path / f"{engine}.json").read_text()))
        runs.append(str(run))
    printed = _cli("compare", *runs, "--out", str(tmp_path / "decision.json"), "--json").stdout
    decision = json.loads((tmp_path / "decision.json").read_text())
    assert decision == json.loads(printed) and decision["candidates"][0]["tails"]
    assert_valid("decision", decision)
    plan = REPO / "scenarios" / "plans" / "quick.toml"
    printed = _cli(
        "plan", str(plan), "--sim-worksheet", "interactive-small-batch", "--out", str(tmp_path / "p"), "--json"
    )
    region = json.loads((tmp_path / "p" / "region.json").read_text())
    assert_valid("region", region)
    assert_valid("region", json.loads(printed.stdout))  # with engine_calibration
    cells = sorted((tmp_path / "p" / "cells").glob("*/rep*/analysis.json"))
    assert cells
    for path in cells:
        assert_valid("analysis", json.loads(path.read_text()))
    # a plan candidate's judgement (capacity, no tails) is the same schema
    _cli("plan", str(plan), "--sim-worksheet", "throughput-large-batch", "--out", str(tmp_path / "q"), "--quiet")
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "compare", str(tmp_path / "p"), str(tmp_path / "q"), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert res.returncode in (0, 4), res.stderr[-2000:]
    plans = json.loads(res.stdout)
    assert plans["candidates"][0]["kind"] == "plan" and "capacity" in plans["candidates"][0]
    assert_valid("decision", plans)
    # a [fleet] plan: its fleet.json, and its --json (the fleet, not a region), conform to the fleet schema
    printed = _cli(
        "plan", "fleet", "--sim-worksheet", "interactive-small-batch", "--out", str(tmp_path / "f"), "--json"
    )
    fleet = json.loads((tmp_path / "f" / "fleet.json").read_text())
    assert fleet == json.loads(printed.stdout) and fleet["lines"]
    assert_valid("fleet", fleet)
    _refused_when_broken(json.loads((tmp_path / f"{engine}.json").read_text()), decision, region)


def _refused_when_broken(analysis: dict, decision: dict, region: dict) -> None:
    """The schemas are not vacuous: a key gone, a key added, a type changed, each is an error."""
    del analysis["verdict"]
    assert any("'verdict' is a required property" in e for e in schema_errors("analysis", analysis))
    decision["candidates"][0]["surprise"] = 1
    assert any("surprise" in e for e in schema_errors("decision", decision))
    tails = decision["candidates"][0]["tails"]  # typed: a class's tails, its contract status
    next(iter(tails.values()))["ttft_ms"]["p99"] = "slow"
    decision["candidates"][0]["contract"]["status"] = "fine"
    errors = schema_errors("decision", decision)
    assert any(e.startswith("candidates/0/tails/") and "/ttft_ms/p99" in e for e in errors), errors
    assert any(e.startswith("candidates/0/contract/status") for e in errors), errors
    region["classes"]["short-message"]["warm"]["cells"][0]["concurrency"] = "eight"
    assert any(e.startswith("classes/short-message/warm/cells/0/concurrency") for e in schema_errors("region", region))


@pytest.mark.slow
def test_practice_and_sim_validate_outputs_validate(tmp_path: Path) -> None:
    """Both on live simulated engines on loopback: practice's decision.json (its comparison and decision) and
    sim validate's fidelity.json."""
    printed = _cli("practice", "--out", str(tmp_path / "practice"), "--window-s", "10", "--json").stdout
    practice = json.loads((tmp_path / "practice" / "decision.json").read_text())
    assert json.loads(printed) == practice
    assert_valid("practice", practice)  # the whole file: workload, ledgers, comparison, decision, owners
    assert_valid("decision", practice["comparison"])
    assert practice["decision"] == practice["comparison"]["decision"]
    with launch_sim_server("instant") as sim:
        printed = _cli(
            *("sim", "validate", "instant", "--target", sim.base_url, "--out", str(tmp_path / "val")),
            *("--duration-s", "5", "--json", str(tmp_path / "val.json")),
        ).stdout
    fidelity = json.loads((tmp_path / "val" / "fidelity.json").read_text())
    assert fidelity["rows"] and fidelity["warmup"]
    assert_valid("fidelity", fidelity)
    # --json FILE writes the same document there, and the table (not JSON) goes to stdout
    assert json.loads((tmp_path / "val.json").read_text()) == fidelity
    assert not printed.lstrip().startswith("{") and "canonical-burst" in printed


#: A name that says what its number counts: a unit, a share, an index, a level, or a count (n, n_*, *_count).
UNIT_NAME = re.compile(r"(_ms|_s|_ns|_rps|_tok_s|_pct|_points|_gib|_bytes|_share|_index|_level|_count)$|^n(_.*)?$")
#: Figures whose unit is given by another key of their object: each says so itself.
UNIT_ELSEWHERE = ("observed", "limit", "rate_step", "rate_steps", "max_inside_rate_step", "value")


def _numeric_properties(schema: dict) -> list[tuple[str, dict, str, dict]]:
    """(object name, object, property, property schema) for every numeric property of every object."""
    objects = [("(root)", schema), *schema.get("$defs", {}).items()]
    return [
        (name, obj, key, prop)
        for name, obj in objects
        for key, prop in (obj.get("properties") or {}).items()
        if re.search(r'"(number|integer)"', json.dumps(prop)) and '"$ref"' not in json.dumps(prop)
    ]


@pytest.mark.parametrize("name", RESULT_NAMES)
def test_every_figure_says_what_it_counts(name: str) -> None:
    """A number's unit is in its name, in its own description, or (a plain count such as `requests`) in its
    object's description; one whose unit another key gives (rate_kind, metric, basis) says so itself."""
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    silent = [
        f"{obj_name}.{key}"
        for obj_name, obj, key, prop in _numeric_properties(schema)
        if "description" not in prop
        and (
            key in UNIT_ELSEWHERE
            or not (UNIT_NAME.search(key) or "object" in json.dumps(prop) or obj.get("description"))
        )
    ]
    assert silent == [], f"{name}: figures that do not say what they count: {silent}"
