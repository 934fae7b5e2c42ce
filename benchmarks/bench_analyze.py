"""Benchmark: analyze a synthetic run of 1,000,000 requests and 100,000,000 chunk rows.

Target (issue 5): ``analyze_run`` finishes within 60 s and 8 GiB peak RSS on the 2-core CI machine,
streaming chunks from Parquet. The run is generated here (vectorised numpy → Arrow record batches,
zstd row groups, chunks grouped by request in completion order, one file per table: a merged run
holds the same in one part file per table directory), and
generation time is reported apart from analysis time.

    python benchmarks/bench_analyze.py                       # full size
    python benchmarks/bench_analyze.py --requests 100000 --chunks 10000000
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.manifest import Manifest
from loadgen.records import CHUNKS_FILE, CHUNKS_SCHEMA, REQUESTS_FILE, REQUESTS_SCHEMA
from loadgen.rundir import write_manifest
from loadgen.scenario import load_scenario, scenario_manifest

REPO = Path(__file__).resolve().parents[1]

CLASSES = np.array(["short-message", "long-thread", "burst"])
ID_WIDTH = 8  # "r" + 7 digits


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


def generate_run(run_dir: Path, n_requests: int, n_chunks: int, seed: int = 7) -> dict[str, float]:
    """Write a synthetic run directory; returns counts. Poisson arrivals at 100 req/s, 3 classes."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    rate = 100.0
    scheduled = np.cumsum(rng.exponential(1e9 / rate, n_requests)).astype(np.int64)
    cls = rng.choice(3, n_requests, p=[0.6, 0.25, 0.15])
    # chunk rows per request: ~n_chunks/n_requests on average, summing exactly to n_chunks
    mean_chunks = n_chunks / n_requests
    counts = rng.integers(max(2, int(mean_chunks * 0.6)), int(mean_chunks * 1.4) + 1, n_requests)
    diff = n_chunks - int(counts.sum())
    q, r = divmod(diff, n_requests)
    counts += q
    counts[:r] += 1
    assert counts.sum() == n_chunks and counts.min() >= 2
    status = rng.choice(5, n_requests, p=[0.975, 0.01, 0.005, 0.005, 0.005])  # ok err timeout abandoned cancelled
    queue = rng.exponential(2e5, n_requests).astype(np.int64)
    sent = scheduled + queue
    first_token = sent + rng.lognormal(np.log(2e8), 0.4, n_requests).astype(np.int64)
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
    rel = csum - np.repeat(csum[starts], counts)
    arrival = np.repeat(first_token, counts) + rel
    last_token = arrival[ends - 1]
    done = arrival[ends]
    out_tokens = np.add.reduceat(tokens, starts)
    # requests.parquet
    ok = status == 0
    failed_before = status == 2  # timeouts: no tokens at all
    req = {
        "request_id": _string_array(_ids(np.arange(n_requests))),
        "request_class": pa.array(CLASSES[cls]),
        "warm": pa.array(np.ones(n_requests, dtype=bool)),
        "scheduled_ns": pa.array(scheduled),
        "slot_acquired_ns": pa.array(sent),
        "sent_ns": pa.array(sent),
        "first_byte_ns": pa.array(first_token - 1000),
        "first_token_ns": pa.array(first_token, mask=failed_before),
        "last_token_ns": pa.array(last_token, mask=failed_before),
        "done_ns": pa.array(done),
        "target_prompt_tokens": pa.array(rng.integers(16, 1024, n_requests).astype(np.int32)),
        "target_output_tokens": pa.array(out_tokens.astype(np.int32)),
        "server_output_tokens": pa.array(out_tokens.astype(np.int32), mask=~ok),
        "client_output_tokens": pa.array(out_tokens.astype(np.int32)),
        "chunk_count": pa.array(counts.astype(np.int32)),
        "cancel_after_tokens": pa.array(np.full(n_requests, 8, dtype=np.int32), mask=status != 3),
        "status": pa.array(np.array(["ok", "error", "timeout", "cancelled", "cancelled"])[status]),
        "error_kind": pa.array(
            np.array([None, "http_5xx", "total_timeout", None, "run_interrupted"], dtype=object)[status]
        ),
    }
    n = n_requests
    columns = [req.get(f.name, pa.nulls(n, f.type)) for f in REQUESTS_SCHEMA]
    table = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(columns, REQUESTS_SCHEMA)], schema=REQUESTS_SCHEMA)
    # small row groups (2,000 requests, 40,000 chunks), as a run of many flushes has
    pq.write_table(table, run_dir / REQUESTS_FILE, compression="zstd", row_group_size=2_000)
    del table, columns, req
    # chunks.parquet, grouped by request in completion order (not request-id order)
    order = np.argsort(done, kind="stable")
    id_matrix = _ids(np.arange(n_requests))
    writer = pq.ParquetWriter(run_dir / CHUNKS_FILE, CHUNKS_SCHEMA, compression="zstd")
    per_batch = 20_000
    for b in range(0, n_requests, per_batch):
        reqs = order[b : b + per_batch]
        c = counts[reqs]
        seg_start = starts[reqs]
        local = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        rows = np.repeat(seg_start, c) + local
        batch = pa.record_batch(
            [
                _string_array(np.repeat(id_matrix[reqs], c, axis=0)),
                pa.array(local.astype(np.int32)),
                pa.array(arrival[rows]),
                pa.array(tokens[rows]),
                pa.array(np.full(len(rows), 180, dtype=np.int32)),
            ],
            schema=CHUNKS_SCHEMA,
        )
        writer.write_batch(batch, row_group_size=40_000)
    writer.close()
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
    return {"requests": n_requests, "chunks": n_chunks}


class _PeakRss:
    """Samples this process's RSS every 50 ms (ru_maxrss also reported; it includes generation)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(0.05)

    def __enter__(self) -> Self:
        self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--chunks", type=int, default=100_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="reuse/keep the run here (default: a temp dir, removed)")
    parser.add_argument("--html", action="store_true", help="also render the HTML report (timed apart)")
    args = parser.parse_args()
    tmp = None
    run_dir = args.dir
    if run_dir is None:
        tmp = tempfile.mkdtemp(prefix="loadgen-bench-")
        run_dir = Path(tmp) / "run"
    try:
        if not (run_dir / CHUNKS_FILE).exists():
            t0 = time.perf_counter()
            generate_run(run_dir, args.requests, args.chunks)
            gen_s = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in run_dir.iterdir())
            print(
                f"generate: {args.requests:,} requests, {args.chunks:,} chunk rows in {gen_s:.1f} s "
                f"({size / 2**20:.0f} MiB on disk)"
            )
        from loadgen.analysis import analyze_run

        with _PeakRss() as rss:
            t0 = time.perf_counter()
            analysis = analyze_run(run_dir)
            wall = time.perf_counter() - t0
        rows = args.requests + args.chunks
        print(
            f"analyze: wall {wall:.2f} s, peak RSS {rss.peak / 2**30:.2f} GiB (sampled), "
            f"{rows / wall / 1e6:.2f} M rows/s ({args.chunks / wall / 1e6:.2f} M chunk rows/s)"
        )
        print(
            f"analyze: ru_maxrss over the whole process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
        )
        overall = analysis.overall.metrics
        print("check: itl_ms", json.dumps(overall["itl_ms"]))
        print("check: ttft_ms", json.dumps(overall["ttft_ms"]))
        verdict = "PASS" if wall <= 60 and rss.peak <= 8 * 2**30 else "FAIL"
        print(f"target (60 s, 8 GiB): {verdict}")
        if args.html:
            from loadgen.analysis import write_html

            t0 = time.perf_counter()
            write_html(analysis, Path(run_dir) / "report.html")
            print(f"html: {time.perf_counter() - t0:.1f} s")
        return 0 if verdict == "PASS" else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
