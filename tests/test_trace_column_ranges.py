"""Every numeric trace column has a range (loadgen.trace.io): a trace whose optional columns hold 2**62 (a
think time, a server time, reasoning tokens) or more reasoning tokens than output tokens is one line through the real CLI,
exit 2, and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.trace.io import TRACE_METADATA_KEY, read_trace

REPO = Path(__file__).resolve().parents[1]
STEADY = REPO / "loadgen" / "traces" / "canonical-steady.parquet"


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True)


def _damaged(path: Path, column: str, value: int) -> Path:
    """The canonical steady trace with ``column`` of row 0 set to ``value`` (the rest as they were)."""
    table, meta = read_trace(STEADY)
    data = table.to_pydict()
    data["output_tokens"][0] = 2
    data[column] = [value] + [None] * (table.num_rows - 1)
    types = {f.name: f.type for f in table.schema}
    out = pa.table({k: pa.array(v, types[k]) for k, v in data.items()})
    pq.write_table(out.replace_schema_metadata({TRACE_METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("think_after_reply_ns", 2**62, "column think_after_reply_ns = 4611686018427387904 (row 0): expected 0.."),
        ("think_after_reply_ns", -1, "column think_after_reply_ns = -1 (row 0)"),
        ("service_ns", 2**62, "column service_ns = 4611686018427387904 (row 0): expected 0.."),
        ("reasoning_tokens", 2**30, "column reasoning_tokens = 1073741824 (row 0): expected 0.."),
        ("reasoning_tokens", 3, "column reasoning_tokens = 3 (row 0): expected at most output_tokens"),
    ],
)
def test_an_optional_column_out_of_range_is_one_line(tmp_path: Path, column: str, value: int, said: str) -> None:
    path = _damaged(tmp_path / "t.parquet", column, value)
    res = _cli("sim", "run", path, "--engine", "instant", "--out", tmp_path / "o")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(path) in res.stderr and said in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()


def _late(path: Path, last_offset_ns: int) -> Path:
    """The canonical steady trace's first two rows, the second scheduled at ``last_offset_ns``."""
    table, meta = read_trace(STEADY)
    table = table.slice(0, 2)
    offsets = pa.array([0, last_offset_ns], table.schema.field("scheduled_offset_ns").type)
    table = table.set_column(table.schema.get_field_index("scheduled_offset_ns"), "scheduled_offset_ns", offsets)
    pq.write_table(table.replace_schema_metadata({TRACE_METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


@pytest.mark.parametrize("command", ["sim", "run"])
def test_a_trace_longer_than_a_run_can_hold_is_refused_before_it_replays(tmp_path: Path, command: str) -> None:
    """A trace may span a year, a run's instants only 2**53 ns: `sim run` simulated such a trace to its end and
    then failed at its close ("manifest update: field duration_s"), its manifest left running; with the instant
    engine the run closed and `analyze` refused it. Now both replays refuse it first, naming the offset."""
    path = _late(tmp_path / "late.parquet", 366 * 86400 * 10**9)
    target = ("--engine", "interactive-small-batch") if command == "sim" else ("--target", "http://127.0.0.1:9")
    args = ("sim", "run") if command == "sim" else ("run",)
    res = _cli(*args, path, *target, "--out", tmp_path / "o")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{path}: scheduled_offset_ns = 31622400000000000 (366.0 days): expected at most" in res.stderr
    assert not (tmp_path / "o").exists()
    # a trace within the bound still replays (the instant engine: at once)
    done = _cli(
        "sim",
        "run",
        _late(tmp_path / "ok.parquet", 90 * 86400 * 10**9),
        "--engine",
        "instant",
        "--out",
        tmp_path / "ok",
    )
    assert done.returncode == 0, done.stderr
    assert _cli("analyze", tmp_path / "ok", "--quiet").returncode == 0
