"""Degenerate run directories (one request, one scheduled instant, an instant engine), as `loadgen sim run` writes them: no
absurd figure, every rate that is not measured is null and says why, and compare does not rank on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_process import REPO, run_loadgen

from loadgen.analysis import analyze_run
from loadgen.analysis import metrics as M
from loadgen.analysis.budgets import budget_checks
from loadgen.analysis.whole_run import whole_run_rates
from loadgen.plan.compare import compare_candidates
from loadgen.rundir.schema import CHUNKS_FILE, REQUESTS_FILE, TRACE_SCHEMA
from loadgen.runs.catalog import Catalog
from loadgen.runs.diff import diff_runs
from loadgen.runs.pareto import format_pareto, pareto_points
from loadgen.runs.report import format_run
from loadgen.sim import run_worksheet
from loadgen.sim.config import PRESETS_DIR
from loadgen.trace.io import write_trace
from loadgen.util.errors import RunDirError
from loadgen.workload.scenario import Budget

CANONICAL = REPO / "scenarios" / "canonical.toml"


def _trace(path: Path, offsets_ns: list[int], cancel_after_tokens: int | None = None) -> Path:
    """A trace of short-message requests (canonical's class) scheduled at ``offsets_ns`` (each cancelled as
    planned after ``cancel_after_tokens`` tokens, when given)."""
    rows = [
        {
            "request_id": f"r{i}",
            "request_class": "short-message",
            "scheduled_offset_ns": t,
            "prompt_tokens": 100,
            "output_tokens": 20,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": cancel_after_tokens,
        }
        for i, t in enumerate(offsets_ns)
    ]
    meta = {"trace_name": path.stem, "seed": 0, "mode": "open", "max_in_flight": 256, "duration_s": 0.0}
    write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path, meta)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Worksheet runs (what `loadgen sim run` writes): one request, and two at one instant, on the instant
    engine (zero costs) and on a preset with costs."""
    tmp = tmp_path_factory.mktemp("degenerate")
    one, same = _trace(tmp / "one.parquet", [0]), _trace(tmp / "same.parquet", [0, 0])
    four = _trace(tmp / "four.parquet", [0, 100_000_000, 200_000_000, 300_000_000])
    failing = tmp / "failing.toml"  # the instant preset, every request answered with an HTTP error
    failing.write_text((PRESETS_DIR / "instant.toml").read_text().replace("error_rate = 0.0", "error_rate = 1.0"))
    made = {}
    for name, trace, engine in (
        ("one", one, "instant"),
        ("same-instant", same, "instant"),
        ("same-batch", same, "interactive-small-batch"),
        ("four", four, "instant"),
        ("four-failed", four, str(failing)),
        ("four-abandoned", _trace(tmp / "four-abandoned.parquet", [0, 10**8, 2 * 10**8, 3 * 10**8], 5), "instant"),
    ):
        made[name] = run_worksheet(trace, engine, tmp / name, scenario=CANONICAL)
    return made


def _analysis(run_dir: Path, window: str | None = None) -> dict:
    return analyze_run(run_dir, window=window).to_dict()


def test_the_rate_rule() -> None:
    assert M.unmeasurable_rate(2.0, 1) is not None  # one request: 1/latency
    assert M.unmeasurable_rate(1e-9, 5) is not None  # shorter than 1 ms
    assert M.unmeasurable_rate(float("nan")) is not None
    assert M.unmeasurable_rate(60.0) is None  # a user's window: one request in it is a rate
    assert M.rate_window_s(0.0005, 2) is None and M.rate_window_s(0.5, 2) == 0.5


def test_one_request_on_an_instant_engine_has_no_rate(runs: dict[str, Path]) -> None:
    """Was: window 1 ns, offered/completed 1,000,000,000 req/s and output 2e10 tok/s in the console and JSON."""
    doc = _analysis(runs["one"])
    overall = doc["overall"]
    for key in ("offered_rps", "send_rps", "completed_rps", "output_tok_s", "prompt_tok_s", "goodput_rps"):
        assert overall[key] is None, key
    assert "1 request(s)" in doc["window"]["rates_unmeasured"]
    assert any("rates not measured" in n for n in doc["notes"])
    assert overall["attainment"] == 1.0  # what is measured still is
    assert not doc["timeseries"]  # per-bin rates would be as absurd
    assert whole_run_rates(runs["one"])["completed_rps_whole_run"] is None


def test_one_instant_for_every_request_counts_every_completion(runs: dict[str, Path]) -> None:
    """Two requests at one instant: the window runs to the last done inclusive (was: the last completion fell on
    the half-open window's end and completed throughput read 0.00 req/s); on an instant engine that window is
    1 ns long, so no rate (was: 2,000,000,000 req/s)."""
    overall = _analysis(runs["same-batch"])["overall"]
    assert overall["offered_rps"] > 0 and overall["completed_rps"] == pytest.approx(overall["offered_rps"])
    doc = _analysis(runs["same-instant"])
    assert doc["overall"]["completed_rps"] is None and "shorter than 1 ms" in doc["window"]["rates_unmeasured"]


def test_a_users_window_is_held_to_the_minimum_only(runs: dict[str, Path]) -> None:
    doc = _analysis(runs["one"], "0:10")
    assert doc["overall"]["offered_rps"] == pytest.approx(0.1) and doc["window"]["rates_unmeasured"] is None
    assert _analysis(runs["one"], "0:0.0001")["overall"]["offered_rps"] is None


def test_compare_does_not_rank_an_unmeasured_rate(runs: dict[str, Path]) -> None:
    """Was: the instant engine's 4e10 tok/s over a 1 ns window made it the choice ('highest output tokens/s')."""
    comp = compare_candidates([runs["same-instant"], runs["same-batch"]], allow_differences=True).to_dict()
    decision = comp["decision"]
    assert decision["chosen"] == "interactive-small-batch"
    assert decision["headline_throughput"]["label"] == "interactive-small-batch"
    assert any(w.startswith("instant: not ranked on throughput") and "shorter than 1 ms" in w for w in decision["why"])
    instant = next(c for c in comp["candidates"] if c["label"] == "instant")
    assert instant["throughput"]["output_tok_s"] is None and instant["throughput"]["output_tok_s_whole_run"] is None


@pytest.mark.slow
def test_the_cli_says_why_there_is_no_rate(runs: dict[str, Path]) -> None:
    """`loadgen analyze` and `loadgen compare` as a user runs them: the reason in the console, no absurd figure."""
    proc = run_loadgen(["analyze", runs["one"]], REPO)
    assert proc.returncode == 0, proc.stderr
    assert "rates not measured" in proc.stdout and "1,000,000,000" not in proc.stdout
    proc = run_loadgen(["compare", runs["same-instant"], runs["same-batch"], "--allow-differences"], REPO)
    assert proc.returncode == 0, proc.stderr
    assert "instant: not ranked on throughput" in proc.stdout and "2,000,000,000" not in proc.stdout


def _edited(
    run_dir: Path, dst: Path, column: str, value: int, *, table_name: str = REQUESTS_FILE, row: int = 0
) -> Path:
    """A copy of ``run_dir`` whose ``row`` of ``table_name`` has ``column`` = ``value`` (real Parquet, edited)."""
    shutil.copytree(run_dir, dst)
    part = sorted((dst / table_name).glob("*.parquet"))[0]
    table = pq.read_table(part)
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type)), part)
    return dst


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("sent_ns", -5_000_000_000, "sent_ns = -5000000000 is before scheduled_ns"),  # was: a negative client queue
        ("client_output_tokens", -50, "client_output_tokens = -50: expected a count from 0"),  # was: silently summed
        ("server_output_tokens", 2**31 - 1, "server_output_tokens = 2147483647"),  # was: output 618,771,536 tok/s
        ("server_prompt_tokens", -10, "server_prompt_tokens = -10"),
    ],
)
def test_an_implausible_recorded_value_is_one_line(
    runs: dict[str, Path], tmp_path: Path, column: str, value: int, says: str
) -> None:
    run_dir = _edited(runs["same-batch"], tmp_path / "edited", column, value)
    with pytest.raises(RunDirError) as err:
        analyze_run(run_dir)
    line = str(err.value)
    assert "\n" not in line and str(run_dir / REQUESTS_FILE) in line and says in line and "request_id 'r0'" in line


def test_one_sample_budget_interval_reads_unbounded_below() -> None:
    """A p50 check over one sample: its interval is not bounded on either side. Was: '95% CI [inf, inf]' (an
    interval above every value, which reads as a certain failure); now '[-inf, inf]', as the tables show it."""
    (check,) = budget_checks("c", "ttft_ms", Budget(p50=300, hard=True), np.array([12.0]), 0, 1)
    assert check.outcome == "inconclusive" and "95% CI [-inf, inf]" in check.reason


def test_the_catalog_and_pareto_do_not_rank_an_unmeasured_rate(runs: dict[str, Path], tmp_path: Path) -> None:
    """Was: `runs pareto` put the instant engine's 2,000,000,000 req/s on the front and `runs show` printed
    1,000,000,000/s; now the rate is null ('-'), off the front, and both say what that means."""
    points = pareto_points([runs["same-instant"], runs["same-batch"]])
    by_dir = {Path(p.run_dir).name: p for p in points}
    assert by_dir["same-instant"].completed_rps is None and not by_dir["same-instant"].on_front
    assert by_dir["same-batch"].on_front
    assert "not on the front, not ranked" in format_pareto(points, "ttft_ms", "overall")
    with Catalog(tmp_path / "cat.duckdb") as cat:
        cat.index([runs["one"]])
        row = cat.find(str(runs["one"]))
        shown = format_run(row, cat.classes(row["path"]))
    assert "completed -/s" in shown and "1,000,000,000" not in shown and "not measured" in shown


def test_diff_says_when_the_candidate_failed_more(runs: dict[str, Path]) -> None:
    """Was: every candidate request failed and the diff read INCONCLUSIVE with no word of it (its rows compare
    latencies of requests that produced tokens); now a note per class counts the failures on each side."""
    result = diff_runs([runs["four"]], [runs["four-failed"]], allow_differences=True)
    assert any(n.startswith("short-message: 4 of 4 candidate request(s) failed vs 0 of 4 base") for n in result.notes)
    assert not any("candidate request(s) failed" in n for n in diff_runs([runs["four"]], [runs["four"]]).notes)


def test_the_diff_judges_the_error_share_and_planned_abandonments_are_no_failures(runs: dict[str, Path]) -> None:
    """Was: a candidate failing every request read INCONCLUSIVE (no latency sample on its side, only a note);
    now its error_share row regresses. Requests the scenario cancels after their first token (planned
    abandonments) are not failures, as in the analysis' error share: that row does not regress."""
    failed = diff_runs([runs["four"]], [runs["four-failed"]], allow_differences=True)
    [row] = [r for r in failed.rows if r.metric == "error_share"]
    assert (row.base, row.candidate, row.failed, row.n_base, row.n_candidate) == (0.0, 1.0, [0, 4], 4, 4)
    assert row.verdict == "regressed" and failed.verdict == "regressed"
    assert row.interval is not None and row.interval[0] > 0.01  # Newcombe from Wilson(0/4) and Wilson(4/4)
    abandoned = diff_runs([runs["four"]], [runs["four-abandoned"]], allow_differences=True)
    assert analyze_run(runs["four-abandoned"]).error_share == 0.0
    [row] = [r for r in abandoned.rows if r.metric == "error_share"]
    assert (row.candidate, row.failed) == (0.0, [0, 0]) and row.verdict != "regressed"


def test_implausible_chunks_are_counted_in_a_note(runs: dict[str, Path], tmp_path: Path) -> None:
    """Was: a chunk that arrived before its request's previous one had its gap silently clamped to 0, and a chunk
    with a negative token count silently dropped; now each is analysed the same way and counted in a note."""
    chunks = pq.read_table(sorted((runs["four"] / CHUNKS_FILE).glob("*.parquet"))[0])
    early = chunks.column("arrival_ns")[1].as_py() - 1_000_000
    run_dir = _edited(runs["four"], tmp_path / "back", "arrival_ns", early, table_name=CHUNKS_FILE, row=3)
    notes = analyze_run(run_dir).notes
    assert any(n.startswith("1 content chunk(s) arrived before the previous chunk of their request") for n in notes)
    run_dir = _edited(runs["four"], tmp_path / "neg", "tokens", -7, table_name=CHUNKS_FILE, row=3)
    assert any(n.startswith("1 chunk row(s) with a negative token count") for n in analyze_run(run_dir).notes)
    assert not any("chunk" in n for n in analyze_run(runs["four"]).notes)


def _emptied(run_dir: Path, dst: Path) -> Path:
    """A copy of ``run_dir`` with no request and no chunk row (and a manifest that recorded none)."""
    shutil.copytree(run_dir, dst)
    for name in (REQUESTS_FILE, CHUNKS_FILE):
        for part in (dst / name).glob("*.parquet"):
            pq.write_table(pq.read_table(part).slice(0, 0), part)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["requests_recorded"] = 0
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_a_run_without_requests_is_unmeasured_in_compare(runs: dict[str, Path], tmp_path: Path) -> None:
    """Was: a run with no request was eligible, 'meets every hard budget of ,' (no class), and could be chosen;
    now its budgets step is unmeasured: nothing to judge."""
    empty = _emptied(runs["one"], tmp_path / "empty")
    doc = analyze_run(empty).to_dict()
    assert doc["overall"]["n_scheduled"] == 0 and doc["overall"]["offered_rps"] is None
    comp = compare_candidates([empty, runs["one"]]).to_dict()
    judged = {c["path"]: c for c in comp["candidates"]}
    assert judged[str(empty)]["verdict"] == "unmeasured"
    assert "nothing to judge" in judged[str(empty)]["steps"][0]["why"][0]
    assert comp["decision"]["chosen_path"] == str(runs["one"])


def test_samples_at_one_instant_are_one_gauge_reading(runs: dict[str, Path]) -> None:
    """The instant engine's zero-length steps write many samples of one label set at one instant. Was: they were
    summed as if each were another label set, so one request showed 'running max 20'; now running max is 1."""
    server = analyze_run(runs["one"]).server or {}
    assert server["running"]["max"] == 1.0


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_instant_names_its_column(runs: dict[str, Path], tmp_path: Path, value: float) -> None:
    """A foreign writer's float instants with NaN/inf: one line naming the file and now the column (was: only
    'a column of the wrong type (Float value nan was truncated ...)', no column)."""
    dst = tmp_path / "foreign"
    shutil.copytree(runs["four"], dst)
    part = sorted((dst / REQUESTS_FILE).glob("*.parquet"))[0]
    table = pq.read_table(part)
    done = [float(v) for v in table.column("done_ns").to_pylist()]
    done[0] = value
    i = table.schema.get_field_index("done_ns")
    pq.write_table(table.set_column(i, pa.field("done_ns", pa.float64()), pa.array(done, pa.float64())), part)
    with pytest.raises(RunDirError) as err:
        analyze_run(dst)
    assert f"{part}: done_ns: a column of the wrong type" in str(err.value)
