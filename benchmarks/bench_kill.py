"""Kill ``loadgen run`` at a random instant; count what had finished and what the records kept.

A 60 s trace at 50 req/s runs against the simulated engine (``--engine``, default ``instant``) on
loopback, once killed with SIGTERM and once with SIGKILL, each at a random instant (seeded). Finished
before the kill is counted twice: by the client (its progress line, redrawn every 0.5 s, the last one
before the kill) and by the server (``vllm:request_success_total`` right after the kill; it also counts
answers the client had not read yet). The run directory is then read back (its recovered view after
SIGKILL) and its rows counted. SIGTERM closes the run, so every request the client saw finish has its
row; SIGKILL keeps those finished before the last flush (at most a flush interval, 1 s, earlier).

    python benchmarks/bench_kill.py [--seed N] [--rate 50] [--duration-s 60] [--engine instant]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.driver import parse_prometheus_text
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.targets import launch_sim_server
from loadgen.trace.io import write_trace


def server_finished(base_url: str) -> int:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return int(sum(value for name, _, value in parse_prometheus_text(text) if name == "vllm:request_success_total"))


def one(sig: signal.Signals, base_url: str, trace: Path, out: Path, at_s: float) -> dict:
    before = server_finished(base_url)
    err = out.parent / f"{out.name}.stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadgen",
                "run",
                str(trace),
                "--target",
                base_url,
                "--out",
                str(out),
                "--progress",
                "on",
                "--scrape-metrics",
                "off",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        while not (out / "manifest.json").exists():
            time.sleep(0.01)
        time.sleep(at_s)
        client_done = [int(x) for x in re.findall(r"done (\d+)", err.read_text())]
        proc.send_signal(sig)
        finished = server_finished(base_url) - before  # at the kill (the client stops asking at once)
        proc.wait(timeout=120)
    run = load_run(out)
    ok = run.requests.column("status").to_pylist().count("ok")
    return {
        "signal": sig.name,
        "at_s": at_s,
        "exit": proc.returncode,
        "state": run.manifest.state,
        "client_finished": client_done[-1] if client_done else None,
        "server_finished": finished,
        "rows": run.requests.num_rows,
        "ok_rows": ok,
        "recovery": run.manifest.recovery,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--engine", default="instant")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-kill-"))
    n = int(args.rate * args.duration_s)
    rows = [
        {
            "request_id": f"r{i:06d}",
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
        for i in range(n)
    ]
    trace = write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        work / "t.parquet",
        {"mode": "open", "max_in_flight": 512, "trace_name": "bench-kill", "seed": args.seed},
    )
    print(f"{n} requests over {args.duration_s:g} s at {args.rate:g} req/s; sim engine {args.engine} on loopback")
    with launch_sim_server(args.engine, log_dir=work) as sim:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            at = rng.uniform(0.1, 0.9) * args.duration_s
            r = one(sig, sim.base_url, trace, work / f"run-{sig.name}", at)
            print(
                f"{r['signal']} at {r['at_s']:.2f} s: exit {r['exit']}, state {r['state']}; finished before the kill: "
                f"{r['client_finished']} seen by the client (≤ 0.5 s before), {r['server_finished']} answered by the "
                f"server; {r['rows']} rows readable afterwards, {r['ok_rows']} of them ok"
            )
            if r["recovery"]:
                rec = r["recovery"]
                print(
                    f"  last flush {rec['last_flush_utc']}; in flight then {rec['in_flight_at_last_flush']}, "
                    f"not yet due {rec['not_due_at_last_flush']}"
                )
    print(f"run directories under {work}")


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
