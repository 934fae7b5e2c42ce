"""Benchmark (diagnostic): is the RTX PRO 6000 ramp-up miss a CPU time per step? What the measured runs say.

The shipped profiled engines price a step from GPU operator times only (``fixed_ms`` = 0: vLLM 0.19 schedules
asynchronously, so the engine core's scheduling and output processing and the worker's input preparation for
step N+1 run while the GPU runs step N). A CPU time the overlap did not hide would show in one of two forms:

- a floor: the step takes max(GPU time, CPU time); it shows only on steps whose GPU time is below the CPU time;
- an addition: some CPU time per step stays on the critical path whatever the GPU time; it shows on every step.

For each run (the three shared ones, and the held-out ones of ``bench_heldout_runs.py`` found under ``--runs``),
replayed as ``sim validate --measured`` replays it (workload arrivals, the shipped TOML; the held-out RTX 4090 run
on the ledger's pool, as its first table there), printed:

1. the replay's step times: how many steps it prices, the shortest, the 5th percentile, the share under 10 ms;
2. the step residual by batch size: for each request whose replayed span (first to last token) holds exactly its
   n - 1 steps, (measured span - replayed span) / (n - 1), the ms a step of vLLM's took more than the replay's
   over that request's life, grouped by the mean decode count of those steps (median per group; the steps' mean
   replayed time beside it), then by when its first token came (10 s windows): the ramp-up against the rest. A
   run of several DP ranks is left out of this part: its ranks step in lockstep, and one rank's steps are not
   the group's;
3. the comparison (worst |error| over all figures, over LLMServingSim's TTFT, TPOT and E2E, and MAPE) with a CPU
   term added as an experiment, nothing shipped: ``fixed_ms`` = 0.25, 0.5, 1 ms (the addition), and every step
   at least 5, 10, 15, 20 ms (the floor).

Deterministic: no GPU, no timing.

    python benchmarks/bench_cpu_term.py [--runs DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_heldout_runs import default_runs_dir, heldout_replays
from bench_profiled import RUNS, SHARED

from loadgen.calibration.llmservingsim import import_llmservingsim_run
from loadgen.calibration.offline import _engine_for, _run_settings, compare_run, replay_table
from loadgen.rundir.io import load_run
from loadgen.sim import EngineConfig, load_engine_config
from loadgen.sim import engine as engine_module
from loadgen.sim.dp_balance import VLLM_DP
from loadgen.sim.worksheet import simulate_trace

ADDED_MS = (0.25, 0.5, 1.0)
FLOORS_MS = (5.0, 10.0, 15.0, 20.0)
WINDOW_S = 10
DECODE_GROUPS = ((1, 32), (32, 64), (64, 96), (96, 120), (120, 257))
THEIRS = ("ttft", "tpot", "e2e")  # the figures LLMServingSim's validation/summary.txt reports


@contextmanager
def _steps(floor_ms: float = 0.0) -> Iterator[list[tuple[int, int, int]]]:
    """Record every step the replay takes (start ns, end ns, decode count); with ``floor_ms``, price each step's
    profiled time at least that (an experiment: ``Engine._profile_ns`` wrapped, not changed)."""
    cls = engine_module.Engine
    step, profile_ns = cls.step, cls._profile_ns
    steps: list[tuple[int, int, int]] = []

    def recording_step(engine: engine_module.Engine, now_ns: int) -> engine_module.StepResult:
        res = step(engine, now_ns)
        if res.duration_ns > 0:
            steps.append((now_ns, now_ns + res.duration_ns, res.decode_seqs))
        return res

    def floored(engine: engine_module.Engine, *args: Any, **kwargs: Any) -> float:
        return max(profile_ns(engine, *args, **kwargs), floor_ms * 1e6)

    cls.step = recording_step  # type: ignore[method-assign,assignment]
    if floor_ms:
        cls._profile_ns = floored  # type: ignore[method-assign,assignment]
    try:
        yield steps
    finally:
        cls.step, cls._profile_ns = step, profile_ns  # type: ignore[method-assign]


def _line(request_id: Any) -> int:
    """The workload line a request id names: ``bench-42`` (measured, or a replay without a workload) or
    ``r000042`` (a replay of an imported workload) -> 42."""
    return int(str(request_id).rpartition("-")[2].lstrip("r"))


def _residual(run_dir: Path, cfg: EngineConfig) -> tuple[np.ndarray, list[str]]:
    """The replay's step times (ms), and part 2's lines (module docstring)."""
    data = load_run(run_dir, chunks=False)
    measured = data.requests.to_pydict()
    settings = _run_settings(data.manifest)
    table, meta, _ = replay_table(run_dir, data.manifest, measured, "workload")
    replicas = int(settings.get("data_parallel_size") or 1)
    with _steps() as steps:
        result = simulate_trace(table, meta, _engine_for(cfg, settings), replicas=replicas, route_policy=VLLM_DP)
    s = np.array(steps, dtype=np.int64)
    durations = (s[:, 1] - s[:, 0]) / 1e6
    if replicas > 1:
        return durations, [f"{replicas} DP ranks in lockstep: one rank's steps are not the group's (left out)"]
    predicted = result.requests_table.to_pydict()
    row = {_line(r): i for i, r in enumerate(predicted["request_id"])}
    ends = s[:, 1]
    cells: list[tuple[float, float, float, int]] = []  # mean decodes, replayed step ms, residual ms, first token
    for i, rid in enumerate(measured["request_id"]):
        j = row[_line(rid)]
        n, first, last = (
            measured["target_output_tokens"][i],
            predicted["first_token_ns"][j],
            predicted["last_token_ns"][j],
        )
        if first is None or last is None or n < 3:
            continue
        a, b = np.searchsorted(ends, first, side="right"), np.searchsorted(ends, last, side="right")
        if b - a != n - 1:
            continue  # preempted after its first token: more steps than tokens
        span = (measured["last_token_ns"][i] - measured["first_token_ns"][i]) / 1e6
        residual = (span - durations[a:b].sum()) / (n - 1)
        cells.append((float(s[a:b, 2].mean()), float(durations[a:b].mean()), residual, measured["first_token_ns"][i]))
    c = np.array(cells)
    lines = [f"{len(c)} requests whose replayed span holds their n - 1 steps"]
    for lo, hi in DECODE_GROUPS:
        k = (c[:, 0] >= lo) & (c[:, 0] < hi)
        if k.sum() >= 3:
            lines.append(
                f"decodes {lo}-{hi - 1}: {k.sum()} requests, replayed step {np.median(c[k, 1]):.2f} ms, "
                f"vLLM's {np.median(c[k, 2]):+.2f} ms a step more (median)"
            )
    t = (c[:, 3] - c[:, 3].min()) / 1e9
    windows = []
    for lo in range(0, int(t.max()) + 1, WINDOW_S):
        k = (t >= lo) & (t < lo + WINDOW_S)
        if k.sum() >= 3:
            windows.append(f"{lo}-{lo + WINDOW_S}: {k.sum()}, {c[k, 0].mean():.0f}, {np.median(c[k, 2]):+.2f}")
    lines.append("by first token (s from the first: requests, mean decodes, ms a step more): " + "; ".join(windows))
    return durations, lines


def _worst(got: Any, names: tuple[str, ...] | None = None) -> str:
    rows = [
        r for r in got.rows if r["signed_pct"] is not None and (names is None or r["figure"].split("_")[0] in names)
    ]
    r = max(rows, key=lambda r: abs(r["signed_pct"]))
    return f"{r['figure']} {r['signed_pct']:+.2f}%"


def _compare(run_dir: Path, cfg: EngineConfig, added_ms: float = 0.0, floor_ms: float = 0.0) -> str:
    cfg = cfg.model_copy(update={"cost": cfg.cost.model_copy(update={"fixed_ms": added_ms})})
    with _steps(floor_ms):
        got = compare_run(run_dir, cfg, "workload")
    return f"worst {_worst(got)}; over TTFT, TPOT, E2E {_worst(got, THEIRS)}; MAPE {got.mape_pct:.2f}%"


def _report(name: str, run_dir: Path, cfg: EngineConfig) -> None:
    durations, lines = _residual(run_dir, cfg)
    print(f"== {name} on {cfg.calibration_label().split(':')[0]}")
    print(
        f"1. the replay's steps: {len(durations):,}, shortest {durations.min():.2f} ms, p5 {np.percentile(durations, 5):.2f}"
        f" ms, under 10 ms {np.mean(durations < 10) * 100:.1f}%"
    )
    print("2. step residual (measured - replayed, per step) by decode count:\n   " + "\n   ".join(lines))
    print(f"3. shipped: {_compare(run_dir, cfg)}")
    for ms in ADDED_MS:
        print(f"   + {ms:g} ms a step: {_compare(run_dir, cfg, added_ms=ms)}")
    for ms in FLOORS_MS:
        print(f"   at least {ms:g} ms a step: {_compare(run_dir, cfg, floor_ms=ms)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=None, help=f"held-out run folders (default {default_runs_dir()})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (folder, engine) in RUNS.items():
            source = SHARED / "bench" / "examples" / folder
            if not source.exists():
                print(f"{source}: the shared run is not here", file=sys.stderr)
                continue
            _report(name, import_llmservingsim_run(source, Path(tmp) / name), load_engine_config(engine))
        for name, run_dir, cfg in heldout_replays(args.runs or default_runs_dir(), Path(tmp) / "heldout"):
            _report(f"{name} (held out)", run_dir, cfg)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
