"""Load plan on the virtual-time worksheet: schema, the region boundary the engine config implies,
resume after an interruption, budgets, unstable tails and measurement corruption."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadgen.plan import (
    PLAN_FILE,
    RESULT_FILE,
    judge_run,
    load_plan,
    parse_plan,
    run_plan,
    unstable_tail,
)
from loadgen.plan.spec import StopLimits
from loadgen.targets import WorksheetTarget
from loadgen.util.errors import PlanError, ScenarioError

REPO = Path(__file__).resolve().parents[1]

# An engine whose capacity is known from its configuration: every step costs FIXED_MS whatever it holds,
# a request of OUTPUT tokens needs OUTPUT steps (prefill + first token in one, then one per token), and at
# most MAX_SEQS run at once. So at most min(MAX_SEQS, client concurrency) requests progress together and
# the throughput ceiling is min(MAX_SEQS, concurrency) / (OUTPUT × FIXED_MS) requests per second.
ENGINE = """
name = "boundary-test"
model = "loadgen-sim"
[scheduler]
max_num_seqs = {max_seqs}
max_num_batched_tokens = 4096
[kv]
num_kv_blocks = 16384
enable_prefix_caching = false
[cost]
fixed_ms = {fixed_ms}
per_prefill_token_ms = 0.0
per_decode_seq_ms = 0.0
per_kv_token_ms = 0.0
noise_sigma = {noise}
"""

SCENARIO = """
name = "boundary"
seed = 7
[classes.short-message]
share = 1.0
input_tokens = {{ dist = "fixed", value = 64 }}
output_tokens = {{ dist = "fixed", value = {output} }}
[classes.short-message.budgets]
ttft_ms = {{ p99 = {ttft_p99}, hard = true }}
itl_ms = {{ p99 = 100, hard = true }}
[errors]
ttft_timeout_s = 60
total_timeout_s = 120
[traces.steady]
process = "poisson"
rate_rps = 10
duration_s = 30
"""


def write_setup(
    tmp: Path,
    *,
    max_seqs: int = 16,
    fixed_ms: float = 10.0,
    output: int = 50,
    noise: float = 0.0,
    ttft_p99: float = 2000,
    rates: list[float],
    concurrency: list[int],
    repeats: int = 3,
    duration_s: float = 30,
    extra: str = "",
) -> tuple[Path, Path]:
    (tmp / "engine.toml").write_text(ENGINE.format(max_seqs=max_seqs, fixed_ms=fixed_ms, noise=noise))
    (tmp / "scenario.toml").write_text(SCENARIO.format(output=output, ttft_p99=ttft_p99))
    plan = (
        f'name = "boundary-plan"\nscenario = "scenario.toml"\ntrace = "steady"\nduration_s = {duration_s}\n'
        f'classes = ["short-message"]\nstates = ["warm"]\nconcurrency = {concurrency}\n'
        f"rates_rps = {[round(r, 6) for r in rates]}\nrepeats = {repeats}\n{extra}"
    )
    (tmp / "plan.toml").write_text(plan)
    return tmp / "plan.toml", tmp / "engine.toml"


def ceiling_rps(max_seqs: int, concurrency: int, output: int, fixed_ms: float) -> float:
    """Requests/s the engine can complete: running sequences × steps per second / steps per request."""
    return min(max_seqs, concurrency) * 1000.0 / (output * fixed_ms)


# ---- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "scenarios" / "plans").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_plans_validate(path: Path) -> None:
    spec = load_plan(path)
    assert spec.scenario_path().is_file()
    assert spec.rate_steps == sorted(spec.rate_steps)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"rate_scales": [1, 2], "rates_rps": [1]}, "exactly one of rate_scales or rates_rps"),
        ({"rates_rps": [2, 1]}, "strictly ascending"),
        ({"rates_rps": [1], "concurrency": [64, 8]}, "concurrency"),
        ({"rates_rps": [1], "classes": ["Chat/x"]}, "classes: 'Chat/x': expected a class name"),
        ({"rates_rps": [1], "repeats": 0}, "repeats"),
        ({"rates_rps": [1], "stops": {"send_lag_p99": 5}}, "stops.send_lag_p99"),
    ],
)
def test_plan_errors_are_one_line(data: dict, expected: str) -> None:
    base = {"name": "p", "scenario": "s.toml", "trace": "steady", **data}
    with pytest.raises(ScenarioError) as info:
        parse_plan(base, "p.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("p.toml:") and expected in message


# ---- the region lands where the engine configuration says ---------------------------------------


def test_region_boundary_matches_engine_ceiling(tmp_path: Path) -> None:
    max_seqs, fixed_ms, output = 16, 10.0, 50
    top = ceiling_rps(max_seqs, 10**6, output, fixed_ms)
    rates = [top * k for k in (0.3, 0.6, 0.85, 1.25, 1.7)]
    concurrency = [max_seqs // 2, max_seqs * 4]
    plan, engine = write_setup(
        tmp_path, max_seqs=max_seqs, fixed_ms=fixed_ms, output=output, rates=rates, concurrency=concurrency
    )
    result = run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")
    assert result.state["status"] == "complete"
    boundary = result.region["classes"]["short-message"]["warm"]["boundary"]
    for row in boundary:
        ceiling = ceiling_rps(max_seqs, row["concurrency"], output, fixed_ms)
        expected_inside = max(i for i, r in enumerate(rates) if r < 0.9 * ceiling)
        expected_outside = min(i for i, r in enumerate(rates) if r > 1.1 * ceiling)
        assert row["max_inside_rate_index"] == expected_inside, row
        assert row["first_outside_rate_index"] == expected_outside, row
        assert "ttft_ms p99" in row["limiting"], row
    cells = {c["cell_id"]: c for c in result.region["classes"]["short-message"]["warm"]["cells"]}
    for row in boundary:  # the boundary cells ran every repeat; offered vs completed are both reported
        inside = cells[f"short-message.warm.c{row['concurrency']}.r{row['max_inside_rate_index']}"]
        assert inside["repeats"] == 3 and inside["passes"] == 3
        outside = cells[f"short-message.warm.c{row['concurrency']}.r{row['first_outside_rate_index']}"]
        assert outside["status"] == "outside" and outside["offered_rps"] > outside["completed_rps"]
    manifest = json.loads((tmp_path / "out" / inside["run_dirs"][0] / "manifest.json").read_text())
    assert manifest["plan_cell"]["cell_id"] == inside["cell_id"] and manifest["repeat"] == 1
    assert isinstance(manifest["order_index"], int)
    assert (tmp_path / "out" / "region-short-message.png").stat().st_size > 5000
    assert "limiting constraint" in (tmp_path / "out" / "region.md").read_text()
    budget = result.region["budget"]
    assert budget["consumed_requests"] > 0 and budget["consumed_time_s"] > 0


# ---- resume -------------------------------------------------------------------------------------


def _statuses(region: dict) -> dict:
    return {
        c["cell_id"]: (c["status"], c["repeats"], c["passes"])
        for c in region["classes"]["short-message"]["warm"]["cells"]
    }


@pytest.mark.slow
def test_resume_after_interruption_skips_finished_runs(tmp_path: Path) -> None:
    top = ceiling_rps(16, 10**6, 50, 10.0)
    plan, engine = write_setup(
        tmp_path, rates=[top * k for k in (0.3, 0.6, 0.85, 1.25, 1.7)], concurrency=[8, 64], duration_s=15
    )
    spec = load_plan(plan)
    whole = run_plan(spec, WorksheetTarget(engine), tmp_path / "whole")
    part = run_plan(spec, WorksheetTarget(engine), tmp_path / "part", max_new_runs=3)
    assert part.state["status"] == "incomplete" and "paused" in part.state["ended"]
    done = {p: p.stat().st_mtime_ns for p in (tmp_path / "part" / "cells").glob(f"*/rep*/{RESULT_FILE}")}
    assert len(done) == 3
    resumed = run_plan(spec, WorksheetTarget(engine), tmp_path / "part")
    assert resumed.state["status"] == "complete"
    for path, mtime in done.items():  # finished runs were read back, not redone
        assert path.stat().st_mtime_ns == mtime
    assert resumed.state["invocations"][-1]["new_runs"] == whole.state["invocations"][-1]["new_runs"] - 3
    assert _statuses(resumed.region) == _statuses(whole.region)


def test_resume_refuses_a_different_plan(tmp_path: Path) -> None:
    plan, engine = write_setup(tmp_path, rates=[5, 10], concurrency=[8], duration_s=5, repeats=1)
    run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")
    plan.write_text(plan.read_text().replace("rates_rps = [5, 10]", "rates_rps = [5, 20]"))
    with pytest.raises(PlanError, match="expected the same plan file to resume"):
        run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")


def test_resume_refuses_a_changed_plan_or_scenario_naming_what_changed(tmp_path: Path) -> None:
    """A plan directory resumes only with the plan and the scenario its cells were judged against; the refusal is
    one line naming the changed settings (found by the capacity-region audit: a scenario whose p50 budget went from
    300 to 30 ms between invocations was resumed silently, and the region mixed cells judged under both)."""
    plan, engine = write_setup(tmp_path, rates=[5, 10, 20], concurrency=[8], duration_s=5, repeats=2)
    cmd = [sys.executable, "-m", "loadgen", "plan", str(plan), "--sim-worksheet", str(engine), "--quiet"]
    cmd += ["--out", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, cwd=REPO, timeout=300)

    assert run("--max-runs", "1").returncode == 3  # paused: incomplete
    done = sorted((tmp_path / "out").glob(f"cells/*/rep*/{RESULT_FILE}"))
    scenario = tmp_path / "scenario.toml"
    original = scenario.read_text()
    scenario.write_text(original.replace("ttft_ms = { p99 = 2000,", "ttft_ms = { p99 = 200,"))
    refused = run()
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "classes.short-message.budgets.ttft_ms.p99 2000.0 → 200.0" in refused.stderr
    assert "expected the same scenario to resume" in refused.stderr
    scenario.write_text(original)
    plan.write_text(plan.read_text().replace("repeats = 2", "repeats = 3"))
    refused = run()
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "changed repeats 2 → 3" in refused.stderr and "expected the same plan file" in refused.stderr
    assert sorted((tmp_path / "out").glob(f"cells/*/rep*/{RESULT_FILE}")) == done  # nothing ran meanwhile
    plan.write_text(plan.read_text().replace("repeats = 3", "repeats = 2"))
    assert run().returncode == 0


@pytest.mark.slow
def test_resume_after_sigint_of_the_real_command(tmp_path: Path) -> None:
    top = ceiling_rps(16, 10**6, 50, 10.0)
    plan, engine = write_setup(
        tmp_path, rates=[top * k for k in (0.2, 0.4, 0.6, 0.85, 1.25, 1.7)], concurrency=[4, 8, 16, 64], duration_s=20
    )
    cmd = [sys.executable, "-m", "loadgen", "plan", str(plan), "--sim-worksheet", str(engine), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "part")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((tmp_path / "part").glob(f"cells/*/rep*/{RESULT_FILE}"))) < 4:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-500:]
    state = json.loads((tmp_path / "part" / PLAN_FILE).read_text())
    assert state["status"] == "interrupted"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "part").glob(f"cells/*/rep*/{RESULT_FILE}")}
    out = subprocess.run(
        [*cmd, "--out", str(tmp_path / "part")], env=env, capture_output=True, cwd=REPO, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr.decode()[-500:]
    for path, mtime in before.items():
        assert path.stat().st_mtime_ns == mtime
    whole = subprocess.run(
        [*cmd, "--out", str(tmp_path / "whole")], env=env, capture_output=True, cwd=REPO, timeout=300, check=False
    )
    assert whole.returncode == 0
    load = lambda d: json.loads((tmp_path / d / "region.json").read_text())
    assert _statuses(load("part")) == _statuses(load("whole"))


@pytest.mark.parametrize("mode", ["grid", "bisect"])
def test_a_concurrency_search_writes_its_region_through_the_real_command(tmp_path: Path, mode: str) -> None:
    """``search.dimension = "concurrency"`` (documented in docs/plans.md) ends with a region whose cells and
    boundary agree with each rate line's answer, the fewest client slots meeting every budget (found by the
    capacity-region audit: the command died with a KeyError traceback building the region, since a concurrency line
    has no single concurrency; and a bisect skipped a row's cells, so its boundary said no rate step was held)."""
    quick = (REPO / "scenarios" / "plans" / "quick.toml").read_text()  # short-message, 1-16 rps
    plan = tmp_path / "plan.toml"
    plan.write_text(
        quick.replace('"../canonical.toml"', json.dumps(str(REPO / "scenarios" / "canonical.toml"))).replace(
            "concurrency = [8, 64]", "concurrency = [2, 4, 8, 16, 64]"
        )
        + f'[search]\ndimension = "concurrency"\nmode = "{mode}"\n'
    )
    engine = "interactive-small-batch"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "plan", str(plan), "--sim-worksheet", str(engine)]
        + ["--out", str(tmp_path / "out"), "--quiet", "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    region = json.loads(proc.stdout)
    cells = {c["cell_id"]: c for c in region["classes"]["short-message"]["warm"]["cells"]}
    lines = json.loads((tmp_path / "out" / PLAN_FILE).read_text())["lines"]
    assert [ln["rate_index"] for ln in lines] == [0, 1, 2, 3, 4]
    for ln in lines:  # the fewest slots that passed is inside, after every repeat; one fewer is not
        if ln.get("last_pass_concurrency") is not None:
            cell = cells[f"short-message.warm.c{ln['last_pass_concurrency']}.r{ln['rate_index']}"]
            assert cell["status"] == "inside" and cell["passes"] == cell["repeats"] == 2
        if ln.get("first_fail_concurrency") is not None:
            cell = cells[f"short-message.warm.c{ln['first_fail_concurrency']}.r{ln['rate_index']}"]
            assert cell["status"] != "inside"
    fewest = {ln["rate_index"]: ln.get("last_pass_concurrency") for ln in lines}
    assert len(set(fewest.values())) >= 2, fewest  # the answer changes with the rate
    for row in region["classes"]["short-message"]["warm"]["boundary"]:
        held = [i for i, slots in fewest.items() if slots is not None and slots <= row["concurrency"]]
        assert row["max_inside_rate_index"] == max(held, default=None), (row, fewest)


def test_a_line_the_plan_stopped_in_says_its_boundary_is_not_found(tmp_path: Path) -> None:
    """Paused before a line's boundary was found and repeated, the region says the highest step passed so far is a
    lower bound, not the boundary; resumed to the end, the line is done (found by the capacity-region audit: the
    shipped quick plan paused after 2 runs gave c8 a 'max inside step' of 4 rps, passed once of its 2 repeats,
    with no limiting constraint, as if it were the boundary)."""
    cmd = [sys.executable, "-m", "loadgen", "plan", "quick", "--sim-worksheet", "interactive-small-batch"]
    cmd += ["--out", str(tmp_path / "out"), "--quiet", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    paused = subprocess.run([*cmd, "--max-runs", "2"], env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert paused.returncode == 3, paused.stderr
    (row, *_) = json.loads(paused.stdout)["classes"]["short-message"]["warm"]["boundary"]
    assert row["concurrency"] == 8 and row["max_inside_rate_index"] is not None
    assert row["line_status"] == "unfinished" and row["limiting"].startswith("search not finished"), row
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    for row in json.loads(done.stdout)["classes"]["short-message"]["warm"]["boundary"]:
        assert row["line_status"] == "done" and not row["limiting"].startswith("search not finished"), row


RARE_SCENARIO = """
name = "rare"
seed = 7
[classes.common]
share = 0.995
input_tokens = { dist = "fixed", value = 64 }
output_tokens = { dist = "fixed", value = 20 }
[classes.common.budgets]
ttft_ms = { p50 = 2000, hard = true }
[classes.rare]
share = 0.005
input_tokens = { dist = "fixed", value = 64 }
output_tokens = { dist = "fixed", value = 20 }
[classes.rare.budgets]
ttft_ms = { p50 = 0.001, hard = true }
[errors]
error_rate_limit = 0.5
[traces.steady]
process = "poisson"
rate_rps = 2
duration_s = 10
"""


def test_a_mixed_cell_without_a_request_of_a_class_does_not_meet_its_budget(tmp_path: Path) -> None:
    """A mixed cell is inside only when every class's hard budgets were measured and met: a class with no request
    in the run (share 0.5% of 12 requests) is inconclusive there, never inside (found by the capacity-region audit:
    every cell was inside, the rare class's impossible budget included, from zero requests of it)."""
    (tmp_path / "rare.toml").write_text(RARE_SCENARIO)
    (tmp_path / "plan.toml").write_text(
        'name = "rare-mixed"\nscenario = "rare.toml"\ntrace = "steady"\nduration_s = 10\nclasses = ["mixed"]\n'
        "concurrency = [64]\nrates_rps = [1, 2, 4]\nrepeats = 2\n"
        '[start]\nmode = "lowest"\n[stops]\ncontract_every_cell = false\n[confidence]\nextend = false\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "plan", str(tmp_path / "plan.toml"), "--sim-worksheet"]
        + ["interactive-small-batch", "--out", str(tmp_path / "out"), "--quiet", "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    region = json.loads(proc.stdout)
    cells = [c for c in region["classes"]["mixed"]["warm"]["cells"] if c["repeats"]]
    assert cells and all(c["status"] == "inconclusive" for c in cells), [c["status"] for c in cells]
    for cell in cells:
        analysis = json.loads((tmp_path / "out" / cell["run_dirs"][0] / "analysis.json").read_text())
        assert analysis["classes"]["rare"]["n_scheduled"] == 0  # the budget was never measured ...
        assert cell["per_class"]["rare"]["status"] == "inconclusive"  # ... so it is not met
        assert "no request of the class" in cell["per_class"]["rare"]["limiting"]
        assert cell["per_class"]["common"]["status"] == "inside"
    assert region["classes"]["mixed"]["warm"]["boundary"][0]["max_inside_rate_index"] is None


# ---- budgets ------------------------------------------------------------------------------------


def test_request_budget_stops_the_plan_and_is_respected(tmp_path: Path) -> None:
    top = ceiling_rps(16, 10**6, 50, 10.0)
    plan, engine = write_setup(
        tmp_path,
        rates=[top * k for k in (0.3, 0.6, 0.85, 1.25)],
        concurrency=[64],
        duration_s=10,
        extra="[budget]\nrequests = 400\n",
    )
    result = run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")
    assert result.state["status"] == "incomplete"
    assert result.state["ended"].startswith("budget exhausted: request budget")
    assert 0 < result.state["budget"]["consumed_requests"] <= 400
    assert "Plan ended early" in (tmp_path / "out" / "region.md").read_text()


# ---- unstable tail (step-time noise injected, a tight convergence criterion) ----------------------


def test_unstable_tail_stops_the_direction(tmp_path: Path) -> None:
    top = ceiling_rps(16, 10**6, 50, 10.0)
    plan, engine = write_setup(
        tmp_path,
        noise=0.8,
        ttft_p99=600000,
        rates=[top * k for k in (0.5, 0.9)],
        concurrency=[64],
        duration_s=10,
        extra="[stops]\np99_spread = 0.02\n",
    )
    result = run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")
    cells = result.region["classes"]["short-message"]["warm"]["cells"]
    stopped = [c for c in cells if c["status"] == "stopped"]
    assert stopped and all(c["limiting"].startswith("stop unstable_tail") for c in stopped)
    assert all(c["repeats"] == 3 for c in stopped)  # judged across the repeats, not on one run


def test_unstable_tail_rule() -> None:
    assert unstable_tail([{"a": 100.0}, {"a": 104.0}, {"a": 98.0}], 0.1) is None
    stop = unstable_tail([{"a": 100.0}, {"a": 180.0}, {"a": 98.0}], 0.1)
    assert stop is not None and stop.kind == "unstable_tail" and "a p99 TTFT" in stop.detail
    assert unstable_tail([{"a": 100.0}], 0.1) is None  # one repeat says nothing about convergence
    assert unstable_tail([{"a": 5.0}, {"a": 12.0}], 0.5, floor_ms=50) is None  # jitter on a tiny p99 is not instability
    assert unstable_tail([{"a": 500.0}, {"a": 1200.0}], 0.5, floor_ms=50) is not None


# ---- measurement corruption: missing records -----------------------------------------------------


def test_missing_records_are_measurement_corruption(tmp_path: Path) -> None:
    from loadgen.analysis import analyze_run
    from loadgen.rundir.io import load_run
    from loadgen.sim import run_worksheet

    plan, engine = write_setup(tmp_path, rates=[10], concurrency=[64], duration_s=5, repeats=1)
    from loadgen.plan.cells import CellCoord, build_cell_trace
    from loadgen.workload.scenario import load_scenario

    spec = load_plan(plan)
    scenario = load_scenario(spec.scenario_path())
    trace, _ = build_cell_trace(
        spec, scenario, CellCoord("short-message", "warm", 64, 0, 10.0, "rps"), tmp_path / "t.parquet"
    )
    run_dir = run_worksheet(trace, engine, tmp_path / "run", scenario=spec.scenario_path())
    clean = judge_run(analyze_run(run_dir, scenario=scenario), load_run(run_dir), StopLimits())
    assert not clean.stops
    table = pq.read_table(run_dir / "requests.parquet")  # a directory of part files, read as one table
    shutil.rmtree(run_dir / "requests.parquet")
    pq.write_table(table.slice(0, table.num_rows - 5), run_dir / "requests.parquet")  # five rows lost
    judged = judge_run(analyze_run(run_dir, scenario=scenario), load_run(run_dir), StopLimits())
    kinds = {s.kind: s.detail for s in judged.stops}
    assert "records missing" in kinds["measurement_corruption"]


# ---- confidence: an inconclusive cell is extended until conclusive or its budget is spent -----------


def _one_cell(tmp_path: Path, extra: str = "") -> dict:
    top = ceiling_rps(16, 10**6, 50, 10.0)
    plan, engine = write_setup(tmp_path, rates=[top * 0.3], concurrency=[64], duration_s=10, repeats=1, extra=extra)
    result = run_plan(load_plan(plan), WorksheetTarget(engine), tmp_path / "out")
    return result.region["classes"]["short-message"]["warm"]["cells"][0]


def test_an_inconclusive_cell_is_extended_until_conclusive(tmp_path: Path) -> None:
    cell = _one_cell(tmp_path)  # 10 s at 9.6 rps: ~96 requests, too few for a p99 (299) or a 1% error share (381)
    record = json.loads((tmp_path / "out" / "cells" / cell["cell_id"] / "rep1" / RESULT_FILE).read_text())
    assert cell["status"] == "inside" and cell["extensions"] >= 1 and not record["inconclusive"]
    assert len(record["extensions"]) == 1 and record["extensions"][0]["inconclusive"] == 0
    assert record["base_run_dir"].endswith("rep1") and record["run_dir"].endswith("-ext1")
    assert record["requests_sent"] > 381 + 90  # the first run's requests and the longer run's both count
    base = json.loads((tmp_path / "out" / record["base_run_dir"] / "analysis.json").read_text())
    assert base["verdict"]["status"] == "inconclusive"  # what made it extend
    final = json.loads((tmp_path / "out" / record["run_dir"] / "analysis.json").read_text())
    assert final["verdict"]["status"] == "pass" and final["overall"]["n_scheduled"] >= 381


def test_an_inconclusive_cell_stops_when_its_budget_is_spent(tmp_path: Path) -> None:
    cell = _one_cell(tmp_path, "[confidence]\nmax_requests = 150\n")
    assert cell["status"] == "inconclusive" and cell["passes"] == 0
    assert "inconclusive after" in cell["limiting"] and "cell budget spent" in cell["limiting"]
    assert "more requests" in cell["limiting"]
    assert "?" in (tmp_path / "out" / "region.md").read_text()
    (tmp_path / "off").mkdir()
    off = _one_cell(tmp_path / "off", "[confidence]\nextend = false\n")
    assert off["status"] == "inconclusive" and off["extensions"] == 0 and "extension off" in off["limiting"]


# ---- boundary search: bisection finds the grid's boundary with far fewer cells ----------------------


def _search_plan(tmp: Path, mode: str) -> Path:
    plan, engine = write_setup(
        tmp,
        rates=[4, 64],
        concurrency=[64],
        duration_s=30,
        repeats=2,
        extra=f'[start]\nmode = "lowest"\n[search]\nmode = "{mode}"\nprecision = 0.05\n',
    )
    return plan


@pytest.mark.slow
def test_bisection_finds_the_grid_boundary_with_at_least_half_fewer_cells(tmp_path: Path) -> None:
    (tmp_path / "grid").mkdir()
    (tmp_path / "bisect").mkdir()
    engine = tmp_path / "grid" / "engine.toml"
    grid = run_plan(
        load_plan(_search_plan(tmp_path / "grid", "grid")), WorksheetTarget(engine), tmp_path / "grid" / "out"
    )
    plan = _search_plan(tmp_path / "bisect", "bisect")
    spec = load_plan(plan)
    assert len(spec.rate_steps) == 58 and spec.rate_steps[0] == 4 and spec.rate_steps[-1] == 64  # 5% apart
    bisect = run_plan(spec, WorksheetTarget(engine), tmp_path / "bisect" / "out")
    g_row = grid.region["classes"]["short-message"]["warm"]["boundary"][0]
    b_row = bisect.region["classes"]["short-message"]["warm"]["boundary"][0]
    ceiling = ceiling_rps(16, 64, 50, 10.0)  # 32 rps
    assert (
        0.6 * ceiling < spec.rate_steps[g_row["max_inside_rate_index"]] < 1.25 * ceiling
    )  # near the ceiling (30 s cells)
    assert abs(b_row["max_inside_rate_index"] - g_row["max_inside_rate_index"]) <= 1
    assert b_row["first_outside_rate_index"] == b_row["max_inside_rate_index"] + 1  # known to one step (5%)
    assert bisect.region["cells_used"] * 2 <= grid.region["cells_used"], (
        bisect.region["cells_used"],
        grid.region["cells_used"],
    )
    # the plan says which cells it used and why each was chosen
    whys = [p["why"] for p in bisect.state["probes"]]
    assert whys[0].startswith("start") and any(w.startswith("bracket") for w in whys)
    assert any(w.startswith("bisect") for w in whys) and any(w.startswith("boundary") for w in whys)
    text = (tmp_path / "bisect" / "out" / "region.md").read_text()
    assert "## Cells used, and why" in text and f"{bisect.region['cells_used']} cells" in text
    # resumable: paused after three runs and resumed, it ends with the same cells and boundary
    part = run_plan(spec, WorksheetTarget(engine), tmp_path / "part", max_new_runs=3)
    assert part.state["status"] == "incomplete"
    resumed = run_plan(spec, WorksheetTarget(engine), tmp_path / "part")
    assert _statuses(resumed.region) == _statuses(bisect.region)
    assert [p["cell_id"] for p in resumed.state["probes"]] == [p["cell_id"] for p in bisect.state["probes"]]
