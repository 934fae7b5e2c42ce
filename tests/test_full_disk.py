"""A full disk under every command that writes (the "no lost data" standard), through the real CLI.

Each test fills a 2 MB tmpfs (root only: skipped elsewhere, with the reason) and runs ``python -m loadgen``
with its output there. What must hold: one error line naming the path and the full disk, exit 2, no traceback;
what was written before stays readable, every scheduled request is accounted for (a row, or the manifest saying
how many have none and why); no half-written file a later command would take for a good one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from cli_process import REPO, run_loadgen
from small_disk import BALLAST, free_space, leave_free, mounted_small_disk
from test_records_survive import loadgen, make_trace, one_error_line, wait_for

from loadgen.analysis import analyze_run
from loadgen.rundir.io import WORKERS_DIR, load_run
from loadgen.rundir.manifest import read_manifest
from loadgen.targets import launch_sim_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def instant():
    with launch_sim_server("instant") as sim:
        yield sim


def no_partial_files(where: Path) -> None:
    leftovers = [p for p in where.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    assert leftovers == [], leftovers


def test_a_run_over_workers_closes_every_manifest_and_counts_what_has_no_row(
    instant, tmp_path: Path, small_disk: Path
) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(6000)])  # 100 req/s for 60 s
    leave_free(small_disk, 400_000)
    out = small_disk / "run"
    proc = loadgen(
        "run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off", "--workers", "2"
    )
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 2, stderr  # was 1: a traceback (a truncated send-lag file), the manifest "running"
    line = one_error_line(stderr)
    assert str(out) in line and "No space left on device" in line
    no_partial_files(out)
    run = load_run(out)
    m = run.manifest
    assert m.state == "failed" and "No space left" in (m.interrupted_by or "")
    rows = run.requests.num_rows
    assert 0 < rows < 6000 and sum(m.status_counts.values()) == rows == m.requests_recorded
    assert f"{6000 - rows} of 6000 scheduled requests have no row" in " ".join(m.warnings)
    for shard in sorted((out / WORKERS_DIR).iterdir()):  # each worker closed its own manifest (none "running")
        assert read_manifest(shard).state == "failed", shard
        stats = shard / "worker.json"  # best effort: absent when it did not fit, never half a file
        assert not stats.exists() or json.loads(stats.read_text())["outcome"].startswith("error:")
    assert m.workers is not None and {w.state for w in m.workers.workers} == {"failed"}
    a = analyze_run(out)
    assert a.run["stop"]["state"] == "failed" and 0 < a.overall.n_scheduled <= rows


# ---- commands that write beside a run: reports, the catalog, a bundle -----------------------------------------


@pytest.fixture(scope="module")
def good_run(instant, tmp_path_factory) -> Path:
    """A whole run directory (300 requests) on an ordinary disk."""
    where = tmp_path_factory.mktemp("good")
    trace = make_trace(where / "t.parquet", [i * 5.0 for i in range(300)])
    done = run_loadgen(["run", trace, "--target", instant.base_url, "--out", where / "run", "--progress", "off"], REPO)
    assert done.returncode == 0, done.stderr
    return where / "run"


def test_analyze_names_the_report_it_could_not_write(good_run: Path, small_disk: Path) -> None:
    leave_free(small_disk, 0)
    report = small_disk / "out" / "a.json"
    done = run_loadgen(["analyze", good_run, "--json", report, "--quiet"], REPO)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)  # was "loadgen: error: No space left on device": which file?
    assert str(report) in line and "No space left on device" in line
    assert not report.exists()
    no_partial_files(small_disk)


def test_runs_index_on_a_full_disk_leaves_no_empty_catalog_and_keeps_the_old_rows(
    good_run: Path, tmp_path: Path, small_disk: Path
) -> None:
    catalog = small_disk / "catalog.duckdb"
    leave_free(small_disk, 0)
    done = run_loadgen(["runs", "--catalog", catalog, "index", good_run], REPO)
    assert done.returncode == 2 and "No space left on device" in one_error_line(done.stderr)
    assert not catalog.exists()  # was an empty file: every later `runs` command refused it as "not valid"
    free_space(small_disk)
    done = run_loadgen(["runs", "--catalog", catalog, "index", good_run], REPO)
    assert done.returncode == 0 and "1 added" in done.stdout, done.stderr
    many = tmp_path / "many"
    for i in range(80):
        shutil.copytree(good_run, many / f"r{i:02d}")
    leave_free(small_disk, 10_000)
    done = run_loadgen(["runs", "--catalog", catalog, "index", many], REPO)
    assert done.returncode == 2, done.stderr  # was 1: a DuckDB TransactionException traceback
    line = one_error_line(done.stderr)
    assert str(catalog) in line and "No space left on device" in line and "nothing of this index" in line
    listed = run_loadgen(["runs", "--catalog", catalog, "list"], REPO)
    assert listed.returncode == 0 and "1 run(s)" in listed.stdout, listed.stderr
    free_space(small_disk)
    done = run_loadgen(["runs", "--catalog", catalog, "index", many], REPO)
    assert done.returncode == 0 and "80 added" in done.stdout, done.stderr


@pytest.mark.parametrize("free", [0, 100_000])  # nothing fits; the folder fits, its tarball does not
def test_handoff_build_on_a_full_disk_keeps_nothing_and_builds_once_there_is_room(
    good_run: Path, small_disk: Path, free: int
) -> None:
    leave_free(small_disk, free)
    bundle = small_disk / "bundle"
    done = run_loadgen(["handoff", good_run, "--out", bundle], REPO)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)  # was "No space left on device" naming no file, or the run's own manifest
    assert str(bundle) in line and "No space left on device" in line
    assert sorted(p.name for p in small_disk.iterdir()) == [BALLAST]  # was: bundle/ and bundle.tar.gz.tmp
    free_space(small_disk)
    assert run_loadgen(["handoff", good_run, "--out", bundle], REPO).returncode == 0
    verified = run_loadgen(["handoff", "verify", f"{bundle}.tar.gz"], REPO)
    assert verified.returncode == 0 and "OK" in verified.stdout, verified.stderr


def test_export_mlflow_on_a_full_disk_is_one_line_and_exports_the_cut_short_run_again(
    good_run: Path, tmp_path: Path
) -> None:
    pytest.importorskip("mlflow", reason="export mlflow needs loadgen[mlflow]")
    runs = [good_run]
    for i in range(2):
        runs.append(tmp_path / f"copy{i}")
        shutil.copytree(good_run, runs[-1])
    with mounted_small_disk(tmp_path / "disk", size="24m") as disk:
        uri = f"sqlite:///{disk / 'mlflow.db'}"
        export = ["export", "mlflow", *runs, "--tracking-uri", uri]
        leave_free(disk, 0)
        done = run_loadgen(export, disk)
        assert done.returncode == 2, done.stderr  # was 1: a sqlalchemy OperationalError traceback
        assert "database or disk is full" in one_error_line(done.stderr) and "nothing exported" in done.stderr
        assert not (disk / "mlflow.db").exists()  # was a half-made MLflow schema that MLflow never opens again
        free_space(disk)
        done = run_loadgen([*export[:2], runs[0], *export[-2:]], disk)  # the store, and the first run in it
        assert done.returncode == 0 and "1 exported" in done.stdout, done.stderr
        leave_free(disk, 2_000_000)  # room for a run's small files, not its HTML report
        done = run_loadgen(export, disk)
        assert done.returncode == 2, done.stderr
        assert "No space left on device" in one_error_line(done.stderr)
        free_space(disk)
        done = run_loadgen(export, disk)  # the run cut short counts as not exported: it goes again
        assert done.returncode == 0 and "2 exported, 1 unchanged" in done.stdout, done.stdout + done.stderr


# ---- stops at other moments than mid-replay: before the first request was due, a killed coordinator -----------


def test_a_run_stopped_before_any_request_was_due_analyses_as_such(instant, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [60_000.0 + i for i in range(50)])  # the first due after 60 s
    out = tmp_path / "run"
    proc = loadgen("run", str(trace), "--target", instant.base_url, "--out", str(out), "--progress", "off")
    wait_for(lambda: (out / "manifest.json").is_file() and read_manifest(out).anchor is not None, "the run's start")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    run = load_run(out)
    assert run.requests.num_rows == 50 == run.manifest.status_counts["not_sent"]
    done = run_loadgen(["analyze", out, "--quiet", "--json", tmp_path / "a.json"], REPO)
    assert done.returncode == 0, done.stderr  # was 2: "0 rows: expected 50 ...: the file was truncated or replaced"
    stop = json.loads((tmp_path / "a.json").read_text())["run"]["stop"]
    assert stop["state"] == "interrupted" and stop["not_due"] == 50


def test_a_killed_run_over_workers_accounts_for_every_request_and_stops_where_both_covered(
    instant, tmp_path: Path
) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(3000)])  # 100 req/s for 30 s
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "run", str(trace), "--target", instant.base_url, "--out", str(out)]
        + ["--progress", "off", "--workers", "2", "--flush-interval-s", "0.2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    parts = out / "requests.parquet"
    wait_for(lambda: all((parts / f"part-w{i}-000002.parquet").exists() for i in (0, 1)), "two flushes per worker")
    family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    for pid in family:  # the coordinator and its workers (their own sessions), at once: nobody closes anything
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    run = load_run(out)
    m = run.manifest
    assert m.state == "killed" and m.recovery is not None
    # was: one worker's dispatch count against both workers' rows ("in flight" -2076 seen on a full disk)
    assert m.recovery["in_flight_at_last_flush"] is None or m.recovery["in_flight_at_last_flush"] >= 0
    assert run.requests.num_rows + m.recovery["without_row"] == 3000
    covered = []
    for i in (0, 1):
        last = sorted(parts.glob(f"part-w{i}-*.parquet"))[-1]
        covered.append(json.loads(pq.read_schema(last).metadata[b"loadgen.part"])["covered_until_ns"])
    assert m.stopped_ns == min(covered)  # was the covered instant of whichever worker's part sorted last
    done = run_loadgen(["analyze", out, "--quiet", "--json", tmp_path / "a.json"], REPO)
    assert done.returncode == 0, done.stderr
    stop = json.loads((tmp_path / "a.json").read_text())["run"]["stop"]
    assert stop["state"] == "killed" and stop["no_row"]["without_row"] == m.recovery["without_row"]


def test_a_fresh_plan_stopped_by_a_full_disk_says_its_directory_was_removed(small_disk: Path) -> None:
    """A plan that fails before any cell finishes removes its directory (nothing to resume); its error line said
    the run's "records flushed before it are kept", pointing at files that were gone."""
    leave_free(small_disk, 30_000)
    out = small_disk / "plan"
    done = run_loadgen(["plan", "quick", "--sim-worksheet", "interactive-small-batch", "--out", out, "--quiet"], REPO)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "No space left on device" in line and "are kept" not in line, line
    assert line.endswith(f"the plan stopped before any cell finished, and {out} was removed (nothing to resume)")
    assert not out.exists()
