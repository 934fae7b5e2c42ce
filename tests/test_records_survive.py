"""Records that survive any ending, and figures that agree (issue 11), through the real CLI.

Each test starts ``python -m loadgen`` as a subprocess against a real simulated server on loopback and
ends it the way a user's environment does: SIGTERM (``timeout``, ``docker stop``), SIGHUP (a closed
terminal), SIGKILL, a full disk (a 2 MB tmpfs, as root; skipped elsewhere, where an injected ENOSPC in
the writer stands in). Waits are for conditions (rows on disk, a child process), never timing checks.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_analysis_run import MS, build_run, scenario_two_classes

from loadgen.analysis import analyze_run
from loadgen.rundir.io import (
    RunWriter,
    load_run,
    read_run_manifest,
    read_run_table,
    run_table_files,
)
from loadgen.rundir.manifest import Manifest, read_manifest
from loadgen.rundir.schema import (
    REQUESTS_FILE,
    REQUESTS_SCHEMA,
    STATUSES,
    TRACE_SCHEMA,
)
from loadgen.targets import launch_sim_server
from loadgen.trace.io import write_trace
from loadgen.util.errors import RecordWriteError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


# ---- helpers --------------------------------------------------------------------------------------------


def make_trace(path: Path, offsets_ms: list[float], output_tokens: int = 10, **meta: Any) -> Path:
    rows = [
        {
            "request_id": f"r{i:05d}",
            "request_class": "short-message",
            "scheduled_offset_ns": int(t * MS),
            "prompt_tokens": 24,
            "output_tokens": output_tokens,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        for i, t in enumerate(offsets_ms)
    ]
    return write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        path,
        {"mode": "open", "max_in_flight": 256, "trace_name": "t", "seed": 1, **meta},
    )


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def loadgen(*args: str, sigint_ignored: bool = False) -> subprocess.Popen:
    """The real CLI as a child; ``sigint_ignored``: started the way a non-interactive shell starts ``cmd &``."""
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def rows_on_disk(run_dir: Path) -> int:
    """Rows a reader finds right now (the run may be live: every part on disk is whole)."""
    if not (run_dir / REQUESTS_FILE).exists():
        return 0
    return read_run_table(run_dir, REQUESTS_FILE, ["request_id"]).num_rows


def no_temp_files(run_dir: Path) -> None:
    leftovers = [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == [], leftovers


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("loadgen: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def instant():
    with launch_sim_server("instant") as sim:
        yield sim


# ---- SIGTERM / SIGHUP behave like Ctrl-C ----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_background_job_with_sigint_ignored_still_stops_cleanly(instant, tmp_path: Path, sig: signal.Signals) -> None:
    # `loadgen run ... &` from a script inherits an ignored SIGINT; the stop signals must still stop the run
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(800)])  # 100 req/s for 8 s
    out = tmp_path / "run"
    proc = loadgen(
        "run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off", sigint_ignored=True
    )
    wait_for(lambda: rows_on_disk(out) >= 50, "rows flushed while the run goes on")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "Fatal error" not in stderr
    run = load_run(out)
    assert run.manifest.state == "interrupted" and run.manifest.interrupted_by == sig.name
    rows = run.requests.to_pylist()
    assert len(rows) == 800 == len({r["request_id"] for r in rows}) == sum(run.manifest.status_counts.values())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_ctrl_c(instant, tmp_path: Path, sig: signal.Signals) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(800)])  # 100 req/s for 8 s
    out = tmp_path / "run"
    proc = loadgen("run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off")
    wait_for(lambda: rows_on_disk(out) >= 50, "rows flushed while the run goes on")  # readable mid-run
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert f"loadgen: interrupted ({sig.name})" in stderr and "Traceback" not in stderr
    no_temp_files(out)
    run = load_run(out)
    m = run.manifest
    assert m.state == "interrupted" and m.interrupted_by == sig.name and m.stopped_ns is not None
    rows = run.requests.to_pylist()
    assert len(rows) == 800 == len({r["request_id"] for r in rows}) == sum(m.status_counts.values())
    not_due = [r for r in rows if r["error_kind"] == "not_due"]
    cut = [r for r in rows if r["error_kind"] == "run_interrupted"]
    assert not_due and all(r["status"] == "not_sent" and r["scheduled_ns"] >= m.stopped_ns for r in not_due)
    assert all(r["scheduled_ns"] < m.stopped_ns for r in cut)
    assert len(run_table_files(out, REQUESTS_FILE)) == 1  # parts merged at the close
    # the analysis covers the run up to the stop and says so; not-due requests are neither offered nor failed
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "analyze",
            str(out),
            "--json",
            str(tmp_path / "a.json"),
            "--html",
            str(tmp_path / "a.html"),
        ],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    assert f"run INTERRUPTED by {sig.name}" in report.stdout
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["state"]["state"] == "interrupted" and doc["state"]["not_due"] == len(not_due)
    assert doc["window"]["end_s"] <= m.stopped_ns / 1e9
    assert doc["overall"]["n_scheduled"] + len(not_due) + doc["state"]["cut_by_stop"] <= 800
    assert doc["overall"]["status_counts"]["not_sent"] == 0 and doc["verdict"]["error_share"] == 0
    assert f"run INTERRUPTED by {sig.name}" in (tmp_path / "a.html").read_text()


# ---- SIGKILL -----------------------------------------------------------------------------------------------


def test_sigkill_keeps_every_flushed_row_and_reads_as_killed(instant, tmp_path: Path) -> None:
    # 60 requests in the first 0.6 s, then one due at 120 s: the run is idle (nothing in flight) when killed
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(60)] + [120_000.0])
    out = tmp_path / "run"
    proc = loadgen(
        "run",
        str(trace),
        "--target",
        instant.base_url,
        "--out",
        str(out),
        "--progress",
        "off",
        "--flush-interval-s",
        "0.2",
    )
    wait_for(lambda: rows_on_disk(out) == 60, "all 60 finished requests on disk")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert read_manifest(out).state == "running"  # nobody closed it ...
    m = read_run_manifest(out)  # ... and the reader sees why
    assert m.state == "killed" and m.recovery is not None
    assert m.recovery["rows_recorded"] == 60 and m.recovery["in_flight_at_last_flush"] == 0
    assert m.recovery["not_due_at_last_flush"] == 1 and m.last_flush.utc is not None
    run = load_run(out)
    assert run.requests.num_rows == 60 and set(run.requests.column("status").to_pylist()) == {"ok"}
    assert run.requests.schema.equals(REQUESTS_SCHEMA)  # the schema of a clean run
    assert pq.read_table(out / REQUESTS_FILE).num_rows == 60  # other tools read the directory as one table
    chunk_ids = set(run.chunks.column("request_id").to_pylist())
    assert chunk_ids == set(run.requests.column("request_id").to_pylist())
    report = subprocess.run(
        [sys.executable, "-m", "loadgen", "analyze", str(out)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode == 0 and "run KILLED" in report.stdout, report.stdout + report.stderr
    assert read_manifest(out).state == "killed"  # analyze wrote the recovered manifest
    a = analyze_run(out)
    assert a.window["end_s"] <= m.stopped_ns / 1e9 < 120 and a.overall.n_scheduled == 60


def test_sigkill_under_load_keeps_what_was_on_disk(instant, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(1000)])  # 100 req/s for 10 s
    out = tmp_path / "run"
    proc = loadgen("run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off")
    seen = wait_for(lambda: rows_on_disk(out) >= 150 and rows_on_disk(out), "150 rows on disk")
    live = analyze_run(out)  # a run still being written reads as far as it is on disk
    assert live.run["stop"]["state"] == "running" and live.overall.n_scheduled >= 150
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    run = load_run(out)
    m = run.manifest
    assert m.state == "killed" and run.requests.num_rows >= seen
    rec = m.recovery
    # every scheduled request is accounted for: a row, in flight at the last flush, or not yet due then
    assert rec["rows_recorded"] + rec["in_flight_at_last_flush"] + rec["not_due_at_last_flush"] == 1000
    # up to the covered instant, every scheduled request has its row
    sched = run.requests.column("scheduled_ns").to_pylist()
    assert sum(1 for t in sched if t < m.stopped_ns) == sum(1 for i in range(1000) if i * 10 * MS < m.stopped_ns)
    assert all(s in STATUSES for s in run.requests.column("status").to_pylist())


# ---- write errors --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_full_disk_stops_the_run_in_one_line_and_keeps_what_was_flushed(
    instant, tmp_path: Path, small_disk: Path
) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(6000)])  # 100 req/s for 60 s
    vfs = os.statvfs(small_disk)
    (small_disk / "ballast").write_bytes(b"\0" * (vfs.f_bavail * vfs.f_frsize - 400_000))  # ~400 kB left
    out = small_disk / "run"
    proc = loadgen("run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off")
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 2, stderr
    line = one_error_line(stderr)
    assert str(out) in line and "No space left on device" in line
    no_temp_files(out)
    run = load_run(out)
    m = run.manifest
    assert m.state == "failed" and m.interrupted_by.startswith("write error:") and "No space left" in m.interrupted_by
    assert 0 < run.requests.num_rows < 6000 and sum(m.status_counts.values()) == run.requests.num_rows
    a = analyze_run(out)
    assert a.run["stop"]["state"] == "failed" and a.overall.n_scheduled > 0


def test_injected_enospc_leaves_flushed_parts_and_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    writer = RunWriter(tmp_path / "run", Manifest(run_kind="measured"), flush_rows=1 << 30)
    row = {
        "request_id": "a",
        "request_class": "c",
        "scheduled_ns": 0,
        "target_prompt_tokens": 1,
        "target_output_tokens": 1,
        "status": "ok",
    }
    writer.add_request(row)
    writer.flush({"flushed_ns": 1, "covered_until_ns": 1, "dispatched": 1})
    from loadgen.rundir import parts

    real = parts.pq.write_table

    def full(table, where, **kw):  # writes a little, then the disk is full
        Path(where).write_bytes(b"PAR1")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(parts.pq, "write_table", full)
    writer.add_request({**row, "request_id": "b"})
    with pytest.raises(RecordWriteError, match=r"requests.parquet/part-000002.parquet: cannot write: No space left"):
        writer.flush()
    with pytest.raises(RecordWriteError):  # broken: no more record writes
        writer.flush()
    monkeypatch.setattr(parts.pq, "write_table", real)
    writer.close({"state": "interrupted"})
    no_temp_files(tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.requests.column("request_id").to_pylist() == ["a"]
    assert run.manifest.state == "failed" and run.manifest.status_counts["ok"] == 1


def _request_row(request_id: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "request_class": "c",
        "scheduled_ns": 0,
        "target_prompt_tokens": 1,
        "target_output_tokens": 1,
        "status": "ok",
    }


def test_deferred_parts_write_the_run_parts_would(tmp_path: Path) -> None:
    """defer_parts (the worksheet): nothing but the manifest before close, then the very files and tables."""
    runs = {}
    for defer in (False, True):
        out = tmp_path / f"defer-{defer}"
        with RunWriter(out, Manifest(run_kind="measured"), flush_rows=2, defer_parts=defer) as writer:
            for i in range(5):
                writer.add_request(_request_row(f"r{i}"))
            writer.add_metrics({"time_ns": [1], "name": ["m"], "labels": ["{}"], "value": [1.0]})
            writer.flush()
            on_disk = sorted(p.name for p in out.rglob("*.parquet") if p.is_file())
            assert (on_disk == []) == defer
        runs[defer] = out
    names = {
        d: sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet") if p.is_file()) for d, out in runs.items()
    }
    assert names[True] == names[False] and len(names[True]) == 3
    for d in (False, True):
        no_temp_files(runs[d])
    for name in ("requests.parquet", "server_metrics.parquet"):
        assert read_run_table(runs[True], name).equals(read_run_table(runs[False], name)), name
    assert read_manifest(runs[True]).requests_recorded == 5


def test_deferred_parts_that_cannot_be_written_fail_the_run(tmp_path: Path, monkeypatch) -> None:
    from loadgen.rundir import parts

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    writer = RunWriter(tmp_path / "run", Manifest(run_kind="measured"), defer_parts=True)
    writer.add_request(_request_row("a"))
    monkeypatch.setattr(parts.pq, "ParquetWriter", full)
    with pytest.raises(RecordWriteError, match="No space left"):
        writer.close()
    no_temp_files(tmp_path / "run")
    m = read_manifest(tmp_path / "run")
    assert m.state == "failed" and "No space left" in m.interrupted_by


# ---- status semantics --------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_client_queue_timeout_is_not_sent_and_sent_ns_is_bytes_on_the_socket(instant, tmp_path: Path) -> None:
    # one slot; the first request gets its first token at once, then stalls 3 s holding the slot, so the
    # others reach their 1 s TTFT timeout while still waiting for it (every request carries the fault)
    trace = make_trace(tmp_path / "t.parquet", [0.0, 1.0, 2.0, 3.0, 4.0])
    out = tmp_path / "run"
    done = run_cli(
        "run",
        str(trace),
        "--target",
        instant.base_url,
        "--out",
        str(out),
        "--progress",
        "off",
        "--max-concurrency",
        "1",
        "--ttft-timeout-s",
        "1",
        "--total-timeout-s",
        "30",
        "--header",
        "X-Loadgen-Fault:stall=3@2",
    )
    assert done.returncode == 0, done.stderr
    rows = {r["request_id"]: r for r in load_run(out).requests.to_pylist()}
    first = rows.pop("r00000")
    assert first["status"] == "ok" and first["sent_ns"] is not None
    for r in rows.values():  # waited for the one slot until their TTFT timeout: never left the client
        assert (r["status"], r["error_kind"]) == ("not_sent", "client_queue_timeout"), r
        assert r["sent_ns"] is None and r["slot_acquired_ns"] is None
        assert r["done_ns"] >= 1e9  # given up at its timeout: it left the system then
    # a window wide enough for any send lag (the default one spans the 5 ms schedule, which a busy host can miss)
    a = analyze_run(out, window="0:60")
    assert a.overall.send_rps * a.window["duration_s"] == pytest.approx(1)  # only the one sent is in the sent rate
    assert a.overall.status_counts["not_sent"] == 4


@pytest.mark.slow
def test_refused_connections_are_not_sent_and_not_in_the_sent_rate(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 25.0 for i in range(400)])  # 40 req/s for 10 s
    out = tmp_path / "run"
    with launch_sim_server("instant") as sim:
        proc = loadgen(
            "run",
            str(trace),
            "--target",
            sim.base_url,
            "--out",
            str(out),
            "--progress",
            "off",
            "--total-timeout-s",
            "5",
        )
        wait_for(lambda: rows_on_disk(out) >= 60, "rows before the server dies")
        sim.process.kill()  # the server dies mid-run: later connections are refused
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    rows = load_run(out).requests.to_pylist()
    refused = [r for r in rows if (r["status"], r["error_kind"]) == ("not_sent", "connect")]
    sent = [r for r in rows if r["sent_ns"] is not None]
    assert len(refused) >= 100 and all(r["sent_ns"] is None for r in refused)
    report = run_cli("analyze", str(out), "--json", str(tmp_path / "a.json"))
    assert report.returncode == 0, report.stderr
    doc = json.loads((tmp_path / "a.json").read_text())
    window = doc["window"]["duration_s"]
    assert doc["overall"]["send_rps"] * window == pytest.approx(len(sent))  # refused ones are not "sent"
    assert doc["overall"]["send_rps"] < doc["overall"]["offered_rps"]


def test_connect_phase_is_recorded_apart_and_not_in_server_ttft(instant, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [0.0] * 8, mode="closed", concurrency=4)  # closed loop: no warm pool
    done = run_cli("run", str(trace), "--target", instant.base_url, "--out", str(tmp_path / "run"), "--progress", "off")
    assert done.returncode == 0, done.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert all(r["status"] == "ok" for r in rows)
    opened = [r for r in rows if r["connect_start_ns"] is not None]
    assert opened, "the first requests of a closed loop open their connections"
    for r in opened:
        assert (
            r["slot_acquired_ns"] <= r["connect_start_ns"] <= r["connect_end_ns"] <= r["sent_ns"] < r["first_token_ns"]
        )
    reused = [r for r in rows if r["connect_start_ns"] is None]
    assert reused and all(r["connect_end_ns"] is None for r in reused)


def test_unserved_model_fails_fast_naming_the_served_ones(instant, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [0.0, 10.0])
    proc = loadgen(
        "run",
        str(trace),
        "--target",
        instant.base_url,
        "--out",
        str(tmp_path / "run"),
        "--model",
        "gpt-nope",
        "--progress",
        "off",
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    line = one_error_line(stderr)
    assert "'gpt-nope'" in line and "'loadgen-sim'" in line and "--no-model-check" in line
    assert not (tmp_path / "run" / REQUESTS_FILE).exists()
    proc = loadgen(
        "run",
        str(trace),
        "--target",
        instant.base_url,
        "--out",
        str(tmp_path / "run2"),
        "--model",
        "gpt-nope",
        "--progress",
        "off",
        "--no-model-check",
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    kinds = read_run_table(tmp_path / "run2", REQUESTS_FILE, ["error_kind"]).column("error_kind").to_pylist()
    assert kinds == ["http_4xx", "http_4xx"]  # the server refused the model: said per request, not hidden


# ---- one population rule for rates ----------------------------------------------------------------------------


def test_goodput_counts_completions_like_completed_throughput(tmp_path: Path) -> None:
    """The issue's case: 20 requests at 2 req/s that each stream for 5 s. Completed counts completions in
    the 10 s window (10 of them: 1.0 req/s); goodput used to count the 20 scheduled ones (2.0 req/s)
    wherever they finished."""
    reqs = [
        {
            "request_id": f"g{i}",
            "request_class": "burst",
            "scheduled_ns": i * 500 * MS,
            "sent_ns": i * 500 * MS,
            "first_token_ns": i * 500 * MS + 100 * MS,
            "last_token_ns": i * 500 * MS + 5000 * MS,
            "done_ns": i * 500 * MS + 5000 * MS,
            "status": "ok",
            "client_output_tokens": 5,
        }
        for i in range(20)
    ]
    a = analyze_run(build_run(tmp_path / "r", reqs, scenario=scenario_two_classes()))
    assert a.window["duration_s"] == pytest.approx(10.0)
    assert a.overall.completed_rps == pytest.approx(1.0)  # 10 finish before 10 s
    assert a.overall.goodput_rps == pytest.approx(1.0) and a.overall.n_good_completed == 10
    assert a.overall.attainment == pytest.approx(1.0)  # every scheduled request met its budget


@given(
    st.lists(
        st.tuples(
            st.sampled_from(STATUSES),
            st.sampled_from(["short-message", "burst", "other"]),
            st.integers(0, 5000),
            st.integers(1, 3000),
            st.integers(0, 8000),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
    st.one_of(st.none(), st.tuples(st.integers(0, 3000), st.integers(1, 6000))),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_goodput_never_exceeds_completed(tmp_path_factory, rows, window) -> None:
    reqs = []
    for i, (status, cls, sched, ttft, e2e, cold) in enumerate(rows):
        r: dict[str, Any] = {
            "request_id": f"h{i}",
            "request_class": cls,
            "scheduled_ns": sched * MS,
            "status": status,
            "warm": not cold,
        }
        if status != "not_sent":
            done = sched + max(ttft, e2e)
            r.update(sent_ns=sched * MS, done_ns=done * MS)
            if status in ("ok", "cancelled"):
                r.update(first_token_ns=(sched + ttft) * MS, last_token_ns=done * MS, client_output_tokens=3)
        reqs.append(r)
    win = None if window is None else (window[0] / 1000, (window[0] + window[1]) / 1000)
    for include_cold in (False, True):
        a = analyze_run(
            build_run(tmp_path_factory.mktemp("g") / "r", reqs, scenario=scenario_two_classes()),
            window=win,
            include_cold=include_cold,
        )
        for g in [a.overall, *a.classes.values()]:
            if g.goodput_rps is not None:
                assert g.goodput_rps <= (g.completed_rps or 0.0) + 1e-12, (g.name, g.goodput_rps, g.completed_rps)
                assert g.n_good_completed <= round((g.completed_rps or 0.0) * a.window["duration_s"])


# ---- every launched child stops on any ending ----------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _sim_child(pid: int) -> list[int]:
    """The launched sim server(s), once one is listening (its log says so: it is past start-up)."""
    found = []
    for c in _children(pid):
        try:
            if "sim" in psutil.Process(c).cmdline() and psutil.Process(c).net_connections(kind="tcp"):
                found.append(c)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("command", ["practice", "plan"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_child_outlives_a_killed_command(tmp_path: Path, command: str, sig: signal.Signals) -> None:
    if command == "practice":
        args = ["practice", "--out", str(tmp_path / "p"), "--window-s", "10"]
    else:
        args = [
            "plan",
            str(REPO / "scenarios" / "plans" / "quick.toml"),
            "--sim",
            "instant",
            "--out",
            str(tmp_path / "p"),
            "--quiet",
        ]
    proc = loadgen(*args)
    children = wait_for(lambda: _sim_child(proc.pid), f"{command}'s sim server", timeout_s=180)
    children = _children(proc.pid)  # everything it launched so far
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and "Traceback" not in stderr, stderr[-2000:]
    for pid in children:
        wait_for(lambda pid=pid: gone(pid), f"child {pid} of the killed {command} to end", timeout_s=60)
