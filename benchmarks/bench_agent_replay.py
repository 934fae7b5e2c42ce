"""Benchmark: how closely a live replay of recorded agent sessions keeps the recorded pacing.

The sessions (kv-cache-tester ``trace_*.json`` under ``../shared/traces/agentic/``) are imported with
``--time-scale``, then replayed by the real driver against the live simulated engine (instant compute, each
reply held to its recorded ``api_time``: ``sim_service_ms``) and by the worksheet (virtual time). Printed per
run: the lag of each step's scheduled instant behind its recorded one (the driver's and the loopback's
overhead, accumulated along each chain of steps), in ms and as a share of the recorded session span, and
each session's makespan against the recorded one (last recorded reply end).

    python benchmarks/bench_agent_replay.py                       # trace_0291 + trace_0277 at 1/100
    python benchmarks/bench_agent_replay.py --scale 0.002 --files ../shared/traces/agentic/kv-cache-tester/traces/trace_0286.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.sim import run_worksheet
from loadgen.targets import launch_sim_server
from loadgen.trace.agentic import import_agentic
from loadgen.trace.io import read_trace

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces" / "agentic" / "kv-cache-tester" / "traces"
ENGINE = (REPO / "scenarios" / "engines" / "instant-long-context.toml").read_text()


def _report(label: str, rows: dict[str, dict], trace: dict[str, dict]) -> None:
    lag_ms = np.array([(r["scheduled_ns"] - trace[k]["scheduled_offset_ns"]) / 1e6 for k, r in rows.items()])
    print(
        f"{label}: {len(rows)} steps, lag behind the recorded instant p50 {np.percentile(lag_ms, 50):.2f} ms, "
        f"p99 {np.percentile(lag_ms, 99):.2f} ms, max {lag_ms.max():.2f} ms"
    )
    for session in sorted({r["conversation_id"].split("/")[0] for r in rows.values()}):
        keys = [k for k, r in rows.items() if r["conversation_id"].split("/")[0] == session]
        recorded = max(trace[k]["scheduled_offset_ns"] + trace[k]["service_ns"] for k in keys) / 1e6
        span = (max(rows[k]["done_ns"] for k in keys) - min(rows[k]["scheduled_ns"] for k in keys)) / 1e6
        print(
            f"  {session}: makespan {span:.1f} ms vs recorded {recorded:.1f} ms "
            f"({100 * (span - recorded) / recorded:+.2f}%)"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", nargs="+", type=Path, default=[TRACES / "trace_0291.json", TRACES / "trace_0277.json"])
    p.add_argument("--scale", type=float, default=0.01, help="time scale of the import (0.01: 100x faster)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        trace_path = import_agentic(args.files, d / "agent.parquet", time_scale=args.scale)
        trace = {r["request_id"]: r for r in read_trace(trace_path)[0].to_pylist()}
        (d / "engine.toml").write_text(ENGINE)
        print(f"{len(args.files)} sessions, {len(trace)} requests, time scale {args.scale:g}")
        ws = load_run(run_worksheet(trace_path, d / "engine.toml", d / "ws")).requests.to_pylist()
        _report("worksheet", {r["request_id"]: r for r in ws}, trace)
        with launch_sim_server(str(d / "engine.toml")) as sim:
            out = run_trace_sync(
                RunOptions(trace_path=trace_path, target_url=sim.base_url, out_dir=d / "run", progress="off")
            )
        live = load_run(out).requests.to_pylist()
        bad = [r["request_id"] for r in live if r["status"] != "ok"]
        print(f"live: {len(bad)} requests not ok")
        _report("live simulated engine", {r["request_id"]: r for r in live}, trace)
    return 0


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        raise SystemExit(main())
