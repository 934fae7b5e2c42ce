"""Checks of user-given network inputs (target URLs, extra headers, the API key's variable name), shared by the
CLI and the driver.

Each check returns None when the input is fine, else the "expected ..." text for a one-line error. No
message ever carries the URL's password: an error shows ``without_userinfo`` of it (``redact.redact_url`` also
drops query values), and ``api_key_env_problem`` never shows the value at all.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = [
    "UNSET_API_KEY",
    "api_key_env_problem",
    "header_problem",
    "target_url_problem",
    "without_userinfo",
]

_USERINFO = re.compile(r"(//)[^/@\s]*@")
#: RFC 9110 token characters: a header name is one token.
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: Headers that frame the message or manage the connection: the transport writes them, never a user.
_FRAMING = frozenset(("content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"))
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CR, LF, NUL and the rest; tab is allowed in values


def without_userinfo(text: str) -> str:
    """``text`` with any ``//user:password@`` in it cut to ``//`` (safe to print)."""
    return _USERINFO.sub(r"\1", text)


def target_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a target base URL (scheme, host, port, no spaces or control bytes), or None."""
    if not url or _CONTROL.search(url) or any(c.isspace() for c in url):
        return "expected an http:// or https:// URL without spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of 0..65535 or not a number
    except ValueError as exc:
        return f"expected an http:// or https:// URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname:
        return "expected an http:// or https:// URL with a host"
    if port == 0:
        return "expected a port in 1..65535"
    return None


def header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be sent as one HTTP header (a CR/LF would inject more; framing headers
    would make the server read another message than the one sent), or None."""
    if not _TOKEN.match(name):
        return "expected a header NAME of letters, digits and -_.!#$%&'*+^`|~"
    if name.lower() in _FRAMING:
        return "set by loadgen for each request (message framing and connection): expected another header"
    if _CONTROL.search(value):
        return "expected a header value without CR, LF or other control characters"
    return None


#: What every command says of an --api-key-env variable that holds no key (after ``--api-key-env NAME: ``).
UNSET_API_KEY = "variable unset or empty: expected the API key in it"


def api_key_env_problem(name: str) -> str | None:
    """Why ``name`` cannot be the NAME of the environment variable holding an API key (a key pasted in its place
    is refused, and never echoed), or None."""
    if not name or not name.replace("_", "a").isalnum():
        return "expected the NAME of an environment variable (letters, digits, _), not a key"
    return None
