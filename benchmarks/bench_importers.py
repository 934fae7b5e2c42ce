"""Benchmark: ``loadgen trace import`` of a 1,000,000-row BurstGPT CSV and a 1,000,000-row Bailian JSONL.

Goal (issue 35): each imports in under 10 s and under 1 GiB peak RSS. The source files are written first
(vectorised, timed apart) following the published schemas: BurstGPT's six columns (two models, two log types,
1 % failed requests with 0 response tokens); Bailian sessions of 1-8 turns with ``--hash-ids`` 16-token block
ids per request (the real files carry one per 16 prompt tokens; fewer here keeps the file near 100 MB). The
import runs as a child process (``python -m loadgen trace import KIND FILE --out T``): its wall time, CPU time
(user+sys) and its own peak RSS (ru_maxrss) are printed, then the trace's row count as a check.

    python benchmarks/bench_importers.py                      # both formats, 10^6 rows each
    python benchmarks/bench_importers.py --rows 100000 --kinds burstgpt
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


def write_burstgpt(path: Path, rows: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    stamps = np.cumsum(rng.exponential(0.05, rows)).round(3)
    req = rng.integers(1, 4000, rows)
    resp = np.where(rng.random(rows) < 0.01, 0, rng.integers(1, 1000, rows))
    model = np.where(rng.random(rows) < 0.8, "ChatGPT", "GPT-4")
    log = np.where(rng.random(rows) < 0.6, "Conversation log", "API log")
    body = pc.binary_join_element_wise(
        pa.array(stamps).cast(pa.string()),
        pa.array(model),
        pa.array(req).cast(pa.string()),
        pa.array(resp).cast(pa.string()),
        pa.array(req + resp).cast(pa.string()),
        pa.array(log),
        ",",
    )
    with open(path, "w") as handle:
        handle.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        handle.write("\n".join(body.to_pylist()) + "\n")


def write_bailian(path: Path, rows: int, hash_ids: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    turns = rng.integers(1, 9, rows)  # session sizes, cut to `rows` requests
    sizes = turns[: np.searchsorted(np.cumsum(turns), rows) + 1]
    sizes[-1] -= sizes.sum() - rows
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    chat = np.arange(rows) + 1_000_000
    turn = np.arange(rows) - starts
    parent = np.where(turn == 0, -1, chat - 1)
    stamps = (np.repeat(rng.uniform(0, 7200, len(sizes)), sizes) + turn * 30.0).round(3)
    inputs = rng.integers(16 * hash_ids, 8000, rows)
    outputs = rng.integers(1, 800, rows)
    kinds = np.array(["text", "search", "image", "file"])[rng.integers(0, 4, rows)]
    ids = np.arange(rows * hash_ids).reshape(rows, hash_ids) if hash_ids else None
    lists = ["[" + ",".join(map(str, row)) + "]" for row in ids] if ids is not None else ["[]"] * rows
    with open(path, "w") as handle:
        for i in range(rows):
            handle.write(
                f'{{"chat_id":{chat[i]},"parent_chat_id":{parent[i]},"timestamp":{stamps[i]},'
                f'"input_length":{inputs[i]},"output_length":{outputs[i]},"type":"{kinds[i]}",'
                f'"turn":{turn[i] + 1},"hash_ids":{lists[i]}}}\n'
            )


def run_import(kind: str, src: Path, out: Path, extra: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "loadgen", "trace", "import", kind, str(src), "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"import failed: {res.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": after.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kinds", nargs="+", default=["burstgpt", "bailian"], choices=["burstgpt", "bailian"])
    ap.add_argument("--hash-ids", type=int, default=8, help="hash ids per Bailian request")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for kind in args.kinds:
            src = Path(tmp) / (f"{kind}.csv" if kind == "burstgpt" else f"{kind}.jsonl")
            t0 = time.perf_counter()
            if kind == "burstgpt":
                write_burstgpt(src, args.rows)
                extra = ["--class-by", "model"]
            else:
                write_bailian(src, args.rows, args.hash_ids)
                extra = ["--class-by", "type"]
            made = time.perf_counter() - t0
            size_mib = src.stat().st_size / 2**20
            out = Path(tmp) / f"{kind}.pq"
            got = run_import(kind, src, out, extra)
            rows = pq.read_metadata(out).num_rows
            print(
                f"{kind}: {rows:,} requests imported from a {size_mib:.0f} MiB file (written in {made:.1f} s): "
                f"wall {got['wall_s']:.2f} s, CPU {got['cpu_s']:.2f} s, peak RSS {got['peak_rss_mib']:.0f} MiB "
                f"(goal: < 10 s, < 1024 MiB)"
            )


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
