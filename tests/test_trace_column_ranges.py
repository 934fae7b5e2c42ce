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
