"""The engine model: one step loop of a continuous-batching server (vLLM v1 scheduler semantics).

State: a waiting queue (FCFS or priority), running sequences under a cap, a token budget per step,
chunked prefill mixed with decodes, paged KV blocks held per sequence, a prefix cache of whole
blocks (by the trace's block hashes, shared-prefix group or conversation), preemption by recompute
(newest first) when a running sequence cannot get a block, and an optional batching window. ``Engine.step(now_ns)``
schedules one step, applies it and returns its duration from the cost model; the caller (worksheet
or live server) owns the clock. KV blocks are ids in a ``BlockPool`` (vLLM's: one LRU free queue, hashes
of full blocks), so eviction takes exactly the blocks vLLM's would.
``Engine.decode_run`` (the worksheet's fast path) takes the steps in which every running sequence
decodes, counting their decodes at once: the same steps, to the bit, as ``step`` one by one.
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .block_pool import BlockPool
from .config import JITTER_PROBABILITIES, EngineConfig
from .profile import OperatorProfile, cudagraph_capture_sizes, cudagraph_tokens
from .profile_grid import GridCoverage, ProfileGrid

__all__ = ["DecodeRun", "Engine", "RunRecorder", "Seq", "StepResult"]

#: Blocks of the pool no sequence holds: vLLM 0.19's BlockPool keeps block 0 back as its null block (a
#: placeholder in block tables), counted in the num_gpu_blocks it logs; its KV usage is over the others.
NULL_BLOCKS = 1
#: A time no step reaches (ns): "no limit" for ``Engine.decode_run``.
NEVER_NS = 1 << 62
#: A negative jitter draw shortens a step to no less than this fraction of its modelled time.
MIN_JITTERED_FRACTION = 0.1
_NO_NS = array("q")  # copied (quicker than array("q")) for a decode run's columns


class Seq:
    """One request inside the engine. Token counts only; no per-token objects."""

    __slots__ = (
        "arrival_ns",
        "blocks",
        "cache_limit",
        "cached_tokens",
        "chain",
        "computed",
        "ctx",
        "emitted",
        "first_token_ns",
        "hashes",
        "idx",
        "key",
        "max_out",
        "num_cached",
        "output",
        "preemptions",
        "priority",
        "prompt",
        "prompt_done",
        "queued_ns",
        "scheduled_ns",
        "shared_blocks",
        "state",
        "stop_after",
    )

    def __init__(
        self,
        idx: int,
        prompt_tokens: int,
        max_tokens: int,
        arrival_ns: int,
        *,
        priority: int = 0,
        cache_key: str | int | None = None,
        cache_limit_tokens: int | None = None,
        chain: list[int] | None = None,
        ctx: Any = None,
    ) -> None:
        self.idx = idx
        self.prompt = prompt_tokens
        self.max_out = max_tokens
        self.priority = priority
        self.arrival_ns = arrival_ns
        self.key = cache_key  # prefix-cache key: conversation id or prefix group
        self.cache_limit = cache_limit_tokens  # tokens of the shareable prefix; None = whole context
        self.output = 0  # tokens generated
        self.computed = 0  # tokens whose KV is computed (vLLM num_computed_tokens)
        self.blocks: list[int] = []  # KV block ids held, in token order (vLLM's req_to_blocks)
        self.num_cached = 0  # of them, the first ones with a prefix-cache hash (vLLM's num_cached_block)
        self.hashes: list[int] | None = None  # its blocks' prefix-cache hashes, as far as needed (Engine._hashes)
        self.prompt_done = False
        self.preemptions = 0
        self.state = "new"  # new | waiting | running | finished | aborted
        self.emitted = 0  # tokens emitted by the last step
        self.first_token_ns: int | None = None
        self.queued_ns: int | None = None  # when it joined the scheduler (vLLM's queued_ts; see Engine.add)
        self.scheduled_ns: int | None = None  # when a step was first scheduled with it (vLLM's scheduled_ts)
        self.cached_tokens = 0  # prefix-cache hit tokens at (last) admission
        self.ctx = ctx  # the face's per-request object
        self.chain = chain  # block hashes of the prompt's full blocks (live server); None = trust the key
        self.stop_after: int | None = None  # the client stops reading after this many tokens (worksheet)
        self.shared_blocks = 0  # full blocks of the prompt other requests may hit (Engine.add: Engine._shared_tokens)


@dataclass(slots=True)
class StepResult:
    """One engine step: its duration and what it did (seqs that emitted tokens this step)."""

    duration_ns: int
    emitted: list[Seq]
    finished: list[Seq]
    prefill_tokens: int
    decode_seqs: int
    kv_tokens_read: int
    preempted: int


@dataclass(slots=True)
class DecodeRun:
    """Decode-only steps taken at once (``Engine.decode_run``): each of ``seqs`` emitted one token in
    every step, in that order; the last step finished ``finished`` (already retired)."""

    seqs: list[Seq]
    idx: array[int]  # their request indexes (``Seq.idx``)
    ends_ns: array[int]  # end of each step (its tokens are due then)
    durations_ns: array[int]
    kv_blocks: array[int]  # blocks held by running sequences after each step (before retiring)
    waiting: int  # waiting requests during the run
    finished: list[Seq]


class RunRecorder(Protocol):
    """Where ``Engine.decode_run`` reports the steps it takes; each call does what the caller does after
    a step (record it, let due requests arrive) and returns the caller's next event (ns)."""

    def decodes(self, run: DecodeRun) -> int: ...

    def step(self, res: StepResult, end_ns: int) -> int: ...


class _DecodeSet:
    """The decoding sequences of a decode run, as its steps see them.

    They are not advanced step by step: each counts from the step of the run it joined in (``joined``,
    absent: from the start), as if it had been at ``computed`` - (that step) when the run began.
    """

    __slots__ = ("block_size", "bases", "cycle", "ends", "idx", "joined", "kv_read", "last")

    def __init__(self, seqs: list[Seq], block_size: int) -> None:
        self.block_size = block_size
        self.kv_read = 0  # their KV tokens computed at the run's start, summed
        self.cycle = [0] * block_size  # new blocks in a step of the run, by its index mod block_size
        self.ends: dict[int, list[Seq]] = {}  # by the steps of the run that finish them, in running order
        self.joined: dict[int, int] = {}  # id(seq) -> the steps of the run taken before it joined
        self.idx = array("i", [seq.idx for seq in seqs])
        self.last = NEVER_NS  # the steps of the run up to the first that finishes some
        self.bases: dict[int, int] = {}  # how many count from each ``computed`` at the run's start
        for seq in seqs:
            self._count(seq, 0)

    def _count(self, seq: Seq, done: int) -> None:
        c = seq.computed - done
        self.kv_read += c
        self.bases[c] = self.bases.get(c, 0) + 1
        # at ``computed`` = c it holds ceil(c / block_size) blocks: a new one in steps p, p + block_size, ...
        # (0-based) of the run, p = -c mod block_size
        self.cycle[-c % self.block_size] += 1
        stop = seq.max_out if seq.stop_after is None or seq.stop_after > seq.max_out else seq.stop_after
        end = stop - seq.output + done
        self.ends.setdefault(end, []).append(seq)
        if end < self.last:
            self.last = end

    def join(self, seq: Seq, done: int) -> None:
        """A sequence admitted in the run's step ``done`` that decodes from now on (last in running order)."""
        self.joined[id(seq)] = done
        self.idx = self.idx[:]  # a new array: a reported run keeps the one it had
        self.idx.append(seq.idx)
        self._count(seq, done)

    def kv_range(self, done: int) -> tuple[int, int]:
        """The longest and shortest KV (tokens) among the run's decodes in its step ``done`` (0-based)."""
        if not self.bases:
            return 0, 0
        return max(self.bases) + done + 1, min(self.bases) + done + 1

    def leave_out(self, seq: Seq) -> None:
        """A sequence admitted in the run that is still prefilling: the run ends, and never advances it."""
        self.joined[id(seq)] = NEVER_NS

    def finish(self) -> list[Seq]:
        """Take out the sequences the step ``last`` finishes, in running order."""
        finished = self.ends.pop(self.last)
        self.idx = self.idx[:]  # a new array: a reported run keeps the one it had
        for seq in finished:
            c = seq.computed - self.joined.get(id(seq), 0)
            self.kv_read -= c
            left = self.bases[c] - 1
            if left:
                self.bases[c] = left
            else:
                del self.bases[c]
            self.cycle[-c % self.block_size] -= 1
            self.idx.remove(seq.idx)  # request indexes are unique
        self.last = min(self.ends) if self.ends else NEVER_NS
        return finished


class Engine:
    """The scheduler + KV cache + cost model; deterministic for a given config, seed and input."""

    def __init__(self, config: EngineConfig, seed: int = 0) -> None:
        self.config = config
        s = config.scheduler
        self.block_size = config.kv.block_size
        self.num_kv_blocks = config.num_kv_blocks  # as vLLM logs it (num_gpu_blocks)
        self.total_blocks = max(1, config.num_kv_blocks - NULL_BLOCKS)  # what sequences can hold
        self.max_num_seqs = s.max_num_seqs
        self.max_batched = s.max_num_batched_tokens
        self.chunked = s.chunked_prefill
        self.long_prefill = s.long_prefill_token_threshold or 0
        self.priority_policy = s.policy == "priority"
        self.spec = s.decode_tokens_per_step
        self.prefix_caching = config.kv.enable_prefix_caching
        c = config.cost
        self._fixed_ns = c.fixed_ms * 1e6
        self._prefill_ns = c.per_prefill_token_ms * 1e6
        self._decode_ns = c.per_decode_seq_ms * 1e6
        self._kv_ns = c.per_kv_token_ms * 1e6
        self._profile: OperatorProfile | None = None  # [cost.profile]: step times from an operator profile
        if c.profile is not None:
            p = c.profile
            self._profile = p.load()
        self.profile = self._profile  # read by the worksheet (an expert-parallel group's lockstep)
        # the profile's measured grid, and the steps priced past it (the worksheet's engine notes: profile_grid)
        self.grid = ProfileGrid.of(self._profile) if self._profile is not None else None
        self.grid_coverage = GridCoverage()
        # the profile's token-count terms (ns) and the count they are charged at (CUDA-graph padded), memoised
        self._tokens_ns: dict[int, tuple[float, int]] = {}
        sched = config.scheduler
        # the CUDA graphs a profiled step may replay, padded up to one (none: every step runs unpadded); read by
        # the worksheet too (an expert-parallel group's padding)
        self.graph_sizes: tuple[int, ...] = (
            tuple(cudagraph_capture_sizes(sched.max_num_seqs, sched.max_num_batched_tokens))
            if sched.cuda_graphs
            else ()
        )
        self._seqs_ns: dict[int, float] = {}
        # the overhead of requests that reached the engine while it ran, owed by its next step (see add)
        self._stolen_ns = c.request_overhead_ms * 1e6 if c.request_overhead_on_engine_cpu else 0.0
        self._owed_ns = 0.0
        self._sigma = c.noise_sigma
        self._rng = np.random.default_rng(seed)
        self._noise: list[float] = []
        # additive jitter: its own stream, so an engine without it draws exactly the noise it always drew
        self._jitter_q = np.array(c.step_jitter_ms, dtype=np.float64) * 1e6 if c.step_jitter_ms else None
        self._jitter_rng = np.random.default_rng([seed, 1])
        self._jitter: list[float] = []
        self.window_ns = int(config.batching.window_ms * 1e6)
        self.min_waiting = config.batching.min_waiting

        self.waiting: deque[Seq] = deque()
        self.async_scheduling = s.async_scheduling
        self.reserve_full_isl = s.reserve_full_isl
        self._arrived: list[Seq] = []  # asynchronous scheduling: arrived during the step under way
        self._visible: list[Seq] = []  # ... during the one before: they join the queue at the next step's start
        # asynchronous scheduling: finished in the last step, they keep their seats and blocks through the next
        # step's scheduling (it was scheduled before their last token was known)
        self._finished_late: list[Seq] = []
        self._held_seats = 0
        # asynchronous scheduling: when the next step is scheduled (vLLM's scheduled_ts), the last step's start
        # while work goes on; None: when it starts (_scheduling_ns)
        self._next_scheduled_ns: int | None = None
        self._waiting_keys: list[tuple[int, int, int]] = []  # priority policy: sorted (prio, arrival, idx)
        self.running: list[Seq] = []
        self.pool = BlockPool(self.total_blocks)
        self._key_ids: dict[str | int, int] = {}  # prefix-cache key -> its number (_key_id), memoised
        self._reserved: list[int] = []  # a decode run's blocks, taken in its steps' order, not yet handed out
        self._head_hit: tuple[Seq, list[int]] | None = None  # the queue head's hit as _head_blocked last found it
        # cumulative counters (vLLM metric names in metrics.py)
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0  # prefill tokens computed (incl. recompute)
        self.generation_tokens_total = 0
        self.steps = 0
        self.busy_ns = 0
        self.finished_total = 0
        self.aborted_total = 0

    # -- queue -----------------------------------------------------------------------------------
    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request's whole context (prompt + output) fits the pool's blocks: one that does not could
        never run (vLLM refuses a prompt longer than its KV capacity), so the faces answer it 400 and ``add``
        refuses it."""
        return -(-(prompt_tokens + max_tokens) // self.block_size) <= self.total_blocks

    def add(self, seq: Seq) -> None:
        """Put a new request in the waiting queue (its arrival_ns is the caller's clock); one that does not
        ``fits`` the pool is a ValueError (it would wait forever). With the request
        overhead on the engine's CPU, a request that arrives while sequences run makes the next step owe it.
        With asynchronous scheduling, a request that arrives while sequences run waits for the step after the
        next: that one was scheduled when the step under way began. Its ``queued_ns`` (vLLM's ``queued_ts``) is
        then the end of the step under way, when vLLM's engine core takes new requests (``_reveal``); otherwise
        its arrival."""
        if not self.fits(seq.prompt, seq.max_out):
            raise ValueError(
                f"request {seq.idx}: {seq.prompt} prompt + {seq.max_out} output tokens need more than the "
                f"{self.total_blocks} KV blocks of {self.block_size} tokens the pool holds"
            )
        seq.state = "waiting"
        seq.shared_blocks = self._shared_tokens(seq) // self.block_size
        if self.async_scheduling and self.running:
            self._arrived.append(seq)
        else:
            seq.queued_ns = seq.arrival_ns
            self._enqueue(seq, front=False)
        if self.running:
            self._owed_ns += self._stolen_ns

    def load_counts(self) -> tuple[int, int]:
        """(waiting, running) as vLLM's scheduler counts them for its stats: the requests in its waiting queue
        (not those that arrived during the step under way, still in the engine core's input queue) and those
        running."""
        return len(self.waiting) + len(self._visible), len(self.running)

    def _release_finished(self, seqs: list[Seq]) -> None:
        """Asynchronous scheduling: free the seats and blocks of sequences that finished a step ago."""
        for seq in seqs:
            self._release(seq)
        self._held_seats = 0

    def _reveal(self, now_ns: int) -> None:
        """Asynchronous scheduling, at a step's start (``now_ns``): the requests that arrived before the previous
        step began join the queue (all of them when nothing runs: the scheduler was idle). Those that arrived
        during the step that just ended were queued now: vLLM's engine core adds requests between two calls of
        ``step_with_batch_queue``, after the step under way has ended (``queued_ts``)."""
        for seq in self._arrived:
            seq.queued_ns = now_ns
        if not self.running:
            self._visible.extend(self._arrived)
            self._arrived = []
        for seq in self._visible:
            self._enqueue(seq, front=False)
        self._visible, self._arrived = self._arrived, []

    def _enqueue(self, seq: Seq, front: bool) -> None:
        if self.priority_policy:
            key = (seq.priority, seq.arrival_ns, seq.idx)
            pos = bisect.bisect_left(self._waiting_keys, key)
            self._waiting_keys.insert(pos, key)
            self.waiting.insert(pos, seq)
        elif front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _pop_waiting(self) -> Seq:
        if self.priority_policy:
            self._waiting_keys.pop(0)
        return self.waiting.popleft()

    def abort(self, seq: Seq) -> bool:
        """Cancel a request wherever it is and free its KV blocks; False if it already ended."""
        if seq.state == "running":
            self.running.remove(seq)
            self._release(seq)
        elif seq.state == "waiting" and (seq in self._arrived or seq in self._visible):
            (self._arrived if seq in self._arrived else self._visible).remove(seq)
        elif seq.state == "waiting":
            i = self.waiting.index(seq)
            del self.waiting[i]
            if self.priority_policy:
                del self._waiting_keys[i]
        else:
            return False
        seq.state = "aborted"
        self.aborted_total += 1
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._visible or self._arrived)

    def hold_until_ns(self, now_ns: int) -> int | None:
        """When the batching window holds every runnable request: the time it opens; else None."""
        if self.running or not self.waiting or not self.window_ns:
            return None
        head = self.waiting[0]
        if head.preemptions or len(self.waiting) >= self.min_waiting:
            return None
        opens = self.waiting[0].arrival_ns + self.window_ns
        return opens if opens > now_ns else None

    def _window_open(self, now_ns: int) -> bool:
        if not self.window_ns or len(self.waiting) >= self.min_waiting:
            return True
        oldest = min(s.arrival_ns for s in self.waiting) if self.priority_policy else self.waiting[0].arrival_ns
        return now_ns - oldest >= self.window_ns

    # -- KV blocks ---------------------------------------------------------------------------------
    @property
    def kv_blocks_used(self) -> int:
        """Blocks some sequence references: all but the free queue (vLLM's ``BlockPool.get_usage`` numerator)."""
        return self.total_blocks - len(self.pool.free)  # BlockPool.num_free, without a second property call

    @property
    def kv_usage(self) -> float:
        """vllm:kv_cache_usage_perc: 1 - free queue / (num_gpu_blocks - 1) (``BlockPool.get_usage``), 0..1."""
        return self.kv_blocks_used / self.total_blocks

    def _alloc(self, seq: Seq, n: int) -> bool:
        """Give ``seq`` ``n`` new blocks from the free queue's head (evicting what they cached); False, with nothing
        changed, when the queue holds fewer (``KVCacheManager.allocate_slots`` returns None)."""
        if n > self.pool.num_free:
            return False
        seq.blocks += self.pool.take(n)
        return True

    def _hashes(self, seq: Seq, n: int) -> list[int]:
        """The prefix-cache hashes of ``seq``'s first ``n`` blocks (at least; memoised in ``seq.hashes``).

        With block hashes (``chain``) the prompt's; a conversation (``cache_limit`` None) shares every block of its
        key, output too (the next turn's prompt holds it); a prefix group the blocks of its prompt's shareable
        prefix. Past those (and for a request without a key), the sequence's own blocks: vLLM caches every full
        block (a preempted request's recompute hits them)."""
        hashes = seq.hashes
        if hashes is None:
            hashes = seq.hashes = list(seq.chain) if seq.chain is not None else []
        j = len(hashes)
        if j < n:
            if seq.chain is None and seq.key is not None:
                shared = n if seq.cache_limit is None else min(n, min(seq.cache_limit, seq.prompt) // self.block_size)
                if j < shared:
                    base = self._key_id(seq.key)  # a random 62-bit start: its blocks count up from it
                    hashes.extend(range(base + j, base + shared))
                    j = shared
            # its own blocks: negative (the trace's and the keys' hashes are not), unique to (request, block)
            own = -(seq.idx << 32) - 1
            hashes.extend(range(own - j, own - n, -1))
        return hashes

    def _key_id(self, key: str | int) -> int:
        """A prefix-cache key as a number, the same in every process and whatever the order keys are met in
        (``hash`` of a str is salted per process)."""
        got = self._key_ids.get(key)
        if got is None:
            raw = key.encode() if isinstance(key, str) else key.to_bytes(16, "little", signed=True)
            got = self._key_ids[key] = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 2
        return got

    def _cache_blocks(self, seq: Seq, tokens: int, final: bool = False) -> None:
        """Hash ``seq``'s full blocks within its first ``tokens`` tokens (``KVCacheManager.cache_blocks``).

        Blocks other requests may hit (its prompt's shared prefix) are hashed as vLLM hashes them, when the step
        that fills them is scheduled. The others wait until it is preempted or finishes (``final``), which changes
        no hit and no eviction: its own blocks only its recompute hits (hashed when it is preempted); a
        conversation turn's blocks past its prompt only a later turn hits, which comes after this one ends (a
        trace may queue it sooner; then it hits them later than vLLM would). So the decode fast path, which hashes
        a run's blocks at its end, and the per-block cost of the hash map stay out of every other step."""
        full = tokens // self.block_size
        if not final and full > seq.shared_blocks:
            full = seq.shared_blocks
        if full > len(seq.blocks):
            full = len(seq.blocks)
        if full <= seq.num_cached or not self.prefix_caching:
            return
        done = seq.num_cached
        self.pool.cache(seq.blocks[done:full], self._hashes(seq, full)[done:full])
        seq.num_cached = full

    def _shared_tokens(self, seq: Seq) -> int:
        """Tokens of ``seq``'s prompt other requests may hit: the trace's block hashes, a prefix group's shareable
        prefix, a conversation turn's prompt (see ``_hashes``)."""
        if seq.chain is not None:
            return len(seq.chain) * self.block_size
        if seq.key is None:
            return 0
        return seq.prompt if seq.cache_limit is None else min(seq.cache_limit, seq.prompt)

    def _hit(self, seq: Seq, num_tokens: int) -> list[int]:
        """The cached blocks ``seq`` reuses (``get_computed_blocks``): its blocks' hashes while cached, at most
        (num_tokens - 1) // block_size of them (the last token is always computed). Nothing is referenced."""
        if not self.prefix_caching:
            return []
        limit = (num_tokens - 1) // self.block_size
        if not seq.preemptions and limit > seq.shared_blocks:
            limit = seq.shared_blocks  # past them its own blocks, which only its recompute hits (_cache_blocks)
        if limit <= 0:
            return []
        hit: list[int] = []
        lookup, add = self.pool.by_hash.get, hit.append  # BlockPool.lookup
        for h in self._hashes(seq, limit)[:limit]:
            b = lookup(h)
            if b is None:
                break
            add(b)
        return hit

    def _admission_refused(self, hit: list[int], new: int, num_tokens: int) -> bool:
        """Whether a waiting request with ``hit`` cached blocks, ``new`` blocks to take now and ``num_tokens`` in
        all waits: the free queue holds fewer than its new blocks plus its hits waiting there (touching takes
        them out: ``get_num_blocks_to_allocate``); with ``reserve_full_isl``, than the blocks of all its tokens
        (``can_fit_full_sequence``)."""
        if self.reserve_full_isl:
            new = max(new, -(-num_tokens // self.block_size) - len(hit))
        ref = self.pool.ref
        for b in hit:  # its hits in the free queue
            if not ref[b]:
                new += 1
        return new > self.pool.num_free

    def reset_prefix_cache(self) -> int:
        """Forget the cached blocks no sequence references (vLLM's ``reset_prefix_cache``, which waits until none
        is referenced); returns how many. Blocks in use keep their hashes."""
        return self.pool.drop_unreferenced_hashes()

    def _release(self, seq: Seq) -> None:
        """Free ``seq``'s blocks, its tail first (``SingleTypeKVCacheManager.free``): the tail is evicted first."""
        self.pool.release(reversed(seq.blocks))
        seq.blocks = []
        seq.num_cached = 0

    def _preempt(self, seq: Seq) -> None:
        """Preempt by recompute (``Scheduler._preempt_request``): free every block, computed = 0, to the front of
        the queue. Its full blocks keep their hashes in the free queue (prompt and output alike): the recompute
        hits those that survive."""
        self._cache_blocks(seq, seq.computed, final=True)
        self._release(seq)
        seq.computed = 0
        seq.prompt_done = False
        seq.preemptions += 1
        seq.state = "waiting"
        self.num_preemptions += 1
        self._enqueue(seq, front=True)

    # -- the step ----------------------------------------------------------------------------------
    def _noise_factor(self) -> float:
        if not self._noise:
            sigma = self._sigma
            z = self._rng.standard_normal(4096)
            self._noise = np.exp(sigma * z - 0.5 * sigma * sigma).tolist()
        return self._noise.pop()

    def _jittered(self, duration: float) -> float:
        """``duration`` (ns) plus a draw of the step jitter (the calibrated quantiles, interpolated at u ~ U(0, 1)),
        never below MIN_JITTERED_FRACTION of it."""
        if not self._jitter:
            assert self._jitter_q is not None
            u = self._jitter_rng.random(4096)
            self._jitter = np.interp(u, JITTER_PROBABILITIES, self._jitter_q).tolist()
        return max(duration + self._jitter.pop(), duration * MIN_JITTERED_FRACTION)

    def step(self, now_ns: int) -> StepResult:
        """Schedule and apply one step at ``now_ns``; tokens it emits are due at now + duration.

        Running sequences first (preempting for blocks), then waiting ones when nothing was
        preempted, then the cost model, then the tokens: vLLM v1's scheduler order.
        """
        finished_before: list[Seq] = []
        if self.async_scheduling:
            self._reveal(now_ns)
            finished_before, self._finished_late = self._finished_late, []
            if self.running:
                self._held_seats = len(finished_before)
            else:  # nothing ran on: their outputs were processed before this step was scheduled
                self._release_finished(finished_before)
                finished_before = []
        scheduled: list[tuple[Seq, int]] = []
        budget, prefill_tokens, decode_seqs, kv_read, preempted = self._schedule_running(scheduled)
        if not preempted and self.waiting and budget > 0 and len(self.running) + self._held_seats < self.max_num_seqs:
            prefill_tokens, decode_seqs, kv_read = self._schedule_waiting(
                now_ns, scheduled, budget, prefill_tokens, decode_seqs, kv_read
            )
        if finished_before:
            self._release_finished(finished_before)
        if self._profile is not None:
            duration_ns = self._profiled_duration_ns(scheduled, 0, 0)
        else:
            duration_ns = self._duration_ns(bool(scheduled), prefill_tokens, decode_seqs, kv_read)
        emitted, finished = self._apply(scheduled, prefill_tokens)
        if scheduled:
            self.steps += 1
            self.busy_ns += duration_ns
        self._next_scheduled_ns = now_ns if self.async_scheduling and scheduled and self.has_work else None
        return StepResult(duration_ns, emitted, finished, prefill_tokens, decode_seqs, kv_read, preempted)

    def decode_run(self, now_ns: int, until_ns: int, record: RunRecorder) -> int | None:
        """Take the next steps while every running sequence decodes, counting the decodes at once.

        Runs of steps that only decode (no waiting request can be admitted: none waits, or seats,
        budget, blocks or a closed batching window stop the queue head) go to ``record.decodes`` a piece
        at a time, up to a step that finishes sequences (retired) or the limit: steps start before
        ``until_ns`` (the caller's next event, renewed by each report). A step that admits goes to
        ``record.step``; the run goes on when what it admitted decodes from then on. It ends before a
        step whose decodes would preempt. Counters, blocks, prefix cache, noise and retirement end
        exactly as ``step`` by ``step`` leaves them. Returns the end of the last step taken; None when
        none was (call ``step``).
        """
        if self.async_scheduling:
            return None  # arrivals join two steps late: step by step
        if self.spec != 1 or not self.running or len(self.running) > self.max_batched or not self._decodes_only():
            return None
        t, done = now_ns, 0  # steps taken; the sequences catch up on them at the end (_advance)
        dset = _DecodeSet(self.running, self.block_size)
        while self.running:
            admission = self._admission_closed_until(t, self.max_batched - len(self.running))
            if admission is None:
                admitted = self._admit_step(t, done, dset)
                if admitted is None:
                    break  # its decodes would preempt
                res, decoding = admitted
                done += 1
                t += res.duration_ns
                until_ns = record.step(res, t)
                if not decoding:
                    break  # it admitted a prompt still being prefilled: step by step
                continue
            run = self._decode_steps(t, min(admission, until_ns), done, dset)
            if not run.ends_ns:
                break  # the next step cannot take its blocks without preempting: step by step
            done += len(run.ends_ns)
            self._take_decodes(run, t, done, dset)
            t = run.ends_ns[-1]
            until_ns = record.decodes(run)
        self._advance(self.running, done, dset)
        assert not self._reserved, "decode run: blocks taken were not handed out"
        return t if done else None

    def _decodes_only(self) -> bool:
        """Whether every running sequence is simply decoding: first token out, ``computed`` one behind
        its tokens, ceil(computed / block_size) blocks held, not finished."""
        bs = self.block_size
        for seq in self.running:
            c = seq.computed
            out = seq.output
            if not seq.prompt_done or c != seq.prompt + out - 1 or len(seq.blocks) != -(-c // bs):
                return False
            if out >= seq.max_out or (seq.stop_after is not None and out >= seq.stop_after):
                return False
        return bs <= 4096  # huge blocks: not worth a table per step phase

    def _advance(self, seqs: list[Seq], done: int, dset: _DecodeSet) -> None:
        """Decoding sequences after their steps of the ``done`` of a run (one token and its blocks each: the run's
        blocks, taken from the free queue in its steps' order, and hashed when full)."""
        bs = self.block_size
        joined = dset.joined
        reserved = self._reserved
        for seq in seqs:
            steps = done - joined[id(seq)] if joined and id(seq) in joined else done
            if steps < 0:
                continue  # left out of the run
            c = seq.computed
            new = -(-(c + steps) // bs) - -(-c // bs)
            if new:
                seq.blocks += reserved[-new:]
                del reserved[-new:]
            seq.computed = c + steps
            if seq.num_cached < seq.shared_blocks:
                self._cache_blocks(seq, c + steps)
            seq.output += steps
            seq.emitted = 1

    def _admission_closed_until(self, now_ns: int, budget: int) -> int | None:
        """Until when decode-only steps from ``now_ns`` on admit nothing; None when the next step might admit
        the queue head. ``NEVER_NS`` when the head waits on seats, budget or blocks: decodes only take blocks,
        so it keeps waiting (a head tried and refused touches nothing). A closed batching window holds it back
        until it opens.
        """
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return NEVER_NS
        head = self.waiting[0]
        if not head.preemptions and not self._window_open(now_ns):
            oldest = min(s.arrival_ns for s in self.waiting) if self.priority_policy else head.arrival_ns
            return oldest + self.window_ns
        return NEVER_NS if self._head_blocked(head, budget) else None

    def _head_blocked(self, seq: Seq, budget: int) -> bool:
        """Whether ``_schedule_waiting`` would leave ``seq`` waiting now (the same tests)."""
        bs = self.block_size
        num_tokens = seq.prompt + seq.output
        hit = self._hit(seq, num_tokens)
        self._head_hit = (seq, hit)  # for the step that admits it, unless the pool changes first (_admit_step)
        cached = len(hit) * bs
        n = num_tokens - cached
        if self.long_prefill and n > self.long_prefill:
            n = self.long_prefill
        if n > budget and not self.chunked:
            return True
        new = -(-(cached + min(n, budget)) // bs) - len(hit)
        return self._admission_refused(hit, new, num_tokens)

    def _decode_steps(self, now_ns: int, limit: int, done: int, dset: _DecodeSet) -> DecodeRun:
        """Decode steps from ``now_ns`` (``done`` taken before, whose sequences are not advanced yet) up
        to the first that finishes a sequence, each starting before ``limit`` and taking its new blocks
        within the free queue: their ends, durations (``_duration_ns``'s float operations in the same
        order, its noise factors) and blocks held after each."""
        b = len(self.running)
        bs = self.block_size
        cycle = dset.cycle
        kv_read = dset.kv_read + done * b
        room = self.pool.num_free  # a waiting head tried and refused touches nothing (vLLM's schedule())
        base = self._fixed_ns + self._prefill_ns * 0 + self._decode_ns * b
        kv_ns = self._kv_ns
        profiled = self._profile is not None
        top_base, bottom_base = (max(dset.bases), min(dset.bases)) if profiled and dset.bases else (0, 0)
        noisy = bool(self._sigma)
        jittered = self._jitter_q is not None
        held = self.kv_blocks_used
        run = DecodeRun(self.running, dset.idx, _NO_NS[:], _NO_NS[:], _NO_NS[:], len(self.waiting), [])
        add_end, add_duration, add_blocks = run.ends_ns.append, run.durations_ns.append, run.kv_blocks.append
        noise = self._noise
        t = now_ns
        taken = 0
        owed = self._owed_ns  # the first step pays it (taken from the engine when the run is: _take_decodes)
        for j in range(done, dset.last):
            if t >= limit:
                break
            new = cycle[j % bs]
            if new:
                if taken + new > room:
                    break
                taken += new
            kv_read += b
            if profiled:
                top, bottom = (top_base + j + 1, bottom_base + j + 1) if b else (0, 0)
                duration = self._profile_ns(0, 0, b, kv_read, b, top, bottom) + owed
            else:
                duration = base + kv_ns * kv_read + owed
            owed = 0.0
            if noisy:
                if noise:
                    duration *= noise.pop()  # _noise_factor, inlined
                else:
                    duration *= self._noise_factor()
                    noise = self._noise
            if jittered:
                duration = self._jittered(duration)
            d = int(duration)
            t += d
            add_end(t)
            add_duration(d)
            add_blocks(held + taken)
        return run

    def _take_decodes(self, run: DecodeRun, start_ns: int, done: int, dset: _DecodeSet) -> None:
        """Apply a decode run's steps from ``start_ns`` (``done`` taken in all): blocks (taken from the free
        queue, handed out by ``_advance``), the counters; when the last step finishes sequences,
        they catch up and retire."""
        m = len(run.ends_ns)
        self._owed_ns = 0.0  # the run's first step paid it
        taken = run.kv_blocks[-1] - self.kv_blocks_used
        if taken:  # the blocks step by step would take (and evict), in the same order
            self._reserved += self.pool.take(taken)
        self.generation_tokens_total += len(run.seqs) * m
        self.steps += m
        self.busy_ns += run.ends_ns[-1] - start_ns  # the durations' sum
        if done == dset.last:
            run.finished = dset.finish()
            self._advance(run.finished, done, dset)
            self._retire(run.finished)

    def _admit_step(self, now_ns: int, done: int, dset: _DecodeSet) -> tuple[StepResult, bool] | None:
        """The next step of a run when it admits from the queue: ``step`` with the run's decodes counted
        at once (the same blocks, budget, KV tokens and order: decodes first). None when the decodes'
        blocks would preempt. Also: whether everything admitted decodes from now on (joins the run)."""
        b = len(self.running)
        new = dset.cycle[done % self.block_size]
        if new > self.pool.num_free:  # step would preempt
            return None
        head_hit, self._head_hit = self._head_hit, None
        if new:
            taken = self.pool.take(new)
            self._reserved += taken
            if head_hit is not None and not set(head_hit[1]).isdisjoint(taken):
                head_hit = None  # a hit block left the free queue (no other hit changes: BlockPool.take)
        scheduled: list[tuple[Seq, int]] = []
        prefill, decode_seqs, kv_read = self._schedule_waiting(
            now_ns, scheduled, self.max_batched - b, 0, b, dset.kv_read + (done + 1) * b, head_hit
        )
        if self._profile is not None:
            duration = self._profiled_duration_ns(scheduled, b, dset.kv_read + (done + 1) * b, *dset.kv_range(done))
        else:
            duration = self._duration_ns(True, prefill, decode_seqs, kv_read)
        emitted, finished, gen = self._advance_scheduled(scheduled)
        emitted = self.running[:b] + emitted  # decodes first, as scheduled
        if done + 1 == dset.last:
            ended = dset.finish()
            self._advance(ended, done + 1, dset)
            finished = ended + finished
        self.prompt_tokens_total += prefill
        self.generation_tokens_total += b + gen
        self.steps += 1
        self.busy_ns += duration
        if finished:
            self._retire(finished)
        decoding = True
        for seq, _n in scheduled:
            if seq.state != "running":
                continue
            if seq.prompt_done and seq.computed == seq.prompt + seq.output - 1:
                dset.join(seq, done + 1)
            else:
                dset.leave_out(seq)
                decoding = False
        return StepResult(duration, emitted, finished, prefill, decode_seqs, kv_read, 0), decoding

    def _schedule_running(self, scheduled: list[tuple[Seq, int]]) -> tuple[int, int, int, int, int]:
        """Step part 1: running sequences in order (decodes and unfinished chunked prefills).

        Appends (seq, tokens) to ``scheduled``; returns (budget left, prefill tokens, decode
        sequences, KV tokens read, sequences preempted).
        """
        bs = self.block_size
        budget = self.max_batched
        running = self.running
        preempted = 0
        long_prefill = self.long_prefill
        spec = self.spec
        prefill_tokens = 0
        decode_seqs = 0
        kv_read = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.computed
            n = seq.prompt + seq.output - computed
            decode = n <= 1
            if decode:
                n = seq.max_out - seq.output
                if n > spec:
                    n = spec
            elif long_prefill and n > long_prefill:
                n = long_prefill
            if n > budget:
                n = budget
            need = -(-(computed + n) // bs) - len(seq.blocks)
            if need > 0 and not self._alloc(seq, need):
                i, gone, count, taken_back = self._make_room(seq, need, i, scheduled)
                preempted += count
                for nj, kv_j, was_decode in taken_back:
                    budget += nj
                    kv_read -= kv_j
                    if was_decode:
                        decode_seqs -= 1
                    else:
                        prefill_tokens -= nj
                if gone:
                    break  # vLLM's schedule(): a running request that cannot be scheduled ends the running pass
            if seq.num_cached < seq.shared_blocks:  # else nothing to hash before it ends (_cache_blocks)
                self._cache_blocks(seq, min(computed + n, seq.prompt + seq.output))
            scheduled.append((seq, n))
            budget -= n
            kv_read += computed + n
            if decode:
                decode_seqs += 1
            else:
                prefill_tokens += n
            i += 1
        return budget, prefill_tokens, decode_seqs, kv_read, preempted

    def _make_room(
        self, seq: Seq, need: int, i: int, scheduled: list[tuple[Seq, int]]
    ) -> tuple[int, bool, int, list[tuple[int, int, bool]]]:
        """Preempt until ``need`` blocks for ``seq`` (at ``running[i]``) are allocated, or ``seq`` itself goes.

        The victim is the newest running sequence, or under the priority policy the one with the
        largest (priority, arrival, index), which may already be scheduled this step: it is taken
        back out. Returns (``seq``'s index now, whether ``seq`` was preempted, how many were, and
        (tokens, KV tokens read, was a decode) of each victim taken back out of ``scheduled``).
        """
        running = self.running
        count = 0
        taken_back: list[tuple[int, int, bool]] = []
        while True:
            if self.priority_policy:
                victim = max(running, key=lambda r: (r.priority, r.arrival_ns, r.idx))
                vi = running.index(victim)
                del running[vi]
                if vi < i:
                    i -= 1
                for j, (sj, nj) in enumerate(scheduled):
                    if sj is victim:
                        del scheduled[j]
                        taken_back.append((nj, sj.computed + nj, sj.computed + 1 >= sj.prompt + sj.output))
                        break
            else:
                victim = running.pop()
            self._preempt(victim)
            count += 1
            if victim is seq:
                return i, True, count, taken_back
            if self._alloc(seq, need):
                return i, False, count, taken_back

    def _schedule_waiting(
        self,
        now_ns: int,
        scheduled: list[tuple[Seq, int]],
        budget: int,
        prefill_tokens: int,
        decode_seqs: int,
        kv_read: int,
        head_hit: tuple[Seq, list[int]] | None = None,
    ) -> tuple[int, int, int]:
        """Step part 2: admit waiting requests in queue order while budget, blocks and seats last.

        A closed batching window admits only preempted requests. ``head_hit``: a sequence's ``_hit`` found since
        the pool last changed. Returns the updated (prefill tokens, decode sequences, KV tokens read).
        """
        bs = self.block_size
        long_prefill = self.long_prefill
        window_open = self._window_open(now_ns)
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) + self._held_seats < self.max_num_seqs:
            seq = waiting[0]
            if not window_open and not seq.preemptions:
                break
            num_tokens = seq.prompt + seq.output
            if head_hit is not None and head_hit[0] is seq:
                hit, head_hit = head_hit[1], None
            else:
                hit = self._hit(seq, num_tokens)
            cached = len(hit) * bs
            n = num_tokens - cached
            if long_prefill and n > long_prefill:
                n = long_prefill
            if n > budget:
                if not self.chunked:
                    break
                n = budget
            new = -(-(cached + n) // bs) - len(hit)
            if self._admission_refused(hit, new, num_tokens):
                break  # vLLM's schedule(): a waiting request without blocks ends the waiting pass (nothing touched)
            self._admit(seq, hit, new, min(cached + n, num_tokens))
            if seq.scheduled_ns is None:
                seq.scheduled_ns = self._scheduling_ns(now_ns)
            scheduled.append((seq, n))
            budget -= n
            kv_read += cached + n
            if cached + 1 >= num_tokens:
                decode_seqs += 1
            else:
                prefill_tokens += n
        return prefill_tokens, decode_seqs, kv_read

    def _scheduling_ns(self, now_ns: int) -> int:
        """When vLLM's scheduler ran for the step that starts at ``now_ns`` (the instant it stamps on the requests
        it schedules, ``Scheduler.schedule``'s ``scheduled_timestamp``): with asynchronous scheduling, as the step
        before began, when work went on after it (``EngineCore.step_with_batch_queue`` schedules a step while the
        one before runs); else now (an idle engine schedules a request as it arrives)."""
        return now_ns if self._next_scheduled_ns is None else self._next_scheduled_ns

    def _admit(self, seq: Seq, hit: list[int], new: int, cache_tokens: int) -> None:
        """Move the queue head to running: reference its ``hit`` blocks, give it ``new`` blocks from the free
        queue, hash the full blocks of its first ``cache_tokens`` (``allocate_slots``)."""
        cached = len(hit) * self.block_size
        self._pop_waiting()
        self.pool.touch(hit)
        seq.blocks = hit
        seq.num_cached = len(hit)
        seq.blocks += self.pool.take(new)
        self._cache_blocks(seq, cache_tokens)
        seq.computed = cached
        seq.cached_tokens = cached
        seq.state = "running"
        self.prefix_queries += seq.prompt + seq.output
        self.prefix_hits += cached
        self.running.append(seq)

    def _duration_ns(self, busy: bool, prefill_tokens: int, decode_seqs: int, kv_read: int) -> int:
        """Step part 3, the cost model: fixed + per prefill token + per decode seq + per KV token read (× noise,
        + jitter); 0 when nothing was scheduled (``busy`` False)."""
        duration = self._fixed_ns + self._prefill_ns * prefill_tokens + self._decode_ns * decode_seqs
        duration += self._kv_ns * kv_read
        if busy and self._owed_ns:
            duration += self._owed_ns
            self._owed_ns = 0.0
        if self._sigma and busy:
            duration *= self._noise_factor()
        if self._jitter_q is not None and busy:
            duration = self._jittered(duration)
        return int(duration) if busy else 0

    def _profile_ns(
        self,
        prefill_tokens: int,
        prefill_cached: int,
        decodes: int,
        decode_kv: int,
        seqs: int,
        kv_max: int = 0,
        kv_min: int = 0,
        more_chunks: Sequence[tuple[int, int]] = (),
    ) -> float:
        """The operator profile's step time (ns) for a step's composition, plus ``fixed_ms``; the token- and
        sequence-count terms are memoised (a decode run asks for the same ones step after step).

        ``prefill_tokens`` over ``prefill_cached`` is the step's largest prefill chunk, which the decodes share its
        attention row with; ``more_chunks`` are its other chunks (tokens, cached prefix). vLLM runs a step's
        attention as one varlen call in which each sequence attends to its own keys only, so each further chunk
        adds its own attention (``attention_us`` with no decodes) rather than lengthening one long sequence."""
        profile, grid = self._profile, self.grid
        assert profile is not None and grid is not None
        tokens = prefill_tokens + decodes + sum(n for n, _ in more_chunks)
        known = self._tokens_ns.get(tokens)
        if known is None:
            charged = cudagraph_tokens(tokens, self.graph_sizes)
            known = self._tokens_ns[tokens] = (profile.tokens_us(charged) * 1e3, charged)
        t, charged = known
        s = self._seqs_ns.get(seqs)
        if s is None:
            s = self._seqs_ns[seqs] = profile.sequences_us(seqs) * 1e3
        attention = profile.attention_us(prefill_tokens, prefill_cached, decodes, decode_kv, kv_max, kv_min)
        prefix = prefill_cached
        for n, cached in more_chunks:
            attention += profile.attention_us(n, cached, 0, 0)
            prefix = max(prefix, cached)
        kv = max(kv_max, decode_kv / decodes) if decodes else 0
        axes = grid.beyond(charged, seqs, prefill_tokens, prefix, decodes, kv, charged * profile.ep)
        total = t + s + attention * 1e3
        self.grid_coverage.add(axes, total)
        return self._fixed_ns + total

    def _profiled_duration_ns(
        self, scheduled: list[tuple[Seq, int]], decodes: int, decode_kv: int, kv_max: int = 0, kv_min: int = 0
    ) -> int:
        """Step part 3 with an operator profile: the composition of ``scheduled`` (prefill chunks over their
        cached prefix, decodes and their KV) plus ``decodes`` more decodes reading ``decode_kv`` KV tokens (a
        decode run's, not in ``scheduled``), then what ``_duration_ns`` adds (owed overhead, noise, jitter)."""
        if not scheduled and not decodes:
            return 0
        chunks: list[tuple[int, int]] = []
        seqs = decodes + len(scheduled)
        if not decodes:
            kv_min = 1 << 62
        for seq, n in scheduled:
            c = seq.computed
            if seq.prompt + seq.output - c <= 1:
                decodes += 1
                decode_kv += c + n
                if c + n > kv_max:
                    kv_max = c + n
                if c + n < kv_min:
                    kv_min = c + n
            else:
                chunks.append((n, c))
        chunks.sort(reverse=True)  # the largest first: it shares the decodes' attention row
        prefill, cached = chunks[0] if chunks else (0, 0)
        duration = self._profile_ns(
            prefill, cached, decodes, decode_kv, seqs, kv_max, kv_min if decodes else 0, more_chunks=chunks[1:]
        )
        if self._owed_ns:
            duration += self._owed_ns
            self._owed_ns = 0.0
        if self._sigma:
            duration *= self._noise_factor()
        if self._jitter_q is not None:
            duration = self._jittered(duration)
        return int(duration)

    def _apply(self, scheduled: list[tuple[Seq, int]], prefill_tokens: int) -> tuple[list[Seq], list[Seq]]:
        """Step part 4: advance computed tokens, emit, promote prompts to the prefix cache, finish.

        Returns (sequences that emitted tokens, sequences that finished).
        """
        emitted, finished, gen = self._advance_scheduled(scheduled)
        self.prompt_tokens_total += prefill_tokens
        self.generation_tokens_total += gen
        if finished:
            self._retire(finished)
        return emitted, finished

    def _advance_scheduled(self, scheduled: list[tuple[Seq, int]]) -> tuple[list[Seq], list[Seq], int]:
        """The scheduled sequences after their tokens: (those that emitted, those that finished, tokens emitted)."""
        emitted: list[Seq] = []
        finished: list[Seq] = []
        gen = 0
        for seq, n in scheduled:
            before = seq.prompt + seq.output
            computed = seq.computed = seq.computed + n
            if computed >= before:
                k = computed - before + 1
                out = seq.output = seq.output + k
                seq.emitted = k
                gen += k
                emitted.append(seq)
                seq.prompt_done = True
                if out >= seq.max_out or (seq.stop_after is not None and out >= seq.stop_after):
                    finished.append(seq)
            else:
                seq.emitted = 0
        return emitted, finished, gen

    def _retire(self, finished: list[Seq]) -> None:
        """Free finished sequences' blocks (their hashed blocks stay cached in the free queue)."""
        for seq in finished:
            if seq.key is not None and seq.chain is None and seq.cache_limit is None:
                self._cache_blocks(seq, seq.computed, final=True)  # a conversation: its next turn hits it all
            if self.async_scheduling:
                self._finished_late.append(seq)
            else:
                self._release(seq)
            seq.state = "finished"
        if len(finished) == 1:  # a new list either way: a reported decode run keeps the one it had (DecodeRun.seqs)
            self.running = self.running[:]
            self.running.remove(finished[0])
        else:
            self.running = [s for s in self.running if s.state == "running"]
        self.finished_total += len(finished)

    def state(self) -> dict[str, float]:
        """Current per-step state (what /metrics and the worksheet expose)."""
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_blocks_used": self.kv_blocks_used,
            "kv_cache_usage": self.kv_usage,
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "preemptions": self.num_preemptions,
        }
