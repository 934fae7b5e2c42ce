"""The part writer process (``loadgen.rundir.part_process``): parts a run's flushes hand to a child at low CPU priority.

Real processes throughout: the child is the one ``PartProcess`` starts, runs go through the real CLI against a
real simulated server, and the child is killed with a real signal. Waits are for conditions, never timings.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_records_survive import ENV, REPO, gone, loadgen, make_trace, no_temp_files, rows_on_disk, wait_for

from loadgen.rundir import part_process as partproc
from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.part_process import PartProcess
from loadgen.rundir.parts import PART_METADATA_KEY
from loadgen.rundir.rowtables import StreamChunks, pack_slice, unpack_slices
from loadgen.rundir.schema import empty_request_row
from loadgen.targets import launch_sim_server
from loadgen.util.errors import RecordWriteError


@pytest.fixture(scope="module")
def instant():
    with launch_sim_server("instant") as sim:
        yield sim


_SCHEMA = pa.schema([("request_id", pa.string()), ("arrival_ns", pa.int64())])


def _table(n: int) -> pa.Table:
    return pa.table({"request_id": [f"r{i}" for i in range(n)], "arrival_ns": list(range(n))}, schema=_SCHEMA)


def _part_writers(pid: int) -> list[psutil.Process]:
    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []  # the run already ended (and was reaped): it has no child left
    for child in children:
        try:
            if "loadgen.rundir.part_process" in child.cmdline():
                found.append(child)
        except psutil.Error:
            pass
    return found


def _assert_taken_over(writer: PartProcess, where: Path, rows: list[int], says: str) -> None:
    """Every part whole, with its rows, after the writer thread took over from the child (and says so)."""
    assert [pq.read_table(where / f"part-{i:06d}.parquet").num_rows for i in range(len(rows))] == rows
    assert writer.kind == "both"
    assert writer.warning is not None and says in writer.warning, writer.warning
    no_temp_files(where)


@pytest.mark.parametrize("priority", ["idle", "low"])
def test_the_child_lowers_itself_once_ready(priority: partproc.Priority) -> None:
    writer = PartProcess(priority)
    try:
        pid = writer._proc.pid  # type: ignore[union-attr]
        writer.wait_ready()  # started at normal priority; lowered once ready
        assert writer.running and writer.priority == priority
        if priority == "idle" and hasattr(os, "sched_getscheduler"):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        if priority == "low":
            assert psutil.Process(pid).nice() == partproc.LOW_NICE
    finally:
        writer.close()
    wait_for(lambda: gone(pid), "the closed child to end")


def test_the_child_is_at_idle_priority_only_where_this_process_has_one_cpu() -> None:
    """On one CPU it may take only what the loop leaves; on several, idle priority could starve it behind
    other busy processes (the suite beside busy loops did), and nice 10 cannot."""
    assert partproc.priority_for(frozenset({3})) == "idle"
    assert partproc.priority_for(frozenset({0, 1})) == "low"
    assert partproc.priority_for(None) == "low"  # the OS does not tell


def test_the_child_writes_whole_parts_with_their_metadata(tmp_path: Path) -> None:
    # not at idle priority here: a host with no idle CPU (the suite beside busy loops) would starve it
    writer = PartProcess("normal")
    writer.wait_ready()
    try:
        pid = writer._proc.pid  # type: ignore[union-attr]
        if hasattr(os, "sched_getscheduler"):
            assert os.sched_getscheduler(pid) != os.SCHED_IDLE
        for i, n in enumerate((0, 1, 5000)):
            meta = {PART_METADATA_KEY: json.dumps({"seq": i})}
            writer.write(tmp_path / f"part-{i:06d}.parquet", _table(n), meta, fsync=True)
        assert writer.kind == "process" and writer.parts == 3 and writer.warning is None
    finally:
        writer.close()
    assert gone(pid) and writer.cpu_s is not None and writer.cpu_s > 0
    for i, n in enumerate((0, 1, 5000)):
        back = pq.read_table(tmp_path / f"part-{i:06d}.parquet")
        assert back.replace_schema_metadata(None).equals(_table(n))
        assert json.loads(back.schema.metadata[PART_METADATA_KEY.encode()]) == {"seq": i}
    no_temp_files(tmp_path)
    writer.close()  # idempotent


def test_a_write_error_in_the_child_is_the_parents_record_write_error(tmp_path: Path) -> None:
    writer = PartProcess("normal")
    writer.wait_ready()
    try:
        missing = tmp_path / "no-such-dir" / "part-000000.parquet"
        with pytest.raises(RecordWriteError) as caught:
            writer.write(missing, _table(10), {}, fsync=True)
        assert caught.value.path == str(missing) and "No such file or directory" in caught.value.reason
        writer.write(tmp_path / "part-000001.parquet", _table(3), {}, fsync=False)  # the child lives on
        assert writer.parts == 1 and writer.kind == "process"
    finally:
        writer.close()
    assert pq.read_table(tmp_path / "part-000001.parquet").num_rows == 3


def _one_part_written(where: Path) -> tuple[PartProcess, psutil.Process]:
    """A ready writer (normal priority) that has written ``part-000000`` (2 rows) through its child."""
    writer = PartProcess("normal")
    writer.wait_ready()
    writer.write(where / "part-000000.parquet", _table(2), {}, fsync=False)
    return writer, psutil.Process(writer._proc.pid)  # type: ignore[union-attr]


def test_a_dead_child_hands_the_rest_to_this_thread_and_says_so(tmp_path: Path) -> None:
    writer, child = _one_part_written(tmp_path)
    try:
        child.kill()
        child.wait(timeout=30)
        writer.write(tmp_path / "part-000001.parquet", _table(3), {}, fsync=False)
        writer.write(tmp_path / "part-000002.parquet", _table(4), {}, fsync=False)
    finally:
        writer.close()
    _assert_taken_over(writer, tmp_path, [2, 3, 4], "the part writer process ended (exit status")
    assert "after 1 part(s)" in writer.warning  # type: ignore[operator]


def test_the_child_ignores_ctrl_c_and_ends_with_its_parent(tmp_path: Path) -> None:
    """A Ctrl-C reaches the whole process group: the child must outlive it (the parent decides); a parent
    killed with SIGKILL must not leave it behind."""
    parent_code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        import pyarrow as pa
        from loadgen.rundir.part_process import PartProcess
        w = PartProcess("normal")
        w.wait_ready()
        w.write(Path(sys.argv[1]), pa.table({"x": [1]}), {}, fsync=False)  # it serves: its handlers are set
        print(w._proc.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, str(tmp_path / "part-000000.parquet")],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        os.kill(child_pid, signal.SIGINT)
        os.kill(child_pid, signal.SIGTERM)
        os.kill(child_pid, signal.SIGHUP)
        ignored = int(
            next(
                ln for ln in Path(f"/proc/{child_pid}/status").read_text().splitlines() if ln.startswith("SigIgn:")
            ).split()[1],
            16,
        )
        assert all(ignored >> (sig - 1) & 1 for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)), hex(ignored)
        assert pq.read_table(tmp_path / "part-000000.parquet").num_rows == 1
        parent.kill()
        parent.wait(timeout=30)
        wait_for(lambda: gone(child_pid), "the child of a killed parent to end", timeout_s=60)
    finally:
        parent.kill()
        parent.wait(timeout=30)


def _run_with_the_child(trace: Path, url: str, out: Path, *pinning: str) -> subprocess.Popen:
    """``loadgen run`` through the real CLI (the part writer process is its default), flushing every 0.2 s."""
    return loadgen(*pinning, "run", str(trace), "--target", url, "--out", str(out), "--flush-interval-s", "0.2")


@pytest.mark.parametrize("cpus", ["one", "all"])
def test_a_run_records_through_the_child_and_names_it_in_the_manifest(instant, tmp_path: Path, cpus: str) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 5.0 for i in range(200)])
    out = tmp_path / "run"
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus == "one" and not usable:
        pytest.skip("this OS does not tell a process's CPUs (no sched_getaffinity)")
    pinning = ["--client-cpus", str(usable[0])] if cpus == "one" else []
    proc = _run_with_the_child(trace, instant.base_url, out, *pinning)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    m = read_manifest(out)
    assert m.state == "complete" and m.driver is not None
    # one CPU: idle priority (it takes only what the loop leaves); several: nice 10
    assert m.driver.part_writer_priority == ("idle" if cpus == "one" or len(usable) == 1 else "low")
    # on a host with no idle CPU (this suite beside busy loops) the idle child may start late, never get to run,
    # or be abandoned, and the writer thread writes meanwhile: the manifest says which
    assert m.driver.part_writer in ("process", "both", "thread"), m.driver.part_writer
    if m.driver.part_writer == "process":
        assert m.driver.part_writer_cpu_s and m.driver.part_writer_cpu_s > 0
    run = load_run(out)
    assert run.requests.num_rows == 200 and set(run.requests.column("status").to_pylist()) == {"ok"}
    assert run.chunks is not None and run.chunks.num_rows == m.chunks_recorded > 0
    no_temp_files(out)


def test_a_run_told_to_write_in_its_thread_starts_no_child(instant, tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.parquet", [i * 5.0 for i in range(100)])
    out = tmp_path / "run"
    proc = loadgen("run", str(trace), "--target", instant.base_url, "--out", str(out), "--part-writer", "thread")
    try:
        wait_for(lambda: rows_on_disk(out) > 0 or proc.poll() is not None, "the first flushed rows")
        assert not _part_writers(proc.pid)
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    m = read_manifest(out)
    assert m.driver is not None and (m.driver.part_writer, m.driver.part_writer_priority) == ("thread", None)
    assert m.driver.part_writer_cpu_s is None and load_run(out).requests.num_rows == 100


@pytest.mark.slow
def test_a_run_whose_part_writer_dies_loses_nothing(instant, tmp_path: Path) -> None:
    # 100 req/s for 6 s; the child is killed once the first rows are on disk
    trace = make_trace(tmp_path / "t.parquet", [i * 10.0 for i in range(600)])
    out = tmp_path / "run"
    proc = _run_with_the_child(trace, instant.base_url, out)
    try:
        wait_for(lambda: rows_on_disk(out) > 0, "the first flushed rows")
        (child,) = wait_for(lambda: _part_writers(proc.pid), "the part writer process")
        child.kill()
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    m = read_manifest(out)
    assert m.state == "complete" and m.driver is not None and m.driver.part_writer in ("both", "thread")
    # killed (or, on a host with no idle CPU, abandoned first, or killed before it was ready): it says so
    assert any("the part writer process" in w for w in m.warnings), m.warnings
    run = load_run(out)
    assert run.requests.num_rows == 600 and set(run.requests.column("status").to_pylist()) == {"ok"}
    assert sorted(run.requests.column("request_id").to_pylist()) == [f"r{i:05d}" for i in range(600)]
    no_temp_files(out)


def test_a_child_that_cannot_start_leaves_the_parts_to_this_thread(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a real process that exits at once
    writer = PartProcess("normal")
    writer.wait_ready()
    try:
        writer.wait_ready()
        writer.write(tmp_path / "part-000000.parquet", _table(7), {}, fsync=True)
    finally:
        writer.close()
    assert pq.read_table(tmp_path / "part-000000.parquet").num_rows == 7
    assert writer.kind == "thread" and writer.warning is not None and "did not start" in writer.warning


def test_a_child_that_does_not_answer_is_abandoned_and_the_thread_writes_its_part(tmp_path: Path) -> None:
    """What ``Recorder.finish`` does when the child, at idle priority on a busy host, has not run for a while:
    here it is stopped (SIGSTOP), so it cannot answer at all."""
    writer, child = _one_part_written(tmp_path)
    try:
        child.suspend()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            job = pool.submit(writer.write, tmp_path / "part-000001.parquet", _table(5), {}, False)
            done, _ = concurrent.futures.wait([job], timeout=0.5)
            assert not done  # it waits for the stopped child ...
            writer.abandon("a test stopped it")
            job.result(timeout=60)  # ... and, once it is abandoned, writes the part itself
        writer.write(tmp_path / "part-000002.parquet", _table(1), {}, fsync=False)
    finally:
        writer.close()
    _assert_taken_over(writer, tmp_path, [2, 5, 1], "stopped after 1 part(s)")


def test_the_child_converts_packed_slices_as_this_process_would() -> None:
    rows = [
        empty_request_row(request_id=f"r{i}", request_class="c", scheduled_ns=i, status="ok", chunk_count=i % 4)
        for i in range(120)
    ]
    items = [
        (row, StreamChunks(*(array("q", range(i % 4)) for _ in "abc")) if i % 4 else None) for i, row in enumerate(rows)
    ]
    packed = [pack_slice(items[i : i + 50]) for i in range(0, 120, 50)]
    writer = PartProcess("normal")
    writer.wait_ready()
    try:
        requests, chunks = writer.convert(packed)
        assert writer.running and writer.warning is None  # the child did it
        expected = unpack_slices(packed)
        assert requests is not None and requests.equals(expected[0])
        assert chunks is not None and chunks.equals(expected[1])
        bad = pack_slice([({**rows[0], "turn_index": 2**40}, None)])
        fitted = writer.convert([bad])[0]  # a value out of its column's range: the child fits the row as this
        assert fitted is not None and fitted.equals(unpack_slices([bad])[0])  # process would (requests_table)
        assert fitted.column("turn_index").to_pylist() == [None] and fitted.column("status").to_pylist() == ["error"]
        assert writer.running and writer.convert(packed)[0].equals(expected[0])  # it lives on
    finally:
        writer.close()


def test_a_child_that_never_answers_is_abandoned_by_the_watchdog(tmp_path: Path, monkeypatch) -> None:
    """No idle CPU for the child (here: SIGSTOP): the write does not wait for it for ever."""
    monkeypatch.setattr(partproc, "ANSWER_TIMEOUT_S", 0.2)
    writer = PartProcess("normal")
    writer.wait_ready()
    try:
        writer.write(tmp_path / "part-000000.parquet", _table(2), {}, fsync=False)
        psutil.Process(writer._proc.pid).suspend()  # type: ignore[union-attr]
        writer.write(tmp_path / "part-000001.parquet", _table(3), {}, fsync=False)  # returns: the thread wrote it
    finally:
        writer.close()
    _assert_taken_over(writer, tmp_path, [2, 3], "stopped after 1 part(s) (it had not answered within 0.2 s")
