"""A target URL's parts, one rule for every client loadgen opens on a target (the run, contract replay,
calibration): the server root that ``/v1/...``, ``/version`` and ``/metrics`` join, and the query string sent
with every request (a gateway may take its key there)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["split_target_url"]


def split_target_url(url: str, *, userinfo: bool = False) -> tuple[str, str]:
    """(the server root: scheme, host, port and path without a trailing ``/v1``; the query string).

    The root carries the URL's ``user:password`` only when ``userinfo`` is asked for (a client that lets httpx
    send it as Basic); otherwise credentials travel in one Authorization header the caller builds.
    """
    parts = urlsplit(url)
    path = parts.path.rstrip("/").removesuffix("/v1")
    if userinfo:
        netloc = parts.netloc
    else:
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, path, "", "")), parts.query
