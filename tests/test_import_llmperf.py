"""Golden data from elsewhere: LLMPerf leaderboard records → run directory → analyze = published summary."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from shared_paths import TRACES

from loadgen.analysis import analyze_run
from loadgen.cli import main
from loadgen.rundir.foreign import import_llmperf, llmperf_error_kind
from loadgen.rundir.io import read_run_table
from loadgen.stats.percentiles import percentile
from loadgen.util.errors import RunDirError

RAW = TRACES / "benchmark_results" / "llmperf-leaderboard" / "raw_data"
FILES = sorted((RAW / "individual").glob("*.json")) if (RAW / "individual").is_dir() else []


def _need_data() -> None:
    if not FILES:
        pytest.skip(f"shared data not present: {RAW} (the repo's ../shared/traces is absent here)")


def _close(ours: float, published: float) -> bool:
    # instants are stored as integer ns: each duration is exact to 0.5 ns
    return math.isclose(ours, published, rel_tol=1e-9, abs_tol=2e-6)


@pytest.mark.parametrize("name", [p.name for p in FILES] or ["(no data)"])
def test_analyze_reproduces_published_quantiles_and_errors(tmp_path, name):
    _need_data()
    src = RAW / "individual" / name
    summary = json.loads((RAW / "summary" / name).read_text())
    out = tmp_path / "run"
    assert main(["import", "llmperf", str(src), "--out", str(out)]) == 0
    a = analyze_run(out)
    o = a.overall
    for metric, key in (("ttft_ms", "ttft_s"), ("e2e_ms", "end_to_end_latency_s")):
        s = o.metrics[metric]
        for q in ("p50", "p95", "p99"):
            assert _close(s[q], summary[f"results_{key}_quantiles_{q}"] * 1000), (metric, q, s[q])
        assert _close(s["mean"], summary[f"results_{key}_mean"] * 1000)
        assert _close(s["max"], summary[f"results_{key}_max"] * 1000)
    # the other published quantiles by the same rule, from the run directory's instants
    req = pq.read_table(out / "requests.parquet").to_pandas()
    ok = req[req.status == "ok"]
    ttft = ((ok.first_token_ns - ok.scheduled_ns) / 1e6).to_numpy()
    for q in (25, 75, 90):
        assert _close(percentile(ttft, q / 100), summary[f"results_ttft_s_quantiles_p{q}"] * 1000)
    # error counts: total, by code, and completed
    assert o.status_counts["error"] == summary["results_number_errors"]
    assert o.status_counts["ok"] == summary["results_num_completed_requests"]
    assert o.n_scheduled == summary["results_num_requests_started"]
    published: dict[str, int] = {}  # a Python-literal dict string, e.g. "{429.0: 130}"
    for code, n in ast.literal_eval(summary["results_error_code_frequency"]).items():
        kind = llmperf_error_kind(code)[0]
        published[kind] = published.get(kind, 0) + n
    assert o.error_kinds == published
    assert a.errored == (summary["results_error_rate"] > 0.01)


def test_synthesized_instants_are_declared_and_rates_flagged(tmp_path):
    _need_data()
    src = RAW / "individual" / "anyscale_13b.json"
    run = import_llmperf(src, tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run_kind"] == "imported" and manifest["synthesized"]["timing"] is True
    assert manifest["options"]["concurrency"] == 5  # from the matching summary
    assert manifest["source"]["sha256"] and manifest["modelExecuted"] is False
    assert "@" not in (manifest["target"]["base_url"] or "")
    a = analyze_run(run)
    assert a.rates_meaningful is False and not a.stability["applied"]
    assert "synthesized" in a.stability["reason"]
    assert a.overall.metrics["itl_ms"]["n"] == 0  # no chunks in the source: none invented
    assert read_run_table(run, "chunks.parquet") is None or read_run_table(run, "chunks.parquet").num_rows == 0
    # slot placement: never more than 5 requests in flight
    req = pq.read_table(run / "requests.parquet").to_pandas()
    t = np.sort(np.concatenate([req.scheduled_ns.to_numpy(), req.done_ns.to_numpy()]))
    inflight = [((req.scheduled_ns <= x) & (req.done_ns > x)).sum() for x in t]
    assert max(inflight) <= 5


def test_error_code_mapping():
    assert llmperf_error_kind(429) == ("http_429", 429)
    assert llmperf_error_kind(503.0) == ("http_5xx", 503)
    assert llmperf_error_kind(-100) == ("client", None)
    assert llmperf_error_kind("x") == ("client", None)


def test_bad_file_is_one_line_error(tmp_path):
    from loadgen.util.errors import RunDirError

    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(RunDirError, match="bad.json: expected a JSON list"):
        import_llmperf(bad, tmp_path / "run")
    bad.write_text('[{"ttft_s": 1}]')
    with pytest.raises(RunDirError, match="end_to_end_latency_s"):
        import_llmperf(bad, tmp_path / "run2")


@pytest.mark.parametrize(
    ("records", "said"),
    [
        ([{"ttft_s": "fast", "end_to_end_latency_s": 1}], "[0].ttft_s = 'fast': expected"),
        (
            [{"ttft_s": 0.1, "end_to_end_latency_s": 1}, {"ttft_s": True, "end_to_end_latency_s": 1}],
            "[1].ttft_s = True: expected a number, got the boolean true",
        ),
        ([{"ttft_s": 0.1, "end_to_end_latency_s": -1}], "[0].end_to_end_latency_s = -1: expected"),
        # the next two were imported, and analyze then refused the run (an instant beyond 2**53 ns, a first
        # token after the end): each is now refused at import, naming the record
        (
            [{"ttft_s": 0.1, "end_to_end_latency_s": 2e7}] * 2,
            "record 0 (individual-00000): done_ns = 20000000000000000: expected an instant within 2**53 ns",
        ),
        (
            [{"ttft_s": 5, "end_to_end_latency_s": 1}],
            "record 0 (individual-00000): done_ns = 1000000000 is before first_token_ns = 5000000000",
        ),
        ([{"ttft_s": 0.1, "end_to_end_latency_s": 1e300}], "[0].end_to_end_latency_s = 1e+300: expected"),
        ([{"ttft_s": 0.1, "end_to_end_latency_s": 1, "number_output_tokens": 10**30}], "[0].number_output_tokens"),
        ([{"ttft_s": 0.1, "end_to_end_latency_s": 1, "number_input_tokens": "ten"}], "[0].number_input_tokens"),
    ],
)
def test_a_broken_record_is_one_line_and_leaves_no_run(tmp_path, records, said):
    """A record with a wrong type was a traceback (ValueError) or read as a number; now one line, exit 2, no run."""
    src = tmp_path / "individual.json"
    src.write_text(json.dumps(records))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "import", "llmperf", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{src}: {said}" in proc.stderr
    assert not out.exists()


def test_a_broken_summary_beside_the_records_is_one_line(tmp_path):
    (tmp_path / "individual").mkdir()
    (tmp_path / "summary").mkdir()
    src = tmp_path / "individual" / "r.json"
    src.write_text(json.dumps([{"ttft_s": 0.1, "end_to_end_latency_s": 1}]))
    (tmp_path / "summary" / "r.json").write_text(json.dumps({"num_concurrent_requests": "many"}))
    with pytest.raises(RunDirError, match=r"summary/r.json: num_concurrent_requests = 'many': expected"):
        import_llmperf(src, tmp_path / "run")


@pytest.mark.parametrize("code", [1e300, "inf", -1e300, 10**30, 1000])
def test_an_error_code_beyond_any_http_status_is_a_client_error(tmp_path, code):
    """An error_code of 1e300 was an OverflowError traceback (kept as the HTTP status), "inf" another one."""
    assert llmperf_error_kind(code) == ("client", None)
    src = tmp_path / "individual.json"
    src.write_text(json.dumps([{"ttft_s": 0.1, "end_to_end_latency_s": 1, "error_code": code}]))
    a = analyze_run(import_llmperf(src, tmp_path / "run"))
    assert a.overall.error_kinds == {"client": 1}
