"""Analysis beyond memory: per-token samples spilled to disk give the same analysis, percentiles bit for bit.

A tiny memory budget (``SpillConfig``, ``--memory-mib``, ``LOADGEN_ANALYZE_MEMORY_MIB``) makes every
sample spill as many sorted runs; the analysis of the same run directory must equal the in-memory one:
every percentile, interval, max, count, CDF point and verdict exactly, means to the last bits only
(a sum over runs adds in another order).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_driver_live import make_trace

from loadgen.analysis import analyze_run
from loadgen.analysis import chunks as chunks_mod
from loadgen.analysis import spill as spill_mod
from loadgen.analysis.spill import SpillConfig
from loadgen.rundir.io import run_table_files
from loadgen.rundir.schema import CHUNKS_FILE

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_analyze import generate_run  # noqa: E402  (the benchmark's generator, block by block)


def _cli(*args: str, env: dict[str, str] | None = None, preexec_fn: Any = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )


def _same(a: Any, b: Any, path: str = "") -> None:
    """Exactly equal, except keys named ``mean`` (equal to 1e-12 relative)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif path.endswith(".mean") and isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-12), path
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


class _Spills:
    """Counts the sorted runs written (the observable proof that the budget made the analysis spill)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = 0
        real = spill_mod.SortedRuns._spill

        def counted(store: spill_mod.SortedRuns, sample: Any) -> None:
            self.runs += 1
            real(store, sample)

        monkeypatch.setattr(spill_mod.SortedRuns, "_spill", counted)
        # small record batches: each sample arrives in many pieces, so it spills as many runs
        monkeypatch.setattr(chunks_mod, "BATCH_ROWS", 256)


def _assert_spilled_equals_in_memory(run: Path, spills: _Spills, tmp_path: Path) -> None:
    whole = analyze_run(run)
    assert spills.runs == 0  # the default budget holds a small run: nothing spilled, output as before
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    spilled = analyze_run(run, spill=SpillConfig(memory_bytes=4096, spill_dir=spill_dir))
    assert spills.runs >= 20
    assert list(spill_dir.iterdir()) == []  # every run file deleted afterwards
    _same(whole.to_dict(), spilled.to_dict())
    _same(whole.plot_data["cdf"], spilled.plot_data["cdf"])
    overall = spilled.overall.metrics["itl_ms"]
    assert overall["n"] > 1000 and overall["p99"] is not None


@pytest.mark.slow
def test_real_run_spilled_equals_in_memory(sim_server, tmp_path, monkeypatch):
    spills = _Spills(monkeypatch)
    sim = sim_server("interactive-small-batch", "--seed", "3")
    classes = ["short-message", "long-thread"]
    ms = 1_000_000
    rows = [
        {
            "request_id": f"r{i}",
            "scheduled_offset_ns": i * 15 * ms,
            "output_tokens": 30 + (i % 5) * 7,
            "request_class": classes[i % 2],
        }
        for i in range(80)
    ]
    trace = make_trace(tmp_path / "t.parquet", rows)
    out = _cli(
        "run",
        str(trace),
        "--target",
        sim.base_url,
        "--out",
        str(tmp_path / "run"),
        "--flush-interval-s",
        "0.2",
        "--progress",
        "off",
    )
    assert out.returncode == 0, out.stderr
    assert len(run_table_files(tmp_path / "run", CHUNKS_FILE)) >= 1
    _assert_spilled_equals_in_memory(tmp_path / "run", spills, tmp_path)


def test_synthetic_multi_part_run_spilled_equals_in_memory(tmp_path, monkeypatch):
    spills = _Spills(monkeypatch)
    run = tmp_path / "run"
    generate_run(run, 400, 12_000, rows_per_part=1_500)  # 8 parts; the tiny budget spills every sample
    assert len(run_table_files(run, CHUNKS_FILE)) >= 8
    _assert_spilled_equals_in_memory(run, spills, tmp_path)


def test_cli_memory_limit_from_the_environment_spills_and_agrees(tmp_path):
    run = tmp_path / "run"
    generate_run(run, 1_000, 40_000, rows_per_part=10_000)
    default = _cli("analyze", str(run), "--quiet", "--json", str(tmp_path / "a.json"))
    assert default.returncode == 0, default.stderr
    low = _cli(
        "analyze",
        str(run),
        "--quiet",
        "--json",
        str(tmp_path / "b.json"),
        "--spill-dir",
        str(tmp_path),
        env={spill_mod.MEMORY_ENV: "0.01"},
    )
    assert low.returncode == 0, low.stderr
    _same(json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b.json").read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "run"]  # spill runs removed


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--memory-mib", "0"], {}, "--memory-mib 0.0: expected a positive number of MiB"),
        ([], {spill_mod.MEMORY_ENV: "lots"}, "LOADGEN_ANALYZE_MEMORY_MIB='lots': expected a positive number of MiB"),
        (["--spill-dir", "/nonexistent/x"], {}, "spill directory '/nonexistent/x': not a directory"),
    ],
)
def test_bad_memory_options_are_one_line(tmp_path, args, env, needle):
    run = tmp_path / "run"
    generate_run(run, 10, 100, rows_per_part=100)
    out = _cli("analyze", str(run), "--quiet", *args, env=env)
    assert out.returncode == 2
    assert out.stderr.startswith("loadgen: error: ") and needle in out.stderr and out.stderr.count("\n") == 1


def test_a_spill_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path):
    """A spill write that fails (here: a file-size limit, as a full disk would) is raised from the writer thread
    as one line, exit 2, and the spill directory is removed."""
    import resource
    import signal

    run = tmp_path / "run"
    generate_run(run, 1_000, 40_000, rows_per_part=10_000)
    spill = tmp_path / "spill"
    spill.mkdir()

    def small_files() -> None:  # in the child: writes past 64 KiB fail with EFBIG instead of a signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    out = _cli(
        "analyze", str(run), "--quiet", "--memory-mib", "0.25", "--spill-dir", str(spill), preexec_fn=small_files
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("loadgen: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "run-000000.bin: File too large: spilling 0.1 MiB" in out.stderr and "--memory-mib" in out.stderr
    assert list(spill.iterdir()) == []


@pytest.mark.parametrize(
    ("values", "disk"),
    [
        (np.array([0, 3, 255], dtype=np.int64), np.uint8),
        (np.array([0, 256, 65535], dtype=np.int64), np.uint16),
        (np.array([7, 2**32 - 1], dtype=np.int64), np.uint32),
        (np.array([0, 2**32], dtype=np.int64), np.int64),  # past 32 bits: kept
        (np.array([-1, 5], dtype=np.int64), np.int64),  # negative: kept
        (np.array([0.5, 1e-9, 3.0], dtype=np.float64), np.float64),  # floats: kept
        (np.arange(3_000_000, dtype=np.int64) * 1000, np.uint32),  # converted in several blocks
    ],
)
def test_a_run_is_written_in_its_narrowest_dtype_and_reads_back_unchanged(tmp_path, values, disk):
    run, total = spill_mod._write_run([values.copy()], values.dtype, tmp_path / "run.bin", np.empty(0, np.uint8))
    try:
        expected = np.sort(values)
        assert run.disk_dtype == np.dtype(disk) and run.dtype == values.dtype
        assert (tmp_path / "run.bin").stat().st_size == len(values) * np.dtype(disk).itemsize
        back = run.read(0, len(values))
        assert back.dtype == values.dtype and np.array_equal(back, expected)
        assert run[len(values) - 1] == expected[-1] and run.searchsorted(expected[len(values) // 2]) == np.searchsorted(
            expected, expected[len(values) // 2]
        )
        assert total == float(np.sum(expected, dtype=np.float64))
    finally:
        run.close()
