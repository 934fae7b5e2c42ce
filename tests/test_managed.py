"""Managed-API comparator: the same trace against a local simulated engine and against the simulated
engine configured as a rate-limited managed API (quota → 429 + Retry-After, model id and
system_fingerprint that change, API key from an environment variable), then the side-by-side report.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadgen.managed import UNKNOWN_INTERNALS, compare_managed, load_price_table
from loadgen.targets import launch_sim_server as start_sim_server
from loadgen.util.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "LOADGEN_TEST_MANAGED_KEY"
SECRET = "sk-managed-TEST-4f1c2b9a7e"
RPM = 8

MANAGED_ENGINE = f"""
[managed]
requests_per_minute = {RPM}
response_models = ["gpt-sim-2026-01-15", "gpt-sim-2026-02-01"]
system_fingerprints = ["fp_aaa111", "fp_bbb222"]
change_after_requests = 4
api_key_env = "{KEY_ENV}"
"""

PRICES = """
currency = "USD"
[candidates.gpt-sim]
usd_per_million_input_tokens = 0.50
usd_per_million_output_tokens = 2.00
[candidates.interactive-small-batch]
usd_per_hour = 3.60
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    from loadgen.driver import RunOptions, run_trace_sync
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    tmp = tmp_path_factory.mktemp("managed")
    text = (ROOT / "scenarios" / "canonical.toml").read_text().replace("duration_s = 60", "duration_s = 5")
    text = text.replace('cases = ["contract/canonical.toml"]', "cases = []")
    (tmp / "scenario.toml").write_text(text)
    trace = generate_trace_file(load_scenario(tmp / "scenario.toml"), "steady", tmp / "steady.parquet", 11)
    base = (ROOT / "scenarios" / "engines" / "instant.toml").read_text()
    engine = tmp / "managed-api.toml"
    engine.write_text(base.replace('name = "instant"', 'name = "managed-api"', 1) + MANAGED_ENGINE)
    import os

    os.environ[KEY_ENV] = SECRET
    try:
        common = dict(trace_path=trace, scenario_path=tmp / "scenario.toml", progress="off")
        with start_sim_server("interactive-small-batch") as local:
            local_run = run_trace_sync(RunOptions(target_url=local.base_url, out_dir=tmp / "local", **common))
        with start_sim_server(str(engine), env={KEY_ENV: SECRET}) as managed:
            managed_run = run_trace_sync(
                RunOptions(
                    target_url=managed.base_url,
                    out_dir=tmp / "managed",
                    api_key_env=KEY_ENV,
                    vllm_extensions="off",
                    rate_limit_rps=50.0,
                    **common,
                )
            )
        (tmp / "prices.toml").write_text(PRICES)
        comparison = compare_managed(local_run, managed_run, prices=tmp / "prices.toml")
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from loadgen.cli import managed_cmd; import argparse;"
                "p = argparse.ArgumentParser(); s = p.add_subparsers(required=True); managed_cmd.register(s);"
                "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))",
                "managed",
                "compare",
                str(local_run),
                str(managed_run),
                "--prices",
                str(tmp / "prices.toml"),
                "--out",
                str(tmp / "report.md"),
                "--json",
                str(tmp / "report.json"),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    finally:
        os.environ.pop(KEY_ENV, None)
    return tmp, Path(local_run), Path(managed_run), comparison, out


@pytest.mark.slow  # shares a ~15 s fixture: two 5 s runs against live simulated servers
def test_quota_rejections_are_recorded_with_retry_after(runs) -> None:
    _, _, managed_run, comparison, _ = runs
    table = pq.read_table(managed_run / "requests.parquet").to_pylist()
    n_429 = sum(1 for r in table if r["http_status"] == 429)
    assert n_429 == len(table) - RPM > 0  # the sim's quota admits RPM requests per minute, the rest get 429
    q = comparison.managed["quotas"]
    assert q["http_429"] == n_429
    ra = [r["retry_after_s"] for r in table if r["http_status"] == 429]
    assert q["retry_after_s"]["n"] == len(ra) and q["retry_after_s"]["max"] == pytest.approx(max(ra))
    assert 0 < q["retry_after_s"]["min"] <= 60
    assert q["client_rate_limit_rps"] == 50.0
    assert comparison.managed["errors"]["error_kinds"].get("http_429") == n_429
    assert comparison.local["quotas"]["http_429"] == 0
    assert any("429" in w for w in comparison.warnings)


@pytest.mark.slow  # shares a ~15 s fixture: two 5 s runs against live simulated servers
def test_change_controls_track_model_and_fingerprint_changes(runs) -> None:
    _, _, managed_run, comparison, _ = runs
    cc = comparison.managed["change_controls"]
    served = [r for r in pq.read_table(managed_run / "requests.parquet").to_pylist() if r["response_model"]]
    assert len(served) == RPM
    assert cc["response_model"]["distinct"] == 2 and cc["system_fingerprint"]["distinct"] == 2
    assert [c["to"] for c in cc["response_model"]["changes"]] == ["gpt-sim-2026-02-01"]
    assert cc["model_differs_from_requested"] == ["gpt-sim-2026-01-15", "gpt-sim-2026-02-01"]
    assert sum(v["count"] for v in cc["response_model"]["values"]) == len(served)
    assert any("response model id changed" in s for s in cc["signals"])
    assert comparison.local["change_controls"]["signals"] == []


@pytest.mark.slow  # shares a ~15 s fixture: two 5 s runs against live simulated servers
def test_cost_from_price_table(runs) -> None:
    _, local_run, managed_run, comparison, _ = runs
    rows = [
        r for r in pq.read_table(managed_run / "requests.parquet").to_pylist() if r["server_output_tokens"] is not None
    ]
    expected = sum(r["server_prompt_tokens"] * 0.5 + r["server_output_tokens"] * 2.0 for r in rows) / 1e6
    cost = comparison.managed["cost"]
    assert cost["complete"] and cost["total"] == pytest.approx(expected)
    assert cost["billed_requests"] == len(rows) == RPM
    assert set(e["price_entry"] for e in cost["per_model"].values()) == {"gpt-sim"}
    manifest = json.loads((local_run / "manifest.json").read_text())
    assert comparison.local["cost"]["total"] == pytest.approx(3.6 * manifest["duration_s"] / 3600)


@pytest.mark.slow  # shares a ~15 s fixture: two 5 s runs against live simulated servers
def test_side_by_side_report_states_unknown_internals(runs) -> None:
    tmp, _, _, comparison, out = runs
    assert out.returncode == 0, out.stderr
    report = (tmp / "report.md").read_text()
    assert "| | local | managed |" in report
    assert "internal memory and scheduling" in report.lower() and UNKNOWN_INTERNALS in report
    assert "ttft_ms p99" in report and "quotas" in report and "cost per run" in report
    data = json.loads((tmp / "report.json").read_text())
    assert data["managed"]["internals"] == UNKNOWN_INTERNALS
    assert data["local"]["latency_ms"]["overall"]["ttft_ms"]["n"] > 0
    assert data["local"]["trace"]["sha256"] == data["managed"]["trace"]["sha256"]
    assert math.isfinite(data["local"]["throughput"]["completed_rps"])


@pytest.mark.slow  # shares a ~15 s fixture: two 5 s runs against live simulated servers
def test_api_key_is_absent_from_every_file_written(runs) -> None:
    tmp, _, _, _, out = runs
    files = [p for p in tmp.rglob("*") if p.is_file()]
    assert len(files) > 8
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in out.stdout + out.stderr


def test_price_table_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text("[candidates.m]\nusd_per_million_input_tokens = -1\n")
    with pytest.raises(ScenarioError, match=r"candidates\.m\.usd_per_million_input_tokens = -1"):
        load_price_table(bad)
    bad.write_text("[candidates.m]\nusd_per_hour = 1\nusd_per_million_input_tokens = 1\n")
    with pytest.raises(ScenarioError, match="expected usd_per_hour, or"):
        load_price_table(bad)


def _write_run(run_dir: Path, rows: list[dict], model: str, engine_config: str | None = None) -> Path:
    from loadgen.rundir.io import RunWriter
    from loadgen.rundir.manifest import Manifest
    from loadgen.rundir.schema import empty_request_row

    manifest = {
        "run_kind": "measured",
        "target": {
            "kind": "managed" if engine_config is None else "sim",
            "base_url": "https://api.example.invalid",
            "model": model,
            "version": {"engine": "loadgen-sim", "engine_config": engine_config},
        },
        "trace": {"name": "t", "sha256": "ab" * 32, "seed": 1},
        "options": {"rate_limit_rps": None},
        "scenario": None,
        "started_utc": "2026-11-29T00:00:00Z",
        "anchor": {"perf_counter_ns": 0},
    }
    with RunWriter(run_dir, Manifest.model_validate(manifest)) as writer:
        for i, r in enumerate(rows):
            base = dict(
                request_id=f"r{i}",
                request_class="short-message",
                scheduled_ns=i * 100_000_000,
                sent_ns=i * 100_000_000,  # sent when due (a row sent before it is due is refused as implausible)
                target_prompt_tokens=100,
                target_output_tokens=10,
            )
            base.update(r)
            writer.add_request(empty_request_row(**base))
        writer.close({"duration_s": 3600.0})
    return run_dir


def test_content_filter_and_changes_ordered_by_time_from_recorded_rows(tmp_path: Path) -> None:
    """Rows as the driver records them (real Parquet): content filters, 429s, out-of-order completion."""
    ok = dict(
        status="ok",
        first_byte_ns=None,
        first_token_ns=None,
        done_ns=None,
        server_prompt_tokens=100,
        server_output_tokens=10,
        finish_reason="stop",
    )
    rows = [
        {
            **ok,
            "first_byte_ns": 900_000_000,
            "done_ns": 950_000_000,
            "response_model": "m-2",
            "system_fingerprint": "fp2",
        },
        {
            **ok,
            "first_byte_ns": 100_000_000,
            "done_ns": 150_000_000,
            "response_model": "m-1",
            "system_fingerprint": "fp1",
        },
        {
            "status": "error",
            "error_kind": "content_filter",
            "finish_reason": "content_filter",
            "first_byte_ns": 300_000_000,
            "done_ns": 310_000_000,
            "response_model": "m-1",
            "client_output_tokens": 3,
        },
        {"status": "error", "error_kind": "http_429", "http_status": 429, "retry_after_s": 2.5, "done_ns": 400_000_000},
    ]
    managed = _write_run(tmp_path / "managed", rows, "m")
    local = _write_run(
        tmp_path / "local", [dict(ok, first_byte_ns=100, done_ns=200, response_model="m")], "m", "big-gpu"
    )
    prices = tmp_path / "prices.toml"
    prices.write_text(
        "example = true\n[candidates.m-]\nusd_per_million_input_tokens = 1.0\n"
        "usd_per_million_output_tokens = 10.0\n[candidates.big-gpu]\nusd_per_hour = 2.0\n"
    )
    comp = compare_managed(local, managed, prices=prices)
    m = comp.managed
    assert m["errors"]["content_filtered"] == 1
    assert [c["to"] for c in m["change_controls"]["response_model"]["changes"]] == ["m-2"]  # by time, not row order
    assert m["change_controls"]["response_model"]["values"][0]["count"] == 2  # m-1 answered twice
    assert m["quotas"]["http_429"] == 1 and m["quotas"]["retry_after_s"]["p50"] == 2.5
    # two with usage (100 in, 10 out each) + the filtered one estimated from client counts (100 in, 3 out)
    assert m["cost"]["total"] == pytest.approx((300 * 1.0 + 23 * 10.0) / 1e6)
    assert m["cost"]["requests_with_estimated_tokens"] == 1 and m["cost"]["billed_requests"] == 3
    assert comp.local["cost"]["total"] == pytest.approx(2.0) and comp.local["cost"]["price_entry"] == "big-gpu"
    assert any("example = true" in w for w in comp.warnings)
    assert "content filtered | 0 | 1 |" in comp.render_markdown()
