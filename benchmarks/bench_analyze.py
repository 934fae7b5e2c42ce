"""Benchmark: ``loadgen analyze`` of a synthetic run of 1,000,000 requests and 100,000,000 chunk rows.

Goal (issue 14): within 10 s and 1.5 GiB peak RSS; ``--scale``: 1,000,000,000 chunk rows in many part
files within 2 GiB peak RSS (spilling to disk), time reported. The run is generated block by block
(bounded memory: vectorised numpy → Arrow, zstd part files of ``--rows-per-part`` chunk rows, chunks
grouped by request in completion order, as a run of many flushes or workers writes them), timed apart.
The analysis runs as a child process (``loadgen analyze RUN --quiet --json``): its wall time, its CPU
time (user+sys: the figure that survives a loaded machine) and its own peak RSS (ru_maxrss) are reported.
The generated run is deleted afterwards unless ``--keep``.

    python benchmarks/bench_analyze.py                                   # 10^6 requests, 10^8 chunk rows
    python benchmarks/bench_analyze.py --scale --dir /var/tmp            # 10^9 chunk rows (~7 GiB on disk)
    python benchmarks/bench_analyze.py --requests 100000 --chunks 10000000
    python benchmarks/bench_analyze.py --runs 3 --touch-probe 40      # repeats; this host's first-touch cost
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.rundir.manifest import Manifest, write_manifest
from loadgen.rundir.schema import CHUNKS_FILE, CHUNKS_SCHEMA, REQUESTS_FILE, REQUESTS_SCHEMA
from loadgen.workload.scenario import load_scenario, scenario_manifest

REPO = Path(__file__).resolve().parents[1]

CLASSES = np.array(["short-message", "long-thread", "burst"])
ID_WIDTH = 10  # "r" + 9 digits
RATE_RPS = 100.0


def _ids(indices: np.ndarray) -> np.ndarray:
    """Fixed-width ASCII ids ``r0000123`` as an (n, 8) uint8 matrix."""
    digits = np.empty((len(indices), ID_WIDTH), dtype=np.uint8)
    digits[:, 0] = ord("r")
    rest = indices.astype(np.int64)
    for col in range(ID_WIDTH - 1, 0, -1):
        digits[:, col] = ord("0") + rest % 10
        rest //= 10
    return digits


def _string_array(id_matrix: np.ndarray) -> pa.Array:
    n = id_matrix.shape[0]
    offsets = np.arange(0, (n + 1) * ID_WIDTH, ID_WIDTH, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(id_matrix).ravel()))


def _block_requests(rows_per_block: int, mean_chunks: float) -> int:
    """Requests per generated block: about ``rows_per_block`` chunk rows, an even count."""
    return max(2, int(rows_per_block / mean_chunks) // 2 * 2)


def _chunk_counts(rng: np.random.Generator, n: int, base: int, extra: int) -> np.ndarray:
    """Chunk rows per request: ``base`` ± up to 40% in +d/−d pairs (so a block sums to n·base), plus
    one row for the first ``extra`` requests of the block."""
    half = (n + 1) // 2
    jitter = rng.integers(-int(base * 0.4), int(base * 0.4) + 1, half)
    d = np.empty(half * 2, dtype=np.int64)
    d[0::2], d[1::2] = jitter, -jitter
    counts = base + d[:n]
    if n % 2:
        counts[-1] = base
    counts[:extra] += 1
    return counts


def _write_part(table_dir: Path, seq: int, table: pa.Table, row_group_size: int) -> None:
    table_dir.mkdir(exist_ok=True)
    pq.write_table(table, table_dir / f"part-{seq:06d}.parquet", compression="zstd", row_group_size=row_group_size)


def _block(rng: np.random.Generator, first_id: int, counts: np.ndarray, t0_ns: int) -> tuple[pa.Table, pa.Table, int]:
    """One block of requests and their chunk rows (chunks grouped by request in completion order)."""
    n = len(counts)
    scheduled = t0_ns + np.cumsum(rng.exponential(1e9 / RATE_RPS, n)).astype(np.int64)
    cls = rng.choice(3, n, p=[0.6, 0.25, 0.15])
    status = rng.choice(5, n, p=[0.975, 0.01, 0.005, 0.005, 0.005])  # ok err timeout abandoned cancelled
    sent = scheduled + rng.exponential(2e5, n).astype(np.int64)
    first_token = sent + rng.lognormal(np.log(2e8), 0.4, n).astype(np.int64)
    # chunk gaps: ~20 ms exponential; the last row of each request is a usage chunk with 0 tokens
    total = int(counts.sum())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    gaps = rng.exponential(2e7, total).astype(np.int64)
    gaps[starts] = 0
    tokens = rng.choice(np.array([1, 2, 3], dtype=np.int32), total, p=[0.88, 0.10, 0.02])
    ends = starts + counts - 1
    tokens[ends] = 0
    gaps[ends] = 1_000_000
    csum = np.cumsum(gaps)
    arrival = np.repeat(first_token - csum[starts], counts) + csum
    del gaps, csum
    last_token, done = arrival[ends - 1], arrival[ends]
    out_tokens = np.add.reduceat(tokens, starts).astype(np.int32)
    ok, failed_before = status == 0, status == 2  # timeouts: no tokens at all
    ids = _string_array(_ids(first_id + np.arange(n)))
    req = {
        "request_id": ids,
        "request_class": pa.array(CLASSES[cls]),
        "warm": pa.array(np.ones(n, dtype=bool)),
        "scheduled_ns": pa.array(scheduled),
        "slot_acquired_ns": pa.array(sent),
        "sent_ns": pa.array(sent),
        "first_byte_ns": pa.array(first_token - 1000),
        "first_token_ns": pa.array(first_token, mask=failed_before),
        "last_token_ns": pa.array(last_token, mask=failed_before),
        "done_ns": pa.array(done),
        "target_prompt_tokens": pa.array(rng.integers(16, 1024, n).astype(np.int32)),
        "target_output_tokens": pa.array(out_tokens),
        "server_output_tokens": pa.array(out_tokens, mask=~ok),
        "client_output_tokens": pa.array(out_tokens),
        "chunk_count": pa.array(counts.astype(np.int32)),
        "cancel_after_tokens": pa.array(np.full(n, 8, dtype=np.int32), mask=status != 3),
        "status": pa.array(np.array(["ok", "error", "timeout", "cancelled", "cancelled"])[status]),
        "error_kind": pa.array(
            np.array([None, "http_5xx", "total_timeout", None, "run_interrupted"], dtype=object)[status]
        ),
    }
    columns = [req.get(f.name, pa.nulls(n, f.type)) for f in REQUESTS_SCHEMA]
    requests = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(columns, REQUESTS_SCHEMA)], schema=REQUESTS_SCHEMA)
    # chunk rows grouped by request, requests in completion order (not request-id order)
    order = np.argsort(done, kind="stable")
    c = counts[order]
    local = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
    rows = np.repeat(starts[order], c) + local
    req_of_row = np.repeat(order.astype(np.int32), c)
    chunk_cols = {
        "request_id": pa.DictionaryArray.from_arrays(pa.array(req_of_row), ids).cast(pa.string()),
        "seq": pa.array(local.astype(np.int32)),
        "arrival_ns": pa.array(arrival[rows]),
        "tokens": pa.array(tokens[rows]),
        "bytes": pa.array(np.full(total, 180, dtype=np.int32)),
    }
    chunks = pa.Table.from_arrays(
        [chunk_cols.get(f.name, pa.nulls(total, f.type)).cast(f.type) for f in CHUNKS_SCHEMA], schema=CHUNKS_SCHEMA
    )
    return requests, chunks, int(scheduled[-1])


def generate_run(run_dir: Path, n_requests: int, n_chunks: int, seed: int = 7, rows_per_part: int = 4_000_000) -> int:
    """Write a synthetic run directory block by block (bounded memory); returns the part files written.

    Poisson arrivals at 100 req/s, 3 classes; each table a directory of part files of about
    ``rows_per_part`` chunk rows, as a run of many flushes (or a run of several workers) has.
    """
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    base, extra = divmod(n_chunks, n_requests)
    assert base >= 2, "at least 2 chunk rows per request"
    per_block = _block_requests(rows_per_part, n_chunks / n_requests)
    t0, seq = 0, 0
    for first in range(0, n_requests, per_block):
        n = min(per_block, n_requests - first)
        counts = _chunk_counts(rng, n, base, max(0, min(n, extra - first)))
        requests, chunks, t0 = _block(rng, first, counts, t0)
        _write_part(run_dir / REQUESTS_FILE, seq, requests, 2_000)  # small row groups, as many flushes write
        _write_part(run_dir / CHUNKS_FILE, seq, chunks, 40_000)
        seq += 1
    manifest = {
        "run_kind": "simulated",
        "target": {"kind": "sim", "base_url": None, "model": "synthetic", "version": None, "engine": None},
        "scenario": scenario_manifest(load_scenario(REPO / "scenarios" / "canonical.toml")),
        "warm_state": {"state": "warm", "actions": []},
        "benchmark": "bench_analyze synthetic run",
        "status_counts": {},
        "requests_recorded": n_requests,
        "chunks_recorded": n_chunks,
        "state": "complete",
    }
    write_manifest(run_dir, Manifest.model_validate(manifest))
    return seq


def _analyze_child(run_dir: Path, memory_mib: float | None, spill_dir: Path | None) -> dict[str, float]:
    """``loadgen analyze RUN --quiet --json`` in a child process: wall s, CPU s (user+sys) and peak RSS
    (the child's own ru_maxrss, from wait4), so neither generation nor this process counts."""
    out = run_dir.parent / "analysis.json"
    cmd = [sys.executable, "-m", "loadgen", "analyze", str(run_dir), "--quiet", "--json", str(out)]
    if memory_mib is not None:
        cmd += ["--memory-mib", str(memory_mib)]
    if spill_dir is not None:
        cmd += ["--spill-dir", str(spill_dir)]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"bench_analyze: {' '.join(cmd)} exited {child.returncode}")
    overall = json.loads(out.read_text())["overall"]["metrics"]
    print("check: itl_ms", json.dumps({k: overall["itl_ms"][k] for k in ("p50", "p95", "p99", "n")}))
    print("check: ttft_ms", json.dumps({k: overall["ttft_ms"][k] for k in ("p50", "p95", "p99", "n")}))
    out.unlink()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_gib": usage.ru_maxrss / 2**20}


_TOUCH = (
    "import resource, time, numpy as np; t = time.perf_counter(); np.ones({n}); "
    "u = resource.getrusage(resource.RUSAGE_SELF); print(time.perf_counter() - t, u.ru_stime)"
)


def _touch_probe(idle_s: float, gib: float = 1.0) -> None:
    """How much this host charges for memory first touched after ``idle_s`` s of idling, against the same
    touch at once (a VM that hands idle guest memory back to its host charges for it again)."""
    cmd = [sys.executable, "-c", _TOUCH.format(n=int(gib * 2**30) // 8)]
    time.sleep(idle_s)
    figures = [subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split() for _ in range(2)]
    (cold, cold_sys), (warm, warm_sys) = ([float(x) for x in f] for f in figures)
    print(
        f"touch probe: {gib:g} GiB of fresh memory after {idle_s:g} s idle: {cold:.2f} s (sys {cold_sys:.2f} s);"
        f" at once after: {warm:.2f} s (sys {warm_sys:.2f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None, help="default 1,000,000")
    parser.add_argument("--chunks", type=int, default=None, help="chunk rows (default 100,000,000)")
    parser.add_argument(
        "--scale", action="store_true", help="the scale check: 1,000,000,000 chunk rows in many parts, RSS <= 2 GiB"
    )
    parser.add_argument("--rows-per-part", type=int, default=4_000_000, help="chunk rows per part file")
    parser.add_argument("--dir", type=Path, default=None, help="generate under this directory (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated run")
    parser.add_argument("--memory-mib", type=float, default=None, help="passed to loadgen analyze")
    parser.add_argument("--spill-dir", type=Path, default=None, help="passed to loadgen analyze")
    parser.add_argument(
        "--runs", type=int, default=1, help="analyses of the same run; the goal is judged on the worst of them"
    )
    parser.add_argument(
        "--touch-probe",
        type=float,
        default=None,
        metavar="IDLE_S",
        help="afterwards, idle IDLE_S s and time touching 1 GiB of fresh memory, then again at once",
    )
    args = parser.parse_args()
    n_req = args.requests or 1_000_000
    n_chunks = args.chunks or (1_000_000_000 if args.scale else 100_000_000)
    goal_s, goal_gib = (None, 2.0) if args.scale else (10.0, 1.5)
    parent = Path(tempfile.mkdtemp(prefix="loadgen-bench-", dir=args.dir))
    run_dir = parent / "run"
    free_gib = shutil.disk_usage(parent).free / 2**30
    print(f"disk: {free_gib:.0f} GiB free under {parent} (about 7 GiB per 10^9 chunk rows written)")
    try:
        t0 = time.perf_counter()
        parts = generate_run(run_dir, n_req, n_chunks, rows_per_part=args.rows_per_part)
        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
        print(
            f"generate: {n_req:,} requests, {n_chunks:,} chunk rows in {parts} part file(s) per table, "
            f"{time.perf_counter() - t0:.0f} s ({size / 2**30:.2f} GiB on disk)"
        )
        os.sync()  # the generator's writeback is not charged to the analysis
        results = []
        for i in range(args.runs):
            r = _analyze_child(run_dir, args.memory_mib, args.spill_dir)
            results.append(r)
            print(
                f"analyze{'' if args.runs == 1 else f' {i + 1}/{args.runs}'}: wall {r['wall_s']:.1f} s, "
                f"CPU {r['cpu_s']:.1f} s (user+sys), peak RSS {r['peak_rss_gib']:.2f} GiB (ru_maxrss of the child), "
                f"{n_chunks / r['wall_s'] / 1e6:.1f} M chunk rows/s"
            )
        if args.runs > 1:
            walls = sorted(x["wall_s"] for x in results)
            print(
                f"analyze: wall best {walls[0]:.1f} s, median {walls[len(walls) // 2]:.1f} s, worst {walls[-1]:.1f} s"
            )
        r = {"wall_s": max(x["wall_s"] for x in results), "peak_rss_gib": max(x["peak_rss_gib"] for x in results)}
        if args.touch_probe is not None:
            _touch_probe(args.touch_probe)
        ok = r["peak_rss_gib"] <= goal_gib and (goal_s is None or r["wall_s"] <= goal_s)
        print(f"goal ({'' if goal_s is None else f'{goal_s:g} s, '}{goal_gib:g} GiB): {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept: {run_dir}")
        else:
            shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        sys.exit(main())
