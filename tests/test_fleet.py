"""Fleet sizing on the simulated engine: N engines behind the routing policy in virtual time (the worksheet),
and ``loadgen plan`` with ``[fleet] replicas`` saying the smallest replica count per rate step."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from loadgen.analysis import analyze_run
from loadgen.plan.fleet import build_fleet
from loadgen.plan.spec import parse_plan
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.sim import run_worksheet
from loadgen.trace.io import write_trace
from loadgen.util.errors import ScenarioError

REPO = Path(__file__).resolve().parents[1]


def _trace(path: Path, n: int, rate_rps: float, conversations: int = 0) -> Path:
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    rows = []
    for i in range(n):
        conv = f"c{i % conversations}" if conversations and i % 3 == 0 else None
        rows.append(
            {
                "request_id": f"r{i:05d}",
                "request_class": "long-thread" if conv else "short-message",
                "scheduled_offset_ns": int(t[i] * 1e9),
                "prompt_tokens": 200,
                "output_tokens": 40,
                "prefix_group": None,
                "prefix_tokens": None,
                "conversation_id": conv,
                "turn_index": (i // (3 * conversations)) if conv else None,
                "cancel_after_tokens": None,
            }
        )
    return write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path, {"mode": "open", "max_in_flight": 512})


@pytest.mark.parametrize("policy", ["round-robin", "least-in-flight"])
def test_worksheet_fleet_routes_every_request_and_serves_more(tmp_path, policy):
    trace = _trace(tmp_path / "t.parquet", 600, 60.0, conversations=5)
    one = analyze_run(run_worksheet(trace, "interactive-small-batch", tmp_path / "one", seed=1))
    out = run_worksheet(trace, "interactive-small-batch", tmp_path / "two", seed=1, replicas=2, route_policy=policy)
    run = load_run(out)
    rows = run.requests.to_pylist()
    assert len(rows) == 600 and all(r["target_index"] in (0, 1) for r in rows)
    per = collections.Counter(r["target_index"] for r in rows)
    assert per[0] + per[1] == 600 and min(per.values()) > 200
    sticky = collections.defaultdict(set)
    for r in rows:
        if r["conversation_id"]:
            sticky[r["conversation_id"]].add(r["target_index"])
    assert sticky and all(len(v) == 1 for v in sticky.values())
    m = run.manifest.to_dict()
    assert len(m["targets"]) == 2 and m["routing"]["policy"] == policy and m["routing"]["routed"] == [per[0], per[1]]
    labels = {json.loads(x).get("target_index") for x in run.server_metrics.column("labels").to_pylist()}
    assert {"0", "1"} <= labels  # each engine's state is labelled with its replica
    two = analyze_run(out)
    assert two.replicas is not None and sum(r["n_scheduled"] for r in two.replicas["replicas"]) == 600
    # at a rate one engine cannot hold, two engines have a lower TTFT p99 (virtual time: deterministic)
    assert two.overall.metrics["ttft_ms"]["p99"] < one.overall.metrics["ttft_ms"]["p99"]
    # same inputs, same fleet: identical tables
    again = load_run(
        run_worksheet(trace, "interactive-small-batch", tmp_path / "again", seed=1, replicas=2, route_policy=policy)
    )
    assert again.requests.equals(run.requests) and again.chunks.equals(run.chunks)


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ({"replicas": [2, 1]}, "fleet.replicas"),
        ({"replicas": [0, 1]}, "fleet.replicas"),
        ({"replicas": [1, 2], "route_policy": "random"}, "fleet.route_policy"),
    ],
)
def test_fleet_errors_are_one_line(fleet, expected):
    with pytest.raises(ScenarioError) as err:
        parse_plan({"name": "p", "scenario": "s.toml", "trace": "t", "rates_rps": [1], "fleet": fleet}, "p.toml")
    assert "\n" not in str(err.value) and expected in str(err.value) and str(err.value).startswith("p.toml")


@pytest.mark.slow
def test_plan_sizes_the_fleet_on_the_worksheet(tmp_path):
    plan = REPO / "scenarios" / "plans" / "fleet.toml"  # the shipped fleet plan: 1, 2, 4 engines, 8-64 rps
    out = tmp_path / "plan"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "plan", str(plan), "--sim-worksheet", "interactive-small-batch"]
        + ["--out", str(out), "--quiet", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr
    fleet = json.loads(proc.stdout)
    assert fleet["kind"] == "loadgen.fleet" and fleet["replicas"] == [1, 2, 4]
    assert json.loads((out / "fleet.json").read_text()) == fleet and (out / "fleet.md").is_file()
    (line,) = fleet["lines"]
    smallest = line["smallest_replicas"]
    inside = {int(n): i for n, i in line["max_inside_rate_index"].items()}
    # more engines hold at least as high a rate, and the smallest count never decreases with the rate
    assert (inside[1] if inside[1] is not None else -1) <= inside[2] <= inside[4]
    known = [n for n in smallest if n is not None]
    assert known == sorted(known) and len(set(known)) >= 2, smallest
    for i, n in enumerate(smallest):  # the count named is the first whose boundary reaches the step
        if n is not None:
            assert inside[n] >= i and all((inside[m] if inside[m] is not None else -1) < i for m in (1, 2, 4) if m < n)
    for n in (1, 2, 4):
        region = json.loads((out / f"replicas-{n}" / "region.json").read_text())
        assert region["target"].get("replicas", 1) == n
    # a fleet plan on a live target is refused in one line
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "plan",
            str(plan),
            "--target",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "fleet" in bad.stderr, bad.stderr


def test_a_fleet_of_an_expert_parallel_engine_counts_whole_servers(tmp_path):
    """The -ep2 engine is one DP rank of a 2-GPU expert-parallel server: one replica of it alone is half a server
    (its partner priced as equally loaded, never simulated), so the shipped fleet plan's replicas 1 is refused in
    one line before anything runs; whole servers (2, 4) are walked."""
    plan = REPO / "scenarios" / "plans" / "fleet.toml"  # replicas 1, 2, 4
    cmd = [sys.executable, "-m", "loadgen", "plan", str(plan), "--sim-worksheet", "rtxpro6000-qwen3-30b-a3b-tp1-ep2"]
    res = subprocess.run([*cmd, "--out", str(tmp_path / "fleet"), "--quiet"], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "fleet.replicas = [1, 2, 4]: 1: engine rtxpro6000-qwen3-30b-a3b-tp1-ep2 is one data-parallel rank" in (
        res.stderr
    )
    assert "expected multiples of 2 (whole vLLM servers)" in res.stderr
    assert not list((tmp_path / "fleet").glob("replicas-*/cells/*"))
    whole = tmp_path / "whole.toml"
    whole.write_text(
        plan.read_text().replace("replicas = [1, 2, 4]", "replicas = [2]").replace("../", f"{REPO}/scenarios/")
    )
    res = subprocess.run(
        [*cmd[:4], str(whole), *cmd[5:], "--out", str(tmp_path / "whole"), "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["replicas"] == [2]


def test_a_count_whose_boundary_is_the_first_rate_step_holds_that_step():
    """A replica count whose highest inside step is step 0 holds step 0 (found by the capacity-region audit: one
    engine inside at 16 rps only was passed over, and the fleet asked for 2 engines at 16 rps)."""

    def region(max_inside: int | None) -> dict:
        boundary = [{"concurrency": 256, "max_inside_rate_index": max_inside}]
        return {
            "plan": "p",
            "rate_kind": "rps",
            "rate_steps": [16.0, 32.0, 64.0],
            "concurrency": [256],
            "status": "complete",
            "classes": {"short-message": {"warm": {"boundary": boundary}}},
        }

    fleet = build_fleet({1: region(0), 2: region(1), 4: region(None)}, "least-in-flight")
    (line,) = fleet["lines"]
    assert line["smallest_replicas"] == [1, 2, None]
