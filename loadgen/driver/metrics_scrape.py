"""Prometheus text-format scraping of a target's ``/metrics`` into server_metrics columns.

``parse_prometheus_text`` is pure (text in, samples out) and handles the exposition format vLLM and
the simulated engine emit: comments, optional labels with escaped values, optional timestamps,
``NaN``/``+Inf``. ``MetricsScraper`` polls on an interval on the run clock; any other layer that
needs samples (the plan, the vLLM launcher) can reuse both.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import httpx

from loadgen.driver.bounded import Bounded, bounded_get
from loadgen.rundir.manifest import MetricsScrapes
from loadgen.util.redact import without_secrets

__all__ = [
    "METRICS_MAX_BYTES",
    "METRICS_MAX_LINES",
    "MetricsScraper",
    "parse_prometheus_text",
    "samples_to_columns",
    "scrape_counts",
    "scrape_warning",
]

#: Most bytes of one /metrics answer read; a longer one counts as a failed scrape.
METRICS_MAX_BYTES = 16 << 20
#: Most lines of one /metrics answer parsed (vLLM's has a few thousand); a longer one counts as a failed scrape.
#: It is parsed on the run's event loop: a million samples a second held the measured requests back.
METRICS_MAX_LINES = 50_000
#: Longest sample line kept (its labels are parsed a character at a time); a longer one is skipped.
METRICS_MAX_LINE_CHARS = 16_384
#: A metric name as the exposition format defines it (at most 256 characters): anything else is not a sample.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,255}")


def _parse_labels(text: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from ``{`` at ``start``; returns (labels, index after ``}``)."""
    labels: dict[str, str] = {}
    i = start + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return labels, i + 1
        eq = text.index("=", i)
        key = text[i:eq].strip()
        i = eq + 1
        while text[i] == " ":
            i += 1
        if text[i] != '"':
            raise ValueError(f"label {key}: value not quoted")
        i += 1
        out = []
        while True:
            c = text[i]
            if c == "\\":
                nxt = text[i + 1]
                out.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                out.append(c)
                i += 1
        labels[key] = "".join(out)
    raise ValueError("unterminated label set")


def _parse_value(token: str) -> float:
    low = token.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(token)


def parse_prometheus_text(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Yield (name, labels, value) for every sample line; malformed lines are skipped."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#" or len(line) > METRICS_MAX_LINE_CHARS:
            continue
        try:
            brace = line.find("{")
            space = line.find(" ")
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                labels, end = _parse_labels(line, brace)
                rest = line[end:].split()
            else:
                name, *rest = line.split()
                labels = {}
            if not rest or not _METRIC_NAME.fullmatch(name):
                continue
            yield name, labels, _parse_value(rest[0])
        except (ValueError, IndexError):
            continue


def samples_to_columns(
    samples, time_ns: int, prefixes: tuple[str, ...] | None = None, extra_labels: dict[str, str] | None = None
) -> dict[str, list[Any]]:
    """server_metrics columns for one scrape at ``time_ns``; ``prefixes`` keeps only matching names;
    ``extra_labels`` are added to every sample's labels (``target_index`` of a replica)."""
    cols: dict[str, list[Any]] = {"time_ns": [], "name": [], "labels": [], "value": []}
    for name, labels, value in samples:
        if prefixes and not name.startswith(prefixes):
            continue
        if extra_labels:
            labels = {**labels, **extra_labels}
        cols["time_ns"].append(time_ns)
        cols["name"].append(name)
        cols["labels"].append(json.dumps(labels, sort_keys=True) if labels else "{}")
        cols["value"].append(value)
    return cols


class MetricsScraper:
    """Polls GET /metrics every ``interval_s`` and hands columns to ``sink`` (on the run clock).

    A sample's time is the midpoint between sending the scrape and receiving its body, relative to
    ``anchor_ns``. A failed scrape is skipped, never raised, and counted by why (``skipped``: no answer, an HTTP
    status, over ``METRICS_MAX_BYTES`` or ``METRICS_MAX_LINES``, no sample in it); ``stored`` counts the
    scrapes whose samples were kept. The run's ``secrets`` never reach a sample.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        anchor_ns: int,
        sink,
        interval_s: float = 1.0,
        prefixes: tuple[str, ...] | None = None,
        labels: dict[str, str] | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.labels = labels  # added to every sample (a replica's target_index)
        self.url = url
        self.anchor_ns = anchor_ns
        self.sink = sink
        self.interval_s = interval_s
        self.prefixes = prefixes
        self.timeout_s = max(interval_s, 10.0)  # one scrape: connect to last byte
        self.secrets = secrets  # replaced in what a scrape stores (a server may echo the key in a label)
        self.stored = 0
        self.skipped: Counter[str] = Counter()

    async def scrape_once(self) -> None:
        t0 = time.perf_counter_ns()
        got = await bounded_get(self.client, self.url, timeout_s=self.timeout_s, max_bytes=METRICS_MAX_BYTES)
        t1 = time.perf_counter_ns()
        body, why = _body(got)
        if body is None:
            self.skipped[why] += 1
            return
        cols = samples_to_columns(
            parse_prometheus_text(without_secrets(body, self.secrets)),
            (t0 + t1) // 2 - self.anchor_ns,
            self.prefixes,
            self.labels,
        )
        if not cols["name"]:
            self.skipped["no sample"] += 1
            return
        self.stored += 1
        self.sink(cols)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Scrape now, then on a fixed-interval grid until cancelled."""
        await self.scrape_once()
        task_status.started()
        start = time.perf_counter_ns()
        k = 1
        interval_ns = int(self.interval_s * 1e9)
        while True:
            target = start + k * interval_ns
            delay = (target - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await anyio.sleep(delay)
            await self.scrape_once()
            k = max(k + 1, (time.perf_counter_ns() - start) // interval_ns + 1)


def _body(got: Bounded) -> tuple[str | None, str]:
    """A scrape's text, or None and why it is not kept."""
    response = got.response
    if response is None:
        return None, "no answer"
    if response.status_code != 200:
        return None, f"HTTP {response.status_code}"
    if got.truncated:
        return None, f"over {METRICS_MAX_BYTES >> 20} MiB"
    body = response.text
    if body.count("\n") > METRICS_MAX_LINES:
        return None, f"over {METRICS_MAX_LINES:,} lines"
    return body, ""


def scrape_counts(scrapers: list[MetricsScraper]) -> MetricsScrapes:
    """The manifest's ``metrics_scrapes`` section: scrapes stored and skipped (by why) over every target."""
    skipped: Counter[str] = Counter()
    for scraper in scrapers:
        skipped.update(scraper.skipped)
    return MetricsScrapes(stored=sum(s.stored for s in scrapers), skipped=dict(sorted(skipped.items())))


def scrape_warning(counts: MetricsScrapes) -> str | None:
    """One line for the manifest's warnings when any scrape was skipped (None: none was)."""
    total = sum(counts.skipped.values())
    if not total:
        return None
    why = ", ".join(f"{n} {reason}" for reason, n in counts.skipped.items())
    return (
        f"server metrics: {total} of {total + counts.stored} /metrics scrapes skipped ({why}); "
        "the server_metrics series has gaps there"
    )
