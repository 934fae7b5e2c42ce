"""A full disk under every command that writes (the "no lost data" standard), through the real CLI.

Each test fills a 2 MB tmpfs (root only: skipped elsewhere, with the reason) and runs ``python -m loadgen``
with its output there. What must hold: one error line naming the path and the full disk, exit 2, no traceback;
what was written before stays readable, every scheduled request is accounted for (a row, or the manifest saying
how many have none and why); no half-written file a later command would take for a good one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from small_disk import leave_free
from test_records_survive import loadgen, make_trace, one_error_line

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
