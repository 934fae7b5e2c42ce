"""Benchmark: the profiled engines against the three shared vLLM 0.19 GPU runs, and how fast they replay.

For each shared run (``../shared/traces/llmservingsim/bench/examples/<GPU>/<model>/``: 300 ShareGPT requests at
10 req/s, every request's queued, scheduled, first- and last-token instants) the run is imported
(``loadgen import llmservingsim``: the workload beside it, arrivals, lengths and prompt block hashes kept) and
compared by the library's ``compare_run`` -- the very comparison ``loadgen sim validate --measured`` prints, with
the same anchoring (``--arrivals``, default ``workload``: the workload's own arrival instants; measured latencies
from the frontend's arrival, mapped onto the engine clock by the smallest queued - arrival offset) -- on the
shipped engine of that GPU, model and TP degree (DP 2: two engines behind vLLM's own balancer, as
``loadgen.sim.dp_balance`` emulates it). Printed per run:

- every figure (TTFT, TPOT = per-request mean ITL, E2E, queue time: mean / p50 / p90 / p99; completed
  throughput), measured beside predicted, signed error; the worst absolute error; and LLMServingSim's own worst
  error on that run (its ``validation/summary.txt``, their figures, for comparison only);
- the wall time of the 300-request replay (``simulate_trace`` on the anchored trace, the profile already loaded;
  best of ``--repeat``) and the profile's load time;
- for a DP run, the spread of the figures as the KV pool and the balancer's timing move (the DP coordinator's
  first publication after a quiet spell delayed by 0-90 ms; ``loadgen.calibration.sensitivity``);
- side by side, the same comparison with the engine's linear cost terms (fixed + per prefill token + per decode
  sequence + per KV token) fitted by least squares to the same profile (``fit_linear_cost``) instead of it.

    python benchmarks/bench_profiled.py                  # all three runs
    python benchmarks/bench_profiled.py --run rtx4090-llama --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.calibration.engine_match import measured_engine_config
from loadgen.calibration.llmservingsim import import_llmservingsim_run
from loadgen.calibration.offline import ANCHORS, RunComparison, compare_run, replay_table
from loadgen.calibration.sensitivity import run_sensitivity
from loadgen.rundir.io import load_run
from loadgen.sim import EngineConfig, load_engine_config
from loadgen.sim.dp_balance import VLLM_DP
from loadgen.sim.profile import fit_linear_cost, load_profile
from loadgen.sim.profile_grid import coverage_line
from loadgen.sim.worksheet import simulate_trace

SHARED = REPO.parent / "shared" / "traces" / "llmservingsim"
#: run -> (measured run folder, engine)
RUNS = {
    "rtx4090-llama": ("RTX4090/Llama-3.1-8B", "rtx4090-llama-3.1-8b-tp1"),
    "rtxpro6000-llama": ("RTXPRO6000/Llama-3.1-8B", "rtxpro6000-llama-3.1-8b-tp1"),
    "rtxpro6000-moe": ("RTXPRO6000/Qwen3-30B-A3B-Instruct-2507", "rtxpro6000-qwen3-30b-a3b-tp1-ep2"),
}
STATS = ("mean", "p50", "p90", "p99")
METRICS = ("ttft", "tpot", "e2e", "queue")


def _replay_wall_s(run_dir: Path, cfg: EngineConfig, anchor: str, repeat: int) -> tuple[float, int, int]:
    """Best wall time of the anchored replay (``simulate_trace`` only), its request count and replicas."""
    data = load_run(run_dir, chunks=False)
    table, meta, _ = replay_table(run_dir, data.manifest, data.requests.to_pydict(), anchor)
    kwargs = measured_engine_config(data.manifest).get("engine_kwargs") or {}
    replicas = int(kwargs.get("data_parallel_size") or 1)
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        simulate_trace(table, meta, cfg, replicas=replicas, route_policy=VLLM_DP if replicas > 1 else "round-robin")
        walls.append(time.perf_counter() - t0)
    return min(walls), table.num_rows, replicas


def _print_rows(got: RunComparison) -> None:
    rows = {r["figure"]: r for r in got.rows}
    print(f"   {'metric':6} " + " ".join(f"{s:>28}" for s in STATS) + "   (ms: measured / predicted / error)")
    for metric in METRICS:
        cells = []
        for stat in STATS:
            r = rows[f"{metric}_{stat}"]
            err = f"{r['signed_pct']:+6.1f}%" if r["signed_pct"] is not None else f"{r['diff']:+5.0f}ms"
            cells.append(f"{r['measured']:10.1f} {r['predicted']:10.1f} {err}")
        print(f"   {metric:6} " + " ".join(cells))
    r = rows["throughput_rps"]
    print(f"   completed throughput {r['measured']:.3f} / {r['predicted']:.3f} req/s {r['signed_pct']:+.1f}%")


def _their_worst(got: RunComparison) -> str:
    if not got.published:
        return "?"
    figure, pct = max(got.published.items(), key=lambda kv: abs(kv[1]))
    return f"{pct:+.1f}% ({figure})"


def bench(run: str, repeat: int, anchor: str, tmp: Path) -> None:
    folder_name, engine = RUNS[run]
    run_dir = import_llmservingsim_run(SHARED / "bench" / "examples" / folder_name, tmp / run)
    cfg = load_engine_config(engine)
    p = cfg.cost.profile
    assert p is not None
    load_profile.cache_clear()
    t0 = time.perf_counter()
    p.load()
    load_s = time.perf_counter() - t0
    wall_s, n, replicas = _replay_wall_s(run_dir, cfg, anchor, repeat)
    got = compare_run(run_dir, cfg, anchor)
    print(f"== {run}: engine {engine} x{replicas}; {cfg.calibration_label()}")
    print(f"   arrivals: {anchor} ({ANCHORS[anchor][1]})")
    print(f"   replay of {n} requests: {wall_s:.2f} s wall (best of {repeat}); profile load {load_s:.2f} s")
    _print_rows(got)
    worst = got.worst or {}
    notes = got.engine_notes
    print(
        f"   worst |error| {abs(worst.get('signed_pct', 0.0)):.1f}% ({worst.get('figure')}); MAPE {got.mape_pct:.1f}%; "
        f"LLMServingSim's worst on this run {_their_worst(got)}; preemptions {notes.get('preemptions')}, "
        f"prefix-cache hit tokens {notes.get('prefix_cache_hits')}"
    )
    if grid := coverage_line(notes.get("profile_grid")):
        print(f"   {grid}")
    if replicas > 1:
        _balancer_sweep(run_dir, cfg, anchor, got)
    linear = _linear_twin(cfg)
    t0 = time.perf_counter()
    fitted = compare_run(run_dir, linear, anchor)
    wall = time.perf_counter() - t0
    terms = ", ".join(f"{k} {v:.4g}" for k, v in linear.cost.model_dump().items() if k in LINEAR_TERMS)
    print(f"   the linear terms fitted to the same profile ({terms}; comparison {wall:.2f} s): signed error")
    rows = {r["figure"]: r for r in fitted.rows}
    for metric in METRICS:
        errs = [rows[f"{metric}_{s}"]["signed_pct"] for s in STATS]
        print(
            f"   {metric:6} "
            + " ".join(f"{s} {e:+6.1f}%" if e is not None else f"{s}    —  " for s, e in zip(STATS, errs, strict=True))
        )
    lin_worst = fitted.worst or {}
    print(
        f"   worst |error| of the linear fit {abs(lin_worst.get('signed_pct', 0.0)):.1f}% ({lin_worst.get('figure')}) "
        f"(profiled: {abs(worst.get('signed_pct', 0.0)):.1f}%)"
    )


def _balancer_sweep(run_dir: Path, cfg: EngineConfig, anchor: str, got: RunComparison) -> None:
    """How much of a DP run's figures is the timing of vLLM's balancer (``loadgen.calibration.sensitivity``, as
    ``sim validate --measured --sensitivity`` prints it)."""
    for spread in run_sensitivity(run_dir, cfg, anchor, got.settings):
        cells = "; ".join(
            f"{v}: {f} {w:.1f}%"
            for v, f, w in zip(spread.settings, spread.worst_figures, spread.worst_abs_pct, strict=True)
        )
        print(f"   sensitivity, {spread.summary()}")
        print(f"      worst |error| at each: {cells}")


LINEAR_TERMS = ("fixed_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms")


def _linear_twin(cfg: EngineConfig) -> EngineConfig:
    """The engine with the linear cost terms fitted to its profile instead of the profile itself (an
    expert-parallel group's lockstep goes with the profile)."""
    p = cfg.cost.profile
    assert p is not None
    profile = p.load()
    terms = fit_linear_cost(profile, cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens)
    return cfg.model_copy(update={"cost": cfg.cost.model_copy(update={**terms, "profile": None})})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", choices=sorted(RUNS), action="append")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--arrivals", choices=sorted(ANCHORS), default="workload")
    args = parser.parse_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED}: the shared runs are not here")
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.run or list(RUNS):
            bench(run, args.repeat, args.arrivals, Path(tmp))


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
