"""Import recorded coding-agent sessions (kv-cache-tester's ``trace_*.json``) as agent sessions.

A file is one session: ``requests[]`` in order, each with ``t`` (s since the session start), ``in`` (the whole
prompt), ``out``, ``hash_ids`` (one per whole 64-token block), ``api_time`` (s the server took; sometimes
absent) and ``think_time``; a ``type: "subagent"`` entry holds a sub-session's own ``requests[]`` (their ``t``
relative to the entry's). Each becomes a trace row that waits for replies (``loadgen.workload.sessions``):

- a step waits for its (sub-)session's previous step and, in the parent, for every sub-session that had ended
  by its recorded start and was not yet waited for (the fan-out join);
- a sub-session's first step waits for the parent step it followed (the last one started before it);
- its think (tool) time is its recorded start minus the last recorded reply end among them, so a server that
  answers each request in its recorded time replays the recorded instants exactly;
- a reply's recorded end is ``t + api_time``; without ``api_time`` it is the next step's ``t - think_time``
  (the file's own pacing rule), and for a last step without one, its start.

The recorded server time goes in ``service_ns`` (loadgen's simulated engine answers in it), the block ids in
``prompt_block_hashes`` (64 tokens each; each file's ids are moved into their own range, as they are local to
the file). Conversation ids are the file's ``id`` and, for a sub-session, ``id/agent_id``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from loadgen import __version__
from loadgen.rundir.identity import sha256_file
from loadgen.util.errors import TraceError
from loadgen.util.limits import MAX_OFFSET_NS, MAX_TOKENS
from loadgen.workload.scenario import class_name_problem
from loadgen.workload.sessions import sub_session_id

from .io import trace_table, write_trace

__all__ = ["AGENTIC_BLOCK_TOKENS", "Step", "import_agentic", "session_steps"]

#: Tokens per ``hash_ids`` entry in these files (their ``block_size``).
AGENTIC_BLOCK_TOKENS = 64
_NS = 1_000_000_000
#: Each file's block ids are shifted into their own range of this width (ids are local to a file).
_ID_RANGE = 1 << 32
#: A request's ``type``: non-streaming, streaming, or a sub-agent holding its own requests.
_TYPES = ("n", "s", "subagent")


@dataclass
class Step:
    """One recorded request as a session step (times in s from the session start)."""

    request_id: str
    conversation_id: str
    turn: int
    start_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    hashes: list[int]
    wait_for: list[str]
    think_s: float | None


def _number(value: object, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise TraceError(f"{where} = {value!r}: expected {what}")
    return float(value)


def _tokens(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise TraceError(f"{where} = {value!r}: expected a token count in 0..{MAX_TOKENS}")
    return value


def _entries(requests: object, where: str) -> list[dict[str, Any]]:
    """A ``requests`` list whose every entry is an object with a known ``type``, else one TraceError line."""
    if not isinstance(requests, list):
        raise TraceError(f"{where}.requests = {repr(requests)[:40]}: expected a list of requests")
    for k, r in enumerate(requests):
        if not isinstance(r, dict):
            raise TraceError(f"{where}.requests[{k}] = {repr(r)[:40]}: expected a request object")
        if r.get("type") not in _TYPES:
            raise TraceError(f"{where}.requests[{k}].type = {r.get('type')!r}: expected one of {', '.join(_TYPES)}")
    return requests


def _hashes(r: dict[str, Any], at: str, prompt_tokens: int) -> list[int]:
    """A request's ``hash_ids``: one block id in 0..2^32 per whole block of its prompt."""
    hashes = r.get("hash_ids")
    ids_ok = isinstance(hashes, list) and all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < _ID_RANGE for h in hashes
    )
    if not isinstance(hashes, list) or not ids_ok:
        raise TraceError(f"{at}.hash_ids: expected a list of block ids in 0..2^32")
    blocks = prompt_tokens // AGENTIC_BLOCK_TOKENS
    if len(hashes) != blocks:
        raise TraceError(
            f"{at}.hash_ids holds {len(hashes)} ids: expected one per whole {AGENTIC_BLOCK_TOKENS}-token block "
            f"of in = {prompt_tokens} ({blocks})"
        )
    return list(hashes)


def _seconds_or_none(r: dict[str, Any], key: str, at: str) -> float | None:
    value = r.get(key)
    return None if value is None else _number(value, f"{at}.{key}", "seconds")


def _steps_of(requests: list[dict[str, Any]], where: str, conv: str, base_s: float) -> list[Step]:
    """The plain requests of one (sub-)session as steps chained one after another (no fan-out yet)."""
    steps: list[Step] = []
    plain = [(k, r) for k, r in enumerate(requests) if r["type"] != "subagent"]
    api_s: list[float | None] = []
    think_s: list[float | None] = []
    for j, (k, r) in enumerate(plain):
        at = f"{where}.requests[{k}]"
        start = base_s + _number(r.get("t"), f"{at}.t", "seconds since the session start")
        prompt = _tokens(r.get("in"), f"{at}.in")
        api_s.append(_seconds_or_none(r, "api_time", at))
        think_s.append(_seconds_or_none(r, "think_time", at))
        steps.append(
            Step(
                request_id=f"{conv}#{j}",
                conversation_id=conv,
                turn=j,
                start_s=start,
                end_s=start,
                prompt_tokens=prompt,
                output_tokens=max(1, _tokens(r.get("out"), f"{at}.out")),
                hashes=_hashes(r, at, prompt),
                wait_for=[steps[-1].request_id] if steps else [],
                think_s=None,
            )
        )
    for j in range(len(plain)):
        api = api_s[j]
        if api is not None:
            end = steps[j].start_s + api
        elif j + 1 < len(plain):
            end = steps[j + 1].start_s - (think_s[j + 1] or 0.0)
        else:
            end = steps[j].start_s
        steps[j].end_s = max(end, steps[j].start_s)
    return steps


def session_steps(data: dict[str, Any], where: str, name: str) -> list[Step]:
    """Every step of one recorded session (the parent's and its sub-sessions'), with its waits and think time."""
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise TraceError(f"{where}: requests: expected a non-empty list")
    requests = _entries(requests, where)
    main = _steps_of(requests, where, name, 0.0)
    if not main:
        raise TraceError(f"{where}: requests: expected at least one request outside sub-agents")
    subs: list[list[Step]] = []
    for k, r in enumerate(requests):
        if r["type"] == "subagent":
            at = f"{where}.requests[{k}]"
            start = _number(r.get("t"), f"{at}.t", "seconds since the session start")
            agent = r.get("agent_id")
            if not isinstance(agent, str) or not agent or "/" in agent or "#" in agent:
                raise TraceError(f"{at}.agent_id = {agent!r}: expected a name without '/' or '#'")
            inner = _entries(r.get("requests", []), at)
            if any(e["type"] == "subagent" for e in inner):
                raise TraceError(f"{at}.requests: a sub-agent inside a sub-agent: expected its own requests only")
            sub = _steps_of(inner, at, sub_session_id(name, agent), start)
            if sub:
                launcher = [s for s in main if s.start_s <= start] or main[:1]
                sub[0].wait_for = [launcher[-1].request_id]
                subs.append(sub)
    _join(main, subs)
    steps = main + [s for sub in subs for s in sub]
    ends = {s.request_id: s.end_s for s in steps}
    for s in steps:
        if s.wait_for:
            s.think_s = max(0.0, s.start_s - max(ends[r] for r in s.wait_for))
    return steps


def _join(main: list[Step], subs: list[list[Step]]) -> None:
    """A parent step also waits for each sub-session that ended by its start and that no earlier step waited for."""
    open_subs = list(subs)
    for step in main[1:]:
        done = [sub for sub in open_subs if sub[-1].end_s <= step.start_s and sub[0].start_s < step.start_s]
        for sub in done:
            step.wait_for.append(sub[-1].request_id)
            open_subs.remove(sub)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise TraceError(f"{path}: not JSON ({exc}): expected a kv-cache-tester trace_*.json") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: a JSON {type(data).__name__}: expected an object with requests[]")
    block = data.get("block_size", AGENTIC_BLOCK_TOKENS)
    if block != AGENTIC_BLOCK_TOKENS:
        raise TraceError(f"{path}: block_size = {block!r}: expected {AGENTIC_BLOCK_TOKENS}")
    return data


def _session_name(data: dict[str, Any], path: Path, taken: set[str]) -> str:
    if data.get("id") is not None and not isinstance(data.get("id"), str):
        raise TraceError(f"{path}: id = {repr(data['id'])[:40]}: expected the session's name (a string)")
    name = data.get("id") if isinstance(data.get("id"), str) else path.stem
    if not name or "/" in name or "#" in name or name in taken:
        raise TraceError(f"{path}: id = {name!r}: expected a session name without '/' or '#', unique among the files")
    taken.add(name)
    return name


def import_agentic(
    paths: Sequence[str | Path], out: str | Path, *, time_scale: float = 1.0, request_class: str = "agent"
) -> Path:
    """Import recorded agent sessions (each file one session, all starting at 0 s) into a trace file;
    ``time_scale`` multiplies every instant, think time and server time (0.01: a hundred times faster)."""
    problem = class_name_problem(request_class)
    if problem is not None:
        raise TraceError(f"--request-class = {request_class!r}: {problem}")
    if not 0 < time_scale <= 1e6:
        raise TraceError(f"--time-scale = {time_scale}: expected a number in (0, 1e6]")
    rows: list[tuple[Step, int]] = []
    taken: set[str] = set()
    files = [Path(p) for p in paths]
    for k, path in enumerate(files):
        data = _read(path)
        rows.extend((s, k) for s in session_steps(data, str(path), _session_name(data, path, taken)))
    rows.sort(key=lambda row: row[0].start_s)  # stable: a file's order among equal instants
    table = _table(rows, time_scale, request_class)
    last_ns = max(table.column("scheduled_offset_ns").to_pylist())
    if last_ns > MAX_OFFSET_NS:
        raise TraceError(f"{files[0]}: sessions span {last_ns / _NS:.3g} s: expected at most {MAX_OFFSET_NS / _NS:g}")
    metadata = {
        "generator": "loadgen.trace.agentic",
        "loadgen_version": __version__,
        "source": ", ".join(str(p) for p in files),
        "source_sha256": [sha256_file(p) for p in files],
        "trace_name": files[0].stem if len(files) == 1 else f"agentic-{len(files)}",
        "seed": None,
        "mode": "open",
        "max_in_flight": None,
        "time_scale": time_scale,
        "request_class": request_class,
        "sessions": len(files),
        "requests": table.num_rows,
        "duration_s": last_ns / _NS,
        "block_hash_tokens": AGENTIC_BLOCK_TOKENS,
        "block_hash_rule": "kv-cache-tester hash_ids (one per whole 64-token block), plus file index x 2^32",
    }
    return write_trace(table, out, metadata)


def _table(rows: list[tuple[Step, int]], scale: float, request_class: str) -> pa.Table:
    def ns(seconds: float) -> int:
        return round(seconds * scale * _NS)

    n = len(rows)
    return trace_table(
        {
            "request_id": [s.request_id for s, _ in rows],
            "request_class": [request_class] * n,
            "scheduled_offset_ns": [ns(s.start_s) for s, _ in rows],
            "prompt_tokens": [s.prompt_tokens for s, _ in rows],
            "output_tokens": [s.output_tokens for s, _ in rows],
            "prefix_group": [None] * n,
            "prefix_tokens": [None] * n,
            "conversation_id": [s.conversation_id for s, _ in rows],
            "turn_index": [s.turn for s, _ in rows],
            "cancel_after_tokens": [None] * n,
            "think_after_reply_ns": [ns(s.think_s) if s.think_s is not None else None for s, _ in rows],
            "reasoning_tokens": [None] * n,
            "prompt_block_hashes": [[h + k * _ID_RANGE for h in s.hashes] for s, k in rows],
            "wait_for_ids": [s.wait_for or None for s, _ in rows],
            "service_ns": [ns(s.end_s - s.start_s) for s, _ in rows],
        }
    )
