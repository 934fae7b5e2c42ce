"""The live simulated server's ready line: printed by ``loadgen sim serve``, parsed by the target layer.

``loadgen sim serve --port 0`` binds a free port and then prints exactly one line
``loadgen-sim listening on http://HOST:PORT`` (an IPv6 host in brackets; followed by the engine's
``[managed] path_prefix`` when it has one, the URL clients use) to stdout. This module is
the one definition of that line, on both sides.
"""

from __future__ import annotations

__all__ = ["READY_PREFIX", "base_url", "ready_line", "find_ready_url"]

READY_PREFIX = "loadgen-sim listening on "


def base_url(host: str, port: int) -> str:
    """``http://host:port`` with an IPv6 literal in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def ready_line(host: str, port: int, path_prefix: str = "") -> str:
    return f"{READY_PREFIX}{base_url(host, port)}{path_prefix}\n"


def find_ready_url(text: str) -> str | None:
    """The base URL from the first ready line in ``text`` (a server's log), None when not there yet."""
    complete = text[: text.rfind("\n") + 1]  # a line still being written is not read
    for line in complete.splitlines():
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX) :].strip().rstrip("/") or None
    return None
