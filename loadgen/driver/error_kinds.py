"""One boundary where foreign failures become a request's (status, error_kind, message).

A failed request is a row, not an exception: the client catches whatever httpx, anyio or the SSE
parser raised and asks ``classify_exception`` what to record. HTTP error statuses go through
``classify_http_status`` (the status → error_kind table itself is ``records.http_error_kind``,
shared with the simulator and the importers). Messages are one line and pass through ``redact``
so no secret is stored.
"""

from __future__ import annotations

import email.utils
import math
import time

import httpx

from loadgen.rundir.schema import STATUS_ERROR, STATUS_TIMEOUT, http_error_kind
from loadgen.util.redact import redact

from .sse import SSEProtocolError
from .transport import MalformedHead

__all__ = [
    "Phase",
    "StreamTruncated",
    "TTFTTimeout",
    "TotalTimeout",
    "classify_exception",
    "classify_http_status",
    "parse_retry_after",
]


class Phase:
    """Where a request was when it failed (decides e.g. connect vs reset_mid_stream)."""

    BEFORE_RESPONSE = 0  # connecting / sending / waiting for headers
    STREAMING = 1  # headers received, reading the body


class TTFTTimeout(Exception):
    """No first token within the TTFT timeout."""


class TotalTimeout(Exception):
    """The request did not finish within the total timeout."""


class StreamTruncated(Exception):
    """The body ended without ``[DONE]`` or a finish_reason."""


def parse_retry_after(value: str | None, now_s: float | None = None) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date; None when absent, unreadable or not finite."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:  # "nan" and "inf" parse as floats: no delay the server stated (None), not 0.0
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def classify_http_status(code: int) -> tuple[str, str]:
    """(status, error_kind) for a response that is not 200 (1xx/3xx where a stream was expected: ``client``)."""
    return STATUS_ERROR, http_error_kind(code)


def classify_exception(exc: BaseException, phase: int, secrets: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """(status, error_kind, one-line message) for an exception that ended a request.

    Run-level cancellation is not handled here (the caller records ``run_interrupted``).
    """
    name = type(exc).__name__
    text = str(exc) or name
    if isinstance(exc, TTFTTimeout):
        return STATUS_TIMEOUT, "ttft_timeout", redact(text, secrets)
    if isinstance(exc, TotalTimeout):
        return STATUS_TIMEOUT, "total_timeout", redact(text, secrets)
    if isinstance(exc, SSEProtocolError):
        return STATUS_ERROR, "malformed_sse", redact(text, secrets)
    if isinstance(exc, StreamTruncated):
        return STATUS_ERROR, "truncated", redact(text, secrets)
    if isinstance(exc, httpx.LocalProtocolError):  # we produced invalid HTTP: a client bug, not the server
        return STATUS_ERROR, "client", redact(f"{name}: {text}", secrets)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.ProxyError)):
        return STATUS_ERROR, "connect", redact(f"{name}: {text}", secrets)
    if isinstance(exc, httpx.TimeoutException):  # read/write/pool timeouts (only when httpx timeouts are set)
        return STATUS_TIMEOUT, "total_timeout", redact(f"{name}: {text}", secrets)
    if isinstance(exc, MalformedHead):  # the server answered, with no HTTP head: not a failure to connect
        return STATUS_ERROR, "malformed_head", redact(text, secrets)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        if phase == Phase.STREAMING:
            return STATUS_ERROR, "reset_mid_stream", redact(f"{name}: {text}", secrets)
        return STATUS_ERROR, "connect", redact(f"{name} before the response: {text}", secrets)
    if isinstance(exc, httpx.TransportError):
        kind = "reset_mid_stream" if phase == Phase.STREAMING else "connect"
        return STATUS_ERROR, kind, redact(f"{name}: {text}", secrets)
    if isinstance(exc, httpx.DecodingError):
        return STATUS_ERROR, "malformed_sse", redact(f"{name}: {text}", secrets)
    if isinstance(exc, (ConnectionError, OSError)):
        kind = "reset_mid_stream" if phase == Phase.STREAMING else "connect"
        return STATUS_ERROR, kind, redact(f"{name}: {text}", secrets)
    if isinstance(exc, UnicodeDecodeError):
        return STATUS_ERROR, "malformed_sse", redact(f"{name}: {text}", secrets)
    return STATUS_ERROR, "client", redact(f"{name}: {text}", secrets)
