"""Redaction: what loadgen may record or print of a URL or a message (no passwords, keys or bearer tokens).

Every query value of a URL is redacted and its name kept (``?code=REDACTED&subscription-key=REDACTED``): a
gateway may take its credential under any name. ``redact`` replaces secrets before it cuts a message, so a
secret across the cut is never kept in part.

Used by the driver (error messages, the target's /version), the targets, the contract replay and calibration.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from loadgen.util.inputs import without_userinfo

__all__ = ["basic_token", "redact", "redact_query", "redact_url", "url_secrets", "without_secrets"]

#: A query value shorter than this is not replaced in what a server says back (it would hit ordinary text).
MIN_QUERY_SECRET_CHARS = 8

#: A query parameter's value (in a URL or in a message that quotes one): every one is redacted, names kept.
_SECRET_QUERY = re.compile(r"([?&][^?&=\s#\"'<>]{1,200}=)[^&\s#\"'<>]+")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


def redact_url(url: str) -> str:
    """A URL without userinfo and without query secrets (safe to record)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # not a URL (bad IPv6 literal or port): still never show a password
        return _SECRET_QUERY.sub(r"\1REDACTED", without_userinfo(url))
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"  # an IPv6 literal keeps its brackets
    if port:
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, redact_query(parts.query), ""))


def redact_query(query: str) -> str:
    """A URL's query string with every value replaced (``a=1&b&c=`` -> ``a=REDACTED&b&c=REDACTED``), names kept."""
    if not query:
        return ""
    fields = (name + "=REDACTED" if sep else name for name, sep, _ in (f.partition("=") for f in query.split("&")))
    return "&".join(fields)


def basic_token(url: str) -> str | None:
    """The Basic token a client makes of a URL's ``user:password`` (what httpx sends), or None without userinfo."""
    parts = urlsplit(url)
    if not parts.username:
        return None
    return base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a target URL carries, to replace wherever a server echoes them: its password (as given and
    decoded), the Basic token made of its userinfo, and every query value of 8 characters or more."""
    parts = urlsplit(url)
    query = tuple(v for _, v in parse_qsl(parts.query) if len(v) >= MIN_QUERY_SECRET_CHARS)
    password = (parts.password, unquote(parts.password)) if parts.password else ()
    token = basic_token(url)
    return tuple(dict.fromkeys((*password, *((token,) if token else ()), *query)))


def without_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every known secret replaced by ``REDACTED``, nothing else changed (no cut, same lines)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "REDACTED")
    return text


def redact(message: str, secrets: tuple[str, ...] = ()) -> str:
    """One line of at most 500 characters, with known secrets, bearer tokens, URL userinfo and query values
    replaced (before the cut: a secret across it is never kept in part)."""
    message = without_secrets(message, secrets)
    message = _BEARER.sub(r"\1REDACTED", message)
    message = without_userinfo(message)
    message = _SECRET_QUERY.sub(r"\1REDACTED", message)
    return " ".join(message.split())[:500]
