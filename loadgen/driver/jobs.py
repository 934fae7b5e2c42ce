"""Turn trace rows into ready-to-send requests (prompt text, body bytes, hashes) before the clock starts.

Prompts are synthesized with ``loadgen.workload.prompts.PromptSynth`` to the trace's exact token counts.
A shared-prefix group's members start with the same prefix text. Turn k of a conversation starts
with turn k−1's whole prompt, followed by a synthetic assistant reply of turn k−1's output length and
the new user text (for chat: the same, as alternating user/assistant messages). Everything is built
up front so the send path only writes bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa

from loadgen.util.errors import TargetError
from loadgen.workload.prompts import PromptSynth, get_tokenizer, prompt_sha256

_dumps: Callable[[Any], bytes]
try:
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


__all__ = ["TOKENIZE_MAX_BYTES", "Job", "ServerTokenizer", "build_jobs", "resolve_tokenizer"]

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
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers or {}, params=params, timeout=timeout_s, trust_env=False
        )
        self._timeout_s = timeout_s
        self._cache: dict[str, list[int]] = {}

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One call, within the timeout and TOKENIZE_MAX_BYTES read (a body that goes on is refused)."""
        deadline = time.monotonic() + self._timeout_s
        try:
            with self._client.stream("POST", path, json=payload) as response:
                status = response.status_code
                raw = bytearray()
                for part in response.iter_raw():
                    raw += part
                    if len(raw) > TOKENIZE_MAX_BYTES or time.monotonic() > deadline:
                        raise TargetError(
                            f"tokenizer server: POST {path}: answer over {TOKENIZE_MAX_BYTES} bytes or "
                            f"{self._timeout_s:g} s: expected a token list"
                        )
        except httpx.HTTPError as exc:
            raise TargetError(
                f"tokenizer server: POST {path} failed ({type(exc).__name__}): expected a reachable /tokenize"
            ) from None
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
        return str(body.get("prompt", ""))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def close(self) -> None:
        self._client.close()


def resolve_tokenizer(
    spec: str,
    base_url: str,
    model: str,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    params: httpx.QueryParams | None = None,
):
    """A tokenizer for prompt synthesis: ``server`` uses the target's /tokenize (each call within
    ``timeout_s``, with the target's query ``params``), else prompts.get_tokenizer."""
    if spec == "server":
        return ServerTokenizer(base_url, model, headers, timeout_s, params)
    return get_tokenizer(spec)


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
    payload: bytes = b""  # the whole HTTP request (head + body), set by the run just before it starts
    scheduled_ns: int | None = None  # run clock, set when the scheduler dispatches it (None: never dispatched)
    target_index: int | None = None  # replica it was routed to at dispatch (None: never dispatched)


def _split_turn(delta: int, prev_output: int) -> tuple[int, int]:
    """(assistant tokens, new user tokens) of a turn's context growth ``delta``; user gets ≥ 1 when possible."""
    if delta <= 0:
        return 0, 0
    assistant = min(prev_output, delta - 1)
    return max(assistant, 0), delta - max(assistant, 0)


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
) -> list[Job]:
    """One Job per trace row, in trace order (bodies are exact JSON bytes for POST); ``prompt_salt``: see
    ``PromptSynth``."""
    synth = PromptSynth(tokenizer, salt=prompt_salt)
    cols = table.to_pydict()
    n = table.num_rows
    # conversation id -> (segments [(role, text, tokens)], prompt tokens, output tokens) of the last turn
    threads: dict[str, tuple[list[tuple[str, str, int]], int, int]] = {}
    jobs: list[Job] = []
    stream_options: dict[str, Any] = {"include_usage": True}
    if vllm_extensions:
        stream_options["continuous_usage_stats"] = True
    for i in range(n):
        rid = cols["request_id"][i]
        p_tokens = int(cols["prompt_tokens"][i])
        o_tokens = int(cols["output_tokens"][i])
        conv = cols["conversation_id"][i]
        turn = cols["turn_index"][i]
        group = cols["prefix_group"][i]
        group_tokens = cols["prefix_tokens"][i] or 0
        prev = threads.get(conv) if conv is not None and turn else None
        if prev is not None:
            segments, prev_prompt, prev_output = prev
            a_tok, u_tok = _split_turn(p_tokens - prev_prompt, prev_output)
            segments = list(segments)
            if a_tok:
                segments.append(("assistant", synth.text(f"{rid}:assistant", a_tok), a_tok))
            if u_tok:
                segments.append(("user", synth.text(f"{rid}:user", u_tok), u_tok))
        else:
            text = synth.text(rid, p_tokens, group, int(group_tokens)) if group else synth.text(rid, p_tokens)
            segments = [("user", text, p_tokens)]
        if conv is not None:
            threads[conv] = (segments, p_tokens, o_tokens)
        if endpoint == "chat":
            messages: list[dict[str, str]] = []
            for role, text, _ in segments:
                if messages and messages[-1]["role"] == role:
                    messages[-1]["content"] += " " + text
                else:
                    messages.append({"role": role, "content": text})
            body: dict[str, Any] = {"model": model, "messages": messages}
            prompt_text = json.dumps(messages, ensure_ascii=False)
            client_tokens = sum(tok for _, _, tok in segments)
        else:
            prompt_text = " ".join(text for _, text, _ in segments)
            body = {"model": model, "prompt": prompt_text}
            client_tokens = tokenizer.count(prompt_text)
        body[max_tokens_field] = o_tokens
        body["stream"] = True
        body["stream_options"] = stream_options
        if vllm_extensions:
            body["ignore_eos"] = True
        if extra_body:
            body.update(extra_body)
        cancel = cols["cancel_after_tokens"][i]
        think = cols["think_after_reply_ns"][i] if "think_after_reply_ns" in cols else None
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
                think_after_reply_ns=int(think) if think is not None and turn else None,
            )
        )
    return jobs
