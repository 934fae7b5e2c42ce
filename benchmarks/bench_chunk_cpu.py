"""Client CPU per received chunk: ``loadgen run`` against ``vllm bench serve``, same server, start-up subtracted.

Both tools stream the same requests (32 prompt / 64 output tokens, closed loop at ``--concurrency``) from
the simulated engine on loopback. Each runs ``--small`` and ``--large`` requests as a child process whose
CPU time (user+sys, from ``wait4``: it survives a loaded machine, wall time does not) is measured; the
marginal CPU per chunk is the difference of the two CPU times over the difference of the chunks received,
so start-up (imports, tokenizer, Parquet set-up) cancels out. ``--repeats`` pairs per tool, interleaved;
the table gives each repeat and the medians. A comparator that cannot run is reported with the reason.

Two servers (``--servers``):
- ``paced``: a step every ``--step-ms`` gives each stream one token, one event per token (no coalescing), so
  every chunk is its own network read for both tools: the per-chunk cost as a real engine's pace makes it.
  The step is 4 ms: at 1 ms, 32 streams send an event every ~31 µs, about what either client spends on one,
  so the client's core saturates, events pile up between its reads, and its per-chunk figure falls with its
  reads per chunk (``vllm bench serve`` moved between 28 and 78 µs across invocations there). Each tool's
  CPU share in its large runs is printed, so a saturated client shows.
- ``instant``: the ``instant`` preset writes as fast as it can and merges tokens that piled up, so a client
  that reads more slowly gets several events per read and pays fewer system calls per chunk (its figure
  drops); loadgen's reads per chunk are printed.

It also runs one open-loop Poisson trace at ``--lag-rate`` req/s × 16-token streams against the instant
server and prints the driver's send-lag p50/p99 from the run manifest (the issue's goal: p99 < 1 ms at
2,500 req/s on one core; on a machine shared with other work it measures the machine as much as the driver).

    python benchmarks/bench_chunk_cpu.py
    python benchmarks/bench_chunk_cpu.py --loadgen-path /tmp/base   # another checkout, for before/after
    python benchmarks/bench_chunk_cpu.py --pin 0:1                  # client and server on a core each
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import canned_server as canned
from bench_driver import PROMPT_TOKENS, make_tokenizer_dir, poisson_trace
from canned_server import vllm_event

from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.targets import launch_sim_server
from loadgen.trace.io import write_trace

VLLM_PY = Path(os.environ.get("LOADGEN_VLLM_PYTHON", "/root/.cache/loadgen/vllm-venv/bin/python"))
OUTPUT_TOKENS = 64


def _child(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str, float]:
    """Run ``cmd``; (CPU s user+sys of the child and the children it reaped, its output, wall s). Raises on
    failure."""
    with tempfile.TemporaryFile(mode="w+") as out:
        start = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {rc}: {text[-600:]}")
    return usage.ru_utime + usage.ru_stime, text, wall


def _closed_trace(path: Path, n: int, concurrency: int) -> Path:
    rows = {
        "request_id": [f"c{i:07d}" for i in range(n)],
        "request_class": ["short-message"] * n,
        "scheduled_offset_ns": [0] * n,
        "prompt_tokens": [PROMPT_TOKENS] * n,
        "output_tokens": [OUTPUT_TOKENS] * n,
        **{k: [None] * n for k in ("prefix_group", "prefix_tokens", "conversation_id", "turn_index")},
        "cancel_after_tokens": [None] * n,
    }
    meta = {"mode": "closed", "concurrency": concurrency, "trace_name": "closed", "seed": 0}
    return write_trace(pa.table(rows, schema=TRACE_SCHEMA), path, meta)


def _loadgen_env(loadgen_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(loadgen_path)}


def loadgen_run(url: str, work: Path, n: int, concurrency: int, loadgen_path: Path) -> tuple[float, int, float]:
    """(CPU s, chunks received, wall s) of one ``loadgen run`` of ``n`` requests (its CPU includes the part
    writer process's, which it reaps)."""
    out = work / f"run-{n}"
    shutil.rmtree(out, ignore_errors=True)
    trace = _closed_trace(work / f"closed-{n}.parquet", n, concurrency)
    cmd = [sys.executable, "-m", "loadgen", "run", str(trace), "--target", url, "--out", str(out)]
    cpu, _, wall = _child(
        [*cmd, "--scrape-metrics", "off", "--progress", "off"], _loadgen_env(loadgen_path), loadgen_path
    )
    m = json.loads((out / "manifest.json").read_text())
    if m["status_counts"].get("ok") != n:
        raise RuntimeError(f"loadgen run: {m['status_counts']}: expected {n} ok")
    return cpu, int(m["chunks_recorded"]), wall


def vllm_run(url: str, work: Path, n: int, concurrency: int) -> tuple[float, int, float]:
    """(CPU s, requests completed, wall s) of one ``vllm bench serve`` of ``n`` requests (chunks: n ×
    per-request)."""
    wrapper = work / "vllm_bench.py"
    wrapper.write_text(
        "import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
    )
    tok = make_tokenizer_dir(work / "tokenizer")
    cmd = [str(VLLM_PY), str(wrapper), "--backend", "openai", "--base-url", url, "--model", "loadgen-sim"]
    cmd += ["--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS)]
    cmd += ["--random-output-len", str(OUTPUT_TOKENS), "--num-prompts", str(n), "--request-rate", "inf"]
    cmd += ["--max-concurrency", str(concurrency), "--ignore-eos", "--tokenizer", str(tok), "--seed", "7"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cpu, text, wall = _child(cmd, env, work)
    ok = [line for line in text.splitlines() if line.startswith("Successful requests:")]
    done = int(ok[-1].split()[-1]) if ok else 0
    if done != n:
        raise RuntimeError(f"vllm bench serve: {done} of {n} successful: {text[-600:]}")
    return cpu, done, wall


def send_lag(url: str, work: Path, rate: float, seconds: float, loadgen_path: Path, server_pid: int | None) -> dict:
    """One open-loop run at ``rate`` req/s × 16 tokens: the driver's send lag, its CPU, and the server's CPU
    share over the run (a server that needs its whole core falls behind, and then so does the schedule)."""
    import psutil

    trace = work / "lag.parquet"
    n = poisson_trace(trace, rate, seconds, output_tokens=16)
    out = work / "run-lag"
    shutil.rmtree(out, ignore_errors=True)
    server = psutil.Process(server_pid) if server_pid else None
    before = sum(server.cpu_times()[:2]) if server else 0.0
    cmd = [sys.executable, "-m", "loadgen", "run", str(trace), "--target", url, "--out", str(out)]
    cpu, _, _ = _child([*cmd, "--scrape-metrics", "off", "--progress", "off"], _loadgen_env(loadgen_path), loadgen_path)
    m = json.loads((out / "manifest.json").read_text())
    lag = m.get("send_lag_ns") or {}
    duration = m.get("duration_s") or seconds
    return {
        "n": n,
        "ok": m["status_counts"].get("ok", 0),
        "p50_ms": (lag.get("p50") or 0) / 1e6,
        "p99_ms": (lag.get("p99") or 0) / 1e6,
        "cpu_s": cpu,
        "run_cpu_s": m["driver"]["process_cpu_s"],
        "connections": m["driver"].get("connections_opened"),
        "server_share": (sum(server.cpu_times()[:2]) - before) / duration if server else float("nan"),
    }


def per_chunk_path(streams: int) -> float:
    """CPU µs per chunk of the driver's per-read path alone (``StreamState.feed``: SSE split, JSON parse,
    token count, timestamps kept), one network read per chunk as at token pace; in this process."""
    import time
    from types import SimpleNamespace

    from loadgen.driver.client import StreamState
    from loadgen.driver.sse import DEFAULT_MAX_LINE_BYTES

    reads = [vllm_event(i, i == OUTPUT_TOKENS - 1) for i in range(OUTPUT_TOKENS)] + [b"data: [DONE]\n\n"]
    ctx = SimpleNamespace(  # counts every text by its length, kept nowhere
        anchor_ns=0,
        max_sse_line_bytes=DEFAULT_MAX_LINE_BYTES,
        retain_completion_text=False,
        _token_cache={},
        count_tokens=len,
        remember=lambda text, n: n,
    )
    clock = time.perf_counter_ns
    t0 = time.process_time()
    for _ in range(streams):
        state = StreamState(ctx, None, None)  # type: ignore[arg-type]
        for data in reads:
            state.feed(clock(), data)
    return (time.process_time() - t0) / (streams * OUTPUT_TOKENS) * 1e6


def _pin(spec: str) -> str:
    """``CLIENT:SERVER`` CPU lists, as ``loadgen --client-cpus CLIENT --engine-cpus SERVER`` sets them: the simulated
    server is launched onto SERVER (``loadgen.util.pinning``), and this process, so every tool it runs, onto CLIENT."""
    from loadgen.util import pinning

    client_text, _, server_text = spec.partition(":")
    server = pinning.parse_cpus(server_text, what="--pin")
    os.environ[pinning.ENGINE_CPUS_ENV] = pinning.format_cpus(server)
    pinning.pin(0, pinning.parse_cpus(client_text, what="--pin"))
    return f"pinned: clients on CPU {client_text}, simulated server on CPU {pinning.format_cpus(server)}"


PACED_TOML = """# bench_chunk_cpu: the instant preset with a {step_ms} ms decode step and no coalescing, so every token is
# its own SSE event and, at this pace, its own network read, for every client alike
name = "paced"
description = "bench_chunk_cpu: {step_ms} ms per step, one event per token"
model = "loadgen-sim"
tokenizer = "cl100k_base"
[scheduler]
max_num_seqs = 1024
max_num_batched_tokens = 1048576
chunked_prefill = true
max_model_len = 131072
[kv]
block_size = 16
num_kv_blocks = 1048576
enable_prefix_caching = false
[cost]
fixed_ms = {step_ms}
[batching]
window_ms = 0
[stream]
coalesce = false
"""


def reads_per_chunk(run_dir: Path) -> float:
    """Network reads per chunk in a loadgen run: chunks that arrived in one read share their arrival instant."""
    import pyarrow.compute as pc

    from loadgen.rundir.io import load_run

    chunks = load_run(run_dir).chunks
    keys = pc.binary_join_element_wise(chunks["request_id"], pc.cast(chunks["arrival_ns"], pa.string()), pa.scalar(":"))
    return len(pc.unique(keys)) / max(1, chunks.num_rows)


def measure(server: str, url: str, work: Path, args) -> dict:
    """Both tools' marginal CPU per chunk against one server, ``args.repeats`` times, interleaved."""
    loadgen_marginal: list[float] = []
    vllm_marginal: list[float] = []
    note = ""
    per_request = reads = float("nan")
    load: dict[str, list[float]] = {"loadgen": [], "vllm": []}  # CPU / wall of each large run, in cores
    for _ in range(args.repeats):
        a_cpu, a_chunks, _ = loadgen_run(url, work, args.small, args.concurrency, args.loadgen_path)
        b_cpu, b_chunks, b_wall = loadgen_run(url, work, args.large, args.concurrency, args.loadgen_path)
        load["loadgen"].append(b_cpu / b_wall)
        per_request = b_chunks / args.large
        reads = reads_per_chunk(work / f"run-{args.large}")
        loadgen_marginal.append((b_cpu - a_cpu) / (b_chunks - a_chunks) * 1e6)
        if args.skip_vllm:
            note = "vllm bench serve: skipped (--skip-vllm)"
            continue
        if not VLLM_PY.exists():
            note = f"vllm bench serve: skipped ({VLLM_PY} not found)"
            continue
        try:
            va_cpu, va_n, _ = vllm_run(url, work, args.small, args.concurrency)
            vb_cpu, vb_n, vb_wall = vllm_run(url, work, args.large, args.concurrency)
            load["vllm"].append(vb_cpu / vb_wall)
        except (OSError, RuntimeError) as exc:
            note = f"vllm bench serve: could not run: {str(exc).splitlines()[0][:300]}"
            continue
        # the same requests, so the same events per request (every token its own event on the paced server;
        # on the instant one a slower reader may get tokens merged into fewer events: its figure is then low)
        vllm_marginal.append((vb_cpu - va_cpu) / ((vb_n - va_n) * per_request) * 1e6)
    return {
        "server": server,
        "loadgen": loadgen_marginal,
        "vllm": vllm_marginal,
        "per_request": per_request,
        "reads_per_chunk": reads,
        "load": load,
        "note": note,
    }


def host_gaps(seconds: float = 4.0) -> dict:
    """The host's own stalls on this core: a process that only reads the clock, and the gaps it sees
    (a VM's vCPU descheduled, an interrupt storm): a floor under any send-lag figure measured here."""
    end = time.perf_counter_ns() + int(seconds * 1e9)
    prev = time.perf_counter_ns()
    gaps: list[int] = []
    while prev < end:
        now = time.perf_counter_ns()
        if now - prev > 200_000:
            gaps.append(now - prev)
        prev = now
    return {"over_1ms": sum(g > 1_000_000 for g in gaps), "longest_ms": max(gaps, default=0) / 1e6, "seconds": seconds}


def _lag_runs(url: str, server_pid: int | None, work: Path, args) -> list[dict]:
    return [
        send_lag(url, work, args.lag_rate, args.lag_seconds, args.loadgen_path, server_pid)
        for _ in range(args.lag_repeats)
    ]


@contextlib.contextmanager
def canned_server():
    """``benchmarks/canned_server.py`` (16-token streams) on the server CPUs of ``--pin``: (url, pid)."""
    from loadgen.util import pinning

    with canned.launch(16, [pinning.engine_cpus()]) as (url, pids):
        yield url, pids[0]


def _fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values) if values else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200, help="requests in the short run (start-up cost)")
    ap.add_argument("--large", type=int, default=2000, help="requests in the long run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="small/large pairs per tool and server, interleaved")
    ap.add_argument(
        "--servers",
        default="paced,instant",
        help="paced: a token every --step-ms per stream, one event and one read per token for every client; "
        "instant: tokens as fast as the server writes them (reads then carry several events, fewer for a "
        "slower client)",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=4.0,
        help="the paced server's step (every stream gets a token); at 1 ms, 32 streams send an event every ~31 µs, "
        "as much as a client spends on one, so its core saturates and its reads start to carry several events",
    )
    ap.add_argument("--lag-rate", type=float, default=2500.0, help="req/s of the send-lag run (0: skip it)")
    ap.add_argument("--lag-seconds", type=float, default=4.0)
    ap.add_argument("--lag-repeats", type=int, default=3, help="send-lag runs (each its own process)")
    ap.add_argument(
        "--lag-server",
        choices=["canned", "instant"],
        default="canned",
        help="the send-lag runs' server: canned (benchmarks/canned_server.py, the least server CPU per token: at "
        "2,500 req/s the simulated server needs most of a core here and falls behind first) or the instant sim",
    )
    ap.add_argument("--loadgen-path", type=Path, default=REPO, help="checkout whose loadgen runs (before/after)")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--path-only", action="store_true", help="only the in-process per-chunk path figure")
    ap.add_argument(
        "--pin",
        metavar="CLIENT:SERVER",
        help="CPU lists, e.g. 0:1: each tool on CLIENT and the simulated server on SERVER (Linux), so the client has a "
        "core of its own, as the send-lag goal assumes",
    )
    args = ap.parse_args()
    if str(args.loadgen_path) != str(REPO):
        sys.path.insert(0, str(args.loadgen_path))
        for name in [m for m in sys.modules if m == "loadgen" or m.startswith("loadgen.")]:
            del sys.modules[name]
    path_us = min(per_chunk_path(2000) for _ in range(3))
    print(f"per-chunk path (StreamState.feed, one read per chunk, in-process): {path_us:.2f} CPU µs/chunk (best of 3)")
    if args.path_only:
        return 0
    if args.pin:
        print(_pin(args.pin))
    results = []
    lags: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="loadgen-chunkcpu-") as tmp:
        work = Path(tmp)
        for server in args.servers.split(","):
            engine: str | Path = "instant"
            if server == "paced":
                engine = work / "paced.toml"
                engine.write_text(PACED_TOML.format(step_ms=args.step_ms))
            with launch_sim_server(engine) as sim:
                results.append(measure(server, sim.base_url, work, args))
                if server == "instant" and args.lag_rate and args.lag_server == "instant":
                    lags = _lag_runs(sim.base_url, sim.server.pid, work, args)
        if not lags and args.lag_rate:
            if args.lag_server == "canned":
                with canned_server() as (url, pid):
                    lags = _lag_runs(url, pid, work, args)
            else:
                with launch_sim_server("instant") as sim:
                    lags = _lag_runs(sim.base_url, sim.server.pid, work, args)
    print(
        f"marginal client CPU per received chunk (µs; ΔCPU / Δchunks between {args.small} and {args.large} requests of "
        f"{OUTPUT_TOKENS} tokens, concurrency {args.concurrency}; each repeat, then the median)"
    )
    print(f"{'server':<9} {'reads/chunk':>11} {'loadgen run':>24} {'vllm bench serve':>24} {'ratio':>6}")
    for r in results:
        lg = statistics.median(r["loadgen"]) if r["loadgen"] else float("nan")
        vl = statistics.median(r["vllm"]) if r["vllm"] else float("nan")
        print(
            f"{r['server']:<9} {r['reads_per_chunk']:>11.2f} {_fmt(r['loadgen']) + f' ({lg:.1f})':>24} "
            f"{_fmt(r['vllm']) + f' ({vl:.1f})':>24} {lg / vl:>6.2f}"
        )
        shares = {tool: max(values) for tool, values in r["load"].items() if values}
        print(
            "  "
            + ", ".join(f"{tool}: up to {share:.2f} of a core" for tool, share in shares.items())
            + " in the large runs"
        )
        if r["note"]:
            print(f"  {r['note']}")
    print("(reads/chunk: loadgen's network reads per event in its large run; ratio: the medians, the goal <= 0.5)")
    if lags:
        print(
            f"send lag at {args.lag_rate:g} req/s × 16 tokens, {args.lag_seconds:g} s, open loop, {args.lag_server} "
            "server (goal p99 < 1 ms); server: its CPU over the run, in cores"
        )
        for lag in lags:
            print(
                f"  p50 {lag['p50_ms']:.2f} ms, p99 {lag['p99_ms']:.2f} ms ({lag['ok']}/{lag['n']} ok); driver CPU "
                f"{lag['run_cpu_s']:.2f} s in the run ({lag['cpu_s']:.1f} s in all), {lag['connections']} connections; "
                f"server {lag['server_share']:.2f}{' (saturated)' if lag['server_share'] >= 0.9 else ''}"
            )
        print(f"  median p99 {statistics.median(lag['p99_ms'] for lag in lags):.2f} ms over {len(lags)} runs")
        gaps = host_gaps(args.lag_seconds)
        print(
            f"  host: a process that only reads the clock on this core saw {gaps['over_1ms']} gaps over 1 ms in "
            f"{gaps['seconds']:g} s (longest {gaps['longest_ms']:.1f} ms): requests due in one are late by it"
        )
    return 0


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        sys.exit(main())
