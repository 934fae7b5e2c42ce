"""Benchmark: on the KV-bound RTX 4090 run, TPOT of the requests the replay preempts and of those it never does.

The shared RTX 4090 run (300 ShareGPT requests at 10 req/s, Llama-3.1-8B, 2,588 KV blocks) preempts by
recompute. The replay (``simulate_trace`` on the workload-anchored trace, the shipped engine under the run's
logged scheduler settings, as ``sim validate --measured`` replays it) records which requests its engine
preempted. Printed for each group: how many requests, and their mean and p90 TPOT (per request: (last - first
token) / (output tokens - 1), ms), predicted beside measured, with the signed error of the mean.

    python benchmarks/bench_preempted_tpot.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.calibration.llmservingsim import import_llmservingsim_run
from loadgen.calibration.offline import _engine_for, _run_settings, replay_table
from loadgen.rundir.io import load_run
from loadgen.sim import engine as engine_module
from loadgen.sim import load_engine_config
from loadgen.sim.worksheet import simulate_trace

RUN = REPO.parent / "shared" / "traces" / "llmservingsim" / "bench" / "examples" / "RTX4090" / "Llama-3.1-8B"
ENGINE = "rtx4090-llama-3.1-8b-tp1"


def _tpot_ms(rows: dict[str, list[Any]], i: int) -> float | None:
    n = rows["server_output_tokens"][i]
    if not n or n < 2 or rows["first_token_ns"][i] is None or rows["last_token_ns"][i] is None:
        return None
    return float((rows["last_token_ns"][i] - rows["first_token_ns"][i]) / 1e6 / (n - 1))


def main() -> None:
    if not RUN.exists():
        sys.exit(f"{RUN}: the shared run is not here")
    preempted: set[int] = set()
    preempt = engine_module.Engine._preempt

    def recording(self: engine_module.Engine, seq: engine_module.Seq) -> None:
        preempted.add(seq.idx)
        preempt(self, seq)

    engine_module.Engine._preempt = recording  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = import_llmservingsim_run(RUN, Path(tmp) / "run")
        data = load_run(run_dir, chunks=False)
        measured = data.requests.to_pydict()
        cfg = _engine_for(load_engine_config(ENGINE), _run_settings(data.manifest))
        table, meta, _ = replay_table(run_dir, data.manifest, measured, "workload")
        predicted = simulate_trace(table, meta, cfg, replicas=1, route_policy="least-in-flight").requests_table
    rows = predicted.to_pydict()
    every = range(len(rows["first_token_ns"]))
    print(f"{ENGINE} on {RUN.parent.name}/{RUN.name}: {len(preempted)} requests preempted at least once in the replay")
    for name, group in (
        ("never preempted", [i for i in every if i not in preempted]),
        ("preempted", sorted(preempted)),
    ):
        pairs = [(_tpot_ms(rows, i), _tpot_ms(measured, i)) for i in group]
        got = np.array([p for p, m in pairs if p is not None and m is not None])
        want = np.array([m for p, m in pairs if p is not None and m is not None])
        print(
            f"   {name:16} {len(group):4} requests: TPOT mean {got.mean():.2f} ms predicted / {want.mean():.2f} ms "
            f"measured ({(got.mean() / want.mean() - 1) * 100:+.1f}%), p90 {np.percentile(got, 90):.2f} / "
            f"{np.percentile(want, 90):.2f} ms"
        )


if __name__ == "__main__":
    main()
