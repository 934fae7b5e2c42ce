"""Benchmark: the profiled engines against the three shared vLLM 0.19 GPU runs, and how fast they replay.

For each shared run (``../shared/traces/llmservingsim/bench/examples/<GPU>/<model>/vllm/``: 300 ShareGPT
requests at 10 req/s, every request's queued, scheduled, first- and last-token instants) the workload JSONL is
imported as a trace (``loadgen trace import llmservingsim``: arrivals, lengths and prompt block hashes kept) and
replayed through the worksheet on the shipped engine of that GPU, model and TP degree (DP 2: two engines behind
the least-in-flight router). Printed per run:

- TTFT, TPOT (per-request mean ITL) and E2E, each mean / p50 / p90 / p99, measured beside predicted, signed
  error; the worst absolute error; and LLMServingSim's own worst error on that run (its
  ``validation/summary.txt``, their figures, for comparison only);
- the wall time of the 300-request replay (``simulate_trace``, the profile already loaded; best of
  ``--repeat``) and the profile's load time;
- side by side, the same replay with the engine's linear cost terms (fixed + per prefill token + per decode
  sequence + per KV token) fitted by least squares to the same profile (``fit_linear_cost``) instead of it.

Measured instants are on two clocks (SOURCES.md §6): arrivals (the frontend's epoch) are mapped onto the engine
clock by the smallest queued - arrival offset, so TTFT and E2E keep the frontend's delay beyond that smallest one.

    python benchmarks/bench_profiled.py                  # all three runs
    python benchmarks/bench_profiled.py --run rtx4090-llama --repeat 3
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.sim import EngineConfig, load_engine_config
from loadgen.sim.profile import fit_linear_cost, load_profile
from loadgen.sim.worksheet import simulate_trace
from loadgen.trace.importers import import_trace
from loadgen.trace.io import read_trace

SHARED = REPO.parent / "shared" / "traces" / "llmservingsim"
#: run -> (measured run folder, workload, engine, replicas)
RUNS = {
    "rtx4090-llama": ("RTX4090/Llama-3.1-8B", "llama-3.1-8b", "rtx4090-llama-3.1-8b-tp1", 1),
    "rtxpro6000-llama": ("RTXPRO6000/Llama-3.1-8B", "llama-3.1-8b", "rtxpro6000-llama-3.1-8b-tp1", 1),
    "rtxpro6000-moe": (
        "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
        "qwen3-30b-a3b",
        "rtxpro6000-qwen3-30b-a3b-tp1-ep2",
        2,
    ),
}
STATS = ("mean", "p50", "p90", "p99")


def _stats(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(np.mean(values))} | {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)}


def _measured(folder: Path) -> dict[str, np.ndarray]:
    rows = [json.loads(line) for line in (folder / "vllm" / "requests.jsonl").open()]
    offset = min(r["queued_ts"] - r["arrival_time"] for r in rows)
    return {
        "TTFT": np.array([r["first_token_ts"] - r["arrival_time"] - offset for r in rows]) * 1e3,
        "TPOT": np.array([(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows]) * 1e3,
        "E2E": np.array([r["last_token_ts"] - r["arrival_time"] - offset for r in rows]) * 1e3,
    }


def _predicted(requests: dict[str, list]) -> dict[str, np.ndarray]:
    sched, first, last = (
        np.array(requests[k], dtype=float) / 1e6 for k in ("scheduled_ns", "first_token_ns", "last_token_ns")
    )
    out = np.array(requests["client_output_tokens"], dtype=float)
    return {"TTFT": first - sched, "TPOT": (last - first) / (out - 1), "E2E": last - sched}


def _their_worst(folder: Path) -> str:
    """LLMServingSim's worst |Diff%| on the run (their summary.txt), with its metric."""
    worst = (0.0, "?")
    for line in (folder / "validation" / "summary.txt").read_text().splitlines():
        m = re.match(r"(\w+ \w+)\s+[\d.]+\s+[\d.]+\s+([+-][\d.]+)%", line)
        if m and abs(float(m.group(2))) > abs(worst[0]):
            worst = (float(m.group(2)), m.group(1))
    return f"{worst[0]:+.1f}% ({worst[1]})"


def bench(run: str, repeat: int, tmp: Path) -> None:
    folder_name, workload, engine, replicas = RUNS[run]
    folder = SHARED / "bench" / "examples" / folder_name
    trace = import_trace(
        "llmservingsim", SHARED / "workloads" / f"sharegpt-{workload}-300-sps10.jsonl", tmp / f"{run}.parquet"
    )
    table, meta = read_trace(trace)
    cfg = load_engine_config(engine)
    p = cfg.cost.profile
    assert p is not None
    load_profile.cache_clear()
    t0 = time.perf_counter()
    load_profile(p.path, p.tp, p.model_config_path, p.ep, p.link_latency_us, p.link_gb_per_s)
    load_s = time.perf_counter() - t0
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = simulate_trace(table, meta, cfg, replicas=replicas, route_policy="least-in-flight")
        walls.append(time.perf_counter() - t0)
    measured, predicted = _measured(folder), _predicted(result.requests_table.to_pydict())
    print(f"== {run}: engine {engine} x{replicas}; {cfg.calibration_label()}")
    print(
        f"   replay of {table.num_rows} requests: {min(walls):.2f} s wall (best of {repeat}); profile load {load_s:.2f} s"
    )
    print(f"   {'metric':6} " + " ".join(f"{s:>26}" for s in STATS) + "   (ms: measured / predicted / error)")
    worst = 0.0
    for metric in ("TTFT", "TPOT", "E2E"):
        m, q = _stats(measured[metric]), _stats(predicted[metric])
        cells = []
        for s in STATS:
            err = (q[s] - m[s]) / m[s] * 100
            worst = max(worst, abs(err))
            cells.append(f"{m[s]:9.1f} {q[s]:9.1f} {err:+6.1f}%")
        print(f"   {metric:6} " + " ".join(cells))
    notes = result.notes
    print(
        f"   worst |error| {worst:.1f}%; LLMServingSim's worst on this run {_their_worst(folder)}; "
        f"preemptions {notes['preemptions']}, prefix-cache hit tokens {notes['prefix_cache_hits']}"
    )
    linear = _linear_twin(cfg)
    t0 = time.perf_counter()
    fitted = simulate_trace(table, meta, linear, replicas=replicas, route_policy="least-in-flight")
    wall = time.perf_counter() - t0
    terms = ", ".join(f"{k} {v:.4g}" for k, v in linear.cost.model_dump().items() if k in LINEAR_TERMS)
    print(f"   the linear terms fitted to the same profile ({terms}; replay {wall:.2f} s): signed error")
    lin = _predicted(fitted.requests_table.to_pydict())
    worst_lin = 0.0
    for metric in ("TTFT", "TPOT", "E2E"):
        m, q = _stats(measured[metric]), _stats(lin[metric])
        errs = [(q[s] - m[s]) / m[s] * 100 for s in STATS]
        worst_lin = max(worst_lin, *(abs(e) for e in errs))
        print(f"   {metric:6} " + " ".join(f"{s} {e:+6.1f}%" for s, e in zip(STATS, errs, strict=True)))
    print(f"   worst |error| of the linear fit {worst_lin:.1f}% (profiled: {worst:.1f}%)")


LINEAR_TERMS = ("fixed_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms")


def _linear_twin(cfg: EngineConfig) -> EngineConfig:
    """The engine with the linear cost terms fitted to its profile instead of the profile itself (an
    expert-parallel group's lockstep goes with the profile)."""
    p = cfg.cost.profile
    assert p is not None
    profile = load_profile(p.path, p.tp, p.model_config_path, p.ep, p.link_latency_us, p.link_gb_per_s)
    terms = fit_linear_cost(profile, cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens)
    return cfg.model_copy(update={"cost": cfg.cost.model_copy(update={**terms, "profile": None})})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", choices=sorted(RUNS), action="append")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED}: the shared runs are not here")
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.run or list(RUNS):
            bench(run, args.repeat, Path(tmp))


if __name__ == "__main__":
    main()
