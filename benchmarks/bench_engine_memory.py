"""Launch-to-launch spread of a vLLM engine's peak memory, by how it is counted.

Launches the same vLLM (``loadgen vllm run``: the tiny Llama with dummy weights, a fixed KV cache,
eager mode, or vLLM's compiled default with ``--compile``) ``--launches`` times, replays the same short trace each time, and prints, per launch, the
process tree's peak memory four ways (``engine_notes.memory`` of each run's manifest):

- ``rss``: the highest sampled sum of RSS over the tree (what the ledger's runtime line is fitted to);
- ``held``: the highest sampled sum of RssAnon + RssShmem (heaps, tensors, the KV cache, IPC buffers);
- ``file``: the highest sampled sum of RssFile (mapped libraries: counted once per process mapping them);
- ``hwm``: the sum of every process's kernel high-water mark (VmHWM), which sampling cannot miss;

then each figure's spread over the launches, (max − min) / mean. The ledger's runtime line can only
predict a peak within 10% if the peak itself repeats within that. Figures, not assertions.

    python benchmarks/bench_engine_memory.py --launches 3          # needs LOADGEN_VLLM_PYTHON (see .ci/vllm.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.trace.io import write_trace
from loadgen.vllm import make_model_dir

GIB = 1 << 30
FIGURES = {
    "rss": "rss_high_water_bytes",
    "held": "held_high_water_bytes",
    "file": "file_backed_high_water_bytes",
    "hwm": "hwm_sum_bytes",
}


def _trace(path: Path, requests: int, rate_rps: float) -> Path:
    rows = [
        {
            "request_id": f"m{i:04d}",
            "request_class": "short-message",
            "scheduled_offset_ns": int(i * 1e9 / rate_rps),
            "prompt_tokens": 128,
            "output_tokens": 32,
        }
        for i in range(requests)
    ]
    meta = {"mode": "open", "max_in_flight": 64, "trace_name": "bench-engine-memory", "seed": 1}
    return write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path, meta)


def _launch(work: Path, model: Path, trace: Path, i: int, kv_gib: int, eager: bool) -> dict[str, int]:
    out = work / f"run-{i}"
    cmd = [sys.executable, "-m", "loadgen"]
    if (os.cpu_count() or 1) >= 2:  # engine and client on separate cores, as calibration runs
        cmd += ["--client-cpus", "0", "--engine-cpus", "1"]
    cmd += ["vllm", "run", "--model-dir", str(model), "--kv-cache-gib", str(kv_gib), "--max-model-len", "1000"]
    cmd += ["--trace", str(trace), "--out", str(out)] + (["--", "--enforce-eager"] if eager else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    memory = json.loads((out / "manifest.json").read_text())["engine_notes"]["memory"]
    return {name: int(memory[key]) for name, key in FIGURES.items() if memory.get(key) is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate-rps", type=float, default=4.0)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="vLLM's default compiled mode, not --enforce-eager")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    if not os.environ.get("LOADGEN_VLLM_PYTHON"):
        sys.exit(
            "set LOADGEN_VLLM_PYTHON to a vLLM interpreter: export LOADGEN_VLLM_PYTHON=$(bash .ci/vllm.sh | tail -1)"
        )
    work = Path(tempfile.mkdtemp(prefix="bench-engine-memory-", dir=args.dir))
    model = make_model_dir("tiny-llama-gqa", work / "model")
    trace = _trace(work / "trace.parquet", args.requests, args.rate_rps)
    launches = []
    for i in range(args.launches):
        figures = _launch(work, model, trace, i, args.kv_cache_gib, not args.compile)
        launches.append(figures)
        print(f"launch {i}: " + "  ".join(f"{k} {v / GIB:.3f} GiB" for k, v in figures.items()), flush=True)
    print(f"spread over {len(launches)} launches, (max - min) / mean:")
    for name in FIGURES:
        values = [f[name] for f in launches if name in f]
        if len(values) == len(launches):
            mean = sum(values) / len(values)
            print(f"  {name:5s} mean {mean / GIB:.3f} GiB  spread {(max(values) - min(values)) / mean:.1%}")
    print(f"runs under {work}")


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
