"""Candidate comparison: one-variable identity check, judgement order, the canonical comparison, prices."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.analysis.server_metrics import counter_increase
from loadgen.contract.checks import CheckOutcome, Observed
from loadgen.contract.replay import CaseResult, ContractResult, write_contract
from loadgen.plan import compare_candidates, format_comparison, load_prices
from loadgen.plan.compare import identity_differences, identity_of
from loadgen.plan.prices import Price, cost_per_million
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import MANIFEST_FILE, SERVER_METRICS_FILE, SERVER_METRICS_SCHEMA
from loadgen.util.errors import PlanError, ScenarioError

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "canonical.toml"
CANDIDATES = ("interactive-small-batch", "throughput-large-batch")


def burst_trace(tmp: Path) -> Path:
    shipped = REPO / "traces" / "canonical-burst.parquet"
    if shipped.is_file():
        return shipped
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    return generate_trace_file(load_scenario(SCENARIO), "burst", tmp / "canonical-burst.parquet")


@pytest.fixture(scope="module")
def worksheet_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both presets over the canonical burst trace in virtual time."""
    from loadgen.sim import run_worksheet

    tmp = tmp_path_factory.mktemp("compare")
    trace = burst_trace(tmp)
    return {name: run_worksheet(trace, name, tmp / name, scenario=SCENARIO) for name in CANDIDATES}


def test_canonical_comparison_rejects_the_large_batch_for_p99_ttft(worksheet_runs: dict[str, Path]) -> None:
    comp = compare_candidates(
        [worksheet_runs[n] for n in CANDIDATES], route="interactive", prices=REPO / "scenarios" / "prices.toml"
    )
    small, large = comp.candidates
    assert (small["label"], large["label"]) == CANDIDATES
    # one minute of trace holds 76 short messages: their p99 can be shown to fail, not yet to pass
    assert small["steps"][0]["result"] == "inconclusive" and small["verdict"] == "eligible"
    assert not small["breaches"] and any(
        "about 223 more requests of class short-message are needed" in w for w in small["steps"][0]["why"]
    )
    assert large["verdict"] == "rejected" and large["rejected_at"] == "hard budgets"
    p99_ttft = [b for b in large["breaches"] if b["metric"] == "ttft_ms" and b["percentile"] == "p99"]
    assert p99_ttft, large["breaches"]
    for breach in p99_ttft:  # each breach names class, percentile, measured value, interval, limit and sample count
        assert breach["class"] in large["route_classes"]
        assert breach["observed"] > breach["limit"] and breach["n"] > 0
        assert breach["outcome"] == "fail" and breach["ci"][0] > breach["limit"]  # conclusive: the whole interval above
    assert comp.decision.chosen == "interactive-small-batch"
    assert comp.decision.inconclusive[0].label == "interactive-small-batch"
    # the large batch completes more tokens per unit of engine time (the headline) and is rejected anyway
    assert large["throughput"]["output_tok_per_engine_busy_s"] > small["throughput"]["output_tok_per_engine_busy_s"]
    assert comp.decision.headline_throughput.label == "throughput-large-batch"
    assert large["cost"]["per_million_output_tokens"] < small["cost"]["per_million_output_tokens"]
    assert any(
        "throughput-large-batch rejected" in w and "headline throughput" in w and "ttft_ms p99" in w
        for w in comp.decision.why
    )
    # the numbers side by side: both candidates' throughput and tails are in the report
    for cand in comp.candidates:
        assert cand["throughput"]["output_tok_s"] > 0 and cand["throughput"]["completed_rps"] > 0
        assert cand["cost"]["per_million_output_tokens"] > 0 and cand["cost"]["example_prices"] is True
    text = format_comparison(comp)
    assert "interactive-small-batch" in text and "throughput-large-batch" in text
    assert "output tok/s" in text and "ttft_ms p99" in text and "EXAMPLE" in text
    assert "448 [318, inf] / 1,500 (n=76) ?" in text and "2,450 [2,427, inf] / 1,500 (n=76) ✗" in text
    # judgement order: behaviour is looked at after hard budgets, and said even when not evaluated
    assert [s["step"] for s in large["steps"]] == ["hard budgets", "behaviour contract"]
    assert small["contract"]["status"] in ("not_evaluated", "not_configured", "passed")
    data = json.loads(json.dumps(comp.to_dict(), default=str))
    assert data["judgement_order"] == ["hard budgets", "behaviour contract", "throughput and cost"]


def test_only_the_declared_variable_may_differ(worksheet_runs: dict[str, Path]) -> None:
    idents = [identity_of(read_manifest(worksheet_runs[n])) for n in CANDIDATES]
    covered, other = identity_differences(idents, "target.engine")
    assert covered and not other
    assert any(k.endswith("max_num_seqs") for k in covered)
    with pytest.raises(PlanError) as info:
        compare_candidates([worksheet_runs[n] for n in CANDIDATES], variable="options.max_concurrency")
    message = str(info.value)
    assert "\n" not in message and "more than the declared variable options.max_concurrency" in message
    assert "target.engine" in message


def test_a_refusal_shows_how_the_values_differ(worksheet_runs: dict[str, Path], tmp_path: Path) -> None:
    """A checkout modified between two candidates records ``<sha>-dirty`` on one: the refusal must show it (values
    were cut at 40 characters, so both read as the same sha)."""
    dirty = tmp_path / "dirty"
    shutil.copytree(worksheet_runs["throughput-large-batch"], dirty)
    manifest = json.loads((dirty / MANIFEST_FILE).read_text())
    sha = "0123456789abcdef0123456789abcdef01234567"
    manifest["harness"]["git_sha"] = sha + "-dirty"
    (dirty / MANIFEST_FILE).write_text(json.dumps(manifest))
    clean = tmp_path / "clean"
    shutil.copytree(worksheet_runs["interactive-small-batch"], clean)
    manifest = json.loads((clean / MANIFEST_FILE).read_text())
    manifest["harness"]["git_sha"] = sha
    (clean / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(PlanError) as info:
        compare_candidates([clean, dirty])
    assert f"harness.git_sha ({sha} vs {sha}-dirty)" in str(info.value)


def test_different_workloads_are_refused_unless_allowed(worksheet_runs: dict[str, Path], tmp_path: Path) -> None:
    from loadgen.sim import run_worksheet
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    other_trace = generate_trace_file(load_scenario(SCENARIO), "burst", tmp_path / "seed2.parquet", seed=2)
    other = run_worksheet(other_trace, "throughput-large-batch", tmp_path / "other", scenario=SCENARIO)
    with pytest.raises(PlanError, match=r"trace\.s"):
        compare_candidates([worksheet_runs["interactive-small-batch"], other])
    comp = compare_candidates([worksheet_runs["interactive-small-batch"], other], allow_differences=True)
    assert any("not one-variable" in n for n in comp.notes)


def test_candidates_of_one_engine_are_told_apart_by_their_directory(
    worksheet_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Two runs of one engine (say, against a local server and a managed stand-in) shared its label: the
    decision read "X is chosen ... X rejected", naming neither. Each now carries its directory."""
    large = worksheet_runs["throughput-large-batch"]
    small = tmp_path / "small"
    shutil.copytree(worksheet_runs["interactive-small-batch"], small)
    manifest = json.loads((small / MANIFEST_FILE).read_text())
    manifest["target"]["engine"]["config"]["name"] = "throughput-large-batch"  # the same label as `large`
    (small / MANIFEST_FILE).write_text(json.dumps(manifest))
    comp = compare_candidates([small, large], allow_differences=True)
    labels = [c["label"] for c in comp.candidates]
    assert labels == [f"throughput-large-batch ({small})", f"throughput-large-batch ({large})"]
    assert comp.decision.chosen == labels[0]
    assert [r.label for r in comp.decision.rejected] == [labels[1]]
    assert format_comparison(comp).count(f"{labels[1]} rejected") == 1


def test_contract_failure_rejects_before_cost(worksheet_runs: dict[str, Path], tmp_path: Path) -> None:
    small = tmp_path / "small"
    shutil.copytree(worksheet_runs["interactive-small-batch"], small)

    def case(case_id: str, passed: bool, got: str) -> CaseResult:
        check = CheckOutcome(kind="language", passed=passed, expected="fr", got=got)
        return CaseResult(case_id=case_id, passed=passed, checks=[check], settings={}, observed=Observed(text=got))

    # as `loadgen contract` writes it: two cases, lang-fr failed
    result = ContractResult(cases=[case("lang-fr", False, "en"), case("lang-fr-2", True, "fr")], target={})
    write_contract(result, small / "contract.json")
    comp = compare_candidates([small, worksheet_runs["throughput-large-batch"]])
    first = comp.candidates[0]
    assert first["steps"][0]["result"] == "inconclusive"  # no hard budget fails conclusively
    assert first["verdict"] == "rejected" and first["rejected_at"] == "behaviour contract"
    assert comp.decision.chosen is None


def test_compare_cli_json_and_refusal(worksheet_runs: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [str(worksheet_runs[n]) for n in CANDIDATES]
    ok = subprocess.run(
        [sys.executable, "-m", "loadgen", "compare", *runs, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["decision"]["chosen"] == "interactive-small-batch"
    bad = subprocess.run(
        [sys.executable, "-m", "loadgen", "compare", *runs, "--variable", "host"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "declared variable host" in bad.stderr


def test_plan_directories_compare_by_region(tmp_path: Path) -> None:
    from loadgen.plan import load_plan, run_plan
    from loadgen.targets import WorksheetTarget

    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'name = "cmp"\nscenario = "{SCENARIO}"\ntrace = "steady"\nduration_s = 10\nclasses = ["short-message"]\n'
        "concurrency = [64]\nrates_rps = [2, 8, 32]\nrepeats = 1\n[stops]\ncontract_every_cell = false\n"
    )
    spec = load_plan(plan)
    dirs = []
    for name in CANDIDATES:
        run_plan(spec, WorksheetTarget(name), tmp_path / name)
        dirs.append(tmp_path / name)
    comp = compare_candidates(dirs, route="short-message")
    by = {c["label"]: c for c in comp.candidates}
    assert set(by) == set(CANDIDATES)
    small = by["interactive-small-batch"]
    assert small["capacity"]["short-message"]["max_inside_offered_rps"] > 0
    # the decision names what it ranked by in a sentence that reads (it once said "the highest the inside cell")
    assert comp.decision.chosen == "interactive-small-batch"
    assert comp.decision.why[0].endswith("it has the highest output tokens/s of the best inside cell"), comp.decision
    # a region.json that is not the published region is refused in one line, never judged: one without its
    # classes was once "eligible" with no figure, and chosen
    region_file = dirs[0] / "region.json"
    region = json.loads(region_file.read_text())
    for damage, expected in (
        (lambda r: r.pop("classes"), "region.json: classes: missing; required"),
        (lambda r: r.update(version=2), "region.json: version = 2: expected 1"),
    ):
        broken = json.loads(json.dumps(region))
        damage(broken)
        region_file.write_text(json.dumps(broken))
        with pytest.raises(PlanError) as caught:
            compare_candidates(dirs, route="short-message")
        assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_price_table_and_cost_formula(tmp_path: Path) -> None:
    table = load_prices(REPO / "scenarios" / "prices.toml")
    assert table.example is True  # the shipped table says it is an example
    price = Price(usd_per_hour=3.6)
    cost = cost_per_million(price, prompt_tok_s=900.0, output_tok_s=100.0)
    assert math.isclose(cost["per_million_output_tokens"], 3.6 / 3600 / 100 * 1e6)
    assert math.isclose(cost["per_million_tokens"], 3.6 / 3600 / 1000 * 1e6)
    managed = cost_per_million(
        Price(usd_per_million_input_tokens=1.0, usd_per_million_output_tokens=4.0),
        prompt_tok_s=300.0,
        output_tok_s=100.0,
    )
    assert math.isclose(managed["per_million_tokens"], (1.0 * 300 + 4.0 * 100) / 400)
    bad = tmp_path / "prices.toml"
    bad.write_text("[candidates.x]\nusd_per_hour = -1\n")
    with pytest.raises(ScenarioError) as info:
        load_prices(bad)
    assert "\n" not in str(info.value) and "candidates.x.usd_per_hour" in str(info.value)


def test_engine_rate_counts_across_a_counter_reset(worksheet_runs: dict[str, Path], tmp_path: Path) -> None:
    """A server restarted mid-run drops its counters to zero: the compare path takes their increase per
    segment (the analysis' counter increase), not last − first."""
    run = tmp_path / "restarted"
    shutil.copytree(worksheet_runs["interactive-small-batch"], run)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest["engine_notes"].pop("output_tokens_per_busy_s")  # as a live server: busy time only from its counters
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    s = 1_000_000_000
    rows = [(t * s, "loadgen_sim_busy_seconds_total", float(t)) for t in range(5)]  # 4 s busy
    rows += [
        (t * s, "vllm:generation_tokens_total", float(v))  # restart after 200: 100 + 100 + 50 + 100
        for t, v in enumerate([0, 100, 200, 50, 150])
    ]
    table = pa.table(
        {
            "time_ns": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "labels": ["{}"] * len(rows),
            "value": [r[2] for r in rows],
        },
        schema=SERVER_METRICS_SCHEMA,
    )
    shutil.rmtree(run / SERVER_METRICS_FILE)  # replace the table (a directory of parts) with these samples
    pq.write_table(table, run / SERVER_METRICS_FILE)  # one plain file: the schema-1 layout, still read
    assert counter_increase(table, ("vllm:generation_tokens_total",)) == 350
    assert counter_increase(table.slice(0, 1), ("loadgen_sim_busy_seconds_total",)) is None  # one sample: no increase
    comp = compare_candidates([run, worksheet_runs["throughput-large-batch"]], route="interactive")
    restarted = next(c for c in comp.candidates if c["path"] == str(run))
    assert restarted["throughput"]["output_tok_per_engine_busy_s"] == pytest.approx(350 / 4)  # last − first: 150 / 4


def test_a_run_that_did_not_complete_is_unmeasured(worksheet_runs: dict[str, Path], tmp_path: Path) -> None:
    """A candidate whose run stopped before completing (here as the driver records a SIGTERM) applied part of its
    workload: it is neither chosen nor rejected on budgets, and the decision says why; it was judged and could be
    chosen like a complete one."""
    stopped = tmp_path / "stopped"
    shutil.copytree(worksheet_runs["interactive-small-batch"], stopped)
    manifest = json.loads((stopped / MANIFEST_FILE).read_text())
    scheduled = pq.read_table(stopped / "requests.parquet").num_rows
    manifest.update(
        state="interrupted", interrupted_by="SIGTERM", scheduled_requests=scheduled, requests_recorded=scheduled
    )
    (stopped / MANIFEST_FILE).write_text(json.dumps(manifest))
    comp = compare_candidates([stopped, worksheet_runs["throughput-large-batch"]], route="interactive")
    small, large = comp.candidates
    assert small["verdict"] == "unmeasured" and small["budgets"] == "unmeasured"
    assert small["steps"][0]["why"][0] == (
        f"the run did not complete (state interrupted by SIGTERM; {scheduled:,} of {scheduled:,} scheduled "
        "requests recorded): it did not apply the whole workload, so it is not judged against candidates that did; "
        "rerun it to completion"
    )
    assert large["verdict"] == "rejected" and comp.decision.chosen is None
    assert any(w.startswith("interactive-small-batch: unmeasured: the run did not complete") for w in comp.decision.why)


def test_a_paused_plan_is_unmeasured_until_resumed(tmp_path: Path) -> None:
    """A plan paused before a line's boundary was found (``--max-runs``) holds lower bounds, not a region: compare
    judges it unmeasured, naming the unfinished line; resumed to the end, it is judged by its region."""
    from loadgen.plan import load_plan, run_plan
    from loadgen.targets import WorksheetTarget

    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'name = "cmp"\nscenario = "{SCENARIO}"\ntrace = "steady"\nduration_s = 10\nclasses = ["short-message"]\n'
        "concurrency = [64]\nrates_rps = [2, 8, 32]\nrepeats = 2\n[stops]\ncontract_every_cell = false\n"
    )
    spec = load_plan(plan)
    dirs = [tmp_path / name for name in CANDIDATES]
    run_plan(spec, WorksheetTarget(CANDIDATES[0]), dirs[0], max_new_runs=1)
    run_plan(spec, WorksheetTarget(CANDIDATES[1]), dirs[1])
    paused = compare_candidates(dirs, route="short-message").candidates[0]
    assert paused["verdict"] == "unmeasured", paused["steps"][0]
    assert paused["steps"][0]["why"][0].startswith(
        "the plan did not finish: 1 line(s) unfinished (short-message warm c64), whose highest passing steps are "
        "lower bounds"
    )
    run_plan(spec, WorksheetTarget(CANDIDATES[0]), dirs[0])
    resumed = compare_candidates(dirs, route="short-message").candidates[0]
    assert resumed["verdict"] != "unmeasured" and resumed["capacity"]["short-message"]["max_inside_offered_rps"] > 0
