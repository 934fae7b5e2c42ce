"""Turn trace rows into ready-to-send requests (prompt text, body bytes, hashes) before the clock starts.

Prompts are synthesized with ``loadgen.workload.prompts.PromptSynth`` to the trace's exact token counts.
A shared-prefix group's members start with the same prefix text. Turn k of a conversation starts
with turn k−1's whole prompt, followed by a synthetic assistant reply of turn k−1's output length and
the new user text (for chat: the same, as alternating user/assistant messages). A row with
``prompt_block_hashes`` (and the trace metadata's ``block_hash_tokens`` B) is built block by block: the text of
hash i is a function of the hash alone, B tokens long, so requests that share a hash share those tokens exactly
and an engine's prefix cache hits where the traced system's did. A row with ``prompt_text`` (a ShareGPT import)
sends that text, after its thread's earlier turns and their recorded replies (``reply_text``). Everything is built
up front so the send path only writes bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa

from loadgen.rundir.schema import SIM_REASONING_FIELD, SIM_SERVICE_FIELD, SIM_TOOL_CALL_FIELD
from loadgen.util.errors import LoadgenError, TargetError
from loadgen.workload.prompts import PromptSynth, get_tokenizer, prompt_sha256

_dumps: Callable[[Any], bytes]
try:
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


__all__ = ["AUTO_FALLBACK_TOKENIZER", "TOKENIZE_MAX_BYTES", "Job", "ServerTokenizer", "build_jobs", "resolve_tokenizer"]

#: Most bytes of one /tokenize or /detokenize answer read (a 1M-token prompt's ids are ~8 MB of JSON).
TOKENIZE_MAX_BYTES = 64 << 20


class ServerTokenizer:
    """The target's own tokenizer through ``POST /tokenize`` and ``/detokenize`` (vLLM's API).

    Used only while building prompts, before the run starts.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        params: httpx.QueryParams | None = None,
    ) -> None:
        self.name = "server"
        self.model = model
        self._client = httpx.Client(  # each read's own timeout past the whole call's (``_post``): that one ends it
            base_url=base_url.rstrip("/"), headers=headers or {}, params=params, timeout=timeout_s + 1, trust_env=False
        )
        self._timeout_s = timeout_s
        self._cache: dict[str, list[int]] = {}

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One call, within the timeout (connect to last byte) and TOKENIZE_MAX_BYTES read (a body that goes on is
        refused). The call runs in a thread of its own that is waited for at most the timeout: httpx bounds each
        read, not the whole, and a server that sent its head a byte at a time held the run's start for hours."""
        answer: list[tuple[int, bytes] | BaseException] = []

        def call() -> None:
            try:
                answer.append(self._call(path, payload))
            except BaseException as exc:  # handed to the caller
                answer.append(exc)

        worker = threading.Thread(target=call, name="loadgen-tokenize", daemon=True)
        worker.start()
        worker.join(self._timeout_s)
        if not answer:  # the thread is left to its read timeout (a daemon: it holds up no exit)
            raise TargetError(
                f"tokenizer server: POST {path}: no complete answer within {self._timeout_s:g} s: expected a token list"
            )
        if isinstance(answer[0], BaseException):
            raise answer[0]
        status, raw = answer[0]
        if status != 200:
            raise TargetError(
                f"tokenizer server: POST {path} answered HTTP {status}: expected 200 (does the target have {path}?)"
            )
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            raise TargetError(f"tokenizer server: POST {path} answered no JSON object: expected vLLM's {path} answer")
        return body

    def _call(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        """(status, body) of one call; a body over TOKENIZE_MAX_BYTES or past the deadline is refused."""
        deadline = time.monotonic() + self._timeout_s
        try:
            with self._client.stream("POST", path, json=payload) as response:
                raw = bytearray()
                for part in response.iter_raw():
                    raw += part
                    if len(raw) > TOKENIZE_MAX_BYTES or time.monotonic() > deadline:
                        raise TargetError(
                            f"tokenizer server: POST {path}: answer over {TOKENIZE_MAX_BYTES} bytes or "
                            f"{self._timeout_s:g} s: expected a token list"
                        )
                return response.status_code, bytes(raw)
        except httpx.HTTPError as exc:
            raise TargetError(
                f"tokenizer server: POST {path} failed ({type(exc).__name__}): expected a reachable /tokenize"
            ) from None

    def encode(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            body = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
            ids = body.get("tokens") or []
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise TargetError("tokenizer server: /tokenize tokens is not a list of token ids: expected integers")
            if not ids and body.get("count"):
                raise TargetError("tokenizer server: /tokenize returned a count but no tokens: expected token ids")
            self._cache[text] = ids
        return ids

    def decode(self, ids: list[int]) -> str:
        body = self._post("/detokenize", {"model": self.model, "tokens": list(ids)})
        prompt = body.get("prompt", "")
        if type(prompt) is not str:  # before, str() of it: ["odd", "text"] became the prompt text "['odd', 'text']"
            raise TargetError(f"tokenizer server: /detokenize prompt is a JSON {type(prompt).__name__}: expected text")
        return prompt

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def close(self) -> None:
        self._client.close()


#: What ``auto`` (the default) falls back to when the target has no usable ``/tokenize``.
AUTO_FALLBACK_TOKENIZER = "cl100k_base"


def resolve_tokenizer(
    spec: str,
    base_url: str,
    model: str,
    headers: dict[str, str] | None = None,
    target_spec: str | None = None,
    *,
    timeout_s: float = 30.0,
    params: httpx.QueryParams | None = None,
) -> tuple[Any, str, str | None]:
    """``(tokenizer, what it is, warning)`` for prompt synthesis.

    ``server`` uses the target's /tokenize; ``auto`` (the default) uses the tokenizer the target says it
    counts with (``target_spec``: loadgen's simulated engine reports it in ``/version``) locally, else
    the target's /tokenize when it answers, else ``cl100k_base`` with a warning (prompts then hold
    cl100k_base's counts, not the target's); any other spec is ``prompts.get_tokenizer``'s. Each call to the
    target ends within ``timeout_s`` (``auto``'s trial call within 10 s) and carries its query ``params``."""
    if spec == "server":
        return ServerTokenizer(base_url, model, headers, timeout_s, params), "server", None
    if spec != "auto":
        return get_tokenizer(spec), spec, None
    if target_spec:
        try:
            return get_tokenizer(target_spec), f"{target_spec} (the target's)", None
        except LoadgenError:
            pass  # not available here (a tokenizer.json on the server's host): ask the server
    server = ServerTokenizer(base_url, model, headers, min(timeout_s, 10.0), params)
    try:
        ids = server.encode("Hello, world")
        if ids and server.decode(ids[:1]):  # prompts are built from decoded token runs: /detokenize too
            return server, "server", None
        why = "it returned no tokens" if not ids else "/detokenize returned no text"
    except (TargetError, ValueError, AttributeError) as exc:
        why = str(exc) if isinstance(exc, TargetError) else f"it answered {type(exc).__name__}"
    server.close()
    return (
        get_tokenizer(AUTO_FALLBACK_TOKENIZER),
        AUTO_FALLBACK_TOKENIZER,
        f"no --tokenizer given and the target's /tokenize is not usable ({why}): prompts are sized with "
        f"{AUTO_FALLBACK_TOKENIZER}, so the server may count other prompt lengths than the trace asks for; pass "
        "--tokenizer hf:PATH/tokenizer.json (the served model's) to size them as the target does",
    )


@dataclass(slots=True)
class Job:
    """One scheduled request, ready to send."""

    index: int
    request_id: str
    request_class: str
    offset_ns: int
    target_prompt_tokens: int
    target_output_tokens: int
    conversation_id: str | None
    turn_index: int | None
    prefix_group: str | None
    cancel_after_tokens: int | None
    body: bytes
    prompt_sha256: str
    client_prompt_tokens: int | None
    prompt_text: str | None
    think_after_reply_ns: int | None = None  # sent this long after the previous turn's reply ended (None: at offset)
    wait_for_ids: list[str] | None = None  # the replies it waits for (None: its conversation's previous turn)
    payload: bytes = b""  # the whole HTTP request (head + body), set by the run just before it starts
    scheduled_ns: int | None = None  # run clock, set when the scheduler dispatches it (None: never dispatched)
    target_index: int | None = None  # replica it was routed to at dispatch (None: never dispatched)
    done_abs_ns: int | None = None  # perf_counter_ns when its reply ended (the row's done_ns), once recorded


def _split_turn(delta: int, prev_output: int) -> tuple[int, int]:
    """(assistant tokens, new user tokens) of a turn's context growth ``delta``; user gets ≥ 1 when possible."""
    if delta <= 0:
        return 0, 0
    assistant = min(prev_output, delta - 1)
    return max(assistant, 0), delta - max(assistant, 0)


#: A conversation's last turn: its segments [(role, text, tokens)], prompt tokens and output tokens.
_Thread = tuple[list[tuple[str, str, int]], int, int]


def build_jobs(
    table: pa.Table,
    *,
    model: str,
    endpoint: str,
    tokenizer,
    retain_prompt_text: bool = False,
    vllm_extensions: bool = True,
    max_tokens_field: str = "max_tokens",
    extra_body: dict[str, Any] | None = None,
    prompt_salt: str = "",
    sim_reasoning: bool = False,
    block_hash_tokens: int = 0,
) -> list[Job]:
    """One Job per trace row, in trace order (bodies are exact JSON bytes for POST); ``prompt_salt``: see
    ``PromptSynth``. ``sim_reasoning`` (the target is loadgen's simulated engine): a row's ``reasoning_tokens``
    goes in the body as ``sim_reasoning_tokens``, the reasoning phase the engine streams before the answer (a
    real model decides its own, and is not sent the field), its ``tool_call_tokens`` as ``sim_tool_call_tokens``
    (the reply's last tokens streamed as a tool call), and its ``service_ns`` as ``sim_service_ms``.
    ``block_hash_tokens``: tokens each ``prompt_block_hashes`` entry stands for (the trace metadata's; 0: the
    hashes are not used)."""
    synth = PromptSynth(tokenizer, salt=prompt_salt)
    cols = table.to_pydict()
    threads: dict[str, _Thread] = {}  # conversation id -> its last turn
    replies: dict[str, str | None] = {}  # conversation id -> its last turn's recorded reply (text rows)
    tail = _body_tail(vllm_extensions)
    jobs: list[Job] = []
    for i in range(table.num_rows):
        rid = cols["request_id"][i]
        p_tokens = int(cols["prompt_tokens"][i])
        o_tokens = int(cols["output_tokens"][i])
        conv = cols["conversation_id"][i]
        turn = cols["turn_index"][i]
        group = cols["prefix_group"][i]
        segments = _row_segments(cols, i, synth, threads, replies, block_hash_tokens)
        if conv is not None:
            threads[conv] = (segments, p_tokens, o_tokens)
        body, prompt_text, client_tokens = _prompt_body(model, endpoint, segments, tokenizer)
        body[max_tokens_field] = o_tokens
        body.update(tail)
        if sim_reasoning:
            body.update(_sim_fields(cols, i))
        if extra_body:
            body.update(extra_body)
        cancel = cols["cancel_after_tokens"][i]
        think = cols["think_after_reply_ns"][i] if "think_after_reply_ns" in cols else None
        waits = cols["wait_for_ids"][i] if "wait_for_ids" in cols else None
        jobs.append(
            Job(
                index=i,
                request_id=rid,
                request_class=cols["request_class"][i],
                offset_ns=int(cols["scheduled_offset_ns"][i]),
                target_prompt_tokens=p_tokens,
                target_output_tokens=o_tokens,
                conversation_id=conv,
                turn_index=turn,
                prefix_group=group,
                cancel_after_tokens=int(cancel) if cancel is not None else None,
                body=_dumps(body),
                prompt_sha256=prompt_sha256(prompt_text),
                client_prompt_tokens=client_tokens,
                prompt_text=prompt_text if retain_prompt_text else None,
                think_after_reply_ns=int(think) if think is not None and (turn or waits) else None,
                wait_for_ids=list(waits) if waits else None,
            )
        )
    return jobs


def _body_tail(vllm_extensions: bool) -> dict[str, Any]:
    """The body fields after max tokens, in this order: streaming with usage (vLLM: per chunk, and no EOS)."""
    stream_options: dict[str, Any] = {"include_usage": True}
    if vllm_extensions:
        stream_options["continuous_usage_stats"] = True
    tail: dict[str, Any] = {"stream": True, "stream_options": stream_options}
    if vllm_extensions:
        tail["ignore_eos"] = True
    return tail


def _row_segments(
    cols: dict[str, list[Any]],
    i: int,
    synth: PromptSynth,
    threads: dict[str, _Thread],
    replies: dict[str, str | None],
    block_hash_tokens: int,
) -> list[tuple[str, str, int]]:
    """Row ``i``'s prompt segments: recorded text after its thread's previous turns and recorded replies; a
    first turn with block hashes built block by block; else synthesised (``_segments``)."""
    rid, p_tokens, conv = cols["request_id"][i], int(cols["prompt_tokens"][i]), cols["conversation_id"][i]
    prev = threads.get(conv) if conv is not None and cols["turn_index"][i] else None
    text = cols["prompt_text"][i] if "prompt_text" in cols else None
    if text is not None:
        segments = _text_segments(synth.tokenizer, prev, replies.get(conv) if prev else None, text)
        if conv is not None:
            replies[conv] = cols["reply_text"][i]
        return segments
    hashes = cols["prompt_block_hashes"][i] if block_hash_tokens and "prompt_block_hashes" in cols else None
    if prev is None and hashes:
        return [("user", synth.hashed(rid, p_tokens, hashes, block_hash_tokens), p_tokens)]
    group = cols["prefix_group"][i]
    return _segments(synth, prev, rid, p_tokens, group, int(cols["prefix_tokens"][i] or 0))


def _sim_fields(cols: dict[str, list[Any]], i: int) -> dict[str, Any]:
    """The fields only loadgen's simulated engine is sent: the row's reasoning phase, tool call and recorded
    service time."""
    fields: dict[str, Any] = {}
    reasoning = cols["reasoning_tokens"][i] if "reasoning_tokens" in cols else None
    if reasoning is not None:
        fields[SIM_REASONING_FIELD] = int(reasoning)
    tool = cols["tool_call_tokens"][i] if "tool_call_tokens" in cols else None
    if tool is not None:
        fields[SIM_TOOL_CALL_FIELD] = int(tool)
    service = cols["service_ns"][i] if "service_ns" in cols else None
    if service is not None:
        fields[SIM_SERVICE_FIELD] = service / 1e6
    return fields


def _segments(
    synth: PromptSynth, prev: _Thread | None, rid: str, p_tokens: int, group: str | None, group_tokens: int
) -> list[tuple[str, str, int]]:
    """A request's prompt as (role, text, tokens) segments: a later turn is its conversation's previous turn
    plus the reply (assistant) and the new user message that make up its growth; a first one is one user
    message (opening with its prefix group's shared text), as is a turn whose prompt is no longer than the
    previous one's (the context was compacted)."""
    if prev is None or p_tokens <= prev[1]:
        text = synth.text(rid, p_tokens, group, group_tokens) if group else synth.text(rid, p_tokens)
        return [("user", text, p_tokens)]
    segments, prev_prompt, prev_output = prev
    a_tok, u_tok = _split_turn(p_tokens - prev_prompt, prev_output)
    segments = list(segments)
    if a_tok:
        segments.append(("assistant", synth.text(f"{rid}:assistant", a_tok), a_tok))
    if u_tok:
        segments.append(("user", synth.text(f"{rid}:user", u_tok), u_tok))
    return segments


def _text_segments(tokenizer, prev: _Thread | None, reply: str | None, text: str) -> list[tuple[str, str, int]]:
    """A recorded-text row's prompt: its thread's previous segments, the previous turn's recorded reply, then
    this row's user text, each counted with the run's tokenizer."""
    segments = list(prev[0]) if prev is not None else []
    if reply:
        segments.append(("assistant", reply, tokenizer.count(reply)))
    segments.append(("user", text, tokenizer.count(text)))
    return segments


def _prompt_body(
    model: str, endpoint: str, segments: list[tuple[str, str, int]], tokenizer
) -> tuple[dict[str, Any], str, int]:
    """(the body's model and prompt or messages, the prompt text as hashed, the client's prompt token count)."""
    if endpoint != "chat":
        prompt_text = " ".join(text for _, text, _ in segments)
        return {"model": model, "prompt": prompt_text}, prompt_text, tokenizer.count(prompt_text)
    messages: list[dict[str, str]] = []
    for role, text, _ in segments:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += " " + text
        else:
            messages.append({"role": role, "content": text})
    prompt_text = json.dumps(messages, ensure_ascii=False)
    return {"model": model, "messages": messages}, prompt_text, sum(tok for _, _, tok in segments)
