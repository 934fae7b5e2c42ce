"""Client CPU per received chunk: ``loadgen run`` against ``vllm bench serve``, same server, start-up subtracted.

Both tools stream the same requests (32 prompt / 64 output tokens, one token per SSE chunk, closed loop
at ``--concurrency``) from the simulated engine's ``instant`` preset on loopback. Each runs twice, with
``--small`` and ``--large`` requests, as a child process whose CPU time (user+sys, from ``wait4``: it
survives a loaded machine, wall time does not) is measured; the marginal CPU per chunk is the
difference of the two CPU times over the difference of the chunks received, so start-up (imports,
tokenizer, Parquet set-up) cancels out. A comparator that cannot run is reported with the reason.

It also runs one open-loop Poisson trace at ``--lag-rate`` req/s × 16-token streams and prints the
driver's send-lag p50/p99 from the run manifest (the issue's goal: p99 < 1 ms at 2,500 req/s on one
core; on a machine shared with other work it measures the machine as much as the driver).

    python benchmarks/bench_chunk_cpu.py
    python benchmarks/bench_chunk_cpu.py --loadgen-path /tmp/base   # another checkout, for before/after
    python benchmarks/bench_chunk_cpu.py --pin 0:1                  # client and server on a core each
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_driver import PROMPT_TOKENS, make_tokenizer_dir, poisson_trace

from loadgen.records import TRACE_SCHEMA
from loadgen.targets import launch_sim_server
from loadgen.trace.io import write_trace

VLLM_PY = Path(os.environ.get("LOADGEN_VLLM_PYTHON", "/root/.cache/loadgen/vllm-venv/bin/python"))
OUTPUT_TOKENS = 64


def _child(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    """Run ``cmd``; (CPU s user+sys of the child alone, its output). Raises on failure."""
    with tempfile.TemporaryFile(mode="w+") as out:
        child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        out.seek(0)
        text = out.read()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {rc}: {text[-600:]}")
    return usage.ru_utime + usage.ru_stime, text


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


def loadgen_run(url: str, work: Path, n: int, concurrency: int, loadgen_path: Path) -> tuple[float, int]:
    """(CPU s, chunks received) of one ``loadgen run`` of ``n`` requests."""
    out = work / f"run-{n}"
    trace = _closed_trace(work / f"closed-{n}.parquet", n, concurrency)
    cmd = [sys.executable, "-m", "loadgen", "run", str(trace), "--target", url, "--out", str(out)]
    cpu, _ = _child([*cmd, "--scrape-metrics", "off", "--progress", "off"], _loadgen_env(loadgen_path), loadgen_path)
    m = json.loads((out / "manifest.json").read_text())
    if m["status_counts"].get("ok") != n:
        raise RuntimeError(f"loadgen run: {m['status_counts']}: expected {n} ok")
    return cpu, int(m["chunks_recorded"])


def vllm_run(url: str, work: Path, n: int, concurrency: int) -> tuple[float, int]:
    """(CPU s, requests completed) of one ``vllm bench serve`` of ``n`` requests (chunks: n × per-request)."""
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
    cpu, text = _child(cmd, env, work)
    ok = [line for line in text.splitlines() if line.startswith("Successful requests:")]
    done = int(ok[-1].split()[-1]) if ok else 0
    if done != n:
        raise RuntimeError(f"vllm bench serve: {done} of {n} successful: {text[-600:]}")
    return cpu, done


def send_lag(url: str, work: Path, rate: float, seconds: float, loadgen_path: Path) -> dict[str, float]:
    trace = work / "lag.parquet"
    n = poisson_trace(trace, rate, seconds, output_tokens=16)
    out = work / "run-lag"
    cmd = [sys.executable, "-m", "loadgen", "run", str(trace), "--target", url, "--out", str(out)]
    cpu, _ = _child([*cmd, "--scrape-metrics", "off", "--progress", "off"], _loadgen_env(loadgen_path), loadgen_path)
    m = json.loads((out / "manifest.json").read_text())
    lag = m.get("send_lag_ns") or {}
    return {
        "n": n,
        "ok": m["status_counts"].get("ok", 0),
        "p50_ms": (lag.get("p50") or 0) / 1e6,
        "p99_ms": (lag.get("p99") or 0) / 1e6,
        "cpu_s": cpu,
    }


def _vllm_event(i: int, last: bool) -> bytes:
    """One event as vLLM's OpenAI completions stream sends it (with continuous usage stats)."""
    usage = f'{{"prompt_tokens":32,"total_tokens":{33 + i},"completion_tokens":{i + 1}}}'
    finish = '"length"' if last else "null"
    return (
        f'data: {{"id":"cmpl-8d1f0c2b6a4e4f0b9d3c","object":"text_completion","created":1764576000,'
        f'"model":"loadgen-sim","choices":[{{"index":0,"text":" w{i}","logprobs":null,"finish_reason":{finish},'
        f'"stop_reason":null}}],"usage":{usage}}}\n\n'
    ).encode()


def per_chunk_path(streams: int) -> float:
    """CPU µs per chunk of the driver's per-read path alone (``StreamState.feed``: SSE split, JSON parse,
    token count, timestamps kept), one network read per chunk as at token pace; in this process."""
    import time
    from types import SimpleNamespace

    from loadgen.driver.client import StreamState
    from loadgen.driver.sse import DEFAULT_MAX_LINE_BYTES

    reads = [_vllm_event(i, i == OUTPUT_TOKENS - 1) for i in range(OUTPUT_TOKENS)] + [b"data: [DONE]\n\n"]
    ctx = SimpleNamespace(
        anchor_ns=0, max_sse_line_bytes=DEFAULT_MAX_LINE_BYTES, retain_completion_text=False, tokens_in=len
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
    server is launched onto SERVER (``loadgen.pinning``), and this process, so every tool it runs, onto CLIENT."""
    from loadgen import pinning

    client_text, _, server_text = spec.partition(":")
    server = pinning.parse_cpus(server_text, what="--pin")
    os.environ[pinning.ENGINE_CPUS_ENV] = pinning.format_cpus(server)
    pinning.pin(0, pinning.parse_cpus(client_text, what="--pin"))
    return f"pinned: clients on CPU {client_text}, simulated server on CPU {pinning.format_cpus(server)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200, help="requests in the short run (start-up cost)")
    ap.add_argument("--large", type=int, default=2000, help="requests in the long run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--lag-rate", type=float, default=2500.0, help="req/s of the send-lag run (0: skip it)")
    ap.add_argument("--lag-seconds", type=float, default=4.0)
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
    rows: list[tuple[str, int, int, float, float]] = []
    if args.pin:
        print(_pin(args.pin))
    with tempfile.TemporaryDirectory(prefix="loadgen-chunkcpu-") as tmp, launch_sim_server("instant") as sim:
        work = Path(tmp)
        a_cpu, a_chunks = loadgen_run(sim.base_url, work, args.small, args.concurrency, args.loadgen_path)
        b_cpu, b_chunks = loadgen_run(sim.base_url, work, args.large, args.concurrency, args.loadgen_path)
        per_request = b_chunks / args.large
        marginal = (b_cpu - a_cpu) / (b_chunks - a_chunks) * 1e6
        rows += [("loadgen run", args.small, a_chunks, a_cpu, float("nan"))]
        rows += [("loadgen run", args.large, b_chunks, b_cpu, marginal)]
        vllm_note = ""
        if args.skip_vllm:
            vllm_note = "vllm bench serve: skipped (--skip-vllm)"
        elif not VLLM_PY.exists():
            vllm_note = f"vllm bench serve: skipped ({VLLM_PY} not found)"
        else:
            try:
                va_cpu, va_n = vllm_run(sim.base_url, work, args.small, args.concurrency)
                vb_cpu, vb_n = vllm_run(sim.base_url, work, args.large, args.concurrency)
                va_chunks, vb_chunks = round(va_n * per_request), round(vb_n * per_request)
                v_marginal = (vb_cpu - va_cpu) / (vb_chunks - va_chunks) * 1e6
                rows += [("vllm bench serve", args.small, va_chunks, va_cpu, float("nan"))]
                rows += [("vllm bench serve", args.large, vb_chunks, vb_cpu, v_marginal)]
                vllm_note = f"ratio loadgen / vllm bench serve (marginal CPU per chunk): {marginal / v_marginal:.2f}"
            except (OSError, RuntimeError) as exc:
                vllm_note = f"vllm bench serve: could not run: {str(exc).splitlines()[0][:300]}"
        lag = (
            send_lag(sim.base_url, work, args.lag_rate, args.lag_seconds, args.loadgen_path) if args.lag_rate else None
        )
    print(f"{'tool':<18} {'requests':>9} {'chunks':>9} {'CPU s':>8} {'CPU µs/chunk marginal':>22}")
    for tool, n, chunks, cpu, marg in rows:
        print(f"{tool:<18} {n:>9} {chunks:>9} {cpu:>8.2f} {'' if marg != marg else f'{marg:.1f}':>22}")
    print(f"({per_request:.0f} chunks per request; marginal = ΔCPU / Δchunks between the two runs of each tool)")
    print(vllm_note)
    if lag is not None:
        print(
            f"send lag at {args.lag_rate:g} req/s × 16 tokens, {args.lag_seconds:g} s: p50 {lag['p50_ms']:.2f} ms, "
            f"p99 {lag['p99_ms']:.2f} ms ({lag['ok']}/{lag['n']} ok, driver CPU {lag['cpu_s']:.1f} s; goal p99 < 1 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
