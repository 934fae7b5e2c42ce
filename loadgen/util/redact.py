"""Redaction: what loadgen may record or print of a URL or a message (no passwords, keys or bearer tokens).

Used by the driver (error messages, the target's /version), the targets, the contract replay and calibration.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from loadgen.util.inputs import without_userinfo

__all__ = ["redact", "redact_url"]

_SECRET_QUERY = re.compile(r"(?i)([?&](?:api[-_]?key|key|token|access_token|sig|signature|secret)=)[^&\s]+")
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
    query = _SECRET_QUERY.sub(r"\1REDACTED", "?" + parts.query)[1:] if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact(message: str, secrets: tuple[str, ...] = ()) -> str:
    """One line, with known secrets, bearer tokens, URL userinfo and query secrets replaced."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "REDACTED")
    message = _BEARER.sub(r"\1REDACTED", message)
    message = without_userinfo(message)
    message = _SECRET_QUERY.sub(r"\1REDACTED", message)
    return " ".join(message.split())[:500]
