"""Scale-out benchmark: one `loadgen run` over 1 process, 2 worker processes, and 2 Ray actors.

Against the simulated engine's ``instant`` preset on loopback (32 prompt / 16 output tokens, Poisson
arrivals), for each configuration and offered rate this script runs the real CLI and reports

* the delivered rate: ok requests / (last reply end − first send), from the merged run's records;
* the send-lag p99 over every worker (the coordinator's exact merge of the workers' raw lags);
* the client CPU per request during the replay (summed over workers: ``driver.process_cpu_s``), and the
  coordination overhead: the coordinator's own CPU (a fixed cost per run, shown per request too), the
  extra client CPU per request over the single process, and the set-up time (launch → every worker ready);

then prints a table that extrapolates to N hosts, with its assumptions.

Pinning: where the host has more than one core the target runs on the last core and the client
(coordinator and every worker) on the others; on a 2-core host the two workers therefore share one
core, which measures the cost of splitting rather than a speed-up (said so in the output).

    python benchmarks/bench_workers.py                 # 3 rates x 3 configurations (a few minutes)
    python benchmarks/bench_workers.py --quick         # 2 rates, shorter runs
    python benchmarks/bench_workers.py --no-ray        # without the Ray configuration
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_driver import poisson_trace

from loadgen.rundir.io import read_run_table
from loadgen.rundir.schema import REQUESTS_FILE
from loadgen.targets import launch_sim_server

CONFIGS = {"1 process": [], "2 processes": ["--workers", "2"], "2 Ray actors": ["--ray", "--workers", "2"]}


def cores() -> tuple[set[int] | None, set[int] | None]:
    """(client cores, target cores), or (None, None) when there is only one core to use."""
    avail = sorted(os.sched_getaffinity(0))
    if len(avail) < 2:
        return None, None
    return set(avail[:-1]), {avail[-1]}


def run_config(trace: Path, url: str, out: Path, extra: list[str], client_cores: set[int] | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "loadgen", "run", str(trace), "--target", url, "--out", str(out)]
    argv += ["--scrape-metrics", "off", "--progress", "off", *extra]
    proc = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, client_cores)) if client_cores else None,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen run {' '.join(extra)} failed: {proc.stderr[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    table = read_run_table(out, REQUESTS_FILE, ["status", "sent_ns", "done_ns"])
    assert table is not None
    ok = table.filter(pc.equal(table["status"], "ok"))
    span_ns = pc.max(ok["done_ns"]).as_py() - pc.min(ok["sent_ns"]).as_py() if ok.num_rows else 0
    lag = manifest["send_lag_ns"]
    workers = manifest.get("workers") or {}
    coordination = workers.get("coordination") or {}
    n = manifest["scheduled_requests"]
    return {
        "n": n,
        "ok": ok.num_rows,
        "accounted": manifest["requests_recorded"] == n,
        "delivered_rps": ok.num_rows / (span_ns / 1e9) if span_ns else 0.0,
        "lag_p50_us": lag["p50"] / 1e3 if lag["p50"] is not None else float("nan"),
        "lag_p99_us": lag["p99"] / 1e3 if lag["p99"] is not None else float("nan"),
        "client_cpu_us_per_req": manifest["driver"]["process_cpu_s"] / max(1, n) * 1e6,
        "coordinator_cpu_s": coordination.get("cpu_user_s", 0.0) + coordination.get("cpu_sys_s", 0.0),
        "setup_s": coordination.get("setup_s"),
        "offsets_us": [
            (w["clock_offset_ns"] / 1e3, w["clock_offset_uncertainty_ns"] / 1e3) for w in workers.get("workers", [])
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rates, 3 s runs")
    parser.add_argument("--rates", default=None, help="comma-separated offered rates (requests/s)")
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray configuration")
    args = parser.parse_args()
    duration = args.duration_s or (3.0 if args.quick else 5.0)
    rates = (
        [float(r) for r in args.rates.split(",")] if args.rates else ([500, 1500] if args.quick else [500, 1000, 2000])
    )
    configs = {k: v for k, v in CONFIGS.items() if not (args.no_ray and "--ray" in v)}
    if "2 Ray actors" in configs:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("Ray not installed (pip install 'loadgen[ray]'): the Ray configuration is skipped")
            configs.pop("2 Ray actors")
    client, target = cores()
    print(
        f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work on the machine skews every figure)"
    )
    print(
        f"pinning: target on cores {sorted(target)}, client (coordinator + workers) on {sorted(client)}"
        if client and target
        else "pinning: none (one core)"
    )
    if client is not None and len(client) < 2:
        print("  -> the 2 workers share one client core: this measures the cost of splitting, not a speed-up")
    results: dict[str, dict[float, dict]] = {name: {} for name in configs}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        with launch_sim_server("instant") as sim:
            if target:
                os.sched_setaffinity(sim.server.pid, target)
            print(f"simulated engine (instant) at {sim.base_url}; 32 prompt / 16 output tokens, {duration:g} s per run")
            for rate in rates:
                trace = work / f"trace-{rate:g}.parquet"
                poisson_trace(trace, rate, duration)
                for name, extra in configs.items():
                    r = run_config(trace, sim.base_url, work / f"run-{rate:g}-{name.replace(' ', '-')}", extra, client)
                    results[name][rate] = r
                    print(
                        f"  {rate:6.0f}/s offered  {name:13s} delivered {r['delivered_rps']:7.0f}/s  ok {r['ok']}/{r['n']}"
                        f"{'' if r['accounted'] else ' NOT ACCOUNTED'}  send lag p50 {r['lag_p50_us']:7.0f} µs "
                        f"p99 {r['lag_p99_us']:8.0f} µs  client CPU {r['client_cpu_us_per_req']:5.0f} µs/req"
                        + (
                            f"  coordinator CPU {r['coordinator_cpu_s']:.2f} s, set-up {r['setup_s']:.1f} s, "
                            f"offsets±unc µs {[(round(o), round(u)) for o, u in r['offsets_us']]}"
                            if r["setup_s"] is not None
                            else ""
                        ),
                        flush=True,
                    )
    summarize(results, rates)
    return 0


def summarize(results: dict[str, dict[float, dict]], rates: list[float]) -> None:
    base = results["1 process"]
    print("\n=== coordination overhead (per request, at each offered rate) ===")
    for name, by_rate in results.items():
        if name == "1 process":
            continue
        for rate, r in by_rate.items():
            extra_us = r["client_cpu_us_per_req"] - base[rate]["client_cpu_us_per_req"]
            coord_us = r["coordinator_cpu_s"] / max(1, r["n"]) * 1e6
            print(
                f"  {name:13s} {rate:6.0f}/s: coordinator {coord_us:6.0f} µs/req ({r['coordinator_cpu_s']:.2f} s per run, "
                f"not on the request path), extra client CPU {extra_us:+6.0f} µs/req vs 1 process, set-up {r['setup_s']:.1f} s"
            )
    # single-worker capacity: the highest offered rate it delivered (≥ 95%) with send-lag p99 < 1 ms, else its best delivery
    kept = [rate for rate, r in base.items() if r["delivered_rps"] >= 0.95 * rate and r["lag_p99_us"] < 1000]
    one = max(kept) if kept else max(r["delivered_rps"] for r in base.values())
    cpu_one = np.median([r["client_cpu_us_per_req"] for r in base.values()])
    cpu_two = (
        np.median([r["client_cpu_us_per_req"] for r in results["2 processes"].values()])
        if "2 processes" in results
        else cpu_one
    )
    efficiency = min(1.0, cpu_one / cpu_two) if cpu_two else 1.0
    print("\n=== extrapolation to N hosts (one worker per host core) ===")
    print(
        f"single worker: {one:.0f} req/s ({'highest offered rate delivered with send-lag p99 < 1 ms' if kept else 'best delivered; no rate held p99 < 1 ms here'}); "
        f"per-worker efficiency {efficiency:.2f} (1-process CPU/request ÷ 2-process CPU/request)"
    )
    print(f"{'hosts':>6} {'cores/host':>11} {'workers':>8} {'rate req/s':>11} {'vs N x single':>14}")
    for hosts in (1, 2, 4, 8, 16, 32):
        for per_host in (1, 8):
            n = hosts * per_host
            eff = 1.0 if n == 1 else efficiency  # one worker is the single process: nothing is split
            print(f"{hosts:6d} {per_host:11d} {n:8d} {n * one * eff:11.0f} {eff:14.2f}")
    print(
        "assumptions: the target is never the bottleneck; each worker has its own core (and host NIC headroom); the\n"
        "coordinator is off the request path (its CPU is a per-run cost: launch, clock offsets, the start message,\n"
        "the merge), so the aggregate is N x one worker's rate x the per-worker efficiency measured above; clock\n"
        "offsets between hosts are measured (ping-pong) and corrected, their uncertainty (half the shortest round\n"
        "trip) adds to each worker's timestamps; the run directory is on storage every host can write."
    )


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        sys.exit(main())
