"""One run over Ray actors on a local Ray cluster (issue 14): `loadgen run --ray --workers 2`.

The real CLI starts a local Ray (``ray.init(num_cpus=2)``), two actors replay their shards against a real
simulated server, and the one run directory is read back. Skipped when the ``ray`` extra is not
installed. A local Ray start costs 10-20 s here, so each test is one run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest
from test_workers import (
    analysis,
    assert_exact_accounting,
    assert_same_analysis,
    conversation_trace,
    last_progress_line,
    rows_by_worker,
    run_cli,
    start_cli,
    trace_ids,
    wait_for,
    worker_rows,
)

from loadgen.rundir.manifest import read_manifest

pytestmark = pytest.mark.ray

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'loadgen[ray]')")


def test_ray_run_is_one_run_equal_to_the_single_process_run(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=60, conversations=10, gap_ms=15)
    sim = sim_server("instant")
    single, merged = tmp_path / "single", tmp_path / "merged"
    for out, extra in ((single, []), (merged, ["--ray", "--workers", "2", "--progress", "on"])):
        result = run_cli("run", str(trace), "--target", sim.base_url, "--out", str(out), *extra)
        assert result.returncode == 0, result.stderr
    # the actors report over the same control channel: one progress line, its last draw the final counts
    final, n = last_progress_line(result.stderr), len(trace_ids(trace))
    assert final.startswith("loadgen run (2 Ray actors) "), result.stderr
    assert f"sent {n}/{n} " in final and " in flight 0 " in final and f" done {n} " in final, final
    assert_exact_accounting(merged, trace)
    assert {"w0", "w1"} <= set(rows_by_worker(merged))
    manifest = read_manifest(merged)
    assert manifest.state == "complete"
    section = manifest.workers
    assert section is not None and section.mode == "ray" and section.ray_address == "local"
    for w in section.workers:
        assert w.node_ip and w.pid and w.pid != os.getpid()
        assert w.clock_offset_ns is not None and (w.clock_offset_uncertainty_ns or 0) >= 0
        assert w.requests_completed == w.requests_assigned and w.exit == "exit code 0"
    assert_same_analysis(single, merged, tmp_path)


def test_ray_killed_actor_is_accounted_for(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=400, conversations=0, gap_ms=20)
    sim = sim_server("instant")
    run_dir = tmp_path / "run"
    proc = start_cli(
        "run", str(trace), "--target", sim.base_url, "--out", str(run_dir), "--ray", "--workers", "2",
        "--flush-interval-s", "0.2",
    )  # fmt: skip
    try:
        wait_for(lambda: worker_rows(run_dir, "w1") > 0, proc, "actor 1 recorded some requests")
        pid = read_manifest(run_dir).workers.workers[1].pid  # type: ignore[union-attr]
        assert pid
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("loadgen: error:")]
    assert len(lines) == 1 and "worker 1 died (actor died" in lines[0], err
    table = assert_exact_accounting(run_dir, trace)
    lost = table.filter(pa.compute.equal(table["error_kind"], "worker_lost"))
    assert lost.num_rows > 0
    assert read_manifest(run_dir).workers.workers[1].requests_lost == lost.num_rows  # type: ignore[union-attr]
    analysis(run_dir, tmp_path / "a.json")


def test_ray_sigterm_stops_every_actor_and_closes_every_shard(tmp_path: Path, sim_server) -> None:
    trace = conversation_trace(tmp_path / "t.parquet", singles=400, conversations=0, gap_ms=20)
    sim = sim_server("instant")
    run_dir = tmp_path / "run"
    proc = start_cli(
        "run", str(trace), "--target", sim.base_url, "--out", str(run_dir), "--ray", "--workers", "2",
        "--flush-interval-s", "0.2",
    )  # fmt: skip
    try:
        wait_for(lambda: worker_rows(run_dir, "w0") > 0 and worker_rows(run_dir, "w1") > 0, proc, "both recorded")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    table = assert_exact_accounting(run_dir, trace)
    assert "worker_lost" not in set(table["error_kind"].to_pylist())
    manifest = read_manifest(run_dir)
    assert manifest.state == "interrupted"
    for w in manifest.workers.workers:  # type: ignore[union-attr]
        assert read_manifest(run_dir / "workers" / f"w{w.worker_id}").state == "interrupted"
