"""Scaling benchmark: does one run over N worker processes deliver N times one worker's rate?

For each per-worker rate R and worker count N, one `loadgen run` (the real CLI) replays a Poisson trace
offered at N x R requests/s (32 prompt / 16 output tokens by default) against ``benchmarks/canned_server.py``
(the least server CPU per token), run as K processes on one port (SO_REUSEPORT), each pinned to its own
core, so that the target is not what is measured. The client (coordinator and every worker) runs on the
other cores. For every run it prints

* the delivered rate: ok requests / (last reply end - first send), from the merged run's records;
* the scaling efficiency: delivered(N) / (N x delivered(1)) at the same per-worker rate;
* the send-lag p99 over every worker (the coordinator's exact merge of the workers' raw lags);
* the client CPU per request (summed over workers) and the coordinator's own CPU and set-up time.

A 2-core host has no room for this (one client core): it needs at least N + 1 client cores and K target
cores, and says so. ``--json FILE`` keeps the figures.

    python benchmarks/bench_scale.py --workers 1,2,4,8 --rates 2000,2500 --target-processes 4
    python benchmarks/bench_scale.py --workers 1,2,4,8 --rates 2000 --target-processes 4 --ray   # Ray actors
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import canned_server as canned
from bench_driver import poisson_trace
from bench_workers import run_config


def split_cores(target_processes: int) -> tuple[set[int], list[set[int]]]:
    """(client cores, one core per target process): the target on the last cores."""
    avail = sorted(os.sched_getaffinity(0))
    if len(avail) <= target_processes:
        raise SystemExit(f"{len(avail)} usable cores: no room for {target_processes} target processes and a client")
    return set(avail[:-target_processes]), [{c} for c in avail[-target_processes:]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts (1: one process)")
    parser.add_argument("--rates", default="2000", help="comma-separated offered rates per worker (requests/s)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="trace length per run")
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request (SSE chunks)")
    parser.add_argument("--target-processes", type=int, default=2, help="canned server processes, one core each")
    parser.add_argument(
        "--ray", action="store_true", help="workers as actors on a local Ray (N > 1; N = 1 stays one process)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    client, target = split_cores(args.target_processes)
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(
        f"pinning: target ({len(target)} processes) on {sorted(c for s in target for c in s)}, client on {sorted(client)}"
    )
    if max(counts) + 1 > len(client):
        print(f"  -> {max(counts)} workers + the coordinator on {len(client)} client cores: workers share cores")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, canned.launch(args.tokens, target) as (url, _):
        work = Path(tmp)
        print(f"canned server at {url}: {args.tokens} output tokens, {args.duration_s:g} s per run", flush=True)
        for rate in rates:
            one = None
            for i, n in enumerate(counts):
                offered = n * rate
                trace = work / f"trace-{offered:g}.parquet"
                poisson_trace(trace, offered, args.duration_s, output_tokens=args.tokens)
                extra = (["--ray"] if args.ray else []) + ["--workers", str(n)] if n > 1 else []
                r = run_config(trace, url, work / f"run-{rate:g}-{i}-{n}", extra, client)
                one = r["delivered_rps"] if n == 1 else one
                r.update(workers=n, per_worker_rps=rate, offered_rps=offered)
                r["efficiency"] = r["delivered_rps"] / (n * one) if one else None
                rows.append(r)
                eff = f"{r['efficiency']:.3f}" if r["efficiency"] is not None else "  n/a"
                print(
                    f"  {n:2d} {'Ray actor(s)' if args.ray and n > 1 else 'worker(s)'} x {rate:5.0f}/s: offered {offered:6.0f}/s delivered {r['delivered_rps']:6.0f}/s "
                    f"(efficiency {eff})  ok {r['ok']}/{r['n']}{'' if r['accounted'] else ' NOT ACCOUNTED'}  "
                    f"send lag p50 {r['lag_p50_us']:6.0f} µs p99 {r['lag_p99_us']:7.0f} µs  client CPU "
                    f"{r['client_cpu_us_per_req']:4.0f} µs/req  coordinator CPU {r['coordinator_cpu_s']:.2f} s"
                    + (f", set-up {r['setup_s']:.1f} s" if r["setup_s"] is not None else ""),
                    flush=True,
                )
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1))
    print(
        "efficiency: delivered(N) / (N x delivered by 1 process at the same per-worker rate); the delivered rate is\n"
        "bounded by the offered rate, so 1.0 means every worker kept up as the single process did"
    )
    return 0


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        sys.exit(main())
