"""One run over worker processes (issue 14): `loadgen run --workers N` through the real CLI.

Each live test runs the real coordinator (``python -m loadgen run``), its worker processes and a real
simulated server on loopback, and reads the one run directory back with the real readers. Waits are for
observable states (rows on disk, a worker's pid in the manifest), never for wall time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_analysis_run import MS

from loadgen.driver.partition import shard_index, shard_sizes, split_bound
from loadgen.rundir.io import read_run_table
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.parts import PartTable, table_files
from loadgen.rundir.schema import REQUESTS_FILE, REQUESTS_SCHEMA, TRACE_SCHEMA
from loadgen.trace.io import write_trace

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


# ---- helpers (shared with test_workers_ray) ------------------------------------------------------------------


def conversation_trace(path: Path, singles: int, conversations: int, gap_ms: float, output_tokens: int = 8) -> Path:
    """``singles`` one-turn requests and ``conversations`` three-turn conversations, ``gap_ms`` apart."""
    rows: list[dict[str, Any]] = []
    t = 0.0
    for i in range(singles + conversations * 3):
        conv = i // 3 if i < conversations * 3 else None
        rows.append(
            {
                "request_id": f"r{i:05d}",
                "request_class": "short-message",
                "scheduled_offset_ns": int(t * MS),
                "prompt_tokens": 24,
                "output_tokens": output_tokens,
                "prefix_group": None,
                "prefix_tokens": None,
                "conversation_id": f"c{conv}" if conv is not None else None,
                "turn_index": i % 3 if conv is not None else None,
                "cancel_after_tokens": None,
            }
        )
        t += gap_ms
    rows.sort(key=lambda r: r["scheduled_offset_ns"])
    return write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        path,
        {"mode": "open", "max_in_flight": 256, "trace_name": "t", "seed": 1},
    )


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


def start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(condition: Callable[[], Any], proc: subprocess.Popen | None = None, what: str = "") -> Any:
    """Poll ``condition`` until it returns a truthy value; fail if ``proc`` ends first (no wall-clock limit
    beyond a generous safety net)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before {what}: rc {proc.returncode}: {err[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"never reached: {what}")


def trace_ids(trace: Path) -> list[str]:
    return pq.read_table(trace, columns=["request_id"]).column("request_id").to_pylist()


def last_progress_line(stderr: str) -> str:
    """The progress line's last draw (``text=True`` turned each ``\\r`` into a line break)."""
    lines = [line for line in stderr.splitlines() if line.startswith("loadgen run")]
    assert lines, stderr
    return lines[-1]


def rows_by_worker(run_dir: Path) -> dict[str, list[str]]:
    """request_id per part series (``""``: the coordinator's; ``w0`` ...)."""
    out: dict[str, list[str]] = {}
    for f in table_files(run_dir / REQUESTS_FILE):
        series = f.name.split("-")[1] if f.name.split("-")[1].startswith("w") else ""
        out.setdefault(series, []).extend(pq.read_table(f, columns=["request_id"]).column("request_id").to_pylist())
    return out


def worker_rows(run_dir: Path, worker: str) -> int:
    files = [f for f in table_files(run_dir / REQUESTS_FILE) if f.name.startswith(f"part-{worker}-")]
    total = 0
    for f in files:
        try:
            total += pq.ParquetFile(f).metadata.num_rows
        except (OSError, pa.ArrowInvalid):  # compacted away between the listing and the read
            return 0
    return total


def assert_exact_accounting(run_dir: Path, trace: Path) -> pa.Table:
    """Every trace request has exactly one row in the merged run, and the manifest counts them all."""
    table = read_run_table(run_dir, REQUESTS_FILE)
    assert table is not None
    ids = table.column("request_id").to_pylist()
    counts = Counter(ids)
    assert not [i for i, n in counts.items() if n != 1], "a request recorded more than once"
    assert set(ids) == set(trace_ids(trace))
    manifest = read_manifest(run_dir)
    assert manifest.scheduled_requests == len(trace_ids(trace))
    assert manifest.requests_recorded == len(ids) == sum(manifest.status_counts.values())
    return table


def analysis(run_dir: Path, out: Path) -> dict[str, Any]:
    result = run_cli("analyze", str(run_dir), "--json", str(out))
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def assert_same_analysis(single_dir: Path, merged_dir: Path, tmp: Path) -> None:
    """Counts exactly equal; latency percentiles equal within timing noise.

    TTFT counts from the scheduled instant, so a client that falls behind its schedule (a starved worker on a
    loaded host) adds its send lag to every latency. The noise allowed is 250 ms plus the worse of the two runs'
    own send-lag p99, as their manifests record it: what is compared is the target's work, not the host's load.
    """
    single, merged = analysis(single_dir, tmp / "a1.json"), analysis(merged_dir, tmp / "a2.json")
    assert merged["run"]["requests"] == single["run"]["requests"]
    assert merged["run"]["chunk_rows"] == single["run"]["chunk_rows"]
    assert merged["window"]["start_s"] == single["window"]["start_s"]
    assert merged["window"]["end_s"] == single["window"]["end_s"]
    for key in ("n_scheduled", "status_counts", "abandoned"):
        assert merged["overall"][key] == single["overall"][key], key
    lags_ms = [(read_manifest(d).send_lag_ns or {}).get("p99") or 0 for d in (single_dir, merged_dir)]
    noise_ms = 250.0 + max(lags_ms) / 1e6
    for name, metric in single["overall"]["metrics"].items():
        other = merged["overall"]["metrics"][name]
        assert other["n"] == metric["n"], name
        for q in ("p50", "p95"):
            if metric[q] is not None:
                assert abs(other[q] - metric[q]) < noise_ms, (name, q, metric[q], other[q], noise_ms)


# ---- units -----------------------------------------------------------------------------------------------------


def test_partition_keeps_conversations_on_one_worker_and_covers_every_request(tmp_path: Path) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=200, conversations=40, gap_ms=1)
    table = pq.read_table(trace)
    for workers in (1, 2, 3, 7):
        index = shard_index(table, workers)
        assert index.min() >= 0 and index.max() < workers
        assert sum(shard_sizes(table, workers)) == table.num_rows
        by_conv: dict[str, set[int]] = {}
        for conv, w in zip(table.column("conversation_id").to_pylist(), index.tolist(), strict=True):
            if conv is not None:
                by_conv.setdefault(conv, set()).add(w)
        assert all(len(ws) == 1 for ws in by_conv.values())
        assert (shard_index(table, workers) == index).all()  # deterministic
    assert min(shard_sizes(table, 2)) > 0.3 * table.num_rows  # a thinned copy each, not everything on one
    assert [split_bound(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert split_bound(None, 3, 0) is None


def test_table_files_reads_every_worker_series_once(tmp_path: Path) -> None:
    directory = tmp_path / REQUESTS_FILE
    coordinator = PartTable(directory, REQUESTS_SCHEMA, fsync=False)
    coordinator.write_part(REQUESTS_SCHEMA.empty_table(), None, {})
    series = {}
    for shard in ("w1", "w0", "w10", "w2"):
        table = PartTable(directory, REQUESTS_SCHEMA, fsync=False, shard=shard)
        for _ in range(3):
            table.write_part(REQUESTS_SCHEMA.empty_table(), None, {})
        series[shard] = table
    series["w1"].compact("{}", {}, 1000)  # a merged series: the range file replaces its parts
    names = [f.name for f in table_files(directory)]
    assert names[0] == "part-000000.parquet"
    assert names[1:4] == [f"part-w0-{i:06d}.parquet" for i in range(3)]
    assert names[4] == "part-w1-000000-000002.parquet"
    assert names[5:8] == [f"part-w2-{i:06d}.parquet" for i in range(3)]
    assert names[8:] == [f"part-w10-{i:06d}.parquet" for i in range(3)]
    with pytest.raises(ValueError):
        PartTable(directory, REQUESTS_SCHEMA, shard="w-1")


# ---- live: the real CLI, worker processes, a simulated server ----------------------------------------------------


@pytest.mark.slow
def test_workers_run_is_one_run_equal_to_the_single_process_run(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=60, conversations=10, gap_ms=15)
    sim = sim_server("instant")
    single, merged = tmp_path / "single", tmp_path / "merged"
    n = len(trace_ids(trace))
    for out, extra, what in ((single, [], "loadgen run "), (merged, ["--workers", "2"], "loadgen run (2 processes) ")):
        result = run_cli("run", str(trace), "--target", sim.base_url, "--out", str(out), "--progress", "on", *extra)
        assert result.returncode == 0, result.stderr
        # one live line for the whole run (the workers report their counts); its last draw has the final counts
        final = last_progress_line(result.stderr)
        assert final.startswith(what), result.stderr
        assert f"sent {n}/{n} " in final and " in flight 0 " in final and f" done {n} " in final, final
        assert " errors 0 " in final and ("p99 TTFT (worst worker) " in final) == bool(extra), final
    table = assert_exact_accounting(merged, trace)
    one = read_run_table(single, REQUESTS_FILE)
    assert one is not None
    # the merged run keeps every request's scheduled instant: one arrival process, thinned per worker
    assert dict(zip(table["request_id"].to_pylist(), table["scheduled_ns"].to_pylist(), strict=True)) == dict(
        zip(one["request_id"].to_pylist(), one["scheduled_ns"].to_pylist(), strict=True)
    )
    series = rows_by_worker(merged)
    assert set(series) >= {"w0", "w1"} and not series.get("")  # the coordinator had nothing to add
    worker_of = {rid: w for w, ids in series.items() for rid in ids}
    convs = pq.read_table(trace, columns=["request_id", "conversation_id"]).to_pylist()
    by_conv: dict[str, set[str]] = {}
    for row in convs:
        if row["conversation_id"]:
            by_conv.setdefault(row["conversation_id"], set()).add(worker_of[row["request_id"]])
    assert all(len(ws) == 1 for ws in by_conv.values())

    manifest = read_manifest(merged)
    assert manifest.state == "complete"
    section = manifest.workers
    assert section is not None and section.mode == "processes" and section.count == 2
    assert [w.worker_id for w in section.workers] == [0, 1]
    assert sum(w.requests_assigned or 0 for w in section.workers) == len(convs)
    for w in section.workers:
        assert w.pid and w.pid != os.getpid()
        assert manifest.host is not None and w.host_sha256 == manifest.host.hostname_sha256
        assert w.clock_offset_ns is not None and w.clock_offset_uncertainty_ns is not None
        assert w.clock_offset_uncertainty_ns >= 0
        assert w.requests_sent == w.requests_completed == w.requests_assigned and w.requests_lost == 0
        assert (w.cpu_user_s or 0) > 0 and w.send_lag_ns["n"] == w.requests_assigned
        assert w.exit == "exit code 0" and w.state == "complete"
    assert manifest.send_lag_ns is not None and manifest.send_lag_ns["n"] == len(convs)
    driver = manifest.driver
    assert driver is not None and driver.part_writer in ("process", "both", "thread")  # what every worker used
    assert driver.part_writer_priority in ("idle", "low")  # both workers chose by the same CPUs
    # worker 0 scraped /metrics and sampled the GPUs: its counts and its telemetry section are the run's
    shard0 = read_manifest(merged / "workers" / "w0")
    assert shard0.metrics_scrapes is not None and shard0.metrics_scrapes.stored >= 2
    assert manifest.metrics_scrapes == shard0.metrics_scrapes and manifest.to_dict()["gpu_telemetry"]
    assert manifest.to_dict()["gpu_telemetry"] == shard0.to_dict()["gpu_telemetry"]
    assert_same_analysis(single, merged, tmp_path)


@pytest.mark.slow
def test_a_killed_worker_leaves_its_rows_and_the_rest_are_recorded_worker_lost(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=400, conversations=0, gap_ms=20)
    sim = sim_server("instant")
    run_dir = tmp_path / "run"
    proc = start_cli(
        "run",
        str(trace),
        "--target",
        sim.base_url,
        "--out",
        str(run_dir),
        "--workers",
        "2",
        "--flush-interval-s",
        "0.2",
    )
    try:
        wait_for(lambda: worker_rows(run_dir, "w1") > 0, proc, "worker 1 recorded some requests")
        pid = read_manifest(run_dir).workers.workers[1].pid  # type: ignore[union-attr]
        assert pid
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("loadgen: error:")]
    assert len(lines) == 1 and "worker 1 died (killed by SIGKILL)" in lines[0], err
    table = assert_exact_accounting(run_dir, trace)
    lost = table.filter(pa.compute.equal(table["error_kind"], "worker_lost"))
    assert lost.num_rows > 0 and f"; {lost.num_rows} requests recorded" in lines[0]
    assert set(lost["status"].to_pylist()) <= {"not_sent", "cancelled"}
    assert set(lost["request_id"].to_pylist()).isdisjoint(rows_by_worker(run_dir).get("w1", []))
    manifest = read_manifest(run_dir)
    assert manifest.state == "failed" and "worker 1 died" in (manifest.interrupted_by or "")
    w1 = manifest.workers.workers[1]  # type: ignore[union-attr]
    assert w1.requests_lost == lost.num_rows and w1.state == "killed"
    assert manifest.workers.workers[0].state == "complete"  # type: ignore[union-attr]
    report = analysis(run_dir, tmp_path / "a.json")  # the run stays readable
    # the death cuts the run like a stop: covered up to the first request it left unknown, none a failure
    assert report["state"]["cut_by_stop"] == lost.num_rows
    first_lost_s = min(lost["scheduled_ns"].to_pylist()) / 1e9
    assert report["state"]["covered_until_s"] <= first_lost_s + 1e-9
    assert report["window"]["end_s"] <= first_lost_s + 1e-9
    kinds = [k for c in report["classes"].values() for k in (c.get("error_kinds") or {})]
    assert "worker_lost" not in kinds


@pytest.mark.slow
def test_sigterm_stops_every_worker_and_closes_every_shard(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=400, conversations=0, gap_ms=20)
    sim = sim_server("instant")
    run_dir = tmp_path / "run"
    proc = start_cli(
        "run",
        str(trace),
        "--target",
        sim.base_url,
        "--out",
        str(run_dir),
        "--workers",
        "2",
        "--flush-interval-s",
        "0.2",
    )
    try:
        wait_for(
            lambda: worker_rows(run_dir, "w0") > 0 and worker_rows(run_dir, "w1") > 0, proc, "both workers recorded"
        )
        pids = [w.pid for w in read_manifest(run_dir).workers.workers]  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    for pid in pids:
        assert pid is not None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    table = assert_exact_accounting(run_dir, trace)
    assert "worker_lost" not in set(table["error_kind"].to_pylist())  # every worker closed its own shard
    manifest = read_manifest(run_dir)
    assert manifest.state == "interrupted" and manifest.interrupted_by == "SIGTERM"
    for w in manifest.workers.workers:  # type: ignore[union-attr]
        assert read_manifest(run_dir / "workers" / f"w{w.worker_id}").state == "interrupted"
    analysis(run_dir, tmp_path / "a.json")


def test_more_workers_than_conversations_is_one_line(tmp_path: Path) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=0, conversations=2, gap_ms=10)
    result = run_cli(
        "run", str(trace), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "r"), "--workers", "5"
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "loadgen: error: --workers 5: worker" in result.stderr
    assert "Traceback" not in result.stderr


def test_ray_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=4, conversations=0, gap_ms=10)
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if the extra were not installed
        "from loadgen.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            str(trace),
            "--target",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "r"),
            "--ray",
        ],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "loadgen: error: --ray: Ray is not installed: expected it as the optional extra (pip install 'loadgen[ray]')"
    )


@pytest.mark.slow
def test_plan_runs_its_measured_runs_over_workers(tmp_path: Path) -> None:
    from test_plan_stops import setup

    plan, engine = setup(tmp_path, rates="[10]", concurrency="[16]")
    out = tmp_path / "plan"
    result = run_cli("plan", str(plan), "--sim", str(engine), "--out", str(out), "--workers", "2", "--max-runs", "1")
    assert result.returncode in (0, 3), result.stderr
    runs = [m.parent for m in out.glob("cells/**/manifest.json") if (m.parent / REQUESTS_FILE).exists()]
    measured = [r for r in runs if read_manifest(r).plan_cell]
    assert measured, runs
    for run_dir in measured:
        manifest = read_manifest(run_dir)
        assert manifest.workers is not None and manifest.workers.count == 2
        assert manifest.options["workers"] == 2
        assert manifest.requests_recorded == manifest.scheduled_requests


def test_worksheet_plans_refuse_workers(tmp_path: Path) -> None:
    from test_plan_stops import setup

    plan, engine = setup(tmp_path)
    result = run_cli("plan", str(plan), "--sim-worksheet", str(engine), "--out", str(tmp_path / "p"), "--workers", "2")
    assert result.returncode == 2 and "--workers 2 with --sim-worksheet" in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_worker_that_cannot_reach_the_target_is_one_line_and_every_request_is_accounted(tmp_path: Path) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=20, conversations=0, gap_ms=10)
    run_dir = tmp_path / "r"
    result = run_cli("run", str(trace), "--target", "http://127.0.0.1:9", "--out", str(run_dir), "--workers", "2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("loadgen: error: ")
    assert "127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr
    assert_exact_accounting(run_dir, trace)  # nothing was sent, and the run says so for every request
    manifest = read_manifest(run_dir)
    assert manifest.state == "failed" and manifest.status_counts["not_sent"] == 20
