"""The pure SSE parser on the recorded OpenAI streams (../shared/traces/sse/openai-python) and edge cases."""

from __future__ import annotations

import json

import pytest

from loadgen.driver.sse import DONE, SSEDecoder, SSELineTooLong, SSEProtocolError, parse_chunk
from tests.shared_paths import TRACES, shared_trace


def _streams():
    folder = TRACES / "sse" / "openai-python"
    return sorted(folder.glob("*.bin")) if folder.is_dir() else []


def _decode_all(raw: bytes, piece: int) -> list[bytes]:
    decoder = SSEDecoder()
    events: list[bytes] = []
    for i in range(0, len(raw), piece):
        events += decoder.feed(raw[i : i + piece])
    return events + decoder.flush()


def _reference_payloads(raw: bytes) -> list[bytes]:
    """Independent reading: events are separated by blank lines; each is one ``data: `` line here."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [ln[len(b"data: ") :] for ln in block.split(b"\n") if ln.startswith(b"data: ")]
        if lines:
            out.append(b"\n".join(lines))
    return out


def test_all_twelve_recorded_streams_are_present():
    shared_trace("sse/openai-python")
    assert len(_streams()) == 12


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 20])
def test_decoder_splits_recorded_streams_like_the_reference_whatever_the_read_size(piece):
    shared_trace("sse/openai-python")
    for path in _streams():
        raw = path.read_bytes()
        events = _decode_all(raw, piece)
        assert events == _reference_payloads(raw), path.name
        assert events[-1] == DONE


def test_recorded_streams_parse_to_consistent_chunks():
    shared_trace("sse/openai-python")
    seen_multi_choice = seen_tool_calls = seen_refusal = False
    for path in _streams():
        raw = path.read_bytes()
        events = _decode_all(raw, 4096)
        chunks = [parse_chunk(p) for p in events[:-1]]
        # exactly one usage chunk, last, with choices: [] -> no text, no finish
        usage = [c for c in chunks if c.completion_tokens is not None]
        assert len(usage) == 1 and usage[0] is chunks[-1], path.name
        assert usage[0].text == "" and usage[0].pieces == 0 and usage[0].finish_reason is None
        last_obj = json.loads(events[-2])
        assert usage[0].completion_tokens == last_obj["usage"]["completion_tokens"]
        assert usage[0].prompt_tokens == last_obj["usage"]["prompt_tokens"]
        # model and fingerprint on every chunk
        assert all(c.model == "gpt-4o-2024-08-06" for c in chunks)
        assert all(c.system_fingerprint and c.system_fingerprint.startswith("fp_") for c in chunks)
        finishes = [c.finish_reason for c in chunks if c.finish_reason]
        n_choices = len({ch["index"] for e in events[:-1] for ch in json.loads(e)["choices"]})
        assert len(finishes) == n_choices, path.name
        # the concatenated text equals what an independent walk over the JSON gives
        expected = ""
        for e in events[:-1]:
            for ch in json.loads(e)["choices"]:
                d = ch["delta"]
                expected += (d.get("content") or "") + (d.get("refusal") or "")
                for call in d.get("tool_calls") or []:
                    expected += (call["function"].get("name") or "") + (call["function"].get("arguments") or "")
        assert "".join(c.text for c in chunks) == expected
        seen_multi_choice |= n_choices > 1
        seen_tool_calls |= "tool_calls" in finishes
        refusal = any(
            json.loads(e)["choices"] and json.loads(e)["choices"][0]["delta"].get("refusal") for e in events[:-1]
        )
        seen_refusal |= refusal
        # plain content, one choice: one content token per content chunk, as OpenAI streams them
        # (refusals and tool calls carry extra unstreamed tokens, so they are not checked this way)
        if n_choices == 1 and "tool_calls" not in finishes and not refusal:
            content_chunks = sum(1 for c in chunks if c.pieces)
            assert content_chunks == usage[0].completion_tokens, path.name
    assert seen_multi_choice and seen_tool_calls and seen_refusal


def test_multi_choice_stream_counts_pieces_per_choice():
    shared_trace("sse/openai-python")
    raw = (
        TRACES / "sse" / "openai-python" / "a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin"
    ).read_bytes()
    chunks = [parse_chunk(p) for p in _decode_all(raw, 512)[:-1]]
    assert sum(c.pieces for c in chunks) == chunks[-1].completion_tokens == 42


def test_multiline_data_comments_crlf_and_fields_are_handled():
    raw = (
        b': keep-alive\r\nevent: message\r\nid: 7\r\ndata: {"choices":\r\ndata: []}\r\n\r\nretry: 10\n\ndata:[DONE]\n\n'
    )
    events = _decode_all(raw, 3)
    assert events == [b'{"choices":\n[]}', DONE]
    assert parse_chunk(events[0]).pieces == 0


def test_event_sizes_count_raw_bytes():
    decoder = SSEDecoder()
    a = b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
    events = decoder.feed(a + a[:10])
    assert events and decoder.sizes == [len(a)]
    events = decoder.feed(a[10:])
    assert decoder.sizes == [len(a)]


def test_unterminated_event_is_returned_by_flush():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"choices":[]}') == []
    assert decoder.pending
    assert decoder.flush() == [b'{"choices":[]}']


@pytest.mark.parametrize("payload", [b"{not json", b"[1,2]", b'"text"', b'{"id":"x"}', b'{"choices":"abc"}'])
def test_malformed_payloads_raise(payload):
    with pytest.raises(SSEProtocolError):
        parse_chunk(payload)


def test_in_stream_error_object():
    chunk = parse_chunk(b'{"error":{"message":"engine\\ndead","type":"InternalServerError","code":500}}')
    assert chunk.error == "engine dead" and chunk.error_code == 500


def test_completions_text_and_vllm_continuous_usage():
    payload = (
        b'{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" the of",'
        b'"finish_reason":null}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}'
    )
    chunk = parse_chunk(payload)
    assert (chunk.text, chunk.pieces, chunk.prompt_tokens, chunk.completion_tokens) == (" the of", 1, 12, 5)


def test_a_partial_line_is_buffered_without_rejoining_and_joined_once():
    decoder = SSEDecoder(max_line_bytes=1 << 22)
    line = b'data: {"choices":[{"index":0,"text":"' + b"x" * 300_000 + b'"}]}'
    for i in range(0, len(line), 1000):
        assert decoder.feed(line[i : i + 1000]) == []
        assert decoder.pending
    events = decoder.feed(b"\n\ndata: [DONE]\n\n")
    assert events == [line[6:], DONE] and decoder.sizes == [len(line) + 2, 14]
    assert parse_chunk(events[0]).pieces == 1


@pytest.mark.parametrize("piece", [1000, 64 * 1024, 3 * 1024 * 1024])
def test_a_line_over_the_cap_fails_as_malformed(piece):
    from loadgen.driver.error_kinds import Phase, classify_exception
    from loadgen.driver.sse import SSELineTooLong

    decoder = SSEDecoder(max_line_bytes=1 << 20)
    stream = b'data: {"choices":[]}\n\n' + b"data: " + b"x" * (2 * 1024 * 1024)
    events: list[bytes] = []
    with pytest.raises(SSELineTooLong) as exc:
        for i in range(0, len(stream), piece):
            events += decoder.feed(stream[i : i + piece])
    assert events in ([], [b'{"choices":[]}'])  # what came before the long line is kept
    assert classify_exception(exc.value, Phase.STREAMING)[1] == "malformed_sse"
    many_lines = SSEDecoder(max_line_bytes=4096)  # one event of many short data lines is capped too
    with pytest.raises(SSELineTooLong, match="event"):
        many_lines.feed(b"data: x\n" * 2000)


def test_one_read_one_event_fast_path_matches_the_general_split():
    """A read carrying exactly one one-line event (the usual read at token pace) gives what the
    general split gives: the payload, its raw size, and the line cap still applies."""
    reads = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n", b"data: x\n\ndata: y\n\n", b"data: x\ny\n\n", b"data:x\n\n"]
    for data in reads:
        fast, general = SSEDecoder(), SSEDecoder()
        assert fast.feed(data) == general._feed_fast(data)
        assert fast.sizes == general.sizes
        assert not fast.pending and not general.pending
    capped = SSEDecoder(max_line_bytes=10)
    with pytest.raises(SSELineTooLong):
        capped.feed(b"data: " + b"x" * 20 + b"\n\n")


def test_content_only_delta_and_richer_deltas_parse_alike():
    plain = parse_chunk(b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}')
    assert (plain.text, plain.pieces, plain.choices, plain.finish_reason) == ("hi", 1, 1, "stop")
    richer = parse_chunk(b'{"choices":[{"delta":{"role":"assistant","content":"hi","refusal":"no"}}]}')
    assert (richer.text, richer.pieces, richer.finish_reason) == ("hino", 1, None)
    two = parse_chunk(b'{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"},"finish_reason":"length"}]}')
    assert (two.text, two.pieces, two.choices, two.finish_reason) == ("ab", 2, 2, "length")
