"""Reading an answer from a target with a bound on both time and bytes (probes, scrapes, resets, contract cases).

Every GET the driver makes besides the measured requests (``/version``, ``/v1/models``, ``/metrics``) goes
through ``bounded_get``; a URL target's cold reset (``POST /reset_prefix_cache``) and each contract case go
through ``bounded_request``. The whole exchange (connect, head, body) ends within ``timeout_s``, and at most
``max_bytes`` of the body are read off the socket, whatever the server announces or sends. A server that
accepts the connection and never answers, or answers a 300 MB ``/version``, costs a bounded wait and a
bounded buffer, never a hung run or a gigabyte of memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import httpx

__all__ = ["PROBE_MAX_BYTES", "PROBE_TIMEOUT_S", "Bounded", "bounded_get", "bounded_request"]

#: Most bytes of one probe's body read (what is read, not only what is kept).
PROBE_MAX_BYTES = 1 << 20
#: Longest a probe may take, connect to last byte, unless the run's own TTFT cap is shorter.
PROBE_TIMEOUT_S = 30.0
#: Headers that describe the framing or coding of the bytes read; the bounded copy is plain bytes.
_FRAMING = ("content-length", "transfer-encoding", "content-encoding")


@dataclass(frozen=True)
class Bounded:
    """What one bounded GET got: the response (None when there was none) and why it is partial or absent."""

    response: httpx.Response | None
    failure: str | None = None  # "timed out after 3 s", "ReadError: ..." (None: an answer came)
    truncated: bool = False  # the body was longer than max_bytes: only its head was read


async def bounded_get(
    client: httpx.AsyncClient, path: str, *, timeout_s: float = PROBE_TIMEOUT_S, max_bytes: int = PROBE_MAX_BYTES
) -> Bounded:
    """GET ``path``: the whole exchange within ``timeout_s``, at most ``max_bytes`` of the body read."""
    return await bounded_request(client, "GET", path, timeout_s=timeout_s, max_bytes=max_bytes)


async def bounded_request(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    timeout_s: float,
    max_bytes: int,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> Bounded:
    """``method path`` (with ``json`` as its body, if given): the whole exchange within ``timeout_s``, at most
    ``max_bytes`` of the answer's body read (0: only the status and headers are waited for; the first body
    byte, if any, ends the read).

    The response returned holds the bytes read (raw: no content decoding), without framing headers. So it asks
    for identity, whatever the client's own headers say: httpx asks for gzip by default, prometheus_client then
    compresses /metrics, and the scrape stored no sample at all (nor did ``sim calibrate`` read vLLM's cache).
    """
    headers = {**(headers or {}), "accept-encoding": "identity"}
    with anyio.move_on_after(timeout_s):
        try:
            async with client.stream(method, path, json=json, headers=headers, timeout=timeout_s) as response:
                body = bytearray()
                truncated = False
                async for part in response.aiter_raw():
                    body += part
                    if len(body) > max_bytes:
                        truncated = True
                        break
                kept = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _FRAMING]
                copy = httpx.Response(response.status_code, headers=kept, content=bytes(body[:max_bytes]))
                return Bounded(copy, truncated=truncated)
        except httpx.HTTPError as exc:
            return Bounded(None, f"{type(exc).__name__}: {str(exc)[:200]}")
    return Bounded(None, f"no complete answer within {timeout_s:g} s")
