"""The simulated engine's KV blocks and scheduler decisions against vLLM 0.19's, on small hand-made traces: one LRU
free queue (v1/core/block_pool.py), a refused waiting request touches nothing, hashes of full blocks and the hit
cap (kv_cache_manager.py), ``scheduler_reserve_full_isl`` and the running pass's end (sched/scheduler.py)."""

from __future__ import annotations

import pytest
from test_sim_engine import _StepLog, cfg, check_accounting, run_to_end

from loadgen.sim import Engine, Seq
from loadgen.sim.block_pool import BlockPool


def _engine(num_kv_blocks: int, **scheduler) -> Engine:
    """4-token blocks, ``num_kv_blocks`` - 1 of them usable (block 0 is vLLM's null block)."""
    return Engine(cfg(kv={"num_kv_blocks": num_kv_blocks, "block_size": 4}, scheduler=scheduler))


def test_the_free_queue_takes_from_its_head_and_frees_to_its_tail():
    pool = BlockPool(5)
    a = pool.take(2)
    assert a == [0, 1] and list(pool.free) == [2, 3, 4]  # never-used blocks first
    pool.cache(a, [11, 12])
    pool.release(reversed(a))  # a request frees its tail first
    assert list(pool.free) == [2, 3, 4, 1, 0] and pool.lookup(12) == 1
    pool.touch([pool.lookup(11)])  # a hit leaves the queue
    assert list(pool.free) == [2, 3, 4, 1] and pool.ref[0] == 1
    assert pool.take(4) == [2, 3, 4, 1] and pool.lookup(12) is None  # taking a cached block evicts its hash
    assert pool.lookup(11) == 0 and pool.num_free == 0
    pool.release([2, 3])
    pool.cache([2, 3], [11, 11])  # the same hash again: vLLM keeps every block, a look-up gets the first left
    assert pool.take(1) == [2] and pool.lookup(11) == 0 and pool.more == {11: [3]}
    pool.touch([3])  # a hit on it: out of the queue
    pool.release([0])
    assert pool.take(1) == [0] and pool.lookup(11) == 3 and not pool.more


def test_cached_blocks_freed_earlier_are_evicted_before_free_blocks_freed_later():
    """vLLM's free queue is one LRU list: the cached blocks of a request that finished first go before the blocks
    (cached or not) of one that finished after it, even its never-cached partial block."""
    e = _engine(6)  # 5 blocks
    a = Seq(0, 8, 1, 0, cache_key=1, chain=[1, 2])  # 2 full blocks, both cached
    run_to_end(e, [a])
    b = Seq(1, 6, 1, 0, cache_key=7, chain=[7])  # 1 cached block and a partial one
    run_to_end(e, [b])
    c = Seq(2, 12, 1, 0, cache_key=9, chain=[9, 9, 9])  # 3 blocks: the 1 never used, then a's 2
    run_to_end(e, [c])
    again_a = Seq(3, 8, 1, 0, cache_key=1, chain=[1, 2])
    again_b = Seq(4, 8, 1, 0, cache_key=7, chain=[7, 8])
    run_to_end(e, [again_b])
    run_to_end(e, [again_a])
    assert again_a.cached_tokens == 0, "a's blocks were evicted although b's partial block was free"
    assert again_b.cached_tokens == 4


def test_a_refused_waiting_request_touches_nothing():
    """A waiting request that cannot get its blocks leaves the free queue as it was (vLLM checks before it
    touches its hits): while nothing frees, the queue only loses blocks from its head, the waiting request's
    cached prefix among them."""
    e = _engine(9)  # 8 blocks
    run_to_end(e, [Seq(0, 8, 1, 0, cache_key=1, chain=[1, 2])])  # its 2 blocks cached
    run_to_end(e, [Seq(1, 8, 1, 0, cache_key=5, chain=[5, 6])])  # 2 more, behind them in the queue
    running = Seq(2, 12, 12, 0)  # 3 blocks, then one more every 4 tokens: 6 at its end
    head = Seq(3, 28, 1, 0, cache_key=1, chain=[1, 2, 3, 4, 5, 6, 7])  # hits 2 blocks, needs 5 more + those 2
    e.add(running)
    t = e.step(0).duration_ns
    e.add(head)
    hits = []
    while running.state == "running" and head.state == "waiting":
        before = list(e.pool.free)
        hits.append(len(e._hit(head, head.prompt)))
        res = e.step(t)
        t += res.duration_ns
        if res.finished:
            break  # the running request's blocks join the queue
        after = list(e.pool.free)
        assert after == before[len(before) - len(after) :]
        check_accounting(e)
    assert hits[0] == 2 and hits[-1] < 2, "the running request's blocks evicted the waiting one's prefix"


def test_a_prompt_of_whole_cached_blocks_recomputes_its_last_block():
    """The hit stops before the last token (``max_cache_hit_length = num_tokens - 1``): 8 tokens in 2 cached
    blocks hit 1 block."""
    e = _engine(8)
    run_to_end(e, [Seq(0, 8, 1, 0, cache_key=1, chain=[1, 2])])
    b = Seq(1, 8, 1, 0, cache_key=1, chain=[1, 2])
    run_to_end(e, [b])
    assert b.cached_tokens == 4 and e.prompt_tokens_total == 8 + 4


def test_reserve_full_isl_admits_only_what_fits_whole():
    """With ``reserve_full_isl`` (vLLM 0.19's default) a waiting request waits until blocks for its whole prompt are
    free; without, its first chunk's blocks are enough, and the running request's decodes then preempt it."""
    got = {}
    for reserve in (True, False):
        e = _engine(6, reserve_full_isl=reserve, max_num_batched_tokens=8, max_num_seqs=2)  # 5 blocks
        running = Seq(0, 8, 8, 0)  # 4 blocks at its end
        waiting = Seq(1, 16, 1, 0)  # 4 blocks; a first chunk of 7 tokens needs 2
        e.add(running)
        e.add(waiting)
        t, admitted_beside = 0, False
        while e.has_work:
            t += e.step(t).duration_ns
            admitted_beside |= running.state == "running" and waiting.scheduled_ns is not None
            check_accounting(e)
        assert running.output == 8 and waiting.output == 1
        got[reserve] = (admitted_beside, e.num_preemptions)
    assert got[True] == (False, 0)
    assert got[False] == (True, 1)


def test_a_running_request_that_preempts_itself_ends_the_running_pass():
    """Priority policy: the request that needs a block is itself the lowest priority, so it is the victim, and
    the running requests after it are not scheduled in that step (vLLM's ``schedule()`` breaks)."""
    e = _engine(4, policy="priority", max_num_batched_tokens=8, max_num_seqs=2)  # 3 blocks
    low = Seq(0, 4, 8, 0, priority=5)  # needs its 3rd block at its 9th token, before high needs its 2nd
    high = Seq(1, 1, 10, 0, priority=0)
    e.add(low)
    t = e.step(0).duration_ns  # low's prompt: 1 block
    e.add(high)
    while True:
        high_out = high.output
        res = e.step(t)
        t += res.duration_ns
        check_accounting(e)
        if res.preempted:
            break
    assert low.state == "waiting" and low.preemptions == 1
    assert res.emitted == [] and high.output == high_out, "high is not scheduled in the step low preempted itself in"


def test_async_scheduling_stamps_vllms_queued_and_scheduled_instants():
    """vLLM's engine core (EngineCore.step_with_batch_queue) adds a request once the step under way has ended
    (queued_ts) and schedules a step while the one before runs (Scheduler.schedule's scheduled_timestamp); an
    idle engine takes a request and schedules it at once."""
    e = Engine(cfg(scheduler={"async_scheduling": True}))  # 1 ms steps
    a, b = Seq(0, 8, 4, 0), Seq(1, 8, 2, 1_500_000)
    e.add(a)
    t = 0
    while a.state != "finished" or b.state != "finished":
        res = e.step(t)
        if t == 1_000_000:
            e.add(b)  # arrives at 1.5 ms, inside the step [1, 2) ms just taken
        t += res.duration_ns
    assert (a.queued_ns, a.scheduled_ns) == (0, 0)
    assert b.queued_ns == 2_000_000, "queued when the step under way at its arrival ended"
    assert b.scheduled_ns == 2_000_000, "its first step [3, 4) ms was scheduled as [2, 3) began"
    idle = Seq(2, 8, 1, 50_000_000)
    e.add(idle)
    e.step(50_000_000)
    assert (idle.queued_ns, idle.scheduled_ns) == (50_000_000, 50_000_000)


def test_taking_more_blocks_than_are_free_is_refused():
    pool = BlockPool(3)
    assert pool.take(2) == [0, 1]
    with pytest.raises(ValueError, match="2 blocks asked of a free queue of 1"):
        pool.take(2)


def _decoding(engine: Engine, idx: int, prompt: int) -> Seq:
    """A running sequence that has emitted its first token and holds the blocks of its computed tokens."""
    s = Seq(idx, prompt, 50, 0)
    s.state, s.computed, s.output, s.prompt_done, s.emitted = "running", prompt, 1, True, 1
    s.blocks = engine.pool.take(-(-prompt // 4))
    engine.running.append(s)
    return s


def _head_hit_taken_by_a_decode() -> tuple[Engine, Seq, Seq, Seq]:
    """A queue head whose one prefix hit waits at the free queue's head, and a decode that needs a new block
    this step: the decode's block is that hit."""
    e = _engine(9)  # blocks 0..7
    cached = e.pool.take(1)  # block 0, cached under the key's first block, then freed: queue 1..7, 0
    e.pool.cache(cached, [e._key_id("g1")])
    e.pool.release(cached)
    b = _decoding(e, 1, 8)  # blocks 1, 2; its next token needs a third
    d = _decoding(e, 2, 15)  # blocks 3..6; its next token fits its fourth
    e.pool.release(e.pool.take(1))  # block 7 to the tail: queue 0, 7
    head = Seq(3, 8, 5, 0, cache_key="g1", cache_limit_tokens=4)
    e.add(head)
    return e, b, d, head


def test_a_queue_head_does_not_admit_on_a_hit_the_decodes_took_this_step():
    """Before the step the head fits (one hit in the free queue + one new block = the two free); the decodes take
    the hit block first (evicting its hash), so the head misses and waits: with the decode fast path as step by
    step (the hit the fast path found before the step is not reused)."""
    for fast in (True, False):
        e, b, d, head = _head_hit_taken_by_a_decode()
        if fast:
            assert e.decode_run(0, 1, _StepLog(e, [])) is not None  # it admits nothing, then decodes on
        else:
            e.step(0)
        # block 0 went to a decode (the fast path hands a run's new blocks out in another order than step by step)
        assert 0 in {b.blocks[2], d.blocks[-1]} and e.pool.lookup(e._key_id("g1")) is None
        assert head.state == "waiting" and head.cached_tokens == 0 and not head.blocks
        check_accounting(e)
