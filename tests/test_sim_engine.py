"""The engine model alone: scheduling, KV accounting, preemption, prefix cache, window, cost, faults."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadgen.sim import Engine, Seq, list_presets, load_engine_config, parse_engine_config, parse_fault_header
from loadgen.sim.config import JITTER_PROBABILITIES, FaultConfig
from loadgen.sim.engine import NEVER_NS, DecodeRun, StepResult
from loadgen.sim.faults import FaultDecider
from loadgen.sim.protocol import FILLER_WORDS, filler_bytes, filler_text, token_bytes
from loadgen.util.errors import ScenarioError


def cfg(**sections):
    """An engine config with 1 ms fixed step cost and the given section overrides."""
    data = {"name": "test", "cost": {"fixed_ms": 1.0, "per_prefill_token_ms": 0.0, "per_decode_seq_ms": 0.0}}
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return parse_engine_config(data, "<test>")


def run_to_end(engine: Engine, seqs: list[Seq], max_steps: int = 100_000) -> int:
    t = 0
    for s in seqs:
        engine.add(s)
    steps = 0
    while engine.has_work:
        hold = engine.hold_until_ns(t)
        if hold is not None:
            t = hold
            continue
        res = engine.step(t)
        t += max(res.duration_ns, 1)
        steps += 1
        assert steps < max_steps, "engine did not finish"
        check_accounting(engine)
    return t


def check_accounting(e: Engine) -> None:
    """Each block's reference count is the number of sequences holding it (running ones, and with asynchronous
    scheduling those that finished a step ago); the free queue holds exactly the others; the hash map names each
    hashed block; a running sequence holds a block for each of its computed tokens' blocks."""
    holders = e.running + e._finished_late
    pool = e.pool
    refs = [0] * e.total_blocks
    for s in holders:
        assert len(set(s.blocks)) == len(s.blocks)
        for b in s.blocks:
            refs[b] += 1
        assert len(s.blocks) * e.block_size >= s.computed, "a running sequence holds fewer blocks than it computed"
        assert all(pool.hash_of[b] is not None for b in s.blocks[: s.num_cached])
    assert pool.ref == refs
    assert set(pool.free) == {b for b, r in enumerate(refs) if r == 0}
    assert e.kv_blocks_used == sum(1 for r in refs if r)
    named = {b: h for h, b in pool.by_hash.items()} | {b: h for h, later in pool.more.items() for b in later}
    assert all(later for later in pool.more.values()) and set(pool.more) <= set(pool.by_hash)
    assert named == {b: h for b, h in enumerate(pool.hash_of) if h is not None}


def test_presets_load_and_are_documented():
    names = list_presets()
    assert {"interactive-small-batch", "throughput-large-batch", "instant"} <= set(names)
    for name in names:
        config = load_engine_config(name)
        assert config.name == name and config.description
        assert config.num_kv_blocks > 0


def test_bad_config_is_one_line_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[scheduler]\nmax_num_seqs = 0\n')
    with pytest.raises(ScenarioError, match=r"bad.toml: scheduler.max_num_seqs = 0: expected"):
        load_engine_config(path)
    with pytest.raises(ScenarioError, match="no such preset"):
        load_engine_config("no-such-preset")


def test_chunked_prefill_splits_and_mixes_with_decodes():
    e = Engine(cfg(scheduler={"max_num_batched_tokens": 256}))
    a = Seq(0, 100, 50, 0)
    e.add(a)
    e.step(0)  # a prefills and emits its first token
    assert a.output == 1
    b = Seq(1, 1000, 5, 0)
    e.add(b)
    steps_to_first = 0
    while b.output == 0:
        res = e.step(0)
        steps_to_first += 1
        assert a in res.emitted, "decodes keep running while b prefills"
        assert res.prefill_tokens <= 255 and res.decode_seqs == 1
    assert steps_to_first == 4  # 1000 tokens at 255 per step (one budget token goes to a's decode)


def test_running_cap_queues_requests():
    e = Engine(cfg(scheduler={"max_num_seqs": 2}))
    seqs = [Seq(i, 10, 5, 0) for i in range(5)]
    for s in seqs:
        e.add(s)
    e.step(0)
    assert len(e.running) == 2 and len(e.waiting) == 3


def test_kv_exhaustion_preempts_newest_first_and_everything_finishes():
    e = Engine(cfg(kv={"num_kv_blocks": 12, "block_size": 4, "enable_prefix_caching": False}))
    seqs = [Seq(i, 8, 12, 0) for i in range(3)]  # each needs 5 blocks at the end: 15 > 12
    for s in seqs:
        e.add(s)
    preempted_first = None
    t = 0
    while e.has_work:
        res = e.step(t)
        t += res.duration_ns
        check_accounting(e)
        if res.preempted and preempted_first is None:
            preempted_first = [s.idx for s in seqs if s.preemptions]
    assert preempted_first == [2], "vLLM preempts the newest running request first"
    assert e.num_preemptions >= 1
    assert all(s.output == 12 for s in seqs)
    assert e.kv_blocks_used == 0 and e.kv_usage == 0


def _preempted_once(num_kv_blocks: int, prefix_caching: bool) -> tuple[Engine, Seq]:
    """Two 8-token prompts (4-token blocks, block-hash chains) decoding 12 tokens each in a small pool: the
    newer one is preempted once (with 16 tokens computed: 4 full blocks, 2 of them output); the engine and that
    sequence when both have finished."""
    e = Engine(cfg(kv={"num_kv_blocks": num_kv_blocks, "block_size": 4, "enable_prefix_caching": prefix_caching}))
    seqs = [Seq(i, 8, 12, 0, cache_key=100 * i + 1, chain=[100 * i + 1, 100 * i + 2]) for i in range(2)]
    run_to_end(e, seqs)
    assert [s.preemptions for s in seqs] == [0, 1] and all(s.output == 12 for s in seqs)
    return e, seqs[1]


def test_a_preempted_sequence_recomputes_only_what_was_evicted():
    """vLLM 0.19 caches every full block a request computed, its output's too, and freeing a preempted request
    leaves them evictable, tail first: its recompute hits what survived."""
    e, b = _preempted_once(10, prefix_caching=True)  # 9 blocks to hold (block 0 is vLLM's null block)
    assert b.cached_tokens == 16  # prompt and output blocks all survived: 1 token left to compute
    assert e.prompt_tokens_total == 16 and e.prefix_hits == 16
    e, b = _preempted_once(9, prefix_caching=True)  # the other sequence took one block back: the tail one
    assert b.cached_tokens == 12
    e, b = _preempted_once(10, prefix_caching=False)
    assert b.cached_tokens == 0 and e.prompt_tokens_total == 16 + 17  # everything recomputed


def test_prefix_cache_reuses_whole_blocks_only():
    e = Engine(cfg(kv={"block_size": 16}))
    a = Seq(0, 300, 2, 0, cache_key="sys", cache_limit_tokens=100)  # 100-token prefix = 6 whole blocks
    run_to_end(e, [a])
    b = Seq(1, 300, 2, 0, cache_key="sys", cache_limit_tokens=100)
    run_to_end(e, [b])
    assert b.cached_tokens == 96
    assert e.prefix_hits == 96 and e.prefix_queries == 600


def test_conversation_reuses_previous_turn_context():
    e = Engine(cfg(kv={"block_size": 16}))
    t1 = Seq(0, 200, 50, 0, cache_key="c1")
    run_to_end(e, [t1])
    t2 = Seq(1, 200 + 50 + 40, 10, 0, cache_key="c1")
    run_to_end(e, [t2])
    assert t2.cached_tokens == (200 + 50 - 1) // 16 * 16  # the last sampled token never got its KV


def test_prefix_chains_stop_at_the_first_different_block():
    e = Engine(cfg(kv={"block_size": 4}))
    a = Seq(0, 20, 1, 0, cache_key=1, chain=[1, 2, 3, 4, 5])
    run_to_end(e, [a])
    b = Seq(1, 20, 1, 0, cache_key=1, chain=[1, 2, 9, 9, 9])
    run_to_end(e, [b])
    assert b.cached_tokens == 8


def _hashed(e: Engine) -> int:
    """Blocks of the pool with a prefix-cache hash."""
    return sum(h is not None for h in e.pool.hash_of)


def test_evicted_prefix_blocks_make_room():
    e = Engine(cfg(kv={"block_size": 4, "num_kv_blocks": 11}))  # 10 blocks + the null block
    a = Seq(0, 32, 1, 0, cache_key="k")
    run_to_end(e, [a])
    assert _hashed(e) == 8 and e.kv_usage == 0  # cached but evictable: free as vLLM counts
    b = Seq(1, 36, 1, 0, cache_key="other")
    run_to_end(e, [b])  # needs 10 blocks: the cached ones are evicted
    assert b.output == 1 and _hashed(e) <= 10


def test_batching_window_holds_new_work():
    e = Engine(cfg(batching={"window_ms": 50, "min_waiting": 3}))
    e.add(Seq(0, 10, 2, 0))
    assert e.hold_until_ns(0) == 50_000_000
    e.add(Seq(1, 10, 2, 0))
    e.add(Seq(2, 10, 2, 0))
    assert e.hold_until_ns(0) is None  # min_waiting reached


def test_cost_model_terms():
    c = parse_engine_config(
        {
            "name": "c",
            "cost": {"fixed_ms": 2, "per_prefill_token_ms": 0.01, "per_decode_seq_ms": 0.5, "per_kv_token_ms": 0.001},
        }
    )
    e = Engine(c)
    e.add(Seq(0, 100, 3, 0))
    res = e.step(0)
    assert res.duration_ns == pytest.approx((2 + 100 * 0.01 + 100 * 0.001) * 1e6)
    res = e.step(0)
    assert res.decode_seqs == 1 and res.duration_ns == pytest.approx((2 + 0.5 + 101 * 0.001) * 1e6)


@pytest.mark.parametrize("on_engine_cpu", [True, False])
def test_request_overhead_on_engine_cpu_lengthens_the_next_step(on_engine_cpu):
    """A request that reaches the engine while a sequence runs costs the next step its overhead (the API server
    shares the engine's CPU), once; one that reaches an idle engine costs no step anything."""
    c = parse_engine_config(
        {
            "name": "c",
            "cost": {
                "fixed_ms": 2,
                "per_prefill_token_ms": 0.01,
                "per_decode_seq_ms": 0.5,
                "request_overhead_ms": 3,
                "request_overhead_on_engine_cpu": on_engine_cpu,
            },
        }
    )
    e = Engine(c)
    e.add(Seq(0, 100, 5, 0))  # idle engine: nothing owed
    assert e.step(0).duration_ns == pytest.approx((2 + 100 * 0.01) * 1e6)
    e.add(Seq(1, 100, 5, 0))  # arrives while request 0 decodes
    owed = 3 if on_engine_cpu else 0
    assert e.step(0).duration_ns == pytest.approx((2 + 100 * 0.01 + 0.5 + owed) * 1e6)
    assert e.step(0).duration_ns == pytest.approx((2 + 2 * 0.5) * 1e6)  # paid once


def test_abort_frees_blocks():
    e = Engine(cfg())
    s = Seq(0, 500, 100, 0)
    e.add(s)
    e.step(0)
    assert e.kv_usage > 0
    assert e.abort(s)
    assert e.kv_usage == 0 and not e.has_work and not e.abort(s)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 60), st.sampled_from([None, "g1", "g2", "c1"])),
        min_size=1,
        max_size=25,
    ),
    st.integers(8, 60),
    st.integers(1, 8),
    st.sampled_from([16, 64, 512]),
    st.sampled_from(["fcfs", "priority"]),
)
def test_accounting_holds_and_every_request_finishes(reqs, blocks, max_seqs, budget, policy):
    e = Engine(
        cfg(
            kv={"block_size": 16, "num_kv_blocks": blocks},
            scheduler={"max_num_seqs": max_seqs, "max_num_batched_tokens": budget, "policy": policy},
        )
    )
    seqs = []
    for i, (p, o, key) in enumerate(reqs):
        if -(-(p + o) // 16) > e.total_blocks:
            continue  # the servers reject requests larger than the whole cache (less vLLM's null block)
        seqs.append(
            Seq(
                i,
                p,
                o,
                i,
                priority=i % 3,
                cache_key=key,
                cache_limit_tokens=64 if key and key.startswith("g") else None,
            )
        )
    run_to_end(e, seqs)
    assert all(s.output == s.max_out and s.state == "finished" for s in seqs)
    assert e.kv_blocks_used == 0


class _StepLog:
    """A RunRecorder that lists each step as (end, duration, emitted, finished) request indexes and lets the
    requests due by then arrive, for driving an engine with or without ``decode_run``."""

    def __init__(self, engine: Engine, arrivals: list[tuple[int, Seq]]) -> None:
        self.engine = engine
        self.pending = sorted(arrivals, key=lambda a: a[0], reverse=True)
        self.rows: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []

    def arrive(self, t: int) -> int:
        while self.pending and self.pending[-1][0] <= t:
            self.engine.add(self.pending.pop()[1])
        return self.pending[-1][0] if self.pending else NEVER_NS

    def decodes(self, run: DecodeRun) -> int:
        for k, end in enumerate(run.ends_ns):
            last = k == len(run.ends_ns) - 1
            finished = tuple(s.idx for s in run.finished) if last else ()
            self.rows.append((end, run.durations_ns[k], tuple(run.idx), finished))
        return self.arrive(run.ends_ns[-1])

    def step(self, res: StepResult, end_ns: int) -> int:
        self.rows.append(
            (end_ns, res.duration_ns, tuple(s.idx for s in res.emitted), tuple(s.idx for s in res.finished))
        )
        return self.arrive(end_ns)


def drive(engine: Engine, arrivals: list[tuple[int, Seq]], fast: bool) -> _StepLog:
    """The worksheet's event loop in small: requests arrive at their times; steps one by one, or decode runs."""
    log = _StepLog(engine, arrivals)
    t, nxt = 0, log.arrive(0)
    for _ in range(100_000):
        if not engine.has_work:
            if nxt == NEVER_NS:
                return log
            t, nxt = nxt, log.arrive(nxt)
            continue
        hold = engine.hold_until_ns(t)
        if hold is not None:
            t = min(hold, nxt)
            nxt = log.arrive(t)
            continue
        end = engine.decode_run(t, nxt, log) if fast else None
        if end is None:
            res = engine.step(t)
            end = t + res.duration_ns
            nxt = log.step(res, end)
        t = end
        nxt = log.arrive(t)
        check_accounting(engine)
    raise AssertionError("engine did not finish")


def engine_state(engine: Engine, seqs: list[Seq]) -> tuple:
    counters = (
        engine.steps,
        engine.busy_ns,
        engine.prompt_tokens_total,
        engine.generation_tokens_total,
        engine.prefix_queries,
        engine.prefix_hits,
        engine.num_preemptions,
        engine.finished_total,
        engine.kv_blocks_used,
        [engine.pool.hash_of[b] for b in engine.pool.free],  # the free queue, as what its blocks cache
    )
    return counters, [
        (s.state, s.output, s.computed, len(s.blocks), s.num_cached, s.preemptions, s.cached_tokens) for s in seqs
    ]


#: Step jitter quantiles (ms) with a heavy right tail and draws below -fixed_ms (clamped to a tenth of the step).
JITTER_MS = [-9.0, -3.0, -1.0, -0.3, 0.0, 0.4, 1.5, 4.0, 30.0]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 300),
            st.integers(1, 60),
            st.integers(0, 40),
            st.sampled_from([None, "g1", "g2", "c1"]),
            st.sampled_from([None, None, 1, 5]),
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(12, 80),
    st.integers(1, 8),
    st.sampled_from([16, 64, 512]),
    st.sampled_from(["fcfs", "priority"]),
    st.sampled_from([1, 4, 16]),
    st.sampled_from([(0.0, 1), (5.0, 3)]),
    st.sampled_from([(0.0, []), (0.3, []), (0.3, JITTER_MS), (0.0, JITTER_MS)]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
@example(  # a conversation and a prefix group: their keys' hash numbers must not depend on which is met first
    reqs=[(1, 1, 0, None, None), (1, 4, 3, "c1", None), (4, 1, 0, "g1", None)],
    blocks=12,
    max_seqs=2,
    budget=16,
    policy="fcfs",
    block_size=4,
    window=(0.0, 1),
    noise=(0.0, []),
    chunked=False,
    overhead_on_cpu=False,
    reserve=False,
)
def test_decode_runs_take_the_same_steps(
    reqs, blocks, max_seqs, budget, policy, block_size, window, noise, chunked, overhead_on_cpu, reserve
):
    """``decode_run`` leaves the engine, step for step, as ``step`` alone does (issue 13), also when arrivals
    owe the next step their request overhead."""
    window_ms, min_waiting = window
    sigma, jitter = noise
    config = cfg(
        kv={"block_size": block_size, "num_kv_blocks": blocks * 16 // block_size},
        scheduler={
            "max_num_seqs": max_seqs,
            "max_num_batched_tokens": budget if chunked else 512,
            "policy": policy,
            "chunked_prefill": chunked,
            "reserve_full_isl": reserve,
            "max_model_len": 8192 if chunked else 512,  # vLLM starts without chunking only when a prompt fits
        },
        cost={
            "per_decode_seq_ms": 0.1,
            "per_kv_token_ms": 0.001,
            "noise_sigma": sigma,
            "step_jitter_ms": jitter,
            "request_overhead_ms": 1.5,
            "request_overhead_on_engine_cpu": overhead_on_cpu,
        },
        batching={"window_ms": window_ms, "min_waiting": min_waiting},
    )
    runs = []
    for fast in (True, False):
        engine = Engine(config, seed=3)
        arrivals, seqs, t = [], [], 0
        for i, (p, o, gap_ms, key, stop) in enumerate(reqs):
            if -(-(p + o) // block_size) > engine.total_blocks or (not chunked and p + o > 512):
                continue  # the servers reject requests larger than the whole cache (or a whole-prompt step)
            seq = Seq(
                i, p, o, t, priority=i % 3, cache_key=key, cache_limit_tokens=64 if key and key[0] == "g" else None
            )
            seq.stop_after = stop
            t += gap_ms * 1_000_000
            arrivals.append((seq.arrival_ns, seq))
            seqs.append(seq)
        log = drive(engine, arrivals, fast)
        runs.append((log.rows, engine_state(engine, seqs)))
    assert runs[0] == runs[1]


def test_decode_run_leaves_an_admission_that_would_preempt_to_step():
    """Decodes that need more blocks than are free, in a step that would admit the queue head: step preempts."""
    e = Engine(
        cfg(
            kv={"block_size": 4, "num_kv_blocks": 7, "enable_prefix_caching": False},
            scheduler={"max_num_batched_tokens": 6, "max_num_seqs": 6},
        )
    )
    decoding = []
    for i in range(3):  # 8 tokens computed in 2 blocks each: each needs a third for its next token
        s = Seq(i, 8, 50, 0)
        s.state, s.computed, s.output, s.prompt_done, s.emitted = "running", 8, 1, True, 1
        s.blocks = e.pool.take(2)
        decoding.append(s)
    e.running = list(decoding)
    e.add(Seq(3, 2, 5, 0))  # needs one block, the one free: admissible, but not after the decodes' three
    assert e.decode_run(0, NEVER_NS, _StepLog(e, [])) is None
    assert [s.computed for s in decoding] == [8, 8, 8] and e.kv_blocks_used == 6 and e.steps == 0
    res = e.step(0)
    assert res.preempted > 0
    check_accounting(e)


def test_fault_header_parsing():
    plan = parse_fault_header("stall=1.5@10, disconnect@5, malformed@3, slow_start=2")
    assert (plan.stall_s, plan.stall_after, plan.disconnect_after, plan.malformed_after, plan.slow_start_s) == (
        1.5,
        10,
        5,
        3,
        2.0,
    )
    assert parse_fault_header("error=503").error_status == 503
    assert parse_fault_header("429=2.5").retry_after_s == 2.5
    for bad in ("explode", "error=200", "stall=x", "disconnect@-1"):
        with pytest.raises(ValueError):
            parse_fault_header(bad)


def test_fault_decider_is_seeded_and_rates_hold():
    config = FaultConfig(seed=3, error_rate=0.1, stall_rate=0.2)
    d1, d2 = FaultDecider(config, seed=1), FaultDecider(config, seed=1)
    plans1 = [d1.decide() for _ in range(2000)]
    plans2 = [d2.decide() for _ in range(2000)]
    assert [p and p.items() for p in plans1] == [p and p.items() for p in plans2]
    errors = sum(1 for p in plans1 if p and p.error_status)
    stalls = sum(1 for p in plans1 if p and p.stall_s)
    assert 140 < errors < 260 and 300 < stalls < 420
    other = FaultDecider(config, seed=2)
    assert [p and p.items() for p in plans1[:200]] != [p and p.items() for p in (other.decide() for _ in range(200))]


def test_filler_is_one_token_per_word_and_bytes_match():
    import numpy as np

    from loadgen.workload.prompts import get_tokenizer

    tok = get_tokenizer("cl100k_base")
    text = filler_text(3, 200)
    assert tok.count(text) == 200
    assert all(tok.count(w) == 1 for w in FILLER_WORDS)
    starts = np.array([0, 5, 17, 40])
    counts = np.array([1, 3, 16, 33])
    assert filler_bytes(starts, counts).tolist() == [len(filler_text(s, c)) for s, c in zip(starts, counts)]
    every = np.arange(3 * len(FILLER_WORDS))
    assert token_bytes(every).tolist() == filler_bytes(every, np.ones_like(every)).tolist()


def test_public_names_exist():
    import loadgen.sim as sim

    for name in sim.__all__:
        assert getattr(sim, name) is not None, name


def test_step_jitter_reproduces_its_quantiles():
    """A calibrated engine's steps spread as its measured jitter says: each step is the modelled time plus a draw
    whose quantiles are ``step_jitter_ms`` (interpolated between them), and none is shorter than a tenth of it."""
    jitter = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0, 12.0]
    e = Engine(cfg(cost={"fixed_ms": 10.0, "step_jitter_ms": jitter}), seed=5)
    e.add(Seq(0, 4, 20_000, 0))
    now, extra_ms = 0, []
    while e.running or e.waiting:
        res = e.step(now)
        now += res.duration_ns
        extra_ms.append(res.duration_ns / 1e6 - 10.0)
    got = np.quantile(extra_ms, JITTER_PROBABILITIES)
    assert got == pytest.approx(jitter, abs=0.25), got
    plain = Engine(cfg(cost={"fixed_ms": 10.0}), seed=5)
    plain.add(Seq(0, 4, 50, 0))
    assert plain.step(0).duration_ns == 10_000_000  # no jitter configured: the modelled time exactly
    clamped = Engine(cfg(cost={"fixed_ms": 10.0, "step_jitter_ms": [-50.0] * 9}), seed=5)
    clamped.add(Seq(0, 4, 50, 0))
    assert clamped.step(0).duration_ns == 1_000_000


@pytest.mark.parametrize(
    "jitter, expected",
    [
        ([1.0, 2.0], "expected 9 non-decreasing quantiles .* got 2 values"),
        ([0, 1, 2, 3, 4, 5, 6, 7, 1], "non-decreasing"),
        ([0.0] * 8 + [1e9], "within"),
        ([0.0] * 8 + [float("nan")], "step_jitter_ms"),
    ],
)
def test_step_jitter_must_be_quantiles(jitter, expected):
    with pytest.raises(ScenarioError, match=expected):
        cfg(cost={"step_jitter_ms": jitter})


def test_prompts_that_part_inside_a_cached_chain_cache_their_own_blocks():
    """The prefix cache is a tree: b parts from a after two blocks and caches its own in a branch, which c then
    reuses (a one-chain-per-first-block cache would give c only a's two blocks)."""
    e = Engine(cfg(kv={"block_size": 4}))
    a = Seq(0, 20, 1, 0, cache_key=1, chain=[1, 2, 3, 4, 5])
    run_to_end(e, [a])
    b = Seq(1, 20, 1, 0, cache_key=1, chain=[1, 2, 9, 10, 11])
    run_to_end(e, [b])
    c = Seq(2, 20, 1, 0, cache_key=1, chain=[1, 2, 9, 10, 12])
    run_to_end(e, [c])
    d = Seq(3, 20, 1, 0, cache_key=1, chain=[1, 2, 3, 4, 6])
    run_to_end(e, [d])
    assert (b.cached_tokens, c.cached_tokens, d.cached_tokens) == (8, 16, 16)
    cached = sum(h is not None for h in e.pool.hash_of)
    assert e.reset_prefix_cache() == cached
    assert not e.pool.by_hash and e.kv_usage == 0


def _chain(tokens: list[int]) -> list[int]:
    """Chained block keys of one-token blocks: key i names tokens 0..i (as the engine's chains do)."""
    out, prev = [], 0
    for t in tokens:
        prev = hash((prev, t)) & ((1 << 62) - 1)
        out.append(prev)
    return out


@settings(max_examples=40)
@given(
    st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=12), st.integers(1, 6)), max_size=20),
    st.integers(84, 120),
)
def test_tree_cache_accounting_holds_under_eviction(prompts, blocks):
    """Branching prompts, more cached blocks than the cache holds: the block accounting holds at every step,
    everything finishes, and a reset drops every cached block."""
    e = Engine(cfg(kv={"block_size": 1, "num_kv_blocks": blocks}, scheduler={"max_num_seqs": 4}))
    seqs = [
        Seq(i, len(tokens), out, i, cache_key=_chain(tokens)[0], chain=_chain(tokens))
        for i, (tokens, out) in enumerate(prompts)
    ]
    run_to_end(e, seqs)
    assert all(s.state == "finished" for s in seqs)
    assert e.kv_blocks_used == 0 and e.kv_usage == 0
    e.reset_prefix_cache()
    assert not e.pool.by_hash and all(h is None for h in e.pool.hash_of)


def _tiny_pool(num_kv_blocks: int, block_size: int, **scheduler) -> Engine:
    return Engine(cfg(kv={"num_kv_blocks": num_kv_blocks, "block_size": block_size}, scheduler=scheduler))


def test_a_queue_head_evicts_the_unreferenced_tail_of_its_own_entry():
    """Found waiting forever on main: a 2-block pool (+ the null block), 2-token blocks. The first request caches
    one block of its prefix group; the second shares 1 token of it, so it hits nothing, yet its trial pinned the
    whole entry and the one free block was too few. vLLM evicts a cached block no request references."""
    e = _tiny_pool(3, 2)
    a = Seq(0, 2, 2, 0, cache_key="g", cache_limit_tokens=2)
    b = Seq(1, 3, 1, 0, cache_key="g", cache_limit_tokens=1)
    run_to_end(e, [a, b], max_steps=1000)
    assert a.output == 2 and b.output == 1 and b.cached_tokens == 0


def test_a_running_hit_inside_an_entry_leaves_its_tail_evictable():
    """Block-hash chains that part inside an entry: the second prompt references its first block only, and the
    blocks past it (the first prompt's own) are evicted before anyone waits or is preempted."""
    e = _tiny_pool(6, 2, max_num_seqs=1)
    a = Seq(0, 8, 1, 0, cache_key=1, chain=[1, 2, 3, 4])
    b = Seq(1, 8, 2, 0, cache_key=1, chain=[1, 9, 8, 7])
    run_to_end(e, [a, b], max_steps=1000)
    assert b.cached_tokens == 2 and b.output == 2 and e.num_preemptions == 0


def test_a_request_larger_than_the_pool_is_refused():
    e = _tiny_pool(3, 2)
    assert e.fits(3, 1) and not e.fits(4, 1)
    with pytest.raises(ValueError, match="request 0: 4 prompt \\+ 1 output tokens need more than the 2 KV blocks"):
        e.add(Seq(0, 4, 1, 0))


def _traces(draw: st.DrawFn) -> tuple[Engine, list[Seq]]:
    """A small engine and requests that fit its pool, sharing prefixes three ways (block-hash chains that part
    anywhere, prefix groups with differing shareable prefixes, conversations), arriving together."""
    bs = draw(st.sampled_from([1, 2, 4]))
    lengths = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 8)), min_size=1, max_size=5))
    largest = max(-(-(p + o) // bs) for p, o in lengths)
    pool = largest + draw(st.integers(0, 3)) + 1  # + the null block
    scheduler = {"max_num_seqs": draw(st.integers(1, 4)), "max_num_batched_tokens": draw(st.sampled_from([4, 8]))}
    scheduler["async_scheduling"] = draw(st.booleans())
    scheduler["reserve_full_isl"] = draw(st.booleans())
    e = _tiny_pool(pool, bs, **scheduler)
    mode = draw(st.sampled_from(["chain", "group", "conversation"]))
    seqs = []
    for i, (p, o) in enumerate(lengths):
        group = draw(st.integers(0, 1))
        if mode == "chain":
            part = draw(st.integers(0, p // bs))
            chain = [100 * group + j for j in range(part)] + [10_000 * (i + 1) + j for j in range(part, p // bs)]
            seqs.append(Seq(i, p, o, 0, cache_key=chain[0] if chain else None, chain=chain))
        elif mode == "group":
            seqs.append(Seq(i, p, o, 0, cache_key=group, cache_limit_tokens=draw(st.integers(0, p))))
        else:
            seqs.append(Seq(i, p, o, 0, cache_key=f"c{group}"))
    return e, seqs


def _check_blocks(e: Engine) -> None:
    """The block accounting (``check_accounting``), and the pool is all of num_kv_blocks but the null block."""
    check_accounting(e)
    assert len(e.pool.ref) == e.num_kv_blocks - 1


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_trace_on_a_pool_that_holds_its_largest_request_completes(data):
    """Every request ends with all its tokens, within a bound on steps (no queue head waits forever), and the
    block accounting holds after every step (``_check_blocks``)."""
    e, seqs = _traces(data.draw)
    for s in seqs:
        e.add(s)
    t = steps = 0
    while e.has_work:
        t += max(e.step(t).duration_ns, 1)
        steps += 1
        assert steps < 2000, "a queue head waits forever"
        _check_blocks(e)
    assert all(s.output == s.max_out and s.state == "finished" for s in seqs)
