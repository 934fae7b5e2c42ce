"""ShareGPT JSON (e.g. ``ShareGPT_Vicuna_unfiltered``): a list of ``{"id", "conversations": [{"from", "value"}]}``
with ``from`` ``human`` (or ``user``) and ``gpt`` (or ``assistant``, ``chatgpt``, ``bard``, ``bing``).

Every conversation becomes a thread with its real text: turn k sends the user message k after the earlier
messages and the recorded replies (``prompt_text``, ``reply_text`` trace columns), and asks for as many output
tokens as the recorded reply k holds. Token counts come from ``tokenizer`` (give the target's: ``hf:PATH``); the
prompt count is the sum over the messages sent, as the driver counts a chat prompt. Consecutive messages of one
side are joined with a newline; ``system`` messages and replies before the first user message are left out, as
is a last user message without a reply. The file has no timestamps: conversation c starts at c / ``rate_rps``
seconds, and each later turn is sent as soon as the previous reply ends (``think_after_reply_ns`` = 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.util.errors import LoadgenError, TraceError
from loadgen.workload.prompts import get_tokenizer

from .import_table import Source

__all__ = ["read_sharegpt"]

_USER = ("human", "user")
_REPLY = ("gpt", "assistant", "chatgpt", "bard", "bing", "model")
_NS = 1_000_000_000
_TURN_GAP_NS = 1  # later turns: ordering estimate only (they wait for the previous reply)


def _turns(path: Path, index: int, record: Any) -> list[tuple[str, str]]:
    """(user text, reply text) pairs of one conversation record."""
    messages = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(messages, list):
        raise TraceError(f"{path}: conversation {index}: no 'conversations' list: expected ShareGPT records")
    pairs: list[tuple[str, str]] = []
    user: list[str] = []
    reply: list[str] = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("value"), str):
            raise TraceError(f"{path}: conversation {index}: message {k}: expected {{'from', 'value': text}}")
        side = msg.get("from")
        if side in _USER:
            if reply:
                pairs.append(("\n".join(user), "\n".join(reply)))
                user, reply = [], []
            user.append(msg["value"])
        elif side in _REPLY and user:
            reply.append(msg["value"])
    if user and reply:
        pairs.append(("\n".join(user), "\n".join(reply)))
    return pairs


def _load(path: Path) -> list[Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError):
        raise TraceError(f"{path}: invalid JSON: expected a ShareGPT list of conversations") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: a JSON {type(data).__name__}: expected a ShareGPT list of conversations")
    return data


def read_sharegpt(path: str | Path, tokenizer: str = "cl100k_base", rate_rps: float = 1.0) -> Source:
    """The requests of a ShareGPT file, one thread per conversation with at least one answered user message."""
    path = Path(path)
    if not np.isfinite(rate_rps) or not 0 < rate_rps <= 1e6:
        raise TraceError(f"--rate-rps = {rate_rps}: expected conversations per second in (0, 1e6]")
    try:
        tok = get_tokenizer(tokenizer)
    except LoadgenError as exc:
        raise TraceError(f"--tokenizer: {exc}") from None
    times, prompts, outputs, convs, users, replies, turns = [], [], [], [], [], [], []
    started = 0
    for index, record in enumerate(_load(path)):
        pairs = _turns(path, index, record)
        if not pairs:
            continue
        start = round(started * _NS / rate_rps)
        conv = f"sg{index}"  # the conversation's place in the file
        context = 0
        for k, (user, reply) in enumerate(pairs):
            context += tok.count(user)
            out = tok.count(reply)
            times.append(start + k * _TURN_GAP_NS)
            prompts.append(context)
            outputs.append(out)
            convs.append(conv)
            users.append(user)
            replies.append(reply)
            turns.append(k)
            context += out
        started += 1
    turn_arr = np.asarray(turns, np.int64)
    return Source(
        kind="sharegpt",
        path=path,
        times_ns=np.asarray(times, np.int64),
        prompts=np.asarray(prompts, np.int64),
        outputs=np.asarray(outputs, np.int64),
        conversations=pa.array(convs, pa.string()),
        prompt_text=pa.array(users, pa.string()),
        reply_text=pa.array(replies, pa.string()),
        source_turns=turn_arr,
        think_after_reply_ns=pa.array(np.where(turn_arr > 0, 0, -1), pa.int64(), mask=turn_arr == 0),
        extra_meta={"tokenizer": tok.name, "conversation_rate_rps": rate_rps, "conversations": started},
    )
