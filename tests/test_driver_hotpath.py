"""The driver's per-read fast paths give what the general paths give, and its scheduling parts behave.

Each fast path (one whole HTTP chunk per read, one SSE event per read, one plain choice per chunk) is
checked against the general code it short-cuts, on generated inputs, hostile ones included; the
recorder's chunk table against the row-by-row layout; the timerfd waits and the request tasks on a
real event loop.
"""

from __future__ import annotations

import json
import random
import sys
import time
from array import array

import anyio
import httpx
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.driver import schedule
from loadgen.driver.sse import SSEDecoder, SSEProtocolError, chunk_from_object, parse_chunk
from loadgen.driver.tasks import RequestTasks
from loadgen.driver.transport import _CHUNKED, _Dechunker
from loadgen.rundir.rowtables import ChunkBatch, StreamChunks, pack_slice, requests_table, unpack_slices
from loadgen.rundir.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA, empty_request_row

# ---------------------------------------------------------------- one plain choice: parse_chunk


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3), st.floats(allow_nan=False, allow_infinity=False)
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=4), inner, max_size=2)),
)
_choice = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2),
        "text": st.one_of(st.text(max_size=4), _value),
        "delta": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"content": st.one_of(st.text(max_size=4), _value), "role": st.just("assistant")}
            ),
            _value,
        ),
        "finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "length"]), _value),
    },
)
_chunk_object = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.one_of(st.lists(_choice, max_size=2), _value),
        "usage": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {},
                optional={
                    "prompt_tokens": st.one_of(st.integers(0, 9), _scalar),
                    "completion_tokens": st.one_of(st.integers(0, 9), _scalar),
                },
            ),
            _value,
        ),
        "model": st.one_of(st.text(max_size=3), st.none()),
        "system_fingerprint": st.one_of(st.text(max_size=3), st.none()),
        "error": st.one_of(st.none(), st.text(max_size=3)),
    },
)


def _outcome(call):
    try:
        return call()
    except SSEProtocolError as exc:
        return ("malformed", str(exc)[:20])


@settings(max_examples=400, deadline=None)
@given(_chunk_object)
def test_parse_chunk_fast_path_gives_the_general_walks_chunk(obj):
    payload = json.dumps(obj).encode()
    assert _outcome(lambda: parse_chunk(payload)) == _outcome(lambda: chunk_from_object(json.loads(payload)))


def test_hostile_field_types_are_malformed_sse_not_a_crash():
    for obj in (
        {"choices": [{"delta": ["not", "an", "object"]}]},
        {"choices": [{"delta": {"role": "assistant", "content": 5}}]},
        {"choices": [], "usage": [1, 2]},
        {"choices": [{"delta": {"tool_calls": ["x"]}}]},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": "5"}},
        {"choices": [], "usage": {"prompt_tokens": 1.5}},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": 10**30}},
        {"choices": [{"text": "a"}], "usage": {"completion_tokens": -1}},
    ):
        with pytest.raises(SSEProtocolError):
            parse_chunk(json.dumps(obj).encode())


# ---------------------------------------------------------------- one event per read: SSEDecoder.single


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_single_event_reads_match_the_general_split(body):
    data = b"data: " + body + b"\n\n"
    fast, general = SSEDecoder(), SSEDecoder()
    payload = fast.single(data)
    events = general._feed_lines(data)
    if payload is not None:
        assert [payload] == events and not general.pending


def test_a_cr_before_the_blank_line_is_left_to_the_general_path():
    decoder = SSEDecoder()
    assert decoder.single(b"data: [DONE]\r\n\n") is None
    assert decoder.feed(b"data: [DONE]\r\n\n") == [b"[DONE]"]


# ---------------------------------------------------------------- one whole chunk per read: _Dechunker


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=30), max_size=6), st.lists(st.integers(1, 40), max_size=12))
def test_dechunker_gives_the_same_body_whatever_the_reads(pieces, cuts):
    wire = _chunked(pieces) + b"LEFT"
    reads, pos = [], 0
    for cut in cuts:  # arbitrary read boundaries; a read that is one whole chunk takes the fast path
        reads.append(wire[pos : pos + cut])
        pos += cut
    reads.append(wire[pos:])
    whole = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\nLEFT"]
    for split in (reads, whole):
        dechunker = _Dechunker(_CHUNKED)
        body = b"".join(dechunker.feed(r) for r in split if r)
        assert body == b"".join(pieces) and dechunker.complete and dechunker.leftover == b"LEFT"


@pytest.mark.parametrize("line", [b"-5", b"zz", b"x" * 5000])
def test_a_bad_chunk_size_is_a_protocol_error(line):
    with pytest.raises(httpx.RemoteProtocolError):
        _Dechunker(_CHUNKED).feed(line + b"\r\nhello\r\n")


# ---------------------------------------------------------------- the recorder's chunk table


def test_chunk_batch_table_is_the_row_by_row_layout():
    batch = ChunkBatch()
    streams = {"a": [5, 7, 9], "b": [11], "c": [13, 17]}
    kinds = {"a": [1, 1, 0], "c": [1, 0]}  # "b" gives no kinds: every chunk is answer
    for rid, arrivals in streams.items():
        n = len(arrivals)
        kind = array("q", kinds[rid]) if rid in kinds else None
        batch.add(
            rid, StreamChunks(array("q", arrivals), array("q", [1] * n), array("q", [100 + k for k in range(n)]), kind)
        )
    rows = [
        {
            "request_id": rid,
            "seq": k,
            "arrival_ns": t,
            "tokens": 1,
            "bytes": 100 + k,
            "kind": ("answer", "reasoning")[kinds.get(rid, [0] * 3)[k]],
        }
        for rid, arrivals in streams.items()
        for k, t in enumerate(arrivals)
    ]
    assert batch.table().equals(pa.Table.from_pylist(rows, schema=CHUNKS_SCHEMA))


def _random_value(rng: random.Random, kind: pa.DataType) -> object:
    if rng.random() < 0.3:
        return None
    if pa.types.is_string(kind):
        return rng.choice(["", "x", "é✓\n", "a" * 300])
    if pa.types.is_boolean(kind):
        return rng.random() < 0.5
    if pa.types.is_int32(kind):
        return rng.randint(-(2**31), 2**31 - 1)
    if pa.types.is_int64(kind):
        return rng.randint(-(2**63), 2**63 - 1)
    if pa.types.is_floating(kind):
        return rng.uniform(-1e9, 1e9)
    raise TypeError(kind)


def test_the_requests_table_is_the_column_by_column_conversion():
    """One struct conversion (the hot path) against one ``pa.array`` per column, on rows of every value kind."""
    rng = random.Random(14)
    rows = [{f.name: _random_value(rng, f.type) for f in REQUESTS_SCHEMA} for _ in range(400)]
    rows.append(empty_request_row())
    for batch in (rows, rows[:1], rows[-1:]):
        columns = {name: [r[name] for r in batch] for name in REQUESTS_SCHEMA.names}
        assert requests_table(batch).equals(pa.Table.from_pydict(columns, schema=REQUESTS_SCHEMA))
    # a value out of its column's range is refused, not wrapped: that column null, that row an error naming it
    fitted = requests_table([{**rows[0], "turn_index": 2**40}]).to_pylist()[0]
    assert fitted["turn_index"] is None and fitted["status"] == "error", fitted
    assert fitted["error_kind"] == "malformed_sse" and "turn_index = 1099511627776" in fitted["error_message"]


def _items(rng: random.Random, n: int) -> list[tuple[dict, StreamChunks | None]]:
    items = []
    for i in range(n):
        row = {f.name: _random_value(rng, f.type) for f in REQUESTS_SCHEMA}
        row["request_id"] = f"r{i}"
        if i % 3 == 0:  # any key order: the values are taken by name
            row = dict(reversed(list(row.items())))
        k = rng.randint(0, 5)
        chunks = (
            None
            if k == 0
            else StreamChunks(*(array("q", [rng.randint(0, 2**31 - 1) for _ in range(k)]) for _ in "abc"))
        )
        items.append((row, chunks))
    return items


def test_packed_slices_unpack_to_the_tables_converted_on_the_loop():
    """The part writer process's conversion (``unpack_slices`` of ``pack_slice``s) against the loop's."""
    rng = random.Random(7)
    items = _items(rng, 250)
    slices = [items[i : i + 50] for i in range(0, len(items), 50)]
    requests, chunks = unpack_slices([pack_slice(s) for s in slices])
    batch = ChunkBatch()
    for row, c in items:
        if c is not None:
            batch.add(row["request_id"], c)
    assert requests is not None and requests.equals(requests_table([row for row, _ in items]))
    assert chunks is not None and chunks.equals(batch.table())
    assert unpack_slices([pack_slice([(items[0][0], None)])])[1] is None  # no chunks, no table
    assert unpack_slices([]) == (None, None)


# ---------------------------------------------------------------- precise waits: the timerfd


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_many_waiters_on_the_timerfd_wake_in_order_never_early_and_a_cancelled_one_is_skipped():
    async def main():
        assert schedule._timerfd() is not None  # the path under test
        start = time.perf_counter_ns() + 100_000_000
        began: list[int] = []
        woke: list[tuple[int, int]] = []

        async def waiter(k: int, deadline: int) -> None:
            began.append(time.perf_counter_ns())
            await schedule.sleep_until(deadline)
            woke.append((k, time.perf_counter_ns() - deadline))

        async with anyio.create_task_group() as tg:
            for k in (5, 1, 4, 0, 3, 2):  # armed out of order
                tg.start_soon(waiter, k, start + k * 2_000_000)
            with anyio.move_on_after(0.01):  # cancelled before its deadline: must not disturb the others
                await schedule.sleep_until(start + 50_000_000)
        return woke, max(began) < start

    woke, armed_in_time = anyio.run(main)
    assert sorted(k for k, _ in woke) == [0, 1, 2, 3, 4, 5]
    assert min(lag for _, lag in woke) >= 0
    if armed_in_time:  # (a host stalled for 100 ms before the waits began makes every deadline past: no order)
        assert [k for k, _ in woke] == [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------- request tasks


def test_request_tasks_wait_for_all_and_cancel_all_on_stop():
    done: list[str] = []

    async def request(name: str, seconds: float) -> None:
        try:
            await anyio.sleep(seconds)
            done.append(name)
        except anyio.get_cancelled_exc_class():
            done.append(f"{name} cancelled")
            raise

    async def joined() -> None:
        async with anyio.create_task_group() as tg:
            tasks = RequestTasks(tg)
            for k in range(3):
                tasks.start(request, f"r{k}", 0.01 * k)
            await tasks.join()

    anyio.run(joined)
    assert sorted(done) == ["r0", "r1", "r2"]
    done.clear()

    async def stopped() -> None:
        with anyio.move_on_after(0.05):
            async with anyio.create_task_group() as tg:
                tasks = RequestTasks(tg)
                tasks.start(request, "quick", 0)
                tasks.start(request, "slow", 10)
                await tasks.join()

    anyio.run(stopped)
    assert sorted(done) == ["quick", "slow cancelled"]


def test_a_failing_request_task_stops_the_others_and_raises():
    cancelled: list[bool] = []

    async def slow() -> None:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    async def boom() -> None:
        await anyio.sleep(0.01)
        raise RuntimeError("bug in a request task")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tasks = RequestTasks(tg)
            tasks.start(slow)
            tasks.start(boom)
            await tasks.join()

    with pytest.raises(BaseException) as info:
        anyio.run(main)
    assert "bug in a request task" in repr(info.value) and cancelled == [True]


# ---------------------------------------------------------------- the simulated server's event loop


def test_sim_server_takes_uvloop_only_for_an_engine_that_models_no_time():
    pytest.importorskip("uvloop")
    from loadgen.sim import load_engine_config
    from loadgen.sim.server import _loop_factory

    assert _loop_factory(load_engine_config("instant")) is not None
    assert _loop_factory(load_engine_config("interactive-small-batch")) is None
