"""Several target URLs (replicas) in one run: routing, sticky conversations, per-replica accounting, a
replica killed mid-run, and the per-replica breakdown of the analysis (two live sim servers on loopback)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_driver_live import _kill_after_successes, assert_exact_accounting, counts, engine_file, make_trace

from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.targets import launch_sim_server

REPO = Path(__file__).resolve().parents[1]


def _replica_counts(run) -> collections.Counter:
    return collections.Counter(run.requests.column("target_index").to_pylist())


def _served(sim) -> float:
    import httpx

    text = httpx.get(sim.base_url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["round-robin", "least-in-flight"])
def test_replicas_split_the_load_with_exact_accounting(tmp_path, policy):
    engine = engine_file(tmp_path, "fast", fixed_ms=1.0)
    rows = [{"request_id": f"r{i:03d}", "scheduled_offset_ns": i * 5_000_000} for i in range(40)]
    # two conversations of 4 turns each: every turn stays on its first turn's replica
    rows += [
        {
            "request_id": f"c{c}t{t}",
            "scheduled_offset_ns": 1_000_000 + t * 40_000_000 + c * 3_000_000,
            "conversation_id": f"conv{c}",
            "turn_index": t,
            "request_class": "long-thread",
        }
        for c in range(2)
        for t in range(4)
    ]
    rows.sort(key=lambda r: r["scheduled_offset_ns"])
    trace = make_trace(tmp_path / "t.parquet", rows)
    with launch_sim_server(str(engine)) as a, launch_sim_server(str(engine)) as b:
        out = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=a.base_url,
                replica_urls=[b.base_url],
                route_policy=policy,
                out_dir=tmp_path / "run",
                progress="off",
            )
        )
        served = (_served(a), _served(b))
    run = load_run(out)
    assert_exact_accounting(run, 48)
    assert counts(run) == {("ok", None): 48}
    per = _replica_counts(run)
    assert set(per) == {0, 1} and per[0] + per[1] == 48
    # what each server itself counted as served is what the records say was routed to it
    assert served == (per[0], per[1])
    if policy == "round-robin":  # strict alternation over first turns and single requests
        assert abs(per[0] - per[1]) <= 2
    turns = collections.defaultdict(set)
    for r in run.requests.to_pylist():
        if r["conversation_id"]:
            turns[r["conversation_id"]].add(r["target_index"])
    assert all(len(v) == 1 for v in turns.values()), turns
    m = run.manifest.to_dict()
    assert [t["base_url"] for t in m["targets"]] == [a.base_url, b.base_url]
    assert m["routing"]["policy"] == policy and m["routing"]["routed"] == [per[0], per[1]]
    _check_breakdown(out, tmp_path, {0: per[0], 1: per[1]})


def _check_breakdown(out: Path, tmp_path: Path, routed: dict[int, int]) -> dict:
    """``loadgen analyze --json`` (and the HTML, console) has a per-replica breakdown that sums to the totals."""
    html, doc_path = tmp_path / "report.html", tmp_path / "analysis.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "analyze", str(out), "--json", str(doc_path), "--html", str(html)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert "per replica" in proc.stdout  # the console report
    doc = json.loads(doc_path.read_text())
    section = doc["replicas"]
    rows = section["replicas"]
    assert [r["target_index"] for r in rows] == [0, 1]
    assert {r["target_index"]: r["n_scheduled"] for r in rows} == routed
    overall = doc["overall"]
    assert sum(r["n_scheduled"] for r in rows) + section["not_routed"] == overall["n_scheduled"]
    assert sum(r["completed"] for r in rows) == overall["status_counts"]["ok"]
    assert sum(r["failed"] for r in rows) == sum(overall["error_kinds"].values())
    assert sum(r["ttft_ms"]["n"] for r in rows) == overall["metrics"]["ttft_ms"]["n"]
    assert sum(r["itl_ms"]["n"] for r in rows) == overall["metrics"]["itl_ms"]["n"]
    assert "Per replica" in html.read_text()
    return section


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["round-robin", "least-in-flight"])
def test_killed_replica_is_marked_down_and_every_request_is_accounted(tmp_path, policy):
    engine = engine_file(tmp_path, "slowish", fixed_ms=5.0, coalesce=False)
    rows = [{"request_id": f"r{i:03d}", "scheduled_offset_ns": i * 20_000_000, "output_tokens": 20} for i in range(120)]
    trace = make_trace(tmp_path / "t.parquet", rows)
    with launch_sim_server(str(engine)) as a, launch_sim_server(str(engine)) as b:
        # replica 1 is killed once it has finished 10 requests (its own counter, not wall time)
        killer = threading.Thread(target=_kill_after_successes, args=(b, 10), daemon=True)
        killer.start()
        out = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=a.base_url,
                replica_urls=[b.base_url],
                route_policy=policy,
                replica_down_after=3,
                out_dir=tmp_path / "run",
                total_timeout_s=10,
                progress="off",
            )
        )
        killer.join()
        served_a = _served(a)
    run = load_run(out)
    assert_exact_accounting(run, 120)
    rows_out = run.requests.to_pylist()
    on_a = [r for r in rows_out if r["target_index"] == 0]
    on_b = [r for r in rows_out if r["target_index"] == 1]
    assert len(on_a) + len(on_b) == 120  # every request was routed somewhere
    assert all(r["status"] == "ok" for r in on_a) and served_a == len(on_a)
    ok_b = [r for r in on_b if r["status"] == "ok"]
    failed_b = [r for r in on_b if r["status"] != "ok"]
    assert len(ok_b) >= 10
    # what failed on the killed replica failed as the network said: refused (not sent) or reset/closed
    assert failed_b and {(r["status"], r["error_kind"]) for r in failed_b} <= {
        ("not_sent", "connect"),
        ("error", "connect"),
        ("error", "reset_mid_stream"),
        ("error", "truncated"),
    }
    m = run.manifest.to_dict()
    down_ns = m["routing"]["down_ns"]
    assert down_ns[0] is None and down_ns[1] is not None
    # after it was marked down, no request was routed to it
    assert all(r["scheduled_ns"] <= down_ns[1] for r in on_b)
    refused = [r for r in failed_b if r["error_kind"] == "connect"]
    assert 3 <= len(refused) <= 3 + 64, len(refused)  # the streak that marked it down, and those already routed
    assert len(on_a) > len(on_b)
    assert m["state"] == "complete"
    section = _check_breakdown(out, tmp_path, {0: len(on_a), 1: len(on_b)})
    assert section["replicas"][1]["failed"] == len(failed_b) and section["replicas"][0]["failed"] == 0


def test_cli_bad_second_target_is_one_line_exit_2(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", [{"request_id": "r0", "scheduled_offset_ns": 0}])
    cmd = [sys.executable, "-m", "loadgen", "run", str(trace), "--out", str(tmp_path / "run")]
    for extra in (
        ["--target", "http://127.0.0.1:9", "--target", "ftp://user:hunter2@x"],
        ["--target", "http://127.0.0.1:9", "--target", "http://127.0.0.1:9/"],
    ):
        proc = subprocess.run(cmd + extra, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("loadgen: error: ") and "Traceback" not in proc.stderr
        assert "--target" in lines[0] or "target URL" in lines[0]
        assert "hunter2" not in proc.stderr


def test_cli_unreachable_second_target_is_one_line_exit_2_and_redacted(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", [{"request_id": "r0", "scheduled_offset_ns": 0}])
    engine = engine_file(tmp_path, "fast", fixed_ms=1.0)
    with launch_sim_server(str(engine)) as a:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "run", str(trace), "--out", str(tmp_path / "run")]
            + ["--target", a.base_url, "--target", "http://user:hunter2@127.0.0.1:9"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadgen: error: target http://127.0.0.1:9: not reachable")
    assert "hunter2" not in proc.stderr and not (tmp_path / "run" / "requests.parquet").exists()
