"""vLLM 0.19's data-parallel balancer as the worksheet emulates it (loadgen.sim.dp_balance): the score, the
tie, the local increments between publications, and the coordinator's publications from the ranks' reports,
each worked by hand from vLLM's code (core_client.py ``get_core_engine_for_request``, coordinator.py)."""

from __future__ import annotations

import pyarrow as pa

from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import TRACE_FULL_SCHEMA
from loadgen.sim import load_engine_config
from loadgen.sim.dp_balance import VLLM_DP, ServerRouter, VllmDpBalancer
from loadgen.sim.worksheet import run_worksheet, simulate_trace
from loadgen.trace.io import write_trace

MS = 1_000_000


def _balancer(ranks: int = 2) -> VllmDpBalancer:
    return VllmDpBalancer(ranks)


def test_a_burst_spreads_over_the_ranks_by_local_increments():
    # idle ranks, nothing published yet: rank 0 wins the tie, and each request routed adds 4 to its rank's score
    b = _balancer()
    assert [b.assign(None, now_ns=t * MS) for t in (0, 1, 2, 3)] == [0, 1, 0, 1]
    assert b.published == [[2, 0], [2, 0]] and b.routed == [2, 2]


def test_the_score_weighs_a_waiting_request_as_four_running():
    b = _balancer()
    b.published = [[1, 0], [0, 3]]  # score 4 against 3: rank 1
    assert b.assign(None, now_ns=0) == 1
    b.published = [[1, 0], [0, 5]]  # 4 against 8: rank 0
    assert b.assign(None, now_ns=0) == 0


def test_conversations_are_not_sticky():
    b = _balancer()
    assert [b.assign("same", now_ns=0), b.assign("same", now_ns=0)] == [0, 1]


def test_the_coordinator_publishes_the_last_complete_step_every_100_ms():
    b = _balancer()
    # both ranks report as they schedule step 1 at 10 ms, then step 2 at 40 ms, step 3 at 70 ms, ...
    for step, t in enumerate(range(10, 400, 30), start=1):
        b.observe(0, t * MS, (0, step))
        b.observe(1, t * MS, (0, 10 * step))
    # step 2's first report (40 ms) makes step 1 the last complete one: published at once (the poll's least wait
    # of 50 ms only holds while no complete step is held), then 100 ms after it
    b.assign(None, now_ns=45 * MS)
    assert b.publications == 1 and b.published[0] == [1, 1] and b.published[1] == [0, 10]
    b.assign(None, now_ns=139 * MS)
    assert b.publications == 1  # the next is due at 140 ms
    b.assign(None, now_ns=141 * MS)
    # at 140 ms the last complete step is 4: step 5's reports (130 ms) came after it (4 and 40 running), + 1
    # waiting for the request routed at 141 ms (the one at 139 ms went to rank 0 on the counts of step 1)
    assert b.publications == 2 and b.published == [[1, 4], [0, 40]]


def test_a_quiet_coordinator_waits_50_ms_after_a_report():
    b = _balancer()
    b.observe(0, 1_000 * MS, (0, 1))  # one report after a long quiet spell, no newer step
    b.assign(None, now_ns=1_049 * MS)
    assert b.publications == 0
    b.assign(None, now_ns=1_050 * MS)
    assert b.publications == 1 and b.published[0][1] == 1


def _table(n: int, gap_ms: int) -> pa.Table:
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "request_class": ["c"] * n,
        "scheduled_offset_ns": [i * gap_ms * MS for i in range(n)],
        "prompt_tokens": [200] * n,
        "output_tokens": [50] * n,
    }
    return pa.Table.from_pydict(
        {f.name: cols.get(f.name, [None] * n) for f in TRACE_FULL_SCHEMA}, schema=TRACE_FULL_SCHEMA
    )


def test_the_worksheet_routes_dp_ranks_by_the_balancer_deterministically():
    cfg = load_engine_config("rtxpro6000-qwen3-30b-a3b-tp1-ep2")
    table = _table(40, 20)
    one = simulate_trace(table, {"mode": "open"}, cfg, replicas=2, route_policy=VLLM_DP)
    again = simulate_trace(table, {"mode": "open"}, cfg, replicas=2, route_policy=VLLM_DP)
    assert one.requests_table.equals(again.requests_table)
    routed = one.notes["routed"]
    assert sum(routed) == 40 and min(routed) >= 15  # spread over both ranks
    assert one.notes["route_policy"] == VLLM_DP


def test_a_fleet_of_expert_parallel_servers_routes_in_two_levels(tmp_path):
    """Four engines of an EP-2 profile are two servers of two DP ranks: round-robin picks the server (as a client
    routes over --target URLs), each server's vLLM balancer picks the rank; the run directory says so."""
    b = ServerRouter(2, 2, "round-robin")
    # the client alternates servers; each server's balancer spreads its own burst over its two ranks
    assert [b.assign(None, now_ns=t * MS) for t in range(8)] == [0, 2, 1, 3, 0, 2, 1, 3]
    b.finished(3)
    assert b.in_flight == [2, 2, 2, 1] and b.client.in_flight == [4, 3] and b.balancers[1].in_flight == [2, 1]
    cfg = load_engine_config("rtxpro6000-qwen3-30b-a3b-tp1-ep2")
    trace = tmp_path / "t.parquet"
    write_trace(_table(24, 30), trace, {"mode": "open"})
    out = run_worksheet(trace, cfg, tmp_path / "run", replicas=4, route_policy="round-robin")
    routing = read_manifest(out).model_dump(mode="json")["routing"]
    assert (routing["servers"], routing["ranks_per_server"], routing["within_server"]) == (2, 2, VLLM_DP)
    assert sum(routing["routed"]) == 24 and min(routing["routed"]) >= 4
