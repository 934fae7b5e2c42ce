"""Two live simulated replicas, one killed mid-run: what the routing did and what the analysis says.

Starts two ``loadgen sim serve`` processes on loopback, replays a steady trace through both with the
chosen policy, kills replica 1 once its own ``/metrics`` counter says it finished ``--kill-after``
requests, then prints the status counts per replica, when it was marked down, and the per-replica
breakdown of ``loadgen analyze``. Figures, not assertions (tests/test_replicas.py asserts the rules).

    python benchmarks/bench_replicas.py --policy least-in-flight --requests 300 --rate 40 --kill-after 40
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.analysis import analyze_run
from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.targets import launch_sim_server
from loadgen.trace.io import write_trace


def _served(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:request_success_total"))


def _kill_after(sim, n: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if _served(sim.base_url) >= n:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    sim.process.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=("round-robin", "least-in-flight"), default="least-in-flight")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second (constant)")
    ap.add_argument("--kill-after", type=int, default=40, help="replica 1 is killed after finishing this many")
    ap.add_argument("--down-after", type=int, default=3)
    ap.add_argument("--engine", default="interactive-small-batch")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    rows = [
        {
            "request_id": f"r{i:05d}",
            "request_class": "short-message",
            "scheduled_offset_ns": int(i * 1e9 / args.rate),
            "prompt_tokens": 64,
            "output_tokens": 32,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        for i in range(args.requests)
    ]
    trace = write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), work / "t.parquet", {"mode": "open"})
    with launch_sim_server(args.engine) as a, launch_sim_server(args.engine) as b:
        killer = threading.Thread(target=_kill_after, args=(b, args.kill_after), daemon=True)
        killer.start()
        out = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=a.base_url,
                replica_urls=[b.base_url],
                route_policy=args.policy,
                replica_down_after=args.down_after,
                out_dir=work / "run",
                total_timeout_s=30,
                progress="off",
            )
        )
        killer.join()
    run = load_run(out)
    m = run.manifest.to_dict()
    print(
        f"run {out}: policy {args.policy}, {args.requests} requests at {args.rate:g}/s, replica 1 killed after "
        f"{args.kill_after} completions; routing {m['routing']}"
    )
    per = collections.Counter((r["target_index"], r["status"], r["error_kind"]) for r in run.requests.to_pylist())
    for key, n in sorted(per.items(), key=lambda kv: (kv[0][0] if kv[0][0] is not None else -1, str(kv[0][1:]))):
        print(f"  replica {key[0]}: {key[1]:9s} {key[2] or '':16s} {n}")
    print(
        f"  total rows {run.requests.num_rows} (scheduled {m['scheduled_requests']}); status counts {m['status_counts']}"
    )
    section = analyze_run(out).replicas or {}
    for r in section.get("replicas", []):
        print(
            f"  analysis replica {r['target_index']}: routed {r['n_scheduled']}, sent {r['sent']}, completed "
            f"{r['completed']}, failed {r['failed']} {r['error_kinds']}, TTFT p50/p99 "
            f"{r['ttft_ms']['p50']:.1f}/{r['ttft_ms']['p99']:.1f} ms (n={r['ttft_ms']['n']}), ITL p50/p99 "
            f"{r['itl_ms']['p50']:.2f}/{r['itl_ms']['p99']:.2f} ms (n={r['itl_ms']['n']})"
        )
    print(f"  never routed: {section.get('not_routed')}")


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
