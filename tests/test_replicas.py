"""Several target URLs (replicas) in one run: routing, sticky conversations, per-replica accounting, a
replica killed mid-run, and the per-replica breakdown of the analysis (two live sim servers on loopback)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_driver_live import _kill_after_successes, assert_exact_accounting, counts, engine_file, make_trace

from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir import load_run
from loadgen.targets import launch_sim_server

REPO = Path(__file__).resolve().parents[1]


def _replica_counts(run) -> collections.Counter:
    return collections.Counter(run.requests.column("target_index").to_pylist())


def _served(sim) -> float:
    import httpx

    text = httpx.get(sim.base_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


@pytest.mark.parametrize("policy", ["round-robin", "least-in-flight"])
def test_replicas_split_the_load_with_exact_accounting(tmp_path, policy):
    engine = engine_file(tmp_path, "fast", fixed_ms=1.0)
    rows = [{"request_id": f"r{i:03d}", "scheduled_offset_ns": i * 5_000_000} for i in range(40)]
    # two conversations of 4 turns each: every turn stays on its first turn's replica
    rows += [
        {
            "request_id": f"c{c}t{t}",
            "scheduled_offset_ns": 1_000_000 + t * 40_000_000 + c * 3_000_000,
            "conversation_id": f"conv{c}",
            "turn_index": t,
            "request_class": "long-thread",
        }
        for c in range(2)
        for t in range(4)
    ]
    rows.sort(key=lambda r: r["scheduled_offset_ns"])
    trace = make_trace(tmp_path / "t.parquet", rows)
    with launch_sim_server(str(engine)) as a, launch_sim_server(str(engine)) as b:
        out = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=a.base_url,
                replica_urls=[b.base_url],
                route_policy=policy,
                out_dir=tmp_path / "run",
                progress="off",
            )
        )
        served = (_served(a), _served(b))
    run = load_run(out)
    assert_exact_accounting(run, 48)
    assert counts(run) == {("ok", None): 48}
    per = _replica_counts(run)
    assert set(per) == {0, 1} and per[0] + per[1] == 48
    # what each server itself counted as served is what the records say was routed to it
    assert served == (per[0], per[1])
    if policy == "round-robin":  # strict alternation over first turns and single requests
        assert abs(per[0] - per[1]) <= 2
    turns = collections.defaultdict(set)
    for r in run.requests.to_pylist():
        if r["conversation_id"]:
            turns[r["conversation_id"]].add(r["target_index"])
    assert all(len(v) == 1 for v in turns.values()), turns
    m = run.manifest.to_dict()
    assert [t["base_url"] for t in m["targets"]] == [a.base_url, b.base_url]
    assert m["routing"]["policy"] == policy and m["routing"]["routed"] == [per[0], per[1]]
