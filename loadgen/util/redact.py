"""Redaction: what loadgen may record or print of a URL or a message (no passwords, keys or bearer tokens).

Every query value of a URL is redacted and its name kept (``?code=REDACTED&subscription-key=REDACTED``): a
gateway may take its credential under any name. ``redact`` replaces secrets before it cuts a message, so a
secret across the cut is never kept in part.

Used by the driver (error messages, the target's /version), the targets, the contract replay and calibration.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

from loadgen.util.inputs import without_userinfo

__all__ = [
    "basic_token",
    "is_credential_name",
    "redact",
    "redact_query",
    "redact_url",
    "url_secrets",
    "with_encodings",
    "without_secrets",
]

#: A query value shorter than this is replaced in what a server says back only when its name is a credential's
#: (``?key=abc``, ``?sig=x1``), and then only as a whole word and never when it is a plain number (a figure).
MIN_QUERY_SECRET_CHARS = 8

#: Names whose values are credentials (whole names: "max_num_batched_tokens" or "tokenizer" are not).
_CREDENTIAL_NAME = re.compile(
    r"(?i)^(?:x[-_])?(?:authorization|proxy[-_]authorization|auth|api[-_]?key|(?:access|refresh|id|auth|api|bearer)?"
    r"[-_]?token|secret|client[-_]?secret|password|passwd|cookie|set[-_]cookie|credentials?|session(?:[-_]?id)?"
    r"|private[-_]?key|key)$"
)
#: Query parameters that carry a credential besides those (Azure SAS ``sig``, Functions ``code``, API Management
#: ``subscription-key``, signed S3/GCS URLs).
_QUERY_CREDENTIAL_NAME = re.compile(
    r"(?i)^(?:sig|signature|code|subscription[-_]?key|sas[-_]?token|x[-_](?:amz|goog)[-_]"
    r"(?:signature|credential|security[-_]token))$"
)
#: A plain number: a short one is not replaced in what a server says (it would hit the figures of a /metrics answer).
_FIGURE = re.compile(r"[+-]?\d+(?:\.\d+)?")

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


def is_credential_name(name: str) -> bool:
    """Whether a header, field or query parameter named ``name`` carries a credential (``X-Api-Key``,
    ``Authorization``, ``token``)."""
    return _CREDENTIAL_NAME.search(name) is not None


def _is_query_credential(name: str) -> bool:
    return is_credential_name(name) or _QUERY_CREDENTIAL_NAME.search(name) is not None


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a target URL carries, to replace wherever a server echoes them: its password (as given and
    decoded), the Basic token made of its userinfo, every query value of 8 characters or more, and the value of
    a credential-named parameter (``key``, ``api_key``, ``token``, ``sig``, ``code`` ...) whatever its length
    unless it is a plain number. A query value counts as sent (percent-encoded) and as decoded."""
    parts = urlsplit(url)
    query: list[str] = []
    for field in parts.query.split("&") if parts.query else ():
        raw_name, _, raw = field.partition("=")
        value = unquote_plus(raw)
        if len(value) >= MIN_QUERY_SECRET_CHARS or (
            value and _is_query_credential(unquote_plus(raw_name)) and not _FIGURE.fullmatch(value)
        ):
            query += [raw, value]
    password = (parts.password, unquote(parts.password)) if parts.password else ()
    token = basic_token(url)
    return tuple(dict.fromkeys((*password, *((token,) if token else ()), *query)))


#: A secret this long or longer is also searched for base64- and percent-encoded (``with_encodings``).
MIN_ENCODED_SECRET_CHARS = 16


def with_encodings(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """``secrets`` and, for each of 16 characters or more, the forms a server may echo it in: percent-encoded,
    JSON-escaped, and base64 (standard and URL-safe) at each of the three alignments it can have inside a longer
    base64 text (``Bearer KEY`` or ``user:KEY`` encoded whole), each cut to the characters that depend on the
    secret alone."""
    out = list(secrets)
    for secret in secrets:
        if len(secret) < MIN_ENCODED_SECRET_CHARS:
            continue
        out.append(quote(secret, safe=""))
        # as a JSON text may write it: escaped as JSON must (quotes, backslashes), ``/`` as ``\/`` (PHP), or every
        # character as ``\uXXXX``
        out += [json.dumps(secret)[1:-1], secret.replace("/", "\\/")]
        out += ["".join(f"\\u{ord(c):04{x}}" for c in secret) for x in "xX"]
        raw = secret.encode()
        for pad in range(3):
            encoded = base64.b64encode(b"\0" * pad + raw).decode()
            head = (0, 2, 3)[pad]  # characters that also hold bits of what comes before
            tail = 4 if (pad + len(raw)) % 3 else 0  # the last group, when it also holds bits of what comes after
            core = encoded[head : len(encoded) - tail]
            out += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(dict.fromkeys(s for s in out if s))


def without_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every known secret replaced by ``REDACTED``, nothing else changed (no cut, same lines). A
    secret shorter than 8 characters is replaced where it stands as a word (not inside ``abcdef`` for ``abc``)."""
    for secret in secrets:
        if len(secret) >= MIN_QUERY_SECRET_CHARS:
            text = text.replace(secret, "REDACTED")
            if len(secret) >= MIN_ENCODED_SECRET_CHARS:  # said back upper- or lower-cased
                text = text.replace(secret.upper(), "REDACTED").replace(secret.lower(), "REDACTED")
    short = _short_secrets(secrets)
    return short.sub("REDACTED", text) if short is not None else text


@functools.lru_cache(maxsize=64)
def _short_secrets(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern for a run's secrets under 8 characters, each as a whole word (None when there are none)."""
    short = sorted({s for s in secrets if 0 < len(s) < MIN_QUERY_SECRET_CHARS}, key=len, reverse=True)
    if not short:
        return None
    return re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, short)) + r")(?![A-Za-z0-9])")


def redact(message: str, secrets: tuple[str, ...] = ()) -> str:
    """One line of at most 500 characters, with known secrets, bearer tokens, URL userinfo and query values
    replaced (before the cut: a secret across it is never kept in part), and then any 8 characters or more of a
    secret of 16 or more: what a message shows of a server's value may have been cut before (a field's first
    60 characters, an error's first 500), the secret with it."""
    message = without_secrets(message, secrets)
    message = _BEARER.sub(r"\1REDACTED", message)
    message = without_userinfo(message)
    message = _SECRET_QUERY.sub(r"\1REDACTED", message)
    return _without_pieces(" ".join(message.split())[:500], secrets)


#: The fewest characters of a secret that count as a piece of it (``_without_pieces``).
MIN_PIECE_CHARS = 8


@functools.lru_cache(maxsize=64)
def _secret_pieces(secrets: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """Every run of ``MIN_PIECE_CHARS`` characters in a secret of 16 or more -> (the secret, where it starts)."""
    pieces: dict[str, tuple[str, int]] = {}
    for secret in secrets:
        if len(secret) >= MIN_ENCODED_SECRET_CHARS:
            for i in range(len(secret) - MIN_PIECE_CHARS + 1):
                pieces.setdefault(secret[i : i + MIN_PIECE_CHARS], (secret, i))
    return pieces


def _without_pieces(message: str, secrets: tuple[str, ...]) -> str:
    """``message`` (a short one) with each run of 8 characters or more of a secret of 16 or more replaced."""
    pieces = _secret_pieces(secrets)
    found = [at for at in (message.find(piece) for piece in pieces) if at >= 0]  # searched at C speed
    if not found:  # the usual case
        return message
    out: list[str] = []
    start, j = 0, min(found)
    n = len(message)
    while j <= n - MIN_PIECE_CHARS:
        hit = pieces.get(message[j : j + MIN_PIECE_CHARS])
        if hit is None:
            j += 1
            continue
        secret, i = hit
        k = MIN_PIECE_CHARS
        while j + k < n and i + k < len(secret) and message[j + k] == secret[i + k]:
            k += 1
        out += (message[start:j], "REDACTED")
        j = start = j + k
    return "".join(out) + message[start:] if out else message
