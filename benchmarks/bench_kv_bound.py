"""Benchmark: the KV-bound RTX 4090 run, where preemptions by recompute decide the tail.

The shared RTX 4090 run (300 ShareGPT requests at 10 req/s, Llama-3.1-8B, 2,588 KV blocks) preempts by
recompute. The replay (``simulate_trace`` on the workload-anchored trace, the shipped engine under the run's
logged scheduler settings, as ``sim validate --measured`` replays it) records which requests its engine
preempted. Printed for each group: how many requests, and their mean and p90 TPOT (per request: (last - first
token) / (output tokens - 1), ms), predicted beside measured, with the signed error of the mean.

Then the pool-size sweep: the same comparison as ``sim validate --measured`` (``compare_run``) with the logged
2,588 KV blocks replaced by each of 2,584 .. 2,592: the worst |error| over the figures, MAPE and the preemptions.

    python benchmarks/bench_kv_bound.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.calibration import offline
from loadgen.calibration.llmservingsim import import_llmservingsim_run
from loadgen.calibration.offline import _engine_for, _run_settings, compare_run, replay_table
from loadgen.rundir.io import load_run
from loadgen.sim import engine as engine_module
from loadgen.sim import load_engine_config
from loadgen.sim.worksheet import WorksheetResult, simulate_trace

RUN = REPO.parent / "shared" / "traces" / "llmservingsim" / "bench" / "examples" / "RTX4090" / "Llama-3.1-8B"
ENGINE = "rtx4090-llama-3.1-8b-tp1"
POOL_SIZES = range(2584, 2593)


def replay(run_dir: Path, blocks: int | None = None) -> tuple[dict[str, list[Any]], WorksheetResult]:
    """The imported run replayed on ENGINE under its logged scheduler settings, as ``sim validate --measured``
    replays it (``blocks``: a pool size in place of the logged one): the measured request columns and the
    worksheet's result. bench_kv_drift.py replays the same way."""
    data = load_run(run_dir, chunks=False)
    measured = data.requests.to_pydict()
    settings = _run_settings(data.manifest) | ({} if blocks is None else {"num_kv_blocks": blocks})
    cfg = _engine_for(load_engine_config(ENGINE), settings)
    table, meta, _ = replay_table(run_dir, data.manifest, measured, "workload")
    return measured, simulate_trace(table, meta, cfg, replicas=1, route_policy="least-in-flight")


def _tpot_ms(rows: dict[str, list[Any]], i: int) -> float | None:
    n = rows["server_output_tokens"][i]
    if not n or n < 2 or rows["first_token_ns"][i] is None or rows["last_token_ns"][i] is None:
        return None
    return float((rows["last_token_ns"][i] - rows["first_token_ns"][i]) / 1e6 / (n - 1))


def _sweep(run_dir: Path) -> None:
    """The comparison with each pool size in place of the logged one (the run's settings, that one replaced)."""
    logged = offline._run_settings
    mapes = []
    for blocks in POOL_SIZES:
        offline._run_settings = lambda manifest, n=blocks: logged(manifest) | {"num_kv_blocks": n}  # type: ignore[misc]
        got = compare_run(run_dir, load_engine_config(ENGINE), "workload")
        worst = got.worst or {}
        mapes.append(got.mape_pct)
        print(
            f"   {blocks} blocks: worst |error| {abs(worst.get('signed_pct', 0.0)):.1f}% ({worst.get('figure')}), "
            f"MAPE {got.mape_pct:.2f}%, preemptions {got.engine_notes.get('preemptions')}"
        )
    offline._run_settings = logged
    print(f"   MAPE over the {len(mapes)} pool sizes: mean {np.mean(mapes):.2f}%")


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
        measured, result = replay(run_dir)
        engine_module.Engine._preempt = preempt  # type: ignore[method-assign]
        _report(result.requests_table.to_pydict(), measured, preempted)
        print(f"{ENGINE}: the pool-size sweep")
        _sweep(run_dir)


def _report(rows: dict[str, list[Any]], measured: dict[str, list[Any]], preempted: set[int]) -> None:
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
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
